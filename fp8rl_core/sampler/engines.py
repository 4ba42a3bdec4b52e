"""The sampler engines by name, and the one call that starts one: :func:`start_sampler`.

Rule: the loop and the engine pool start engines only through :func:`start_sampler`, which starts the one its
config names (``SamplerConfig.engine``, ``sampler.engine`` of a run); an engine is one implementation of the seam
(:class:`fp8rl_core.sampler.seam.Sampler`) registered in :data:`ENGINES` under its name, its module imported when
it is first started. An unknown name fails naming the known ones.
Described in docs/design.md (Engines).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from fp8rl_core.sampler.config import MX_GRID, SAMPLER_ENGINES, SamplerConfig
from fp8rl_core.sampler.seam import Sampler, SamplerError

__all__ = ["DEFAULT_ENGINE", "ENGINES", "engine_class", "start_sampler"]


def _vllm() -> type[Sampler]:
    from fp8rl_core.sampler.vllm.engine import VllmSampler

    return VllmSampler


def _sglang() -> type[Sampler]:
    from fp8rl_core.sampler.sglang.engine import SglangSampler

    return SglangSampler


#: engine name → the class implementing the seam (imported on first use)
ENGINES: dict[str, Callable[[], type[Sampler]]] = {"vllm": _vllm, "sglang": _sglang}
DEFAULT_ENGINE = SAMPLER_ENGINES[0]


def engine_class(engine: str) -> type[Sampler]:
    """The seam implementation registered as ``engine``."""
    if engine not in ENGINES:
        raise SamplerError(f"unknown sampler engine {engine!r}; known engines: {', '.join(sorted(ENGINES))}")
    return ENGINES[engine]()


def start_sampler(checkpoint: str | Path, schemes: Mapping[str, str], initial: Mapping[str, torch.Tensor],
                  cfg: SamplerConfig = SamplerConfig(), *, version: int = 0, mx_grid: str = MX_GRID,
                  work_root: str | Path | None = None, **engine_args) -> Sampler:
    """A live ``cfg.engine`` for the warm-start ``checkpoint``'s model with per-layer ``schemes``, loaded with
    ``initial`` (sync names) as weight ``version``. ``engine_args``: what only that engine takes (vLLM:
    ``seed``, ``tensor_parallel``; SGLang: those, ``python`` and ``timeout_s``)."""
    return engine_class(cfg.engine)(checkpoint, schemes, initial, cfg, version=version, mx_grid=mx_grid,
                                    work_root=work_root, **engine_args)
