"""The fixed-weights statistics on constructed units whose answers are known: the ratio of means, its
median companion, the tail shares, the pairing, the power a design has (σ² within and between
checkpoints from the units themselves), and the seed whose checkpoints carry the pooled ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8rl_core.metrics.matching import matching_power, matching_ratio, most_influential_seed, paired, tail_share


def rows_of(variant: str, kl_by_checkpoint: dict[str, list[float]], positions: int = 10, source: str = "held-out"):
    return [{"checkpoint": ck, "source": source, "sequence": i, "variant": variant, "kl": float(k),
             "positions": positions} for ck, kls in kl_by_checkpoint.items() for i, k in enumerate(kls)]


def test_an_exact_factor_is_recovered_by_the_ratio_and_the_median_with_no_spread():
    rng = np.random.default_rng(0)
    a = {"c0": rng.gamma(2.0, 1e-4, 400).tolist(), "c1": rng.gamma(2.0, 2e-4, 400).tolist()}
    b = {ck: [0.84 * x for x in v] for ck, v in a.items()}
    rows = rows_of("bf16-sampler", a) + rows_of("all", b)
    r = matching_ratio(rows, "bf16-sampler", "all", n_boot=300)
    assert r.ratio == pytest.approx(0.84) and r.median_ratio == pytest.approx(0.84)
    assert r.lo == pytest.approx(0.84) and r.hi == pytest.approx(0.84)  # paired: every replicate is 0.84
    assert (r.units, r.checkpoints, r.direction) == (800, 2, "lower")
    one = matching_ratio(rows, "bf16-sampler", "all", checkpoint="c1", n_boot=300)
    assert (one.units, one.checkpoints) == (400, 1) and one.ratio == pytest.approx(0.84)
    assert one.a_mean == pytest.approx(sum(a["c1"]) / (400 * 10))


def test_a_heavy_tail_moves_the_mean_ratio_and_not_the_median():
    a = [1e-4] * 500
    b = [0.9e-4] * 495 + [1e-2] * 5  # five sequences carry most of b's mean
    rows = rows_of("a", {"c": a}) + rows_of("b", {"c": b})
    r = matching_ratio(rows, "a", "b", n_boot=500)
    want = sum(b) / sum(a)
    assert r.ratio == pytest.approx(want) and r.ratio > 1.8
    assert r.median_ratio == pytest.approx(0.9)
    assert r.median_hi < 1 < r.lo  # the mean is higher, the median robustly lower
    assert r.b_tail.top5 == pytest.approx(5e-2 / sum(b))
    assert r.b_tail.top1pct == pytest.approx(r.b_tail.top5)  # 1% of 500 = 5
    assert r.a_tail.top1pct == pytest.approx(0.01)


def test_tail_share_rounds_the_top_percent_up_and_is_zero_where_the_sides_agree_exactly():
    t = tail_share([3.0, 1.0, 1.0])
    assert (t.top1pct, t.top5, t.units) == (pytest.approx(0.6), 1.0, 3)
    assert tail_share([0.0, 0.0]) == tail_share([0.0, 0.0]).__class__(0.0, 0.0, 2)
    with pytest.raises(ValueError, match="no sequences"):
        tail_share([])


def test_pairing_uses_the_shared_units_and_names_what_is_missing():
    rows = rows_of("a", {"c": [1, 2, 3]}) + rows_of("b", {"c": [1, 2]}) + rows_of("b", {"c": [5]}, source="sampled")
    rows += [r | {"sequence": 7} for r in rows_of("a", {"c": [4]}, source="sampled")]
    keys, ua, ub = paired(rows, "a", "b")
    assert keys == [("c", "held-out", 0), ("c", "held-out", 1)]
    assert ua[:, 0].tolist() == [1, 2] and ub[:, 1].tolist() == [10, 10]
    with pytest.raises(ValueError, match="variant 'z' has no measured sequences"):
        paired(rows, "a", "z")
    with pytest.raises(ValueError, match="share no probe sequence on source 'sampled'"):
        paired(rows, "a", "b", source="sampled")


def test_power_separates_sequence_noise_from_checkpoints_whose_ratios_differ():
    rng = np.random.default_rng(1)
    cps, m = 6, 1500
    rows = []
    shifts = [-0.2, -0.1, 0.0, 0.0, 0.1, 0.2]  # each checkpoint its own log ratio: sample variance 0.02
    for c in range(cps):
        a = rng.gamma(2.0, 1e-4, m)
        true = 0.8 * math.exp(shifts[c])
        b = a * true * rng.lognormal(0, 0.5, m) / math.exp(0.5 ** 2 / 2)
        rows += rows_of("a", {f"c{c}": a.tolist()}) + rows_of("b", {f"c{c}": b.tolist()})
    p = matching_power(rows, "a", "b", target=0.89)
    assert (p.checkpoints, p.sequences) == (cps, m)
    assert p.components.between == pytest.approx(0.02, rel=0.35)  # the checkpoints' own spread (first order)
    assert 0.2 < p.components.within < 2.0
    assert set(p.within_by_checkpoint) == {f"c{c}" for c in range(cps)}
    # one checkpoint: sequence noise alone — the per-checkpoint factor follows σ²_within / m
    z = 1.959963984540054 + 0.8416212335729143
    assert p.resolvable == pytest.approx(math.exp(z * math.sqrt(p.components.within / m)))
    assert p.sequences_for_target == math.ceil(z * z * p.components.within / math.log(0.89) ** 2)
    assert p.pooled_resolvable > math.exp(z * math.sqrt(p.components.within / (cps * m)))  # between counts too
    assert p.checkpoints_for_target is not None and p.checkpoints_for_target >= 1
    with pytest.raises(ValueError, match="target"):
        matching_power(rows, "a", "b", target=1.0)


def test_the_seed_whose_heavy_checkpoints_carry_the_ratio_of_means_is_found_with_its_share():
    """Seeds 0-3 at ratio 1 with KL 1e-4, seed 4 at ratio 0.5 with KL 1e-2: a ratio of means weighs seed 4 by
    its KL, so the pooled ratio is near 0.5 and without seed 4 exactly 1."""
    rows = []
    for seed in range(5):
        level, factor = (1e-2, 0.5) if seed == 4 else (1e-4, 1.0)
        a = {f"seed{seed}/step{st}": [level] * 50 for st in (0, 8)}
        for variant, f in (("a", 1.0), ("b", factor)):
            rows += [r | {"seed": seed} for r in rows_of(variant, {ck: [f * x for x in v] for ck, v in a.items()})]
    i = most_influential_seed(rows, "a", "b")
    heavy = 1e-2 * 100
    assert (i.seed, i.seeds) == (4, 5)
    assert i.share == pytest.approx(heavy / (heavy + 4 * 1e-4 * 100))
    assert i.ratio == pytest.approx((0.5 * heavy + 4e-2) / (heavy + 4e-2)) and i.ratio_without == pytest.approx(1.0)
    few = [r for r in rows if r["seed"] < 2]
    assert most_influential_seed(few, "a", "b") is None  # one of two left out is no pool
