"""MXFP8 training emulated on CPU: Transformer Engine's ``MXFP8BlockScaling`` recipe, exact bytes.

Rule: each linear layer on the grid runs TE's three GEMMs (fprop, dgrad, wgrad) on MXFP8 operands
quantized from the high-precision tensor (rowwise or columnwise as TE does, tokens padded to 32 for
wgrad), multiplied in fp32 after dequantization; weights optionally cached per step
(``Recipe(cache_weights=True)``); :func:`capture_operands` records the operands each GEMM consumed.
Specified in docs/library.md (The MXFP8 emulation); the numerics in docs/design.md (Numerics).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fp8rl_core.grids import QuantizedTensor, quantize

from .recipe import Recipe
from .patterns import gemm_layers
from .timers import timed

__all__ = [
    "BLOCK",
    "GemmOperands",
    "MXFP8Experts",
    "MXFP8Linear",
    "MXFP8Router",
    "apply_recipe",
    "bf16_autocast",
    "capture_operands",
    "clear_weight_cache",
    "forward_weights",
    "linear",
    "on_grid_layers",
    "weight_cache_info",
]

BLOCK = 32
_ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------------------
# Operand capture (part of the code path: the very objects each product is computed from)
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmOperands:
    """The two quantized operands one emulated GEMM consumed.

    gemm ``fprop``: ``Y = a·bᵀ`` (a = X rowwise [M,K], b = W rowwise [N,K]);
    ``dgrad``: ``dX = a·b`` (a = dY rowwise [M,N], b = W columnwise [N,K]);
    ``wgrad``: ``dW = aᵀ·b`` (a = dY columnwise [M,N], b = X columnwise [M,K]).
    ``layer`` is the GEMM layer name (``None`` for an anonymous :func:`linear` call); ``expert`` the
    expert index for an expert projection.
    """

    gemm: str
    layer: str | None
    expert: int | None
    a: QuantizedTensor
    b: QuantizedTensor


_local = threading.local()


@contextlib.contextmanager
def capture_operands() -> Iterator[list[GemmOperands]]:
    """Record every MXFP8 GEMM's operands (forward and backward) run in this thread inside the block."""
    prev = getattr(_local, "capture", None)
    records: list[GemmOperands] = []
    _local.capture = records
    try:
        yield records
    finally:
        _local.capture = prev


def _emit(gemm: str, tag: tuple[str | None, int | None], a: QuantizedTensor, b: QuantizedTensor) -> None:
    records = getattr(_local, "capture", None)
    if records is not None:
        records.append(GemmOperands(gemm, tag[0], tag[1], a, b))


# ----------------------------------------------------------------------------------------------------
# Weight cache
# ----------------------------------------------------------------------------------------------------
class _Entry:
    __slots__ = ("ref", "key", "row", "col")

    def __init__(self, ref: weakref.ref, key: tuple) -> None:
        self.ref, self.key = ref, key
        self.row: QuantizedTensor | None = None
        self.col: QuantizedTensor | None = None


_CACHE: dict[int, _Entry] = {}
_STATS = {"hits": 0, "misses": 0}


def _drop(key: int, ref: weakref.ref) -> None:
    entry = _CACHE.get(key)
    if entry is not None and entry.ref is ref:
        del _CACHE[key]


def weight_cache_info() -> dict[str, int]:
    """``{"hits", "misses", "entries"}`` of the forward-weight cache (a miss re-quantizes a weight)."""
    return {**_STATS, "entries": len(_CACHE)}


def clear_weight_cache() -> None:
    """Drop every cached quantized weight and reset the counters."""
    _CACHE.clear()
    _STATS.update(hits=0, misses=0)


def _weight_operands(
    weight: torch.Tensor, recipe: Recipe, need_col: bool, col_axis: int
) -> tuple[QuantizedTensor, QuantizedTensor | None]:
    """W rowwise (blocks along K = last dim) and, if ``need_col``, W columnwise (blocks along N =
    ``col_axis``), both from the high-precision weight; from the cache when ``recipe.cache_weights``."""
    grid = recipe.fwd_grid
    w = weight.detach()
    if not recipe.cache_weights:
        with torch.no_grad(), timed("quantize"):
            row = quantize(w, grid, axis=-1)
            col = quantize(w, grid, axis=col_axis) if need_col else None
        return row, col
    key = (weight._version, weight.data_ptr(), tuple(weight.shape), weight.dtype, grid, col_axis)
    entry = _CACHE.get(id(weight))
    if entry is not None and entry.ref() is weight and entry.key == key:
        _STATS["hits"] += 1
    else:
        _STATS["misses"] += 1
        ref = entry.ref if entry is not None and entry.ref() is weight else None
        if ref is None:
            ref = weakref.ref(weight)
            weakref.finalize(weight, _drop, id(weight), ref)
        entry = _CACHE[id(weight)] = _Entry(ref, key)
    with torch.no_grad(), timed("quantize"):
        if entry.row is None:
            entry.row = quantize(w, grid, axis=-1)
        if need_col and entry.col is None:
            entry.col = quantize(w, grid, axis=col_axis)
    return entry.row, entry.col if need_col else None


