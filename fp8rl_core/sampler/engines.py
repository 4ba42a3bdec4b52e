"""The one call that starts a sampler engine: :func:`start_sampler`.

Rule: the loop and the engine pool start engines only through :func:`start_sampler`, which starts the one its
config names (``SamplerConfig.engine``, ``sampler.engine`` of a run); an engine is one implementation of the seam
(:class:`fp8rl_core.sampler.seam.Sampler`) whose class path is its row's ``sampler`` in the engine table
(:data:`fp8rl_core.sampler.capabilities.CAPABILITIES`), its module imported when it is first started. An unknown
name fails naming the known ones. Described in docs/design.md (Engines).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from fp8rl_core.sampler.capabilities import CAPABILITIES, DEFAULT_ENGINE
from fp8rl_core.sampler.config import MX_GRID, SamplerConfig
from fp8rl_core.sampler.seam import Sampler, SamplerError

__all__ = ["DEFAULT_ENGINE", "engine_class", "start_sampler"]


def engine_class(engine: str) -> type[Sampler]:
    """The seam implementation of ``engine``'s row (its class path, imported now)."""
    if engine not in CAPABILITIES:
        raise SamplerError(f"unknown sampler engine {engine!r}; known engines: {', '.join(sorted(CAPABILITIES))}")
    return CAPABILITIES[engine].sampler_class()


def start_sampler(checkpoint: str | Path, schemes: Mapping[str, str], initial: Mapping[str, torch.Tensor],
                  cfg: SamplerConfig = SamplerConfig(), *, version: int = 0, mx_grid: str = MX_GRID,
                  work_root: str | Path | None = None, **engine_args) -> Sampler:
    """A live ``cfg.engine`` for the warm-start ``checkpoint``'s model with per-layer ``schemes``, loaded with
    ``initial`` (sync names) as weight ``version``. ``engine_args``: what only that engine takes (vLLM:
    ``seed``, ``tensor_parallel``; SGLang: those, ``python`` and ``timeout_s``)."""
    return engine_class(cfg.engine)(checkpoint, schemes, initial, cfg, version=version, mx_grid=mx_grid,
                                    work_root=work_root, **engine_args)
