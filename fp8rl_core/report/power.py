"""What a sweep's design can resolve: for each KL claim's exact probe comparison, the power of the
sweep's seeds × probe sequences and the seeds the paper's ratio would need
(:func:`fp8rl_core.metrics.power.power_estimate`). Specified in docs/metrics.md ("Claims and
verdicts", "Power").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fp8rl_core.metrics.power import PowerEstimate, power_estimate

from .claims import CLAIMS, KL_KINDS, PROBE_MEASURE, Claim
from .compare import match_presets
from .data import SweepData, probe_units, sweep_models

__all__ = ["PowerRow", "power_rows"]


@dataclass(frozen=True)
class PowerRow:
    """The power of one KL claim's exact probe comparison on one model (:func:`power_rows`).

    ``claim``: "candidate vs baseline (id)"; ``seeds`` × ``sequences`` per seed: the design;
    ``between`` / ``within``: the variance components of the paired log-ratio between and within
    seeds; ``se``: se of log(ratio) for the design; ``resolvable``: the factor f such that ratios ≤ 1/f
    or ≥ f are resolved with the requested power; ``target``: the paper's ratio (the low end of a
    range); ``seeds_for_target``: the seeds it needs at ``sequences`` (None without a target);
    ``estimate``: the whole :class:`~fp8rl_core.metrics.power.PowerEstimate`."""

    id: str
    claim: str
    model: str
    seeds: int
    sequences: int
    between: float
    within: float
    se: float
    resolvable: float
    target: float | None
    seeds_for_target: int | None
    estimate: PowerEstimate


def power_rows(data: SweepData, *, level: float = 0.95, power: float = 0.8, seeds: int | None = None,
               sequences: int | None = None, claims: Sequence[Claim] = CLAIMS) -> list[PowerRow]:
    """One :class:`PowerRow` per (KL claim, model) with paired exact probe units on ≥ 2 seeds, for
    ``seeds`` × ``sequences`` per seed (default: the sweep's own design). No probe table → ``[]``."""
    if data.probe.empty:
        return []
    units = probe_units(data, PROBE_MEASURE, ("model", "preset"))
    rows = []
    for claim in claims:
        if claim.kind not in KL_KINDS:
            continue
        for model in sweep_models(data, claim.models):
            m = match_presets(units, model, claim.baseline, claim.candidate)
            if m is None or not m.paired or m.n_seeds < 2:
                continue
            target = claim.paper_ratio if claim.paper_ratio is not None else (
                claim.paper_range[0] if claim.paper_range else None)
            est = power_estimate(m.a, m.b, m.a_seeds, seeds=seeds, sequences=sequences, target=target, level=level,
                                 power=power)
            rows.append(PowerRow(claim.id, f"{claim.candidate} vs {claim.baseline} ({claim.id})", model, est.seeds,
                                 est.sequences, est.components.between, est.components.within, est.se,
                                 est.resolvable, target, est.seeds_for_target, est))
    return rows
