"""What a sweep's design can resolve: for each KL claim's exact probe comparison, the power of the
sweep's seeds × probe sequences and the seeds the paper's ratio would need
(:func:`fp8rl_core.metrics.power.power_estimate`); :func:`claim_power` the same on any KL measure's units,
one seed included (what an unresolved verdict's needed sample comes from). Specified in docs/metrics.md ("Claims and
verdicts", "Power").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fp8rl_core.metrics.power import (PowerEstimate, VarianceComponents, log_ratio_influence, log_ratio_se,
                                      power_estimate, resolvable_ratio, sample_needed)

from .claims import CLAIMS, KL_KINDS, PROBE_MEASURE, Claim
from .compare import match_presets
from .data import SweepData, Units, probe_units, sweep_models

__all__ = ["PowerRow", "claim_power", "power_rows"]


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


def claim_power(units: Mapping[tuple, Units], claim: Claim, model: str | None, *, level: float = 0.95,
                power: float = 0.8, seeds: int | None = None, sequences: int | None = None,
                step: int | None = None) -> PowerRow | None:
    """One KL claim's :class:`PowerRow` on ``model`` from paired ``units`` of any KL measure (grouped by
    (model, preset); ``step``: that RL step's units only); None when the two presets' units are missing or
    unpaired. With one seed σ²_between is
    unknown: the row's components are (0, the sequences' variance) and its ``estimate.needed`` says how many
    sequences one seed would need at least (:func:`~fp8rl_core.metrics.power.sample_needed`)."""
    m = match_presets(units, model, claim.baseline, claim.candidate, step=step)
    if m is None or not m.paired or m.n_units < 2:
        return None
    target = claim.paper_ratio if claim.paper_ratio is not None else (
        claim.paper_range[0] if claim.paper_range else None)
    if m.n_seeds >= 2:
        est = power_estimate(m.a, m.b, m.a_seeds, seeds=seeds, sequences=sequences, target=target, level=level,
                             power=power)
    else:
        z = log_ratio_influence(m.a, m.b)
        vc = VarianceComponents(0.0, float(np.var(z, ddof=1)), 1, int(z.size))
        n, k = 1 if seeds is None else int(seeds), int(z.size) if sequences is None else int(sequences)
        needed = None if target is None else sample_needed(vc, target, k, level=level, power=power)
        est = PowerEstimate(vc, n, k, log_ratio_se(vc, n, k), resolvable_ratio(vc, n, k, level=level, power=power),
                            target, None, level, power, needed)
    return PowerRow(claim.id, f"{claim.candidate} vs {claim.baseline} ({claim.id})", model, est.seeds,
                    est.sequences, est.components.between, est.components.within, est.se, est.resolvable, target,
                    est.seeds_for_target, est)


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
            row = claim_power(units, claim, model, level=level, power=power, seeds=seeds, sequences=sequences)
            if row is not None:
                rows.append(row)
    return rows
