"""What a run's exact probe KL rests on (fp8rl_core.metrics.probe.probe_interval): its probe sequences and the
bootstrap interval over them, from the per-sequence rows probe_divergence returns."""

from __future__ import annotations

import numpy as np
import pytest

from fp8rl_core.metrics.probe import probe_interval
from fp8rl_core.metrics.stats import cluster_bootstrap


def rows(kl_sums, positions=8):
    return [{"sequence": i, "positions": positions, "kl": k, "kl_rev": k, "js": k / 4} for i, k in enumerate(kl_sums)]


def test_the_interval_is_the_bootstrap_over_probe_sequences_around_the_runs_full_kl():
    sums = list(np.random.default_rng(3).exponential(0.01, size=16))
    out = probe_interval(rows(sums), n_boot=500, level=0.95, seed=7)
    iv = cluster_bootstrap(sums, [8.0] * 16, n_boot=500, level=0.95, seed=7)
    assert out == {"full_sequences": 16.0, "full_kl_lo": iv.lo, "full_kl_hi": iv.hi}
    full_kl = sum(sums) / (16 * 8)  # what probe_divergence reports: the mean over every scored position
    assert out["full_kl_lo"] < full_kl < out["full_kl_hi"]


def test_equal_sequences_give_a_point_interval_and_no_bootstrap_gives_none():
    out = probe_interval(rows([0.08] * 4), n_boot=200, level=0.95, seed=0)
    assert out["full_kl_lo"] == pytest.approx(0.01) and out["full_kl_hi"] == pytest.approx(0.01)
    assert probe_interval(rows([0.08] * 4), n_boot=0, level=0.95, seed=0) == {"full_sequences": 4.0}
    assert probe_interval([], n_boot=200, level=0.95, seed=0) == {"full_sequences": 0.0}
