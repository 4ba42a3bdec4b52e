"""Confidence intervals for mismatch metrics: a cluster bootstrap over sequences (optionally over seeds,
then sequences), and a bootstrap ratio for comparing two configurations.

Rule: a sequence, not a token, is the unit of resampling; every metric is a ratio of sums over units
(Cochran 1977, §6.2) with a seeded percentile bootstrap (Efron & Tibshirani 1993, ch. 13), two-stage
across seeds (Davison & Hinkley 1997, §3.8); two configurations compare as a ratio b/a, paired when they
share units. The method in full on :func:`cluster_bootstrap` and :func:`compare_ratio`; what it is used
for: docs/metrics.md (Intervals and comparisons).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

#: where an interval lies relative to "no change": entirely below it, entirely above it, or across it
CiSide = Literal["lower", "higher", "unresolved"]


def ci_side(lo: float, hi: float, null: float = 1.0) -> CiSide:
    """Where the interval [lo, hi] lies relative to ``null`` (1 for a ratio, 0 for a difference):
    ``"lower"`` when hi < null, ``"higher"`` when lo > null, else ``"unresolved"`` (it includes no change).
    The one rule every verdict and every per-checkpoint direction is read from (docs/metrics.md, "Claims and
    verdicts")."""
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}]: lo exceeds hi")
    return "lower" if hi < null else "higher" if lo > null else "unresolved"

__all__ = [
    "CiSide",
    "Interval",
    "Comparison",
    "ci_side",
    "cluster_bootstrap",
    "compare_factors",
    "compare_ratio",
    "describe_change",
    "sum_by_key",
    "paired_units",
]

_MAX_CELLS = 2_000_000  # replicates × units per chunk of multinomial counts (≈16 MB of int64)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval."""

    estimate: float
    lo: float
    hi: float
    level: float
    se: float
    n_boot: int
    n_units: int
    n_groups: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Comparison:
    """``ratio = b / a`` with its bootstrap percentile interval and both point estimates."""

    ratio: float
    lo: float
    hi: float
    level: float
    a: float
    b: float
    paired: bool
    n_boot: int

    def describe(self, digits: int = 0) -> str:
        return describe_change(self.ratio, self.lo, self.hi, level=self.level, digits=digits)

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in asdict(self).items()}


# ---------------------------------------------------------------------------------------------- inputs

def _vector(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per unit), got shape {tuple(a.shape)}")
    if a.size == 0:
        raise ValueError(f"{name} is empty: no units to resample")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} has {int((~np.isfinite(a)).sum())} non-finite values")
    return a


def _units(num: Any, den: Any, num_name: str, den_name: str) -> tuple[np.ndarray, np.ndarray]:
    n = _vector(num, num_name)
    if den is None:
        d = np.ones_like(n)
    else:
        d = _vector(den, den_name)
        if d.shape != n.shape:
            raise ValueError(f"{num_name} and {den_name} differ in length: {n.size} vs {d.size}")
        if (d <= 0).any():
            raise ValueError(f"{den_name} must be > 0 (e.g. token counts of non-empty sequences); "
                             f"{int((d <= 0).sum())} are not")
    return n, d


