"""fp8rl_core.verl.metrics: a verl run's summary metrics from verl's per-step metrics."""

from __future__ import annotations

import pytest

from fp8rl_core.verl.metrics import summary


def test_summary_maps_verls_per_step_metrics_onto_the_native_names():
    history = {
        "rollout_corr/k3_kl": [(2, 3e-4), (1, 1e-4)],  # out of order: sorted by step
        "rollout_corr/kl": [(1, -2e-4), (2, 4e-4)],
        "critic/score/mean": [(1, 0.5), (2, 0.75)],
        "timing_s/step": [(1, 30.0), (2, 2.0), (3, 4.0)],
        "training/rollout_probs_diff_mean": [(1, 0.001), (2, 0.003)],
        "training/rollout_probs_diff_max": [(1, 0.2), (2, 0.1)],
        "timing_s/update_weights": [(1, 0.1), (2, 0.3)],
    }
    s = summary(history)
    assert s["kl/k3"] == pytest.approx(2e-4) and s["kl/k1"] == pytest.approx(1e-4)
    assert s["reward/first"] == 0.5 and s["reward/final"] == 0.75
    assert s["time/first_step_s"] == 30.0 and s["time/warm_step_s"] == pytest.approx(3.0)
    assert s["kl/mean_abs_prob_diff"] == pytest.approx(0.002) and s["kl/max_abs_prob_diff"] == 0.2
    assert s["verl/update_weights_s"] == pytest.approx(0.2) and s["verl/steps"] == 3.0


def test_summary_leaves_out_what_verl_did_not_log():
    s = summary({"rollout_corr/k3_kl": [(1, 1e-4)], "timing_s/step": [(1, 9.0)], "critic/score/mean": []})
    assert s == {"kl/k3": 1e-4, "verl/k3_kl": 1e-4, "time/first_step_s": 9.0, "verl/steps": 1.0}  # no warm step
    assert summary({}) == {}
