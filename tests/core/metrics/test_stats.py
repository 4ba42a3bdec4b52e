"""Bootstrap intervals: hand-computed point estimates and resampling distributions, coverage on data
with a known mean (and why sequences, not tokens, are the unit), pairing, the two-stage option,
determinism, the wording of a change, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8rl_core.metrics.mismatch import metric_units, sequence_table
from fp8rl_core.metrics.stats import (
    compare_factors,
    Comparison,
    Interval,
    cluster_bootstrap,
    compare_ratio,
    describe_change,
    paired_units,
    sum_by_key,
)


@pytest.mark.parametrize("num,den,expected", [
    ([1.0, 2.0, 3.0], [1.0, 1.0, 2.0], 1.5),      # (1 + 2 + 3) / (1 + 1 + 2)
    ([1.0, 2.0, 3.0], None, 2.0),                  # plain mean over units
    ([0.3, 0.0, 0.9, 0.2], [3, 1, 4, 2], 0.14),    # 1.4 / 10: a token mean from per-sequence sums
])
def test_point_estimate_is_the_ratio_of_sums(num, den, expected):
    got = cluster_bootstrap(num, den, n_boot=50)
    assert got.estimate == pytest.approx(expected, rel=1e-12)
    assert got.n_units == len(num) and got.n_boot == 50 and got.n_groups == 1
    assert got.lo <= got.estimate <= got.hi


def test_resampling_distribution_of_two_units_by_hand():
    # units 0 and 1: a replicate's mean is 0, ½ or 1 with probabilities ¼, ½, ¼ → the 2.5% and 97.5%
    # quantiles are 0 and 1, and the bootstrap variance is (plug-in variance ¼) / 2 = ⅛
    got = cluster_bootstrap([0.0, 1.0], n_boot=4000, seed=5)
    assert (got.lo, got.hi) == (0.0, 1.0)
    assert got.se == pytest.approx(math.sqrt(1 / 8), abs=0.01)


def test_groups_only_resampling_by_hand():
    # groups A = units {0, 0} and B = {1, 1}: drawing (A, A), (A, B), (B, B) gives 0, ½, 1
    got = cluster_bootstrap([0.0, 0.0, 1.0, 1.0], groups=["A", "A", "B", "B"], resample_within_groups=False,
                            n_boot=2000, seed=1)
    assert got.n_groups == 2 and (got.lo, got.hi) == (0.0, 1.0)
    assert got.se == pytest.approx(math.sqrt(1 / 8), abs=0.015)


def test_interval_covers_a_known_mean():
    x = np.random.default_rng(11).exponential(2.0, size=400)  # true mean 2
    got = cluster_bootstrap(x, seed=0)
    assert got.lo < 2.0 < got.hi
    assert got.hi - got.lo == pytest.approx(2 * 1.96 * 2.0 / math.sqrt(400), rel=0.25)  # ≈ normal theory


def test_coverage_over_many_datasets_is_near_nominal():
    rng = np.random.default_rng(2024)
    cover = []
    for k in range(200):
        iv = cluster_bootstrap(rng.normal(1.0, 1.0, 50), n_boot=400, seed=k)
        cover.append(iv.lo < 1.0 < iv.hi)
    assert 0.88 <= np.mean(cover) <= 0.99


def test_sequences_not_tokens_are_the_unit():
    # token value = per-sequence effect u ~ N(1, 1) + small noise; 40 sequences × 20 tokens; true mean 1.
    # Resampling sequences covers the true token mean; resampling tokens (as if independent) does not.
    rng = np.random.default_rng(7)
    seq_cover, tok_cover = [], []
    for k in range(100):
        u = rng.normal(1.0, 1.0, 40)
        tokens = np.repeat(u, 20) + rng.normal(0.0, 0.1, 800)
        seq_sum = tokens.reshape(40, 20).sum(1)
        by_seq = cluster_bootstrap(seq_sum, np.full(40, 20.0), n_boot=300, seed=k)
        by_tok = cluster_bootstrap(tokens, n_boot=300, seed=k)
        assert by_seq.estimate == pytest.approx(by_tok.estimate, rel=1e-12)
        seq_cover.append(by_seq.lo < 1.0 < by_seq.hi)
        tok_cover.append(by_tok.lo < 1.0 < by_tok.hi)
    assert np.mean(seq_cover) >= 0.85
    assert np.mean(tok_cover) <= 0.75


def test_bootstrap_of_a_mismatch_table():
    rng = np.random.default_rng(0)
    s = np.log(rng.uniform(0.1, 1.0, 300))
    lrn = np.minimum(s + rng.normal(0, 0.1, 300), 0.0)
    seq = np.repeat(np.arange(30), 10)
    tab = sequence_table(s, lrn, seq)
    iv = cluster_bootstrap(*metric_units(tab, "k3"), n_boot=500)
    lr = lrn - s
    assert iv.estimate == pytest.approx(np.mean(np.expm1(lr) - lr), rel=1e-12)
    assert 0 < iv.lo < iv.estimate < iv.hi


def test_deterministic_with_a_seed():
    x = np.random.default_rng(3).normal(size=100)
    assert cluster_bootstrap(x, seed=42) == cluster_bootstrap(x, seed=42)
    assert cluster_bootstrap(x, seed=42).lo != cluster_bootstrap(x, seed=43).lo
    a, b = x + 5.0, 1.1 * x + 5.0
    assert compare_ratio(a, b, paired=False, seed=9) == compare_ratio(a, b, paired=False, seed=9)


def test_one_group_is_the_flat_bootstrap_exactly():
    x = np.random.default_rng(4).normal(size=64)
    assert cluster_bootstrap(x, groups=np.zeros(64, int), seed=3) == cluster_bootstrap(x, seed=3)


def test_two_stage_interval_carries_the_between_seed_spread():
    rng = np.random.default_rng(8)
    seeds = np.repeat(np.arange(5), 100)
    x = 1.0 + rng.normal(0.0, 0.5, 5)[seeds] + rng.normal(0.0, 0.05, 500)  # seeds differ, sequences agree
    flat = cluster_bootstrap(x, seed=0)
    two = cluster_bootstrap(x, groups=seeds, seed=0)
    whole = cluster_bootstrap(x, groups=seeds, resample_within_groups=False, seed=0)
    assert two.n_groups == 5 and two.estimate == flat.estimate
    assert two.hi - two.lo > 5 * (flat.hi - flat.lo)
    assert whole.hi - whole.lo > 5 * (flat.hi - flat.lo)


# ------------------------------------------------------------------------------------------- compare

@pytest.mark.parametrize("a,b,ratio", [
    (([1.0, 2.0], [1.0, 1.0]), ([0.9, 1.5], [1.0, 1.0]), 0.8),   # (2.4/2) / (3/2)
    ([2.0, 4.0], [3.0, 3.0], 1.0),
    (([1.0, 3.0], [2.0, 2.0]), ([2.0, 2.0], [1.0, 3.0]), 1.0),   # 4/4 vs 4/4
    ([1.0, 1.0, 4.0], [3.0, 3.0, 6.0], 2.0),                     # 4 / 2
])
@pytest.mark.parametrize("paired", [True, False])
def test_compare_ratio_point_estimate_is_b_over_a(a, b, ratio, paired):
    got = compare_ratio(a, b, paired=paired, n_boot=200)
    assert isinstance(got, Comparison)
    assert got.ratio == pytest.approx(ratio, rel=1e-12)
    assert got.ratio == pytest.approx(got.b / got.a, rel=1e-12)
    assert got.paired is paired and got.lo <= got.hi


def test_identical_inputs_give_ratio_one():
    x = np.random.default_rng(1).lognormal(size=80)
    p = compare_ratio(x, x.copy(), paired=True)
    assert (p.ratio, p.lo, p.hi) == (1.0, 1.0, 1.0)  # the same draws on both sides cancel exactly
    u = compare_ratio(x, x.copy(), paired=False)
    assert u.ratio == 1.0 and u.lo < 1.0 < u.hi
    g = compare_ratio(x, x.copy(), paired=True, groups=np.arange(80) % 4)
    assert (g.ratio, g.lo, g.hi) == (1.0, 1.0, 1.0)


def test_pairing_narrows_the_interval_on_correlated_data():
    rng = np.random.default_rng(12)
    base = rng.lognormal(0.0, 1.0, 300)           # prompts differ a lot
    a = base * rng.lognormal(0.0, 0.05, 300)
    b = 0.84 * base * rng.lognormal(0.0, 0.05, 300)  # b is 16% lower on the same prompts
    paired = compare_ratio(a, b, paired=True)
    unpaired = compare_ratio(a, b, paired=False)
    assert paired.ratio == unpaired.ratio
    assert paired.lo < 0.84 < paired.hi
    assert (paired.hi - paired.lo) < 0.25 * (unpaired.hi - unpaired.lo)
    assert paired.describe().endswith("lower)")


def test_compare_ratio_refuses_bad_input():
    with pytest.raises(ValueError, match="baseline a_units estimate is 0"):
        compare_ratio([0.0, 0.0], [1.0, 2.0], paired=False)
    with pytest.raises(ValueError, match="replicates have a baseline estimate of 0"):
        compare_ratio([0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], paired=True, n_boot=200)
    with pytest.raises(ValueError, match="same units on both sides"):
        compare_ratio([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)
    with pytest.raises(ValueError, match="leave b_groups unset"):
        compare_ratio([1.0, 2.0], [1.0, 2.0], paired=True, b_groups=[0, 1])
    with pytest.raises(ValueError, match="a_units is empty"):
        compare_ratio([], [1.0], paired=False)
    with pytest.raises(ValueError, match="b_units denominator must be > 0"):
        compare_ratio([1.0], ([1.0], [0.0]), paired=False)
    with pytest.raises(ValueError, match="b_groups must give one group label per unit"):
        compare_ratio([1.0, 2.0], [1.0, 2.0], paired=False, b_groups=[0])


@pytest.mark.parametrize("kwargs,message", [
    (dict(num=[]), "num is empty"),
    (dict(num=[1.0, 2.0], den=[1.0]), "num and den differ in length"),
    (dict(num=[1.0, 2.0], den=[1.0, 0.0]), "den must be > 0"),
    (dict(num=[1.0, math.inf]), "num has 1 non-finite"),
    (dict(num=[[1.0, 2.0]]), "num must be 1-D"),
    (dict(num=[1.0, 2.0], level=1.5), "level must be in"),
    (dict(num=[1.0, 2.0], n_boot=0), "n_boot must be"),
    (dict(num=[1.0, 2.0], groups=[0, 1, 2]), "groups must give one group label per unit"),
])
def test_cluster_bootstrap_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cluster_bootstrap(**kwargs)


# ------------------------------------------------------------------------------------------- wording

@pytest.mark.parametrize("args,kwargs,text", [
    ((0.84, 0.78, 0.91), {}, "16% lower (95% CI 9%–22% lower)"),
    ((1.10, 1.05, 1.20), {}, "10% higher (95% CI 5%–20% higher)"),
    ((0.97, 0.95, 1.02), {}, "3% lower (95% CI 5% lower – 2% higher)"),
    ((0.84, 0.78, 0.91), dict(level=0.9, digits=1), "16.0% lower (90% CI 9.0%–22.0% lower)"),
    ((2.03, 1.81, 2.30), {}, "2.03× as high (95% CI 1.81×–2.30×)"),
    ((1.0, 1.0, 1.0), {}, "unchanged (95% CI 0% – 0%)"),
    ((0.998, 0.97, 1.01), {}, "unchanged (95% CI 3% lower – 1% higher)"),
])
def test_describe_change(args, kwargs, text):
    assert describe_change(*args, **kwargs) == text


@pytest.mark.parametrize("args,message", [
    ((0.84, 0.9, 0.95), "does not contain"),
    ((math.nan, 0.8, 0.9), "ratio must be a finite"),
    ((0.8, -0.1, 0.9), "lo must be a finite"),
])
def test_describe_change_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        describe_change(*args)


def test_records_flatten_to_dicts():
    iv = Interval(1.0, 0.5, 1.5, 0.95, 0.2, 10, 3, 1)
    assert iv.as_dict("kl/")["kl/hi"] == 1.5
    c = Comparison(0.84, 0.78, 0.91, 0.95, 1.0, 0.84, True, 10)
    assert c.describe() == "16% lower (95% CI 9%–22% lower)" and c.as_dict()["paired"] == 1.0


# ----------------------------------------------------------------------------------------- alignment

def test_sum_by_key_collapses_units():
    keys, num, den = sum_by_key([3, 1, 3], [1.0, 2.0, 3.0], [1.0, 1.0, 2.0])
    assert keys.tolist() == [1, 3] and num.tolist() == [2.0, 4.0] and den.tolist() == [1.0, 3.0]
    keys2, num2, _ = sum_by_key(np.array([[0, 1], [0, 1], [1, 1]]), [1.0, 2.0, 3.0])
    assert keys2.tolist() == [[0, 1], [1, 1]] and num2.tolist() == [3.0, 3.0]


def test_paired_units_align_by_key_and_refuse_different_prompts():
    a, b, keys = paired_units([2, 1, 2], ([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]), [1, 2], [0.5, 1.5])
    assert keys.tolist() == [1, 2]
    assert a[0].tolist() == [2.0, 4.0] and a[1].tolist() == [1.0, 2.0]
    assert b[0].tolist() == [0.5, 1.5] and b[1].tolist() == [1.0, 1.0]
    assert compare_ratio(a, b, paired=True, n_boot=50).ratio == pytest.approx((2.0 / 2) / (6.0 / 3))
    with pytest.raises(ValueError, match="1 keys only in a_keys .* 1 only in b_keys"):
        paired_units([1, 2], [1.0, 1.0], [1, 3], [1.0, 1.0])


# --------------------------------------------------------------------------------- compare_factors

def _experiment(rng, factor, n_seeds=4, n_seq=64, noise=0.3):
    """One paired experiment: per (seed, sequence) a baseline value and a candidate = factor × baseline ×
    lognormal noise; returns (a_units, b_units, groups)."""
    a = rng.lognormal(0.0, 1.0, n_seeds * n_seq)
    b = factor * a * rng.lognormal(-noise**2 / 2, noise, a.size)
    return a, b, np.repeat(np.arange(n_seeds), n_seq)


def test_compare_factors_point_estimate_is_the_quotient_of_the_two_factors():
    a1, b1 = np.array([1.0, 3.0]), np.array([4.0, 12.0])   # factor 4
    a2, b2 = np.array([2.0, 2.0, 4.0]), np.array([2.0, 4.0, 10.0])  # factor 16/8 = 2
    cmp = compare_factors((a1, b1, None), (a2, b2, None), n_boot=200)
    assert cmp.a == pytest.approx(4.0) and cmp.b == pytest.approx(2.0) and cmp.ratio == pytest.approx(0.5)
    assert cmp.lo <= 0.5 <= cmp.hi and not cmp.paired
    # the first factor is exact on every replicate (b1 = 4·a1), so the interval is the second factor's / 4
    f2 = compare_ratio(a2, b2, paired=True, n_boot=200, seed=0)
    assert cmp.hi / cmp.lo == pytest.approx(f2.hi / f2.lo, rel=0.5)


def test_compare_factors_resolves_a_factor_that_changes_and_not_one_that_does_not():
    rng = np.random.default_rng(7)
    mini, small, same = _experiment(rng, 9.0), _experiment(rng, 2.0), _experiment(rng, 9.0)
    changed = compare_factors(mini, small, seed=1)
    assert changed.ratio == pytest.approx(2.0 / 9.0, rel=0.15)
    assert changed.hi < 1.0                       # resolved: the factor is smaller in the second experiment
    unchanged = compare_factors(mini, same, seed=1)
    assert unchanged.lo < 1.0 < unchanged.hi       # the same factor: no change resolved
    assert compare_factors(mini, small, seed=1) == changed  # deterministic for a seed


def test_compare_factors_names_the_experiment_with_a_zero_baseline():
    with pytest.raises(ValueError, match="second experiment: the baseline a_units estimate is 0"):
        compare_factors((np.ones(3), np.ones(3), None), (np.zeros(3), np.ones(3), None))
