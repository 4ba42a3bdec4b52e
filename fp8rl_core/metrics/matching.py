"""Statistics of the fixed-weights matching experiment: one configuration's KL relative to another's, per
checkpoint and across checkpoints, with what a heavy tail does to it and what the design can resolve.

Rule: units are probe sequences, paired across variants by (checkpoint, source, sequence); a ratio is
Σ KL_b / Σ positions_b over Σ KL_a / Σ positions_a (:func:`fp8rl_core.metrics.stats.compare_ratio`, paired
percentile bootstrap; across checkpoints two-stage: checkpoints, then sequences within). Its robust companion
is the median over sequences of the paired per-position log ratio (exponentiated), bootstrapped alike; the
tail is the share of the mean KL its top 1% of sequences carry. Power: σ²_within per checkpoint and
σ²_between checkpoints of the log-ratio influence (:mod:`.power`). One seed left out: the seed whose checkpoints
move the pooled ratio most. docs/metrics.md (Fixed weights).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .power import (SampleNeeded, VarianceComponents, log_ratio_influence, resolvable_ratio, sample_needed,
                    variance_components)
from .stats import ci_side, compare_ratio

__all__ = ["MatchingRatio", "MatchingPower", "SeedInfluence", "TailShare", "matching_power", "matching_ratio",
           "most_influential_seed", "paired", "tail_share"]

#: the units' key: which sequence of which checkpoint's probe set
KEY = ("checkpoint", "source", "sequence")


def paired(rows: Sequence[Mapping], a: str, b: str, *, checkpoint: str | None = None, source: str | None = None
           ) -> tuple[list[tuple], np.ndarray, np.ndarray]:
    """The units variants ``a`` and ``b`` share (rows of :class:`fp8rl_core.matching.MatchingMeasurement`),
    optionally one checkpoint's or one source's: (keys, a's [n, 2] (kl, positions), b's [n, 2]) in key order.
    Raises naming what is missing when either variant has no rows or the two share no unit."""
    def table(v: str) -> dict[tuple, tuple[float, float]]:
        return {tuple(r[k] for k in KEY): (float(r["kl"]), float(r["positions"])) for r in rows
                if r["variant"] == v and (checkpoint is None or r["checkpoint"] == checkpoint)
                and (source is None or r["source"] == source)}

    ta, tb = table(a), table(b)
    where = "".join(f" {k} {v!r}" for k, v in (("at checkpoint", checkpoint), ("on source", source)) if v)
    for v, t in ((a, ta), (b, tb)):
        if not t:
            raise ValueError(f"variant {v!r} has no measured sequences{where}")
    keys = sorted(set(ta) & set(tb))
    if not keys:
        raise ValueError(f"variants {a!r} and {b!r} share no probe sequence{where}")
    return keys, np.array([ta[k] for k in keys]), np.array([tb[k] for k in keys])


@dataclass(frozen=True)
class TailShare:
    """How much of a variant's mean KL its heaviest sequences carry: ``top1pct`` (the top 1% of sequences,
    at least one), ``top5`` (the five heaviest), over ``units`` sequences."""

    top1pct: float
    top5: float
    units: int


def tail_share(kl: Sequence[float]) -> TailShare:
    """:class:`TailShare` of per-sequence KL sums ``kl`` (all shares 0 when every KL is exactly 0: the two
    sides agree on every sequence)."""
    x = np.sort(np.asarray(kl, dtype=np.float64))[::-1]
    total = float(x.sum())
    if x.size == 0:
        raise ValueError("tail share of no sequences")
    if total <= 0:
        return TailShare(0.0, 0.0, int(x.size))
    k = max(1, math.ceil(0.01 * x.size))
    return TailShare(float(x[:k].sum()) / total, float(x[:5].sum()) / total, int(x.size))


@dataclass(frozen=True)
class MatchingRatio:
    """b's KL relative to a's: the ratio of means (``ratio`` with its interval), the robust companion
    ``median_ratio`` (median paired per-position log ratio, exponentiated, with its interval), each side's
    :class:`TailShare`, the means themselves (nats per position), ``units`` sequences over ``checkpoints``."""

    a: str
    b: str
    ratio: float
    lo: float
    hi: float
    median_ratio: float
    median_lo: float
    median_hi: float
    a_mean: float
    b_mean: float
    a_tail: TailShare
    b_tail: TailShare
    units: int
    checkpoints: int
    level: float

    @property
    def direction(self) -> str:
        """``lower`` / ``higher`` when the interval excludes 1, else ``unresolved`` (:func:`.stats.ci_side`)."""
        return ci_side(self.lo, self.hi)


def _median_log_ratio(ua: np.ndarray, ub: np.ndarray) -> np.ndarray:
    floor = 1e-300  # a sequence whose KL is exactly 0 on one side (identical distributions) stays finite
    return np.log(np.maximum(ub[:, 0], floor) / ub[:, 1]) - np.log(np.maximum(ua[:, 0], floor) / ua[:, 1])


def matching_ratio(rows: Sequence[Mapping], a: str, b: str, *, checkpoint: str | None = None,
                   source: str | None = None, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> MatchingRatio:
    """b relative to baseline a on their shared units (one checkpoint's, or all: then the bootstrap draws
    checkpoints, then sequences within each)."""
    keys, ua, ub = paired(rows, a, b, checkpoint=checkpoint, source=source)
    groups = [k[0] for k in keys]
    cps = len(set(groups))
    g = groups if cps > 1 else None
    cmp = compare_ratio((ua[:, 0], ua[:, 1]), (ub[:, 0], ub[:, 1]), paired=True, groups=g, n_boot=n_boot,
                        level=level, seed=seed)
    d = _median_log_ratio(ua, ub)
    rng = np.random.default_rng(seed + 1)
    if g is None:
        idx = rng.integers(0, d.size, size=(n_boot, d.size))
        reps = np.median(d[idx], axis=1)
    else:
        by = {c: np.flatnonzero(np.asarray(groups) == c) for c in dict.fromkeys(groups)}
        members = list(by.values())
        reps = np.empty(n_boot)
        for i in range(n_boot):
            pick = rng.integers(0, len(members), size=len(members))
            reps[i] = np.median(np.concatenate([d[rng.choice(members[j], size=members[j].size)] for j in pick]))
    q = (1 - level) / 2
    lo, hi = np.quantile(reps, [q, 1 - q])
    return MatchingRatio(a, b, cmp.ratio, cmp.lo, cmp.hi, float(math.exp(np.median(d))), float(math.exp(lo)),
                         float(math.exp(hi)), float(ua[:, 0].sum() / ua[:, 1].sum()),
                         float(ub[:, 0].sum() / ub[:, 1].sum()), tail_share(ua[:, 0]), tail_share(ub[:, 0]),
                         len(keys), cps, float(level))


@dataclass(frozen=True)
class SeedInfluence:
    """The seed whose checkpoints move the pooled ratio of means most when left out (point estimates): ``seed``,
    ``share`` (its checkpoints' part of baseline a's summed KL: their weight in the ratio of means),
    ``ratio`` (the pooled ratio with every seed) and ``ratio_without`` (without this one), over ``seeds`` seeds."""

    seed: int
    share: float
    ratio: float
    ratio_without: float
    seeds: int


def most_influential_seed(rows: Sequence[Mapping], a: str, b: str, *, min_seeds: int = 3) -> SeedInfluence | None:
    """Which seed's checkpoints carry the pooled ratio of b to a (:class:`SeedInfluence`): each seed left out
    in turn, the one whose absence moves log(ratio) most. ``None`` with fewer than ``min_seeds`` seeds (leaving
    one of two out leaves a single seed, not a pool). A ratio of means weighs each checkpoint by its KL, so one
    checkpoint with KL far above the others' can decide a pooled verdict the rest do not support."""
    seed_of = {r["checkpoint"]: int(r["seed"]) for r in rows}
    keys, ua, ub = paired(rows, a, b)
    seeds = np.array([seed_of[k[0]] for k in keys])
    order = list(dict.fromkeys(seeds.tolist()))
    if len(order) < min_seeds:
        return None
    ta, tb = ua.sum(axis=0), ub.sum(axis=0)  # (KL, positions)

    def ratio(sa: np.ndarray, sb: np.ndarray) -> float:
        return float((sb[0] / sb[1]) / (sa[0] / sa[1]))

    full = ratio(ta, tb)
    best: tuple[float, int, float, float] | None = None
    for s in order:
        m = seeds == s
        without = ratio(ta - ua[m].sum(axis=0), tb - ub[m].sum(axis=0))
        move = abs(math.log(without / full))
        if best is None or move > best[0]:
            best = (move, s, float(ua[m, 0].sum() / ta[0]), without)
    assert best is not None
    return SeedInfluence(best[1], best[2], full, best[3], len(order))