# ----------------------------------------------------------------------------------------------------
# The autograd function: fprop / dgrad / wgrad
# ----------------------------------------------------------------------------------------------------
def _autocast_off(device: torch.device) -> torch.autocast:
    return torch.autocast(device.type, enabled=False)


class _MXFP8LinearFunction(torch.autograd.Function):
    """``Y = X·Wᵀ (+ b)`` with TE's three MXFP8 GEMMs; ``x2d`` is [M, K], ``weight`` [N, K]."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, recipe, w_row, w_col, tag, grad_enabled):  # noqa: D401
        # needs_input_grad ignores no_grad mode (forward itself always runs without grad): ask the caller
        need_wgrad = grad_enabled and ctx.needs_input_grad[1]
        with _autocast_off(x2d.device):
            with timed("quantize"):
                x_row = quantize(x2d, recipe.fwd_grid, axis=-1)
                # TE's input_quantizer makes the columnwise copy in the forward (when W needs a grad)
                x_col = quantize(x2d, recipe.fwd_grid, axis=0, pad=True) if need_wgrad else None
            _emit("fprop", tag, x_row, w_row)
            with timed("gemm"):
                y = x_row.dequantize(torch.float32) @ w_row.dequantize(torch.float32).T
                if bias is not None:
                    y = y + bias.to(torch.float32)
        ctx.save_for_backward(weight)  # autograd's version check: no in-place write before backward
        ctx.recipe, ctx.tag, ctx.x_col, ctx.w_col = recipe, tag, x_col, w_col
        ctx.x_dtype = x2d.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x2d.dtype)

    @staticmethod
    def backward(ctx, dy):
        (weight,) = ctx.saved_tensors
        need_dgrad, need_wgrad, need_dbias = ctx.needs_input_grad[:3]
        recipe = ctx.recipe
        dx = dw = db = None
        with _autocast_off(dy.device):
            with timed("quantize"):
                dy_row = quantize(dy, recipe.grad_grid, axis=-1) if need_dgrad else None
                dy_col = quantize(dy, recipe.grad_grid, axis=0, pad=True) if need_wgrad else None
            if need_dgrad:
                if ctx.w_col is None:
                    raise RuntimeError("MXFP8 dgrad needs W columnwise, which the forward did not prepare")
                _emit("dgrad", ctx.tag, dy_row, ctx.w_col)
                with timed("gemm"):
                    dx = (dy_row.dequantize(torch.float32) @ ctx.w_col.dequantize(torch.float32)).to(ctx.x_dtype)
            if need_wgrad:
                _emit("wgrad", ctx.tag, dy_col, ctx.x_col)
                with timed("gemm"):
                    dw = dy_col.dequantize(torch.float32).T @ ctx.x_col.dequantize(torch.float32)
                dw = dw.to(weight.dtype)
            if need_dbias:
                db = dy.to(torch.float32).sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None


def _check_operands(x: torch.Tensor, weight: torch.Tensor, layer: str | None) -> None:
    where = f"MXFP8 layer {layer!r}" if layer else "MXFP8 linear"
    if not isinstance(x, torch.Tensor) or x.dtype not in _ACT_DTYPES:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{where}: input must be a float32/bfloat16/float16 tensor, got {what}")
    if weight.dim() != 2:
        raise ValueError(f"{where}: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{where}: input's last dim ({x.shape[-1] if x.dim() else 'scalar'}) must equal the weight's "
            f"in_features K={weight.shape[1]} (weight shape {tuple(weight.shape)})"
        )
    _check_block_dims(weight.shape[0], weight.shape[1], where)


def _check_block_dims(n: int, k: int, where: str) -> None:
    for dim, val, role in (("K", k, "in_features, blocks of fprop/wgrad"), ("N", n, "out_features, blocks of dgrad")):
        if val % BLOCK:
            raise ValueError(
                f"{where}: {dim}={val} ({role}) is not a multiple of {BLOCK}; MXFP8 GEMMs need K and N "
                f"divisible by {BLOCK} (only the token dim M is padded) — keep this layer off the grid"
            )


def _linear_core(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    recipe: Recipe,
    w_row: QuantizedTensor,
    w_col: QuantizedTensor | None,
    tag: tuple[str | None, int | None],
) -> torch.Tensor:
    n, k = weight.shape
    lead = x.shape[:-1]
    x2d = x.reshape(-1, k)
    if x2d.shape[0] == 0:  # no tokens (nothing to quantize): an empty product, still on the graph
        y = x2d @ weight.to(x2d.dtype).T
        return (y if bias is None else y + bias.to(y.dtype)).reshape(*lead, n)
    y = _MXFP8LinearFunction.apply(x2d, weight, bias, recipe, w_row, w_col, tag, torch.is_grad_enabled())
    return y.reshape(*lead, n)


def _activation(x: torch.Tensor) -> torch.Tensor:
    """TE casts the input to ``activation_dtype`` (the autocast dtype under autocast) before quantizing."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    recipe: Recipe = Recipe(),
    *,
    layer: str | None = None,
) -> torch.Tensor:
    """``x·Wᵀ + b`` through TE's three MXFP8 GEMMs (the operands: docs/library.md, The MXFP8 emulation).

    x: [..., K] float32/bfloat16 (leading dims are flattened into the token dim M); weight: [N, K]
    (fp32 master); K and N multiples of 32. ``layer`` names the GEMM in captured operands.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an mxfp8.Recipe, got {type(recipe).__name__}")
    _check_operands(x, weight, layer)
    x = _activation(x)
    need_col = torch.is_grad_enabled() and x.requires_grad
    w_row, w_col = _weight_operands(weight, recipe, need_col, col_axis=0)
    return _linear_core(x, weight, bias, recipe, w_row, w_col, (layer, None))


def bf16_autocast(device_type: str = "cpu") -> torch.autocast:
    """The learner's BF16 context: off-grid layers compute in BF16 (Megatron's BF16 layers), MXFP8
    layers take BF16 activations and fp32 master weights and keep fp32 products.

    Cost on the 2-core CPU (torch 2.13, one thread): a [1536, 256]×[768, 256] ``F.linear`` runs
    about 2× *faster* under autocast than in fp32 (oneDNN BF16 kernels); the tiny test models'
    forward+backward costs the same within ±6% (overhead-bound, not GEMM-bound).
    """
    return torch.autocast(device_type, dtype=torch.bfloat16)


# ----------------------------------------------------------------------------------------------------
# Modules
# ----------------------------------------------------------------------------------------------------
class MXFP8Linear(nn.Module):
    """An ``nn.Linear`` on the grid: the *same* ``weight``/``bias`` Parameters, forward via :func:`linear`."""

    def __init__(self, linear_module: nn.Module, recipe: Recipe, name: str | None = None) -> None:
        super().__init__()
        w = linear_module.weight
        if w.dim() != 2:
            raise ValueError(f"MXFP8Linear wraps a module with a 2-D weight, got {tuple(w.shape)}")
        self.out_features, self.in_features = w.shape
        _check_block_dims(self.out_features, self.in_features, f"MXFP8 layer {name!r}")
        self.weight = w
        self.bias = getattr(linear_module, "bias", None)
        self.recipe = recipe
        self.layer_name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.recipe, layer=self.layer_name)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, grid={self.recipe.fwd_grid}, grad_grid={self.recipe.grad_grid}"
        )


_ROUTER_ATTRS = ("top_k", "num_experts", "norm_topk_prob", "hidden_dim")


class MXFP8Router(nn.Module):
    """A Hugging Face MoE top-k router (``Qwen3MoeTopKRouter``) with its logits GEMM on the grid.

    Same ``weight`` Parameter; same forward as HF (reshape → logits → fp32 softmax → top-k → optional
    renormalisation → cast to the logits' dtype), with ``F.linear`` replaced by :func:`linear`.
    Off the grid by default (see :mod:`.patterns`); only an explicit selection puts it here.
    """

    def __init__(self, router: nn.Module, recipe: Recipe, name: str | None = None) -> None:
        super().__init__()
        missing = [a for a in _ROUTER_ATTRS if not hasattr(router, a)]
        if missing:
            raise ValueError(
                f"cannot put {type(router).__name__} {name!r} on the grid: not an nn.Linear and not a "
                f"top-k router (missing {', '.join(missing)})"
            )
        for a in _ROUTER_ATTRS:
            setattr(self, a, getattr(router, a))
        self.weight = router.weight
        self.recipe = recipe
        self.layer_name = name

    def forward(self, hidden_states: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = linear(hidden_states, self.weight, None, self.recipe, layer=self.layer_name)
        router_probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_top_value = router_top_value.to(router_logits.dtype)
        return router_logits, router_top_value, router_indices


EXPERT_PROJECTIONS = ("gate_up_proj", "down_proj")


class MXFP8Experts(nn.Module):
    """Fused MoE experts (``Qwen3MoeExperts``) with chosen projections on the grid.

    Holds the *same* ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I] Parameters and computes
    exactly the HF eager forward: for each expert hit by ``top_k_index``, its tokens go through
    ``gate_up_proj[e]`` → ``act(gate) * up`` (gate = first I rows, up = last I) → ``down_proj[e]``,
    are scaled by their routing weight and ``index_add``-ed into the output. Each projection in
    ``on_grid`` is an MXFP8 GEMM (:func:`linear` semantics, expert ``e``'s weight being the slice
    ``param[e]`` of the [E, N, K] tensor quantized rowwise along K — the tensor
    :func:`forward_weights` reports); the others are plain ``F.linear`` like HF. (HF's default
    ``experts_implementation`` may be ``grouped_mm``; that is the same math batched.)
    """

    def __init__(self, experts: nn.Module, recipe: Recipe, on_grid: Iterable[str], name: str | None = None) -> None:
        super().__init__()
        on_grid = frozenset(on_grid)
        bad = sorted(on_grid - set(EXPERT_PROJECTIONS))
        if bad:
            raise ValueError(f"unknown expert projection(s) {bad}; valid: {', '.join(EXPERT_PROJECTIONS)}")
        if not all(isinstance(getattr(experts, p, None), torch.Tensor) for p in EXPERT_PROJECTIONS):
            raise ValueError(
                f"cannot put {type(experts).__name__} {name!r} on the grid: expected fused experts with "
                f"3-D gate_up_proj [E, 2I, H] and down_proj [E, H, I] parameters"
            )
        layout = {a: getattr(experts, a, d) for a, d in
                  (("has_bias", False), ("is_transposed", False), ("is_concatenated", True), ("has_gate", True))}
        if layout != {"has_bias": False, "is_transposed": False, "is_concatenated": True, "has_gate": True}:
            raise ValueError(f"experts {name!r} have an unsupported layout {layout}; only Qwen3-MoE's is emulated")
        for p in sorted(on_grid):
            e, n, k = getattr(experts, p).shape
            _check_block_dims(n, k, f"expert projection {name}.{p} [E={e}, N={n}, K={k}]")
        self.gate_up_proj = experts.gate_up_proj
        self.down_proj = experts.down_proj
        self.act_fn = experts.act_fn
        self.num_experts = experts.gate_up_proj.shape[0]
        self.hidden_dim = experts.gate_up_proj.shape[2]
        self.intermediate_dim = experts.down_proj.shape[2]
        self.config = getattr(experts, "config", None)
        self.recipe = recipe
        self.on_grid = on_grid
        self.layer_name = name

    def _operands(self, proj: str, need_col: bool):
        return _weight_operands(getattr(self, proj), self.recipe, need_col, col_axis=1)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        final_hidden_states = torch.zeros_like(hidden_states)
        with torch.no_grad():
            expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts + 1)
            expert_mask = expert_mask.permute(2, 1, 0)
            expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()

        need_col = torch.is_grad_enabled()
        ops = {p: self._operands(p, need_col) for p in EXPERT_PROJECTIONS if p in self.on_grid}

        def project(proj: str, x: torch.Tensor, e: int) -> torch.Tensor:
            w = getattr(self, proj)[e]
            if proj not in ops:
                return F.linear(x, w)
            row, col = ops[proj]
            x = _activation(x)
            w_row = QuantizedTensor(row.data[e], row.scale[e], row.grid, axis=row.axis - 1)
            w_col = None if col is None else QuantizedTensor(col.data[e], col.scale[e], col.grid, axis=col.axis - 1)
            return _linear_core(x, w, None, self.recipe, w_row, w_col, (f"{self.layer_name}.{proj}", e))

        for expert_idx in expert_hit:
            e = int(expert_idx[0])
            if e == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(expert_mask[e])
            current_state = hidden_states[token_idx]
            gate, up = project("gate_up_proj", current_state, e).chunk(2, dim=-1)
            current_hidden_states = self.act_fn(gate) * up
            current_hidden_states = project("down_proj", current_hidden_states, e)
            current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
            final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
        return final_hidden_states

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, on_grid={sorted(self.on_grid)}, grid={self.recipe.fwd_grid}"


_SWAPPED = (MXFP8Linear, MXFP8Router, MXFP8Experts)


# ----------------------------------------------------------------------------------------------------
# Swap, on-grid layers, forward weights
# ----------------------------------------------------------------------------------------------------
def apply_recipe(model: nn.Module, layer_names: Iterable[str], recipe: Recipe) -> list[str]:
    """Put exactly ``layer_names`` (GEMM layer names, see :func:`~.patterns.gemm_layers`) on the grid.

    Swaps modules in place: ``nn.Linear`` → :class:`MXFP8Linear`, a top-k router →
    :class:`MXFP8Router`, fused experts → :class:`MXFP8Experts` (with the named projections on the
    grid). Parameters are the same objects under the same names, so ``state_dict()`` keys, optimizers
    and ``save_pretrained`` are unaffected. Returns the swapped names in model order. Raises
    ValueError for a name that is not a GEMM layer, a layer already swapped, or K/N not multiples of 32.
    """
    if isinstance(layer_names, str):
        raise TypeError(
            f"apply_recipe takes a list of layer names, got the string {layer_names!r}; resolve presets "
            f"and patterns first with patterns.resolve_layers(model, selection)"
        )
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be an mxfp8.Recipe, got {type(recipe).__name__}")
    wanted = list(dict.fromkeys(layer_names))
    valid = gemm_layers(model)
    valid_set = set(valid)
    unknown = [n for n in wanted if n not in valid_set]
    if unknown:
        raise ValueError(
            f"not GEMM layers of this model: {unknown}; GEMM layers look like: "
            f"{', '.join(valid[:6])}{', …' if len(valid) > 6 else ''} ({len(valid)} in all)"
        )
    modules = dict(model.named_modules())
    plan: dict[str, set[str]] = {}  # module name -> expert projections ({} for a whole linear module)
    for n in valid:
        if n not in set(wanted):
            continue
        if n in modules:
            plan[n] = set()
        else:
            parent, proj = n.rsplit(".", 1) if "." in n else ("", n)
            plan.setdefault(parent, set()).add(proj)
    for mod_name, projs in plan.items():
        module = modules[mod_name]
        if isinstance(module, _SWAPPED):
            raise ValueError(f"layer {mod_name!r} is already on the grid ({type(module).__name__}); apply a recipe once")
        if mod_name == "":
            raise ValueError("cannot swap the root module itself; pass a model that contains the layer")
        if projs:
            for p in sorted(projs):
                e, n_, k = getattr(module, p).shape
                _check_block_dims(n_, k, f"expert projection {mod_name}.{p} [E={e}, N={n_}, K={k}]")
        else:
            n_, k = module.weight.shape
            _check_block_dims(n_, k, f"layer {mod_name!r} weight [N={n_}, K={k}]")
    for mod_name, projs in plan.items():
        module = modules[mod_name]
        if projs:
            new: nn.Module = MXFP8Experts(module, recipe, projs, mod_name)
        elif isinstance(module, nn.Linear):
            new = MXFP8Linear(module, recipe, mod_name)
        else:
            new = MXFP8Router(module, recipe, mod_name)
        parent_name, _, child = mod_name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new)
    return [n for n in valid if n in set(wanted)]


def on_grid_layers(model: nn.Module) -> list[str]:
    """GEMM layer names currently on the grid (swapped by :func:`apply_recipe`), in model order."""
    return [name for name, _, _ in _on_grid(model)]


def _on_grid(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, Recipe]]:
    for name, module in model.named_modules():
        if isinstance(module, (MXFP8Linear, MXFP8Router)):
            yield name, module.weight, module.recipe
        elif isinstance(module, MXFP8Experts):
            for p in EXPERT_PROJECTIONS:
                if p in module.on_grid:
                    yield f"{name}.{p}", getattr(module, p), module.recipe


def forward_weights(model: nn.Module) -> dict[str, QuantizedTensor]:
    """The learner's FP8 forward weights: for every on-grid layer, the rowwise QuantizedTensor of its
    current master weight exactly as the fprop GEMM uses it (experts: the [E, N, K] tensor quantized
    along K; expert e's operand is its slice ``[e]``). From the weight cache when the recipe caches,
    so byte-identical to — and, within a step, the very object — the fprop GEMM consumed."""
    out: dict[str, QuantizedTensor] = {}
    for name, weight, recipe in _on_grid(model):
        col_axis = 1 if weight.dim() == 3 else 0
        out[name] = _weight_operands(weight, recipe, need_col=False, col_axis=col_axis)[0]
    return out
