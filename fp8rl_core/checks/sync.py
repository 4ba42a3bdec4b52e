"""All checks that exist, run against a live pipeline after a sync (see :mod:`.basic` for each)."""

from __future__ import annotations

import torch

from fp8rl_core.grids import bf16_view
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sampler.layout import fused_group, sampler_layer

from .basic import (
    CheckResult,
    check_coverage,
    check_derived_state,
    check_grid_bytes,
    check_precision,
    check_version,
    expected_sync_names,
)

__all__ = ["check_sync", "processed_counts", "sampler_bf16_views"]


def sampler_bf16_views(model: torch.nn.Module, schemes: dict[str, str]) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """What every off-grid engine tensor must equal — the BF16 view of the learner's master, fused in
    vLLM's order — and the names the engine cannot return as values (BF16 experts, prepacked)."""
    params = dict(model.named_parameters())
    layers = gemm_layers(model)
    views: dict[str, torch.Tensor] = {}
    skip: list[str] = []
    covered: set[str] = set()
    for prefix in dict.fromkeys(sampler_layer(n) for n in layers):
        members = [m for m in fused_group(prefix, layers) if (m if m in params else f"{m}.weight") in params]
        if not members:
            continue
        names = [m if m in params else f"{m}.weight" for m in members]
        covered.update(names)
        if schemes.get(prefix) == "mxfp8":
            continue
        if prefix.endswith(".experts"):
            views[f"{prefix}.w13_weight"], views[f"{prefix}.w2_weight"] = (bf16_view(params[n].detach()) for n in names)
            if prefix not in schemes:
                skip += [f"{prefix}.w13_weight", f"{prefix}.w2_weight"]
        else:
            views[f"{prefix}.weight"] = torch.cat([bf16_view(params[n].detach()) for n in names])
    for name, p in params.items():
        if name not in covered:
            views[name] = bf16_view(p.detach())
    return views, tuple(skip)


def processed_counts(sampler) -> dict[str, int]:
    return {p: v["processed"] for p, v in sampler.layers().items()}


def check_sync(pipe, processed_before: dict[str, int]) -> tuple[list[CheckResult], dict[str, int]]:
    """W1, W2, W4, W5, W6 on the live engine of ``pipe`` after one sync; returns the results and the
    engine's processing counts (the ``processed_before`` of the next sync)."""
    sampler, learner = pipe.sampler, pipe.learner
    versions = sampler.engine_version()
    layers = sampler.layers()
    after = {p: v["processed"] for p, v in layers.items()}
    readback = sampler.read_back()
    model = learner.model
    expected = expected_sync_names([n for n, _ in model.named_parameters()], gemm_layers(model), pipe.schemes)
    views, skip = sampler_bf16_views(model, pipe.schemes)
    results = [
        check_coverage(list(readback), expected, versions, learner.version),
        check_grid_bytes(readback, learner.forward_weights(), pipe.schemes, learner.layers),
        check_precision(readback, views, {p: v["scheme"] for p, v in layers.items()}, pipe.schemes, skip),
        check_version(versions, learner.version),
        check_derived_state(sampler.prefix_cache_blocks(), processed_before, after),
    ]
    return results, after