@dataclass(frozen=True)
class MatchingPower:
    """What a fixed-weights design resolves on one comparison, from its own units: ``components`` — σ²_within
    (sequence to sequence) and σ²_between (checkpoint to checkpoint: how far the checkpoints' own ratios
    differ beyond sequence noise) of the log-ratio influence over all units; ``within_by_checkpoint`` — each
    checkpoint's σ²_within (its influence centred on its own ratio); for ``sequences`` per checkpoint,
    ``resolvable`` (the factor f: a ratio ≤ 1/f or ≥ f resolved at one checkpoint with probability ``power``)
    and ``sequences_for_target`` (per checkpoint, to resolve ``target``); across the ``checkpoints``,
    ``pooled_resolvable`` and ``checkpoints_for_target`` (at ``sequences`` each); ``needed``: the whole
    :class:`~fp8rl_core.metrics.power.SampleNeeded` for ``target``, checkpoints as the groups."""

    components: VarianceComponents
    within_by_checkpoint: dict[str, float]
    checkpoints: int
    sequences: int
    resolvable: float
    sequences_for_target: int
    pooled_resolvable: float
    checkpoints_for_target: int | None
    target: float
    level: float
    power: float
    needed: SampleNeeded


def matching_power(rows: Sequence[Mapping], a: str, b: str, *, target: float, level: float = 0.95,
                   power: float = 0.8) -> MatchingPower:
    """The power of comparing b with a at fixed weights (:class:`MatchingPower`). At one checkpoint only
    sequence noise remains (its weights are fixed): se(log R) = sqrt(σ²_within / m); across K checkpoints
    se = sqrt(σ²_between / K + σ²_within / (K·m)) (:func:`fp8rl_core.metrics.power.log_ratio_se`)."""
    if not (0 < target and target != 1):
        raise ValueError(f"target must be a positive ratio ≠ 1, got {target}")
    keys, ua, ub = paired(rows, a, b)
    groups = [k[0] for k in keys]
    order = list(dict.fromkeys(groups))
    garr = np.asarray(groups)
    within = {}
    for c in order:
        m = garr == c
        if m.sum() < 2:
            raise ValueError(f"checkpoint {c!r} has {int(m.sum())} shared sequence(s); power needs at least 2")
        within[c] = float(np.var(log_ratio_influence((ua[m, 0], ua[m, 1]), (ub[m, 0], ub[m, 1])), ddof=1))
    z = log_ratio_influence((ua[:, 0], ua[:, 1]), (ub[:, 0], ub[:, 1]))
    vc = variance_components(z, groups) if len(order) > 1 else VarianceComponents(0.0, within[order[0]], 1, len(keys))
    k, m = len(order), round(len(keys) / len(order))
    one = VarianceComponents(0.0, vc.within, 1, m)  # one checkpoint: its weights fixed, sequence noise alone
    needed = sample_needed(vc, target, m, level=level, power=power)
    return MatchingPower(vc, within, k, m, resolvable_ratio(one, 1, m, level=level, power=power), needed.units,
                         resolvable_ratio(vc, k, m, level=level, power=power), needed.groups, float(target),
                         float(level), float(power), needed)
