"""Power of a paired KL comparison: which ratio n seeds × m probe sequences can resolve, from a pilot.

Rule: each paired probe sequence's influence on log(ratio) (the delta method), its variance split
between and within seeds by the one-way random-effects ANOVA (Searle, Casella & McCulloch 1992, §3.5),
se(log R) = sqrt(σ²_between/n + σ²_within/(n·m)), and the factor resolvable at a level and power — or
the seeds a target ratio needs. Specified in docs/results/power.md (The calculation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["PowerEstimate", "VarianceComponents", "log_ratio_influence", "log_ratio_se", "power_estimate",
           "resolvable_ratio", "seeds_needed", "variance_components"]


@dataclass(frozen=True)
class VarianceComponents:
    """σ²_between (across seeds) and σ²_within (across units of a seed) of a per-unit value, and the pilot's
    size: ``seeds`` groups, ``units`` in all."""

    between: float
    within: float
    seeds: int
    units: int


@dataclass(frozen=True)
class PowerEstimate:
    """One comparison's power from a pilot: its variance components (``components``), the design it is
    evaluated for (``seeds`` × ``sequences`` per seed), ``se`` of log R there, ``resolvable`` — the factor
    f ≥ 1 such that a ratio ≤ 1/f or ≥ f is resolved with probability ``power`` at ``level`` — and, for
    ``target`` (a ratio, e.g. the paper's), ``seeds_for_target``: the seeds needed at ``sequences``."""

    components: VarianceComponents
    seeds: int
    sequences: int
    se: float
    resolvable: float
    target: float | None
    seeds_for_target: int | None
    level: float
    power: float


def _unit_pairs(u: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(u, tuple):
        if len(u) != 2:
            raise ValueError(f"{name} must be values or a (num, den) pair, got a tuple of {len(u)}")
        n, d = (np.asarray(x, dtype=np.float64).reshape(-1) for x in u)
    else:
        n = np.asarray(u, dtype=np.float64).reshape(-1)
        d = np.ones_like(n)
    if n.shape != d.shape:
        raise ValueError(f"{name}: num and den differ in length ({n.size} vs {d.size})")
    return n, d


def log_ratio_influence(a_units: Any, b_units: Any) -> np.ndarray:
    """Per-unit influence z_u on log(ratio b/a) of paired units (docs/results/power.md): ``a_units`` and
    ``b_units`` are per-unit values or (num, den) pairs, in the same unit order."""
    an, ad = _unit_pairs(a_units, "a_units")
    bn, bd = _unit_pairs(b_units, "b_units")
    if an.size != bn.size:
        raise ValueError(f"paired units differ in number: a has {an.size}, b has {bn.size}")
    if an.size == 0:
        raise ValueError("no units")
    parts = []
    for x, name in ((bn, "b num"), (bd, "b den"), (an, "a num"), (ad, "a den")):
        mean = x.mean()
        if mean == 0:
            raise ValueError(f"the mean of {name} is 0: the ratio is undefined")
        parts.append(x / mean)
    return parts[0] - parts[1] - parts[2] + parts[3]


def variance_components(values: Any, groups: Any) -> VarianceComponents:
    """σ²_between and σ²_within of ``values`` grouped by ``groups`` (one label per value), by the one-way
    random-effects ANOVA (docs/results/power.md). Needs ≥ 2 groups and more values than groups."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    g = np.asarray(groups).reshape(-1)
    if v.size != g.size:
        raise ValueError(f"values and groups differ in length ({v.size} vs {g.size})")
    labels, inv = np.unique(g, return_inverse=True)
    k, n = labels.size, v.size
    if k < 2 or n <= k:
        raise ValueError(f"need at least 2 groups and more values than groups, got {k} groups of {n} values")
    counts = np.bincount(inv, minlength=k).astype(np.float64)
    means = np.bincount(inv, weights=v, minlength=k) / counts
    grand = v.mean()
    msb = float((counts * (means - grand) ** 2).sum() / (k - 1))
    msw = float(((v - means[inv]) ** 2).sum() / (n - k))
    m0 = (n - float((counts**2).sum()) / n) / (k - 1)
    return VarianceComponents(max(0.0, (msb - msw) / m0), msw, int(k), int(n))


def _quantiles(level: float, power: float) -> float:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    nd = NormalDist()
    return nd.inv_cdf((1 + level) / 2) + nd.inv_cdf(power)


def log_ratio_se(vc: VarianceComponents, seeds: int, sequences: int) -> float:
    """se(log R) for ``seeds`` × ``sequences`` per seed: sqrt(σ²_between/n + σ²_within/(n·m))."""
    if seeds < 1 or sequences < 1:
        raise ValueError(f"seeds and sequences must be ≥ 1, got {seeds} and {sequences}")
    return math.sqrt(vc.between / seeds + vc.within / (seeds * sequences))


def resolvable_ratio(vc: VarianceComponents, seeds: int, sequences: int, *, level: float = 0.95,
                     power: float = 0.8) -> float:
    """The factor f ≥ 1 such that a true ratio ≤ 1/f or ≥ f is resolved (its ``level`` CI excludes 1) with
    probability ``power``: exp((z_α + z_β)·se). ``power=0.5``: exp of the CI's half-width."""
    return math.exp(_quantiles(level, power) * log_ratio_se(vc, seeds, sequences))


def seeds_needed(vc: VarianceComponents, ratio: float, sequences: int, *, level: float = 0.95,
                 power: float = 0.8) -> int:
    """Seeds (each with ``sequences`` units) needed to resolve a true ratio ``ratio`` (≠ 1) with
    probability ``power`` at ``level``: ⌈(z_α + z_β)²·(σ²_between + σ²_within/m)/(log ratio)²⌉, at least 1."""
    if ratio <= 0 or ratio == 1:
        raise ValueError(f"ratio must be positive and ≠ 1, got {ratio}")
    if sequences < 1:
        raise ValueError(f"sequences must be ≥ 1, got {sequences}")
    z = _quantiles(level, power)
    need = z * z * (vc.between + vc.within / sequences) / math.log(ratio) ** 2
    return max(1, math.ceil(need - 1e-9))


def power_estimate(a_units: Any, b_units: Any, groups: Any, *, seeds: int | None = None,
                   sequences: int | None = None, target: float | None = None, level: float = 0.95,
                   power: float = 0.8) -> PowerEstimate:
    """The power of comparing b with a (paired units, ``groups`` = each unit's seed) for a design of
    ``seeds`` × ``sequences`` per seed (default: the pilot's own, its mean units per seed rounded), and the
    seeds needed for ``target`` (a ratio) at that many sequences."""
    z = log_ratio_influence(a_units, b_units)
    vc = variance_components(z, groups)
    n = vc.seeds if seeds is None else int(seeds)
    m = round(vc.units / vc.seeds) if sequences is None else int(sequences)
    need = None if target is None else seeds_needed(vc, target, m, level=level, power=power)
    return PowerEstimate(vc, n, m, log_ratio_se(vc, n, m), resolvable_ratio(vc, n, m, level=level, power=power),
                         target, need, level, power)
