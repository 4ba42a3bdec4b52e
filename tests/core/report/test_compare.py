"""Comparing two presets (fp8rl_core.report.compare): the units they are compared over, paired by key where
both cover the same keys and unpaired otherwise — for KL and for step times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8rl_core.metrics import compare_ratio
from fp8rl_core.report import compare_presets, compare_times, sequence_units
from fp8rl_core.report.compare import compare_matched, match_units

from .sweeps import DENSE, MOE, make_sweep


@pytest.fixture(scope="module")
def sweep():
    return make_sweep()


def test_sequence_units_are_keyed_by_seed_step_sequence(sweep):
    units = sequence_units(sweep, "k3", by=("model", "preset"))
    u = units[(DENSE, "all")]
    assert u.keys.shape == (3 * 2 * 8, 3) and u.n_seeds == 3 and len(u.runs) == 3
    assert np.array_equal(np.unique(u.keys, axis=0), u.keys)  # sorted, unique
    assert (u.den == 6).all()  # six tokens per sequence
    # one sequence's k3 sum by hand: 3 tokens at +x and 3 at −x → 3·(e^x + e^−x − 2)
    t = sweep.tokens[(sweep.tokens["run_id"] == f"{DENSE}-all-1") & (sweep.tokens["step"] == 2)
                     & (sweep.tokens["sequence"] == 5)]
    x = float(t["learner_logprob"].iloc[0] - t["sampler_logprob"].iloc[0])
    row = np.flatnonzero((u.keys == [1, 2, 5]).all(axis=1))[0]
    assert u.num[row] == pytest.approx(3 * (math.exp(x) + math.exp(-x) - 2), rel=1e-9)


def test_unpaired_when_the_presets_differ_in_seeds():
    data = make_sweep(presets=("bf16-sampler", "all"), models=(DENSE,), steps=False, checks=False)
    drop = data.runs["run_id"] == f"{DENSE}-all-2"
    data.runs = data.runs[~drop].reset_index(drop=True)
    res = compare_presets(data, "bf16-sampler", "all", n_boot=500)
    assert res.paired is False and res.seeds == (3, 2)
    assert "unpaired" in res.text
    assert res.sequences == (48, 32)


def test_matching_pairs_equal_key_sets_and_sums_units_sharing_a_key():
    a_keys = np.array([[0, 1, 0], [0, 1, 1], [1, 1, 0], [0, 1, 1]])
    b_keys = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 1]])
    m = match_units(a_keys, (np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4)), b_keys,
                    (np.array([30.0, 10.0, 20.0]), np.ones(3)))
    assert m.paired and m.counts == (4, 3) and m.seed_counts == (2, 2) and (m.n_units, m.n_seeds) == (3, 2)
    assert m.a[0].tolist() == [1.0, 6.0, 3.0] and m.a[1].tolist() == [1.0, 2.0, 1.0]
    assert m.b[0].tolist() == [10.0, 20.0, 30.0] and m.a_seeds.tolist() == [0, 0, 1]
    cmp = compare_matched(m, n_boot=200)
    assert cmp == compare_ratio(m.a, m.b, paired=True, groups=[0, 0, 1], n_boot=200)
    assert cmp.ratio == pytest.approx((60 / 3) / (10 / 4))  # Σnum/Σden of each side


def test_matching_leaves_different_key_sets_unpaired_with_their_own_seeds():
    a_keys, b_keys = np.array([[0, 1, 0], [1, 1, 0]]), np.array([[0, 1, 0], [2, 1, 0], [2, 1, 1]])
    m = match_units(a_keys, np.array([1.0, 3.0]), b_keys, np.array([2.0, 4.0, 6.0]))
    assert not m.paired and m.counts == (2, 3) and m.seed_counts == (2, 2)
    assert m.a_seeds.tolist() == [0, 1] and m.b_seeds.tolist() == [0, 2, 2]
    cmp = compare_matched(m, n_boot=200)
    assert cmp == compare_ratio([1.0, 3.0], [2.0, 4.0, 6.0], paired=False, groups=[0, 1], b_groups=[0, 2, 2],
                                n_boot=200)
    assert cmp.ratio == pytest.approx(4.0 / 2.0) and cmp.paired is False


def test_times_are_paired_by_seed_and_step_unless_a_step_is_missing(sweep):
    paired = compare_times(sweep, MOE, "bf16-e2e", "all", "step_s", n_boot=200)
    assert paired.paired and paired.sequences == (6, 6) and paired.seeds == (3, 3)
    assert paired.comparison.ratio == pytest.approx(0.893, rel=0.01)
    assert "paired by (seed, step) over 6 units (steps table, total_s − checks_s)" in paired.text
    data = make_sweep(presets=("bf16-e2e", "all"), models=(MOE,), checks=False)
    st = data.steps
    data.steps = st[~((st["run_id"] == f"{MOE}-all-2") & (st["step"] == 2))]
    unpaired = compare_times(data, MOE, "bf16-e2e", "all", "generate_s", n_boot=200)
    assert not unpaired.paired and unpaired.sequences == (6, 5)
    assert unpaired.text.endswith("; unpaired, 6 vs 5 units (steps table)")
    assert unpaired.comparison.ratio == pytest.approx(0.76, rel=0.01)
    assert compare_times(data, DENSE, "bf16-e2e", "all", "step_s") is None  # no such model in this sweep