def _split_units(u: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A unit spec: a 1-D array of per-unit values (denominator 1) or a tuple (num, den) of two arrays."""
    if isinstance(u, tuple) and len(u) == 2 and np.ndim(u[0]) == 1 and np.ndim(u[1]) == 1:
        return _units(u[0], u[1], f"{name} numerator", f"{name} denominator")
    return _units(u, None, name, "")


def _group_index(groups: Any, n: int, name: str) -> list[np.ndarray] | None:
    if groups is None:
        return None
    g = np.asarray(groups)
    if g.ndim != 1 or g.size != n:
        raise ValueError(f"{name} must give one group label per unit ({n}), got shape {tuple(g.shape)}")
    _, inv = np.unique(g, return_inverse=True)
    members = [np.flatnonzero(inv == k) for k in range(int(inv.max()) + 1)]
    return members if len(members) > 1 else None  # one group is the flat bootstrap


def _check_settings(n_boot: int, level: float) -> None:
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be ≥ 1, got {n_boot}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def _count_chunks(rng: np.random.Generator, n: int, members: list[np.ndarray] | None,
                  n_boot: int, within: bool = True) -> Iterator[np.ndarray]:
    """Multinomial resampling counts [chunk, n] (float64), n_boot rows in all; see :func:`cluster_bootstrap`."""
    per = max(1, _MAX_CELLS // n)
    done = 0
    while done < n_boot:
        b = min(per, n_boot - done)
        if members is None:
            w = rng.multinomial(n, np.full(n, 1.0 / n), size=b)
        else:
            n_groups = len(members)
            copies = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=b)  # [b, G]
            w = np.zeros((b, n), dtype=np.int64)
            for k, idx in enumerate(members):
                ng = idx.size
                if within:
                    w[:, idx] = rng.multinomial(copies[:, k] * ng, np.full(ng, 1.0 / ng))
                else:  # whole groups: every unit of a group counts once per drawn copy
                    w[:, idx] = copies[:, k][:, None]
        done += b
        yield w.astype(np.float64)


def _interval(reps: np.ndarray, level: float) -> tuple[float, float, float]:
    lo, hi = np.quantile(reps, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    se = float(reps.std(ddof=1)) if reps.size > 1 else 0.0
    return float(lo), float(hi), se


# ------------------------------------------------------------------------------------------ bootstrap

def cluster_bootstrap(num: Any, den: Any = None, *, groups: Any = None, resample_within_groups: bool = True,
                      n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> Interval:
    """Ratio-of-sums estimate ``Σnum/Σden`` over units (sequences) and its percentile bootstrap interval.

    ``num``, ``den``: one value per unit (``den`` > 0; ``None`` → 1, a plain mean over units), e.g. from
    :func:`fp8rl_core.metrics.mismatch.metric_units`. ``groups``: optional label per unit (e.g. the
    seed) for the two-stage bootstrap, groups then units within them (``resample_within_groups=False``:
    groups only, each drawn group keeping all its units). ``n_boot`` replicates,
    ``level`` coverage, ``seed`` for the generator.

    Why sequences, not tokens. Tokens of one completion share a prompt, a prefix and a sampling path, so their
    mismatch values are correlated; resampling tokens as if independent understates the uncertainty. The unit of
    resampling is therefore a sequence (a *cluster* of tokens). Every metric is written as a ratio of sums over
    units::

        estimate = Σ_u num_u / Σ_u den_u

    — a token mean is (per-sequence token sum, token count) (the combined ratio estimator, Cochran,
    *Sampling Techniques*, 3rd ed. 1977, §6.2); a sequence mean is (per-sequence value, 1).
    :func:`fp8rl_core.metrics.mismatch.metric_units` builds these pairs from a per-sequence table.

    Bootstrap (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13 percentile interval). Each
    of ``n_boot`` replicates draws the n units with replacement (as multinomial counts ``w_u``, which is the
    same thing) and computes ``Σ w_u num_u / Σ w_u den_u``; the interval is the ``(1 − level)/2`` and ``(1 +
    level)/2`` quantiles of the replicates (linear interpolation), the point estimate is the full-sample ratio,
    and ``se`` is the replicates' standard deviation. A ``numpy`` generator seeded with ``seed`` drives every
    draw, so a call is deterministic.

    Two-stage, with ``groups``. Across seeds (or runs), sequences of one seed share the model and the data
    order, so a seed is a higher-level cluster. With ``groups`` (one label per unit, e.g. the seed), a replicate
    first draws the G groups with replacement, then, for each drawn copy of a group, draws that group's n_g
    units with replacement (Davison & Hinkley, *Bootstrap Methods and their Application*, 1997, §3.8, the
    strategy that resamples at both stages; Field & Welsh, JRSS-B 69, 2007). The within-group draws of all c
    copies of a group together are one multinomial of c·n_g draws over its units, which is how it is computed.
    Resampling at both stages counts the within-group noise twice, so it overstates the variance (conservative):
    by up to a factor 2 when the groups do not really differ, negligibly when the between-group spread
    dominates. ``resample_within_groups=False`` resamples whole groups only, which is closer to unbiased when
    there are many groups but with few groups (2–5 seeds) gives very coarse intervals, since only a handful of
    distinct group draws exist — report either with the number of groups. A single group gives exactly the flat
    bootstrap (same draws, same seed).
    """
    _check_settings(n_boot, level)
    n_arr, d_arr = _units(num, den, "num", "den")
    members = _group_index(groups, n_arr.size, "groups")
    rng = np.random.default_rng(seed)
    chunks = _count_chunks(rng, n_arr.size, members, n_boot, resample_within_groups)
    reps = np.concatenate([(w @ n_arr) / (w @ d_arr) for w in chunks])
    point = float(n_arr.sum() / d_arr.sum())
    lo, hi, se = _interval(reps, level)
    return Interval(point, lo, hi, float(level), se, int(n_boot), int(n_arr.size),
                    1 if members is None else len(members))


def _ratio_replicates(a_units: Any, b_units: Any, *, paired: bool, groups: Any, b_groups: Any,
                      resample_within_groups: bool, n_boot: int, rng: np.random.Generator
                      ) -> tuple[float, float, np.ndarray]:
    """(estimate_a, estimate_b, the n_boot replicate ratios b/a) for :func:`compare_ratio`."""
    a_num, a_den = _split_units(a_units, "a_units")
    b_num, b_den = _split_units(b_units, "b_units")
    a_point = float(a_num.sum() / a_den.sum())
    b_point = float(b_num.sum() / b_den.sum())
    if a_point == 0.0:
        raise ValueError("the baseline a_units estimate is 0: a ratio b/a is undefined")
    if paired:
        if a_num.size != b_num.size:
            raise ValueError(f"paired comparison needs the same units on both sides: a_units has {a_num.size}, "
                             f"b_units {b_num.size}")
        if b_groups is not None:
            raise ValueError("paired comparison uses one `groups` for both sides; leave b_groups unset")
        members = _group_index(groups, a_num.size, "groups")
        with np.errstate(divide="ignore", invalid="ignore"):
            parts = [((w @ b_num) / (w @ b_den)) / ((w @ a_num) / (w @ a_den))
                     for w in _count_chunks(rng, a_num.size, members, n_boot, resample_within_groups)]
    else:
        ma = _group_index(groups, a_num.size, "groups")
        mb = _group_index(b_groups, b_num.size, "b_groups")
        within = resample_within_groups
        ra = np.concatenate([(w @ a_num) / (w @ a_den) for w in _count_chunks(rng, a_num.size, ma, n_boot, within)])
        rb = np.concatenate([(w @ b_num) / (w @ b_den) for w in _count_chunks(rng, b_num.size, mb, n_boot, within)])
        with np.errstate(divide="ignore", invalid="ignore"):
            parts = [rb / ra]
    reps = np.concatenate(parts)
    bad = ~np.isfinite(reps)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} of {reps.size} bootstrap replicates have a baseline estimate of 0 "
                         "(a ratio is undefined); the baseline metric is 0 on too many units")
    return a_point, b_point, reps


def compare_ratio(a_units: Any, b_units: Any, *, paired: bool, groups: Any = None, b_groups: Any = None,
                  resample_within_groups: bool = True, n_boot: int = 2000, level: float = 0.95,
                  seed: int = 0) -> Comparison:
    """``estimate_b / estimate_a`` with a percentile bootstrap interval (b relative to baseline a).

    ``a_units``, ``b_units``: per-unit values (1-D) or ``(num, den)`` tuples, estimates Σnum/Σden.
    ``paired=True``: the two sides are the same units in the same order (use :func:`paired_units` to
    align by prompt id); each replicate draws one set of counts and applies it to both sides; ``groups``
    (per-unit labels, e.g. seeds) then applies to both. ``paired=False``: independent replicates, with
    ``groups`` for a and ``b_groups`` for b; ``resample_within_groups`` as in :func:`cluster_bootstrap`.
    Raises if the baseline estimate is 0 (no ratio).

    ``ratio = estimate_b / estimate_a``: b relative to a (a is the baseline, e.g. the BF16 sampler; b the
    candidate, e.g. the sampler on the learner's grid), so 0.84 reads "b is 16% lower". Paired (both sides
    measured on the same units in the same order, e.g. the same prompt ids — a sweep shares its data):
    each replicate applies the *same* unit counts to both sides, so unit-to-unit variation common to both
    cancels in the ratio. Unpaired: independent replicates for each side. The ratio interval is the
    percentile interval of the replicate ratios. :func:`describe_change` turns it into words.
    """
    _check_settings(n_boot, level)
    a_point, b_point, reps = _ratio_replicates(
        a_units, b_units, paired=paired, groups=groups, b_groups=b_groups,
        resample_within_groups=resample_within_groups, n_boot=n_boot, rng=np.random.default_rng(seed))
    lo, hi, _ = _interval(reps, level)
    return Comparison(b_point / a_point, lo, hi, float(level), a_point, b_point, bool(paired), int(n_boot))


def compare_factors(first: tuple[Any, Any, Any], second: tuple[Any, Any, Any], *, n_boot: int = 2000,
                    level: float = 0.95, seed: int = 0) -> Comparison:
    """How a paired factor changes between two independent experiments: ``F₂ / F₁`` with its interval.

    Each of ``first`` and ``second`` is ``(a_units, b_units, groups)`` of one experiment, paired as in
    :func:`compare_ratio` (e.g. one model's probe KL under a baseline sampler a and a candidate b, units
    = probe sequences, groups = seeds); its factor is ``F = estimate_b / estimate_a``. The experiments
    share no units (different models, different runs), so each replicate draws both factors
    independently — each with its own paired two-stage bootstrap — and divides them; the interval is the
    percentile interval of those ``n_boot`` quotients (the same bootstrap as :func:`compare_ratio`,
    Efron & Tibshirani 1993 ch. 13, applied to a statistic of two independent samples). A ratio of 1
    means the factor does not depend on what differs between the experiments; in the returned
    :class:`Comparison` ``a`` = F₁, ``b`` = F₂, ``paired`` = False (between the experiments)."""
    _check_settings(n_boot, level)
    rng = np.random.default_rng(seed)
    factors, reps = [], []
    for name, (a_units, b_units, groups) in (("first", first), ("second", second)):
        try:
            a_point, b_point, r = _ratio_replicates(a_units, b_units, paired=True, groups=groups, b_groups=None,
                                                    resample_within_groups=True, n_boot=n_boot, rng=rng)
        except ValueError as e:
            raise ValueError(f"{name} experiment: {e}") from e
        factors.append(b_point / a_point)
        reps.append(r)
    lo, hi, _ = _interval(reps[1] / reps[0], level)
    return Comparison(factors[1] / factors[0], lo, hi, float(level), factors[0], factors[1], False, int(n_boot))


# ------------------------------------------------------------------------------------------- wording

def _pct(x: float, digits: int) -> str:
    return f"{abs(x) * 100:.{digits}f}%"


def _is_zero(r: float, digits: int) -> bool:
    return float(f"{abs(r - 1.0) * 100:.{digits}f}") == 0.0


def _side(r: float, digits: int) -> str:
    """'9% lower' / '2% higher' / '0%' for a ratio r (rounded to ``digits`` decimals)."""
    if _is_zero(r, digits):
        return _pct(0.0, digits)
    return f"{_pct(r - 1.0, digits)} {'lower' if r < 1.0 else 'higher'}"


def describe_change(ratio: float, lo: float, hi: float, *, level: float = 0.95, digits: int = 0) -> str:
    """Words for a ratio b/a and its interval: ``describe_change(0.84, 0.78, 0.91)`` →
    ``"16% lower (95% CI 9%–22% lower)"``; an interval across 1 reads ``"(95% CI 3% lower – 2% higher)"``;
    ratios of 2 or more read as multiples, ``"2.03× as high (95% CI 1.81×–2.30×)"``. ``digits``: decimals
    of the percentages."""
    for name, v in (("ratio", ratio), ("lo", lo), ("hi", hi)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite non-negative ratio, got {v}")
    if not lo <= ratio <= hi:
        raise ValueError(f"the interval [{lo}, {hi}] does not contain the ratio {ratio}")
    ci = f"{level * 100:g}% CI"
    if ratio >= 2.0:
        return f"{ratio:.2f}× as high ({ci} {lo:.2f}×–{hi:.2f}×)"
    head = "unchanged" if _is_zero(ratio, digits) else _side(ratio, digits)
    if hi < 1.0:  # both below: the smaller reduction first
        body = f"{_pct(1.0 - hi, digits)}–{_pct(1.0 - lo, digits)} lower"
    elif lo > 1.0:
        body = f"{_pct(lo - 1.0, digits)}–{_pct(hi - 1.0, digits)} higher"
    else:
        body = f"{_side(lo, digits)} – {_side(hi, digits)}"
    return f"{head} ({ci} {body})"


# ------------------------------------------------------------------------------------------ alignment

def sum_by_key(keys: Any, num: Any, den: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collapse units sharing a key into one (sums of num and den): e.g. sequences → prompts, so that
    two configurations can be paired by prompt id. ``keys``: [n] or [n, K] integers. Returns
    (unique keys in sorted order, num sums, den sums)."""
    n_arr, d_arr = _units(num, den, "num", "den")
    k = np.asarray(keys)
    if k.ndim not in (1, 2) or k.shape[0] != n_arr.size:
        raise ValueError(f"keys must have shape [{n_arr.size}] or [{n_arr.size}, K], got {tuple(k.shape)}")
    uniq, inv = np.unique(k, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    return (uniq, np.bincount(inv, weights=n_arr, minlength=uniq.shape[0]),
            np.bincount(inv, weights=d_arr, minlength=uniq.shape[0]))


def paired_units(a_keys: Any, a_units: Any, b_keys: Any, b_units: Any
                 ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Align two configurations' units by key for :func:`compare_ratio` (``paired=True``).

    Units sharing a key on one side are summed (:func:`sum_by_key`). The key sets must be equal — a
    paired comparison over different prompts would be wrong silently — otherwise ``ValueError`` names
    how many keys each side lacks. Returns ((a_num, a_den), (b_num, b_den), keys)."""
    an, ad = _split_units(a_units, "a_units")
    bn, bd = _split_units(b_units, "b_units")
    ka, an, ad = sum_by_key(a_keys, an, ad)
    kb, bn, bd = sum_by_key(b_keys, bn, bd)
    if ka.shape != kb.shape or not np.array_equal(ka, kb):
        sa = {tuple(np.atleast_1d(x).tolist()) for x in ka}
        sb = {tuple(np.atleast_1d(x).tolist()) for x in kb}
        raise ValueError(f"paired units need the same keys on both sides: {len(sa - sb)} keys only in a_keys "
                         f"(e.g. {sorted(sa - sb)[:3]}), {len(sb - sa)} only in b_keys (e.g. {sorted(sb - sa)[:3]})")
    return (an, ad), (bn, bd), ka
