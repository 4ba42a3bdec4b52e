"""The fault catalogue: named perturbations of one step of the real sync path, each declaring the
condition it breaks (docs/design.md, "The seven conditions").

A :class:`Fault` is a set of sync hooks (:class:`fp8rl_core.sync.hooks.SyncHooks`): whoever injects it
passes it as ``hooks`` to :func:`fp8rl_core.loop.start_pipeline` (a ``config`` fault) or
:func:`fp8rl_core.loop.sync_weights` (the others), and it acts at one stage of the sync path:

* ``config``    — the engine (and the exporter) run other per-layer schemes than the run configures
                  (:meth:`~Fault.schemes_for_engine`); present from the start.
* ``export``    — the sync tensors are changed after :func:`~fp8rl_core.sync.export.export_weights`.
* ``transport`` — the written sync (buckets + manifest) is changed before the engine reads it.
* ``load`` / ``post-load`` — a hook runs in the engine's worker process around vLLM's in-place reload
  (:meth:`~Fault.worker_hook` names a ``module:function`` of this module).
* ``engine``    — what the sampler does around the load: a replica not synced, the cache not reset.

Everything else is the production path: the same exporter, transport, worker loader, vLLM's reload
and post-load processing. :data:`FAULTS` lists them; :func:`fault` looks one up by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fp8rl_core.grids import QuantizedTensor, parse_grid, quantize
from fp8rl_core.grids.formats import bf16_view
from fp8rl_core.grids.schemes import DEFAULT_SCHEME, SCHEMES, Scheme, scheme
from fp8rl_core.sync.hooks import SyncHooks

__all__ = ["FAULTS", "Fault", "fault"]

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Fault(SyncHooks):
    name: str
    condition: str  # the condition it breaks (docs/design.md): W1 … W7
    stage: str
    model: str  # "dense" | "moe": the model it is injected on
    what: str  # what goes wrong, as seen in real systems
    export: Callable[["object", Tensors], Tensors] | None = None
    transport: Callable[["object"], None] | None = None
    worker: str | None = None  # "module:function" run in the worker (phase "after" the reload)
    engine_schemes: Callable[[dict[str, str]], dict[str, str]] | None = None
    resets_cache: bool = True
    stale_replica: int | None = None  # replica index left on the old version
    replicas: int = 1
    bucket_mb: float | None = None
    captures_pre_step: bool = False
    params: dict = field(default_factory=dict)

    # -- the sync hooks (fp8rl_core.sync.hooks) -----------------------------------------------------
    def schemes_for_engine(self, configured: dict[str, str]) -> dict[str, str]:
        return self.engine_schemes(dict(configured)) if self.engine_schemes is not None else configured

    def on_export(self, pipe, tensors: Tensors) -> Tensors:
        if self.captures_pre_step:
            return dict(getattr(pipe, "pre_step_export"))
        return self.export(pipe, dict(tensors)) if self.export is not None else tensors

    def skips_replica(self, index: int) -> bool:
        return self.stale_replica == index

    def sync_bucket_mb(self, configured: float) -> float:
        return self.bucket_mb if self.bucket_mb is not None else configured

    def on_transport(self, handle) -> None:
        if self.transport is not None:
            self.transport(handle)

    def worker_hook(self) -> str | None:
        return self.worker

    def resets_prefix_cache(self) -> bool:
        return self.resets_cache


# ----------------------------------------------------------------------------------------------------
# helpers on sync tensors
# ----------------------------------------------------------------------------------------------------
def _first(tensors: Tensors, suffix: str) -> str:
    names = sorted(n for n in tensors if n.endswith(suffix))
    if not names:
        raise ValueError(f"fault needs a sync tensor ending in {suffix!r}; this model/preset has none")
    return names[0]


def _swap_rows(t: torch.Tensor, a: slice, b: slice) -> torch.Tensor:
    t = t.clone()
    ta, tb = t[a].clone(), t[b].clone()
    t[a], t[b] = tb, ta
    return t


def _qkv_sizes(pipe) -> tuple[int, int]:
    c = pipe.learner.model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_attention_heads * hd, c.num_key_value_heads * hd


def _swap_kv(pipe, tensors: Tensors) -> Tensors:
    name = _first(tensors, "self_attn.qkv_proj.weight")
    q, kv = _qkv_sizes(pipe)
    for n in (name, name + "_scale"):
        if n in tensors:
            tensors[n] = _swap_rows(tensors[n], slice(q, q + kv), slice(q + kv, q + 2 * kv))
    return tensors


def _swap_gate_up(pipe, tensors: Tensors) -> Tensors:
    name = _first(tensors, "mlp.gate_up_proj.weight")
    i = tensors[name].shape[0] // 2
    for n in (name, name + "_scale"):
        if n in tensors:
            tensors[n] = _swap_rows(tensors[n], slice(0, i), slice(i, 2 * i))
    return tensors


def _permute_experts(pipe, tensors: Tensors) -> Tensors:
    name = _first(tensors, "mlp.experts.w13_weight")
    prefix = name.removesuffix(".w13_weight")
    for n in [k for k in tensors if k.startswith(prefix + ".w")]:
        tensors[n] = torch.roll(tensors[n], shifts=1, dims=0).contiguous()  # expert e gets e-1's weights
    return tensors


def _drop_experts(pipe, tensors: Tensors) -> Tensors:
    return {n: t for n, t in tensors.items() if ".mlp.experts." not in n}


def _drop_lm_head(pipe, tensors: Tensors) -> Tensors:
    return {n: t for n, t in tensors.items() if not n.startswith("lm_head.")}


def _columnwise_scales(pipe, tensors: Tensors) -> Tensors:
    """Scales of the learner's columnwise copy (32×1 blocks down K's partner dimension N) put where the
    rowwise scales go, reshaped to their [N, K/32] shape — the data bytes stay rowwise."""
    name = _first(tensors, "self_attn.o_proj.weight_scale")
    layer = name.removesuffix(".weight_scale")
    master = dict(pipe.learner.model.named_parameters())[f"{layer}.weight"].detach().float()
    grid = pipe.learner.cfg.recipe.fwd_grid
    col = quantize(master, grid, axis=0).scale  # [N/32, K]
    tensors[name] = col.t().contiguous().reshape(tensors[name].shape).contiguous()
    return tensors


def _fp8_round_trip(pipe, tensors: Tensors) -> Tensors:
    name = "model.embed_tokens.weight"
    grid = pipe.learner.cfg.recipe.fwd_grid
    tensors[name] = bf16_view(quantize(tensors[name].float(), grid, axis=-1).dequantize(torch.float32))
    return tensors


def _drop_bucket(handle) -> None:
    """Lose one bucket of the sync (the second) between writer and reader: the manifest no longer lists it."""
    m = json.loads(handle.manifest.read_text())
    if len(m["buckets"]) < 2:
        raise ValueError("the dropped-bucket fault needs a sync of at least 2 buckets (lower bucket_mb)")
    lost = m["buckets"].pop(1)
    (handle.manifest.parent / lost["file"]).unlink()
    handle.manifest.write_text(json.dumps(m))


#: the other grid the router-fp8 fault puts the MoE router on: the quantized scheme whose held bytes are on a grid
#: other than the learner's (block128: the engine quantizes to 128×128 blocks itself)
_OTHER_GRID = next(s.name for s in SCHEMES.values() if s.quantized and s.grid() != SCHEMES[DEFAULT_SCHEME].grid())


def _router_fp8(schemes: dict[str, str]) -> dict[str, str]:
    return schemes | {p.removesuffix(".experts") + ".gate": _OTHER_GRID for p in schemes if p.endswith(".mlp.experts")}


def _substring_gate(schemes: dict[str, str]) -> dict[str, str]:
    """vLLM-style ``ignored_layers=["gate"]`` (meant for the router) matched as a substring: every
    layer whose name contains "gate" — gate_up_proj too — stays BF16."""
    return {p: s for p, s in schemes.items() if "gate" not in p}


# ----------------------------------------------------------------------------------------------------
# worker-side hooks (run inside vLLM's worker process, after the reload)
# ----------------------------------------------------------------------------------------------------
def _on_learner_grid(s: Scheme) -> bool:
    return s.on_learner_grid


def _requantizes(s: Scheme) -> bool:
    """A scheme whose engine quantizes the BF16 view itself by a rule W2 checks (``requant``)."""
    return s.rule_checked


def _fp8rl_linear_layers(worker, which=_on_learner_grid):
    """(prefix, module) of the worker's linear layers whose scheme ``which`` selects (default: the learner's bytes)."""
    for prefix, module, s in worker._fp8rl_layers():
        if which(scheme(s)) and not hasattr(module, "w13_weight"):
            yield prefix, module


@torch.no_grad()
def worker_requantize_floor(worker, phase: str) -> None:
    """The sampler requantizes what it received with another scale rule: dequantize the learner's bytes
    and quantize again with OCP FLOOR (instead of the learner's RCEIL)."""
    if phase != "after":
        return
    for _, module in _fp8rl_linear_layers(worker):
        grid = parse_grid(module.quant_method.scheme.mx_grid)
        floor = parse_grid(f"mxfp8-{grid.elem}-floor")
        w = module.weight.data.view(grid.format.dtype)
        deq = QuantizedTensor(w, module.weight_scale.data, grid, axis=1).dequantize()
        q = quantize(deq, floor, axis=-1)
        module.weight.data.copy_(q.data.view(torch.uint8))
        module.weight_scale.data.copy_(q.scale)
        module.fp8rl_w = QuantizedTensor(q.data, q.scale, floor, axis=1).dequantize()


@torch.no_grad()
def worker_process_twice(worker, phase: str) -> None:
    """Post-load processing runs a second time on every layer on the learner's grid."""
    if phase != "after":
        return
    for prefix, module, s in worker._fp8rl_layers():
        if scheme(s).on_learner_grid:
            module.quant_method.process_weights_after_loading(module)


@torch.no_grad()
def worker_stale_derived(worker, phase: str) -> None:
    """The derived (dequantized) copy a layer computes with is not rebuilt from the new weights: the
    copy from before this sync stays in use, and the layer's processing is not counted."""
    kept = list(worker.__dict__.get("fp8rl_fault_saved", {})) if phase == "after" else []
    worker_stale_copy_counted(worker, phase)
    layers = dict(_fp8rl_linear_layers(worker))
    for prefix in kept:
        layers[prefix].fp8rl_processed -= 1


@torch.no_grad()
def worker_requant_byte_flipped(worker, phase: str) -> None:
    """A sampler that requantizes (preset ``requant``) holds one wrong E4M3 byte after its own quantization:
    the first data byte of the first such linear layer has its lowest bit flipped, in the held bytes and in
    the copy the layer computes with. Not in :data:`FAULTS` (their presets put the learner's bytes on the
    grid); the ``requant`` engine test plants it."""
    if phase != "after":
        return
    for _, module in _fp8rl_linear_layers(worker, _requantizes):
        data = module.fp8rl_data.view(torch.uint8)
        data.view(-1)[0] ^= 1
        held = module.quant_method.scheme
        module.fp8rl_w = held.spec.dequantize_held(module.fp8rl_data, module.fp8rl_scale, held.grid)
        return


@torch.no_grad()
def worker_requant_byte_flipped_on_rank1(worker, phase: str) -> None:
    """:func:`worker_requant_byte_flipped` on tensor-parallel rank 1 only (rank 1's shard of the first
    ``requant`` linear layer; every other rank holds the right bytes); the ``requant`` engine test at tensor
    parallel 2 plants it."""
    if worker.fp8rl_tp_rank()["rank"] == 1:
        worker_requant_byte_flipped(worker, phase)


@torch.no_grad()
def worker_stale_copy_counted(worker, phase: str) -> None:
    """The engine keeps computing with the previous version's dequantized copy of every layer on the learner's
    grid while the held bytes are the new version's; post-load processing ran and is counted (unlike
    ``derived-copy-stale``, whose processing is skipped)."""
    layers = dict(_fp8rl_linear_layers(worker))
    if phase == "before":
        worker.__dict__["fp8rl_fault_saved"] = {p: m.fp8rl_w.clone() for p, m in layers.items()}
        return
    for prefix, w in worker.__dict__.pop("fp8rl_fault_saved", {}).items():
        layers[prefix].fp8rl_w = w


@torch.no_grad()
def worker_copy_on_other_grid(worker, phase: str) -> None:
    """One layer on the learner's grid (the first) silently computes on another grid: its copy is the held
    values requantized with OCP FLOOR scales, while the held bytes stay the learner's (RCEIL)."""
    if phase != "after":
        return
    for _, module in _fp8rl_linear_layers(worker):
        grid = parse_grid(module.quant_method.scheme.mx_grid)
        floor = parse_grid(f"mxfp8-{grid.elem}-floor")
        module.fp8rl_w = quantize(module.fp8rl_w, floor, axis=-1).dequantize(torch.float32)
        return


_W = "fp8rl_core.checks.faults:"
_LAST = "fp8rl_core.checks.worker_faults:"  # the faults on the last tensor-parallel rank

FAULTS: list[Fault] = [
    Fault("dropped-bucket", "W1", "transport", "dense",
          "one bucket of the sync is lost between writer and reader; its tensors keep the old weights",
          transport=_drop_bucket, bucket_mb=0.25),
    Fault("experts-never-synced", "W1", "export", "moe",
          "the exporter skips the routed experts (they stay at the previous version)", export=_drop_experts),
    Fault("lm-head-assumed-tied", "W1", "export", "dense",
          "the exporter assumes lm_head is tied to the embeddings and does not send it; the sampler keeps its own",
          export=_drop_lm_head),
    Fault("sampler-requantizes-floor", "W2", "post-load", "dense",
          "the sampler requantizes the received weights with OCP FLOOR scales instead of the learner's RCEIL",
          worker=_W + "worker_requantize_floor"),
    Fault("columnwise-scales", "W3", "export", "dense",
          "o_proj's scales are taken from the learner's columnwise copy, reshaped to the rowwise shape",
          export=_columnwise_scales),
    Fault("qkv-order-swapped", "W3", "export", "dense",
          "k and v are fused in the wrong order in layer 0's qkv_proj (data and scales)", export=_swap_kv),
    Fault("gate-up-order-swapped", "W3", "export", "dense",
          "gate and up are fused in the wrong order in layer 0's gate_up_proj", export=_swap_gate_up),
    Fault("expert-permutation", "W3", "export", "moe",
          "layer 0's experts are sent rotated by one (expert e holds expert e-1)", export=_permute_experts),
    Fault("router-quantized", "W4", "config", "moe",
          "the sampler quantizes the MoE router to FP8 (128x128 block) though the run keeps it BF16",
          engine_schemes=_router_fp8),
    Fault("gate-up-bf16-by-substring", "W4", "config", "dense",
          "a substring rule meant for the router ('gate') keeps every gate_up_proj in BF16",
          engine_schemes=_substring_gate),
    Fault("bf16-through-fp8", "W4", "export", "dense",
          "the BF16 embedding table is sent through an MXFP8 quantize-dequantize round trip",
          export=_fp8_round_trip),
    Fault("replica-left-behind", "W5", "engine", "dense",
          "one of two sampler replicas is not synced and stays on the previous version",
          stale_replica=1, replicas=2),
    Fault("pre-step-weights", "W5", "export", "dense",
          "the exporter sends the weights from before the optimizer step under the new version",
          captures_pre_step=True),
    Fault("prefix-cache-kept", "W6", "engine", "dense",
          "the prefix cache is not reset after the sync (cached KV of old weights can be reused)",
          resets_cache=False),
    Fault("post-load-twice", "W6", "post-load", "dense",
          "post-load processing runs twice on the layers on the learner's grid",
          worker=_W + "worker_process_twice"),
    Fault("derived-copy-stale", "W6", "post-load", "dense",
          "post-load processing is skipped: the layers keep computing with their previous dequantized copy",
          worker=_W + "worker_stale_derived"),
    Fault("expert-copy-negated", "W6", "post-load", "moe",
          "on the last tensor-parallel rank, one expert's fp32 compute copy is negated; its bytes and scales stay right",
          worker=_LAST + "worker_expert_copy_negated"),
    Fault("compute-copy-stale", "W6", "post-load", "dense",
          "the layers keep computing with the previous version's copy while the held bytes are new (processing counted)",
          worker=_W + "worker_stale_copy_counted"),
    Fault("copy-on-other-grid", "W6", "post-load", "dense",
          "one layer computes on another grid (FLOOR-requantized copy) while holding the learner's RCEIL bytes",
          worker=_W + "worker_copy_on_other_grid"),
    Fault("rotary-cache-nudged", "W6", "post-load", "dense",
          "on the last tensor-parallel rank, one element of the rotary cos/sin cache the layers share moves by one "
          "float32 step; no sync writes it, every synced tensor stays right",
          worker=_LAST + "worker_rotary_cache_nudged"),
    Fault("norm-eps-changed", "W6", "post-load", "dense",
          "on the last tensor-parallel rank, a sync changes layer 1's input norm eps (a module attribute) to 10×; no "
          "tensor changes", worker=_LAST + "worker_norm_eps_changed"),
    Fault("sync-wrote-elsewhere", "W2", "engine", "dense",
          "on the last tensor-parallel rank the sync's tensors land where the engine does not compute from: its "
          "parameters and compute copies stay the previous version's", worker=_LAST + "worker_sync_wrote_elsewhere"),
    Fault("norm-eps-unlike-learner", "W6", "config", "dense",
          "on the last tensor-parallel rank, the engine computes layer 1's input norm with 10× the eps the learner "
          "read from the same config.json, as it was since its start", worker=_LAST + "worker_norm_eps_unlike_learner"),
]


def fault(name: str) -> Fault:
    for f in FAULTS:
        if f.name == name:
            return f
    raise KeyError(f"unknown fault {name!r}; valid: {', '.join(f.name for f in FAULTS)}")
