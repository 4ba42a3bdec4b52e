"""The behavioural alarm (W7 on every sync): absolute bounds, jumps over the run's own clean history, NaN,
and the numbers it reads from a native step row."""

from __future__ import annotations

import math

import pytest

from fp8rl_core.checks.alarm import ALARM_BOUNDS, MismatchAlarm, alarm_numbers
from fp8rl_core.checks.runner import CheckPolicy

M = "mismatch/mean_abs_logprob_diff"


def test_a_clean_history_raises_nothing_and_a_jump_fires_naming_step_metric_and_ratio():
    alarm = MismatchAlarm(jump=10.0, warmup=2)
    for step, v in enumerate([0.010, 0.030, 0.012, 0.025, 0.011], start=1):
        r = alarm.observe(step, {M: v})
        assert r.passed and r.condition == "W7" and r.count == 0, r.offenders
    r = alarm.observe(6, {M: 0.30})  # 25x the median 0.012 of the clean steps, under the absolute 0.5
    assert not r.passed and len(r.offenders) == 1
    assert r.offenders[0] == (f"step 6: {M} = 0.3 jumped 25× over the run's median 0.012 of 5 earlier steps "
                              "(alarm at 10×)")
    assert alarm.history[M] == [0.010, 0.030, 0.012, 0.025, 0.011]  # the failing value does not join it
    assert alarm.observe(7, {M: 0.02}).passed  # back to normal


def test_the_absolute_bound_fires_from_the_first_step_and_nan_fails():
    alarm = MismatchAlarm()
    r = alarm.observe(1, {M: 0.839, "rollout_corr/k3_kl": 0.41})
    assert not r.passed and r.offenders == [f"step 1: {M} = 0.839 above its bound 0.5",
                                            "step 1: rollout_corr/k3_kl = 0.41 above its bound 0.05"]
    assert r.measured == pytest.approx(0.41 / 0.05)
    assert not MismatchAlarm().observe(1, {M: math.nan}).passed


def test_jumps_need_the_warmup_and_the_noise_floor():
    alarm = MismatchAlarm(jump=10.0, warmup=2)
    assert alarm.observe(1, {"rollout_corr/k3_kl": 6e-7}).passed
    assert alarm.observe(2, {"rollout_corr/k3_kl": 9e-4}).passed  # 1500x, but one clean step only (warm-up)
    assert alarm.observe(3, {"rollout_corr/k3_kl": 8e-7}).passed
    assert alarm.observe(4, {"rollout_corr/k3_kl": 9e-4}).passed  # 1100x the median 9e-4/2, under the floor 1e-3
    assert alarm.history["rollout_corr/k3_kl"] == [6e-7, 9e-4, 8e-7, 9e-4]
    r = alarm.observe(5, {"rollout_corr/k3_kl": 2e-2})  # median 4.5e-4 of four: 44x
    assert not r.passed and "jumped 44.4×" in r.offenders[0]


def test_no_watched_number_means_not_run_and_native_rows_give_mean_abs_logprob_diff_and_k3():
    assert MismatchAlarm().observe(1, {"reward": 1.0}) is None
    assert alarm_numbers({"mean_abs_logprob_diff": 0.02, "max_abs_logprob_diff": 0.5}) == {M: 0.02}
    assert alarm_numbers({"mean_abs_logprob_diff": 0.02, "k3": 3e-5, "step": 4}) == {M: 0.02, "mismatch/k3": 3e-5}
    assert alarm_numbers({}) == {}
    assert {b.metric for b in ALARM_BOUNDS} == {M, "mismatch/k3", "rollout_corr/k3_kl",
                                                "training/rollout_probs_diff_mean"}
    with pytest.raises(ValueError, match="jump must be > 1"):
        MismatchAlarm(jump=1.0)
    p = CheckPolicy()
    assert (p.alarm, p.compute_copy, p.alarm_jump, p.alarm_warmup) == (True, True, 10.0, 2)
