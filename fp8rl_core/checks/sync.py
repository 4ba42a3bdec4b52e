"""The learner's BF16 views in the engine's names (the W4 expectation)."""

from __future__ import annotations

import torch

from fp8rl_core.grids import bf16_view
from fp8rl_core.grids.schemes import layer_scheme
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sync.layout import fused_group, sampler_layer


__all__ = ["sampler_bf16_views"]


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
        if layer_scheme(schemes, prefix).on_learner_grid:  # its bytes are W2's, not a view
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
