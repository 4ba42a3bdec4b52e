"""fp8rl's bytes into SGLang's MXFP8 parameters: a custom weight loader for ``update_weights_from_tensor``.

Written against **sglang 0.5.12** (verl 0.9.1's pin, ``constraints-sglang.txt``) and checked against that
version's own model classes on CPU (tests/core/sampler/sglang/test_models.py, in .venv-sglang). The rule:
SGLang's ``Fp8LinearMethod`` / ``Fp8MoEMethod`` (``srt/layers/quantization/fp8.py``, ``quant_method``
"mxfp8") hold per rank ``weight`` (E4M3) and ``weight_scale_inv`` (compact row-major uint8 E8M0, one byte
per 1×32 block along K — fp8rl's rowwise ``weight_scale``), experts as ``w13_weight``/``w2_weight`` and their
``…_scale_inv``. The loader writes the compact bytes in place (``copy_``, identity kept), cuts full tensors
for the rank (:func:`fp8rl_core.sync.ranks.shard_tensor`), and runs each quantized layer's own
``process_weights_after_loading`` once both data and scales arrived (it derives the GEMM backend's layouts;
twice would shuffle or swizzle twice). SGLang calls ``dynamic_import(load_format)(model, named_tensors)``
for a ``load_format`` listed in ``server_args.custom_weight_loader``, then flushes the radix cache when the
request says so: :data:`UPDATE_REQUEST`. Names are vLLM's fused ones, scales ``…_scale_inv``
(:func:`sglang_name`). The long form, with source lines: docs/gpu.md, "Tensor-parallel ranks and SGLang".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import ShardError, shard_tensor

__all__ = ["LOADER", "UPDATE_REQUEST", "LoadReport", "SglangLoadError", "fp8rl_name", "load_into", "load_weights",
           "sglang_name"]

#: the fully qualified name SGLang imports: ``server_args.custom_weight_loader=[LOADER]`` and the request's
#: ``load_format``
LOADER = "fp8rl_core.sampler.sglang.loader.load_weights"
#: the fields of ``UpdateWeightsFromTensorReqInput`` a sync sets (besides its tensors): this loader, and
#: the radix-cache flush after the update (cached KV of the old weights must not be reused: W6)
UPDATE_REQUEST = {"load_format": LOADER, "flush_cache": True}
#: what SGLang derives into attributes of their own from the loaded parameters (never sent; rebuilt by the
#: layer's method): ``weight_scale_inv_swizzled``
DERIVED = ("_swizzled",)


class SglangLoadError(ValueError):
    """A sync tensor does not fit SGLang's model: unknown name, wrong shape or value class, missing."""


def sglang_name(name: str) -> str:
    """fp8rl sync name → SGLang parameter name (``…weight_scale`` → ``…weight_scale_inv``)."""
    return name + "_inv" if name.endswith("weight_scale") else name


def fp8rl_name(name: str) -> str:
    """SGLang parameter name → fp8rl sync name."""
    return name.removesuffix("_inv") if name.endswith("weight_scale_inv") else name


@dataclass(frozen=True)
class LoadReport:
    loaded: tuple[str, ...]  # SGLang parameter names written, in the order received
    processed: tuple[str, ...]  # modules whose quantization method re-derived its kernel layout


def _is_bytes(t: torch.Tensor) -> bool:
    return t.element_size() == 1


def _quantized(module: nn.Module) -> set[str]:
    """The module's own parameters a sync writes when it is quantized (data + scales)."""
    own = {n for n, _ in module.named_parameters(recurse=False)}
    if not any(n.endswith("weight_scale_inv") for n in own):
        return set()
    return {n for n in own if n.endswith(("weight", "weight_scale_inv")) and not any(d in n for d in DERIVED)}


