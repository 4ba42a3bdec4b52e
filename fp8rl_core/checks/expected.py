"""What the engine must hold after a sync, derived from the *learner* (never from the exporter's output):
sync names, on-grid bytes, BF16 views, the bytes a layer that requantizes must compute (:mod:`.requant`),
their fingerprints and shapes, and the fp32 masters by fused group for the layout check. Expectations
follow the *configured* per-layer schemes of the run (what the user asked for), so an engine or exporter
that deviates from the configuration is caught."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import fused_group, sampler_layer

from .basic import expected_grid_tensors, expected_sync_names
from .requant import RequantDifference, requant_expected

__all__ = ["Expected", "expected_from_learner"]


@dataclass
class Expected:
    version: int
    names: set[str]
    grid: dict[str, torch.Tensor]  # on-grid engine tensor → uint8 bytes
    views: dict[str, torch.Tensor]  # off-grid engine tensor → BF16 view
    skip: tuple[str, ...]  # engine tensors not readable as values (prepacked BF16 experts)
    groups: dict[str, list[str]]  # vLLM layer → learner members, engine order
    masters: dict[str, torch.Tensor]  # learner member → fp32 master
    grid_fp: dict[str, str] = field(default_factory=dict)
    view_fp: dict[str, str] = field(default_factory=dict)
    #: ``requant`` layers: the bytes the engine's own quantization must produce (derived read-back names)
    requant: dict[str, torch.Tensor] = field(default_factory=dict)
    requant_fp: dict[str, str] = field(default_factory=dict)
    requant_diff: RequantDifference = field(default_factory=RequantDifference)

    @property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        out = {n: (tuple(t.shape), True) for n, t in (self.grid | self.requant).items()}
        out |= {n: (tuple(t.shape), False) for n, t in self.views.items()}
        return out

    @property
    def all_fp(self) -> dict[str, str]:
        return {n: f for n, f in (self.grid_fp | self.view_fp | self.requant_fp).items() if n not in self.skip}


def expected_from_learner(learner, configured: dict[str, str]) -> Expected:
    """The expectation for ``learner`` at its current version under the ``configured`` schemes."""
    from .sync import sampler_bf16_views

    model = learner.model
    params = dict(model.named_parameters())
    layers = gemm_layers(model)
    names = expected_sync_names(list(params), layers, configured)
    forward = learner.forward_weights()
    grid = expected_grid_tensors(forward, configured, learner.layers)
    views, skip = sampler_bf16_views(model, configured)
    groups: dict[str, list[str]] = {}
    masters: dict[str, torch.Tensor] = {}
    for layer in layers:
        pname = layer if layer in params else f"{layer}.weight"
        if pname not in params:
            continue
        masters[layer] = params[pname].detach().float()
        prefix = sampler_layer(layer)
        if prefix not in groups:
            groups[prefix] = [m for m in fused_group(prefix, layers)
                              if (m if m in params else f"{m}.weight") in params]
    requant, diff = requant_expected(model, forward, configured, learner.layers)
    return Expected(learner.version, names, grid, views, skip, groups, masters,
                    fingerprints(grid), fingerprints(views), requant, fingerprints(requant), diff)
