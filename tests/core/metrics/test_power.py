"""The power calculation's arithmetic (fp8rl_core.metrics.power) against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8rl_core.metrics.power import (
    VarianceComponents,
    between_interval,
    log_ratio_influence,
    log_ratio_se,
    power_estimate,
    resolvable_ratio,
    sample_needed,
    seeds_needed,
    variance_components,
)

Z975, Z80 = 1.959963984540054, 0.8416212335729143


def test_variance_components_balanced_by_hand():
    # groups [1, 3] and [5, 7]: means 2, 6, grand 4; MSB = 2·(4 + 4)/1 = 16; MSW = 4·1/(4 − 2) = 2; m0 = 2
    vc = variance_components([1, 3, 5, 7], [0, 0, 1, 1])
    assert vc == VarianceComponents(between=7.0, within=2.0, seeds=2, units=4)


def test_variance_components_unbalanced_by_hand():
    # groups [0, 2] (mean 1) and [4] (mean 4); grand 2; MSB = (2·1 + 1·4)/1 = 6; MSW = (1 + 1)/(3 − 2) = 2;
    # m0 = (3 − (4 + 1)/3)/1 = 4/3; between = (6 − 2)/(4/3) = 3
    vc = variance_components([0, 2, 4], ["s0", "s0", "s1"])
    assert vc.within == pytest.approx(2.0)
    assert vc.between == pytest.approx(3.0)
    assert (vc.seeds, vc.units) == (2, 3)


def test_between_is_clipped_at_zero_when_groups_agree_better_than_chance():
    # group means equal (both 2): MSB = 0 < MSW = 2 → between 0, not negative
    vc = variance_components([1, 3, 1, 3], [0, 0, 1, 1])
    assert vc.between == 0.0 and vc.within == pytest.approx(4 / 2)


def test_se_resolvable_and_seeds_by_hand():
    vc = VarianceComponents(between=0.02, within=0.5, seeds=3, units=192)
    # se = sqrt(0.02/4 + 0.5/(4·50)) = sqrt(0.0075) = 0.0866025
    assert log_ratio_se(vc, 4, 50) == pytest.approx(0.08660254, rel=1e-7)
    # (1.959964 + 0.841621) · 0.0866025 = 0.242625 → exp = 1.274590
    assert resolvable_ratio(vc, 4, 50) == pytest.approx(1.2745898, rel=1e-6)
    # power 0.5: the CI half-width alone, exp(1.959964 · 0.0866025) = 1.184994
    assert resolvable_ratio(vc, 4, 50, power=0.5) == pytest.approx(1.1849942, rel=1e-6)
    # n = 2.801585² · (0.02 + 0.5/50) / log(0.89)² = 7.848880 · 0.03 / 0.0135801 = 17.34 → 18
    assert seeds_needed(vc, 0.89, 50) == 18
    # the same effect the other way (1/0.89) needs the same seeds
    assert seeds_needed(vc, 1 / 0.89, 50) == 18


def test_more_sequences_cannot_beat_the_between_seed_term():
    vc = VarianceComponents(between=0.1, within=1.0, seeds=3, units=30)
    floor = math.exp((Z975 + Z80) * math.sqrt(0.1 / 3))
    assert resolvable_ratio(vc, 3, 10**9) == pytest.approx(floor, rel=1e-6)
    assert resolvable_ratio(vc, 3, 64) > floor


def test_influence_is_zero_for_an_exact_constant_ratio():
    z = log_ratio_influence([1.0, 1.0, 2.0], [2.0, 2.0, 4.0])
    np.testing.assert_allclose(z, 0.0, atol=1e-15)


def test_influence_by_hand_and_is_the_derivative_of_log_ratio():
    # a = [1, 1], b = [1, 3]: mean(b) = 2 → z = [1/2 − 1, 3/2 − 1] = [−0.5, 0.5]
    np.testing.assert_allclose(log_ratio_influence([1.0, 1.0], [1.0, 3.0]), [-0.5, 0.5])
    # with (num, den) pairs: d log R / d w_u at w = 1 is z_u / N (finite difference on unit weights)
    rng = np.random.default_rng(0)
    an, ad, bn, bd = rng.uniform(0.5, 2.0, (4, 6))
    z = log_ratio_influence((an, ad), (bn, bd))

    def log_r(w):
        return math.log((w @ bn / (w @ bd)) / (w @ an / (w @ ad)))

    h = 1e-6
    for u in range(6):
        w = np.ones(6)
        w[u] += h
        assert (log_r(w) - log_r(np.ones(6))) / h == pytest.approx(z[u] / 6, rel=1e-4)


def test_power_estimate_puts_it_together():
    # 3 seeds × 2 units; a = 1 everywhere, b = 1 ± d around seed levels: z = b / mean(b) − 1
    a = np.ones(6)
    b = np.array([0.9, 1.1, 1.9, 2.1, 2.9, 3.1])
    seeds = [0, 0, 1, 1, 2, 2]
    est = power_estimate(a, b, seeds, target=0.5)
    vc = variance_components(b / b.mean() - 1, seeds)
    assert est.components == vc
    assert (est.seeds, est.sequences) == (3, 2)
    assert est.se == pytest.approx(math.sqrt(vc.between / 3 + vc.within / 6))
    assert est.resolvable == pytest.approx(math.exp((Z975 + Z80) * est.se))
    assert est.seeds_for_target == seeds_needed(vc, 0.5, 2)
    bigger = power_estimate(a, b, seeds, seeds=12, sequences=2)
    assert bigger.resolvable < est.resolvable and bigger.seeds_for_target is None


@pytest.mark.parametrize("call, match", [
    (lambda: variance_components([1, 2], [0, 1]), "more values than groups"),
    (lambda: variance_components([1, 2, 3], [0, 0, 0]), "at least 2 groups"),
    (lambda: log_ratio_influence([1, 2], [1, 2, 3]), "differ in number"),
    (lambda: log_ratio_influence([0, 0], [1, 2]), "mean of a num is 0"),
    (lambda: seeds_needed(VarianceComponents(0, 1, 2, 4), 1.0, 10), "≠ 1"),
    (lambda: resolvable_ratio(VarianceComponents(0, 1, 2, 4), 2, 2, level=1.0), "level"),
])
def test_errors_say_what_is_wrong(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------- the sample a resolution needs

#: claim (a) on the dense small at fixed weights, as committed (docs/results/matching-fixed-weights/summary.md,
#: Power): 6 checkpoints × 2048 sequences, σ²_within 3.07, σ²_between 0.0231
DENSE_A = VarianceComponents(0.0231, 3.07, 6, 6 * 2048)


def test_checkpoints_a_pooled_claim_a_needs_on_the_dense_small():
    n = sample_needed(DENSE_A, 0.89, 2048)
    # ⌈2.8016² · (0.0231 + 3.07 / 2048) / log(0.89)²⌉ = ⌈14.22⌉; m → ∞: ⌈2.8016² · 0.0231 / log(0.89)²⌉ = ⌈13.35⌉
    z2 = (Z975 + Z80) ** 2
    assert z2 * (0.0231 + 3.07 / 2048) / math.log(0.89) ** 2 == pytest.approx(14.22, abs=0.01)
    assert (n.groups, n.floor, n.per_group, n.have, n.enough) == (15, 14, 2048, 6, False)
    assert n.units == math.ceil(z2 * 3.07 / math.log(0.89) ** 2) == 1775  # one checkpoint: the report's 1775
    assert n.groups == seeds_needed(DENSE_A, 0.89, 2048)
    # σ²_between from 6 checkpoints is itself uncertain: its 90% interval moves the answer from 7 to 64
    lo, hi = between_interval(DENSE_A, 0.9)
    assert lo == pytest.approx((5 * (2048 * 0.0231 + 3.07) / 11.070 - 3.07) / 2048, rel=0.01)  # χ²(5) 0.95: 11.070
    assert hi == pytest.approx((5 * (2048 * 0.0231 + 3.07) / 1.1455 - 3.07) / 2048, rel=0.02)  # χ²(5) 0.05: 1.1455
    assert n.groups_range == (7, 64)


def test_a_design_that_had_the_power_says_so():
    # (a) on the MoE small at fixed weights: 2 checkpoints × 2048, σ²_within 1.92, σ²_between 0.0018 → 2 needed
    n = sample_needed(VarianceComponents(0.0018, 1.92, 2, 4096), 0.89, 2048)
    assert n.groups == 2 and n.enough and n.groups_range is None  # 2 groups: σ²_between's interval unbounded


def test_one_group_gives_a_lower_bound_in_units():
    n = sample_needed(VarianceComponents(0.0, 1.92, 1, 32), 0.89, 32)
    assert n.groups is None and n.groups_range is None and n.floor is None and not n.enough
    assert n.units == math.ceil((Z975 + Z80) ** 2 * 1.92 / math.log(0.89) ** 2)


def test_sample_needed_refuses_a_ratio_of_one():
    with pytest.raises(ValueError, match="target must be a positive ratio ≠ 1, got 1"):
        sample_needed(DENSE_A, 1.0, 2048)
    with pytest.raises(ValueError, match="at least 4 groups, got 3"):
        between_interval(VarianceComponents(0.0, 1.0, 3, 30))