def _prepare(name: str, t: torch.Tensor, param: torch.Tensor, layout: ModelLayout | None, rank: int, tp: int,
             expert_parallel: bool, grid: bool) -> torch.Tensor:
    src, sent = fp8rl_name(name), list(t.shape)
    if _is_bytes(param) != _is_bytes(t):
        raise SglangLoadError(
            f"{name}: SGLang holds {str(param.dtype).removeprefix('torch.')}, the sync sends "
            f"{str(t.dtype).removeprefix('torch.')} — on-grid bytes go into FP8/uint8 parameters, BF16 views into "
            f"floating ones (is the layer on the same grid on both sides?)")
    if tuple(t.shape) != tuple(param.shape) and layout is not None and tp > 1:
        try:
            t = shard_tensor(src, t, layout, rank, tp, on_grid=grid, expert_parallel=expert_parallel)
        except ShardError as e:
            raise SglangLoadError(f"{name}: cannot cut the full tensor for tp rank {rank}/{tp}: {e}") from e
    if tuple(t.shape) != tuple(param.shape):
        cut = f", cut for tp rank {rank}/{tp} to {list(t.shape)}" if list(t.shape) != sent else ""
        raise SglangLoadError(f"{name}: SGLang's parameter is {list(param.shape)}, the sync sends {sent}{cut}")
    return t


@torch.no_grad()
def load_into(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
              layout: ModelLayout | None = None, rank: int = 0, tp: int = 1, expert_parallel: bool = False,
              complete: bool = False) -> LoadReport:
    """Copy fp8rl's sync tensors into ``model``'s SGLang parameters in place (``copy_``: every Parameter
    keeps its identity, storage and ``weight_loader``), then let each quantized layer whose data and
    scales have all been written re-derive its kernel layout (``quant_method.process_weights_after_loading``).

    Every tensor is validated before any is copied: an unknown or duplicated name, a wrong value class
    (bytes vs floating) or a shape that is neither the rank's shard nor cuttable into it raises
    :class:`SglangLoadError` and leaves the model untouched. ``complete``: this call carries the whole sync,
    so every quantized parameter (and every other parameter the sync names) must be in it."""
    params = dict(model.named_parameters())
    named = list(named_tensors)
    on_grid = {fp8rl_name(n).removesuffix("_scale") for n, _ in named if fp8rl_name(n).endswith("weight_scale")}
    staged: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    seen: set[str] = set()
    for name, t in named:
        target = sglang_name(name)
        if target in seen:
            raise SglangLoadError(f"{name}: sent twice in one update")
        seen.add(target)
        param = params.get(target)
        if param is None:
            close = sorted(p for p in params if p.rsplit(".", 1)[0] == target.rsplit(".", 1)[0])
            raise SglangLoadError(f"{name}: SGLang's model has no parameter {target!r}"
                                  + (f"; that layer has {close}" if close else ""))
        staged.append((target, param, _prepare(target, t, param, layout, rank, tp, expert_parallel,
                                               fp8rl_name(name).removesuffix("_scale") in on_grid)))
    if complete:
        wanted = {n for n in params if not any(d in n for d in DERIVED)}
        missing = sorted(wanted - seen)
        if missing:
            raise SglangLoadError(f"the sync lacks {len(missing)} of SGLang's parameters, e.g. {missing[:4]}")
    for _, param, t in staged:
        if _is_bytes(param):
            param.data.view(torch.uint8).copy_(t.contiguous().view(torch.uint8))
        else:
            param.data.copy_(t)
    processed = []
    modules = dict(model.named_modules())
    for target in dict.fromkeys(n.rpartition(".")[0] for n, _, _ in staged):
        module = modules[target]
        need = _quantized(module)
        if not need:
            continue
        written = module.__dict__.setdefault("_fp8rl_written", set())
        written.update(n.rpartition(".")[2] for n, _, _ in staged if n.rpartition(".")[0] == target)
        method = getattr(module, "quant_method", None)
        if need <= written and method is not None:
            method.process_weights_after_loading(module)
            written.clear()
            processed.append(target)
    return LoadReport(tuple(n for n, _, _ in staged), tuple(processed))


def _sglang_rank() -> tuple[int, int]:
    """This process's TP rank and size in SGLang (imported only inside an SGLang worker)."""
    from sglang.srt.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def load_weights(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """SGLang's custom-loader signature (``custom_loader(model, named_tensors)``, see the module
    docstring): :func:`load_into` with this worker's TP rank and the model's own config."""
    rank, tp = _sglang_rank()
    cfg = getattr(model, "config", None)
    layout = ModelLayout.from_hf_config(cfg) if cfg is not None and tp > 1 else None
    load_into(model, named_tensors, layout=layout, rank=rank, tp=tp)
