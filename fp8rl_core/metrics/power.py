"""Power of a paired KL comparison: which ratio n seeds × m probe sequences can resolve, from a pilot.

Rule: each paired probe sequence's influence on log(ratio) (the delta method), its variance split
between and within seeds by the one-way random-effects ANOVA (Searle, Casella & McCulloch 1992, §3.5),
se(log R) = sqrt(σ²_between/n + σ²_within/(n·m)), and the factor resolvable at a level and power — or
the sample a target ratio needs (:func:`sample_needed`: groups — seeds or checkpoints — at m units each,
with the range that σ²_between's own uncertainty allows). Specified in docs/results/power.md (The
calculation; Checkpoints for a pooled claim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["PowerEstimate", "SampleNeeded", "VarianceComponents", "between_interval", "log_ratio_influence",
           "log_ratio_se", "power_estimate", "resolvable_ratio", "sample_needed", "seeds_needed", "variance_components"]


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
    ``target`` (a ratio, e.g. the paper's), ``seeds_for_target``: the seeds needed at ``sequences``, and
    ``needed``: the whole :class:`SampleNeeded` (None without a target)."""

    components: VarianceComponents
    seeds: int
    sequences: int
    se: float
    resolvable: float
    target: float | None
    seeds_for_target: int | None
    level: float
    power: float
    needed: SampleNeeded | None = None


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
    needed = None if target is None else sample_needed(vc, target, m, level=level, power=power)
    return PowerEstimate(vc, n, m, log_ratio_se(vc, n, m), resolvable_ratio(vc, n, m, level=level, power=power),
                         target, None if needed is None else needed.groups, level, power, needed)


def _chi2_quantile(p: float, df: int) -> float:
    """The p-quantile of χ² with ``df`` degrees of freedom by the Wilson–Hilferty cube-root approximation
    (Johnson, Kotz & Balakrishnan, *Continuous Univariate Distributions* 1, 1994, §18.5; within ~1% from
    df = 3 at the quantiles used here)."""
    c = 2.0 / (9.0 * df)
    return df * max(0.0, 1.0 - c + NormalDist().inv_cdf(p) * math.sqrt(c)) ** 3


def between_interval(vc: VarianceComponents, level: float = 0.9) -> tuple[float, float]:
    """An approximate ``level`` interval for σ²_between from the pilot's k groups: E[MSB] = m0·σ²_between +
    σ²_within and (k − 1)·MSB / E[MSB] ~ χ²(k − 1) (Searle, Casella & McCulloch 1992, §3.5d), with σ²_within
    taken as known (it rests on N − k ≫ k − 1 units) and MSB rebuilt as m0·σ²_between + σ²_within (m0 = the
    mean group size; exact for equal groups unless σ²_between was clipped at 0). Needs ≥ 4 groups (the
    χ² approximation's range; with fewer the interval is unbounded for any practical purpose)."""
    if vc.seeds < 4:
        raise ValueError(f"an interval for σ²_between needs at least 4 groups, got {vc.seeds}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    df, m0 = vc.seeds - 1, vc.units / vc.seeds
    msb = m0 * vc.between + vc.within
    q = (1 - level) / 2
    hi_e, lo_e = df * msb / _chi2_quantile(q, df), df * msb / _chi2_quantile(1 - q, df)
    return max(0.0, (lo_e - vc.within) / m0), max(0.0, (hi_e - vc.within) / m0)


@dataclass(frozen=True)
class SampleNeeded:
    """What resolving a true ratio ``target`` needs — its ``level`` CI excluding 1 with probability
    ``power`` — by the variance components of the data at hand (:func:`sample_needed`).

    ``groups``: groups (seeds, or checkpoints at fixed weights) at ``per_group`` units each (None when the
    data had one group, so σ²_between is unknown); ``groups_range``: the same at the ends of σ²_between's
    ``spread_level`` interval (:func:`between_interval`; None with fewer than 4 groups); ``floor``: the groups needed
    however many units each (⌈z²·σ²_between / log²r⌉, 1 when σ²_between is 0: then units alone help);
    ``units``: the units needed in all when σ²_between is 0 (⌈z²·σ²_within / log²r⌉) — with one group a
    lower bound; ``have``: the groups the data had; ``enough``: whether ``groups`` ≤ ``have`` (this design
    already had the power)."""

    target: float
    groups: int | None
    groups_range: tuple[int, int] | None
    per_group: int
    floor: int | None
    units: int
    have: int
    level: float
    power: float
    spread_level: float

    @property
    def enough(self) -> bool:
        return self.groups is not None and self.groups <= self.have


def sample_needed(vc: VarianceComponents, target: float, per_group: int, *, level: float = 0.95, power: float = 0.8,
                  spread_level: float = 0.9) -> SampleNeeded:
    """The sample that resolves ``target`` (a ratio ≠ 1) with probability ``power`` at ``level`` at
    ``per_group`` units per group: n = ⌈(z_α + z_β)²·(σ²_between + σ²_within/m)/(log r)²⌉ groups
    (:func:`seeds_needed`), its range over σ²_between's ``spread_level`` interval, the floor m → ∞ and
    the units alone when σ²_between = 0 (docs/results/power.md). ``vc`` from one group (``vc.seeds == 1``,
    σ²_between unknown): only ``units``, a lower bound."""
    if target <= 0 or target == 1:
        raise ValueError(f"target must be a positive ratio ≠ 1, got {target}")
    if per_group < 1:
        raise ValueError(f"per_group must be ≥ 1, got {per_group}")
    z2 = _quantiles(level, power) ** 2
    lr2 = math.log(target) ** 2
    units = max(1, math.ceil(z2 * vc.within / lr2 - 1e-9))
    if vc.seeds < 2:
        return SampleNeeded(float(target), None, None, int(per_group), None, units, vc.seeds, float(level),
                            float(power), float(spread_level))
    groups = seeds_needed(vc, target, per_group, level=level, power=power)
    at = lambda b: seeds_needed(VarianceComponents(b, vc.within, vc.seeds, vc.units), target, per_group,  # noqa: E731
                                level=level, power=power)
    spread = None if vc.seeds < 4 else tuple(at(b) for b in between_interval(vc, spread_level))
    floor = max(1, math.ceil(z2 * vc.between / lr2 - 1e-9))
    return SampleNeeded(float(target), groups, spread, int(per_group), floor, units, vc.seeds,
                        float(level), float(power), float(spread_level))
