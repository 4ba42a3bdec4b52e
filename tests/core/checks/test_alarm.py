"""The behavioural alarm (W7 on every sync): absolute bounds, jumps over the run's own clean history, NaN,
and the numbers it reads from a native step row."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
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
                                            "step 1: rollout_corr/k3_kl = 0.41 above its bound 0.1"]
    assert r.measured == pytest.approx(0.41 / 0.1)
    assert not MismatchAlarm().observe(1, {M: math.nan}).passed


def test_jumps_need_the_warmup_and_the_noise_floor():
    alarm = MismatchAlarm(jump=10.0, warmup=2)
    assert alarm.observe(1, {"rollout_corr/k3_kl": 6e-7}).passed
    assert alarm.observe(2, {"rollout_corr/k3_kl": 9e-4}).passed  # 1500x, but one clean step only (warm-up)
    assert alarm.observe(3, {"rollout_corr/k3_kl": 8e-7}).passed
    assert alarm.observe(4, {"rollout_corr/k3_kl": 9e-4}).passed  # 1100x the median 9e-4/2, under the floor
    assert alarm.observe(5, {"rollout_corr/k3_kl": 0.04}).passed  # 89x the median 4.5e-4, under the floor 0.05
    assert alarm.history["rollout_corr/k3_kl"] == [6e-7, 9e-4, 8e-7, 9e-4, 0.04]
    r = alarm.observe(6, {"rollout_corr/k3_kl": 0.08})  # median 9e-4 of five: 89x, above the floor
    assert not r.passed and "jumped 88.9×" in r.offenders[0]


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


MEASURED = Path(__file__).with_name("measured_mismatch.csv")


def _replay(rows: pd.DataFrame) -> list[tuple[str, str, int, str]]:
    """Every run of ``rows`` replayed step by step through the default alarm: (source, run, step, kind) of each
    step it fails."""
    fired = []
    for (source, run), g in rows.groupby(["source", "run"], sort=False):
        alarm = MismatchAlarm(jump=CheckPolicy().alarm_jump, warmup=CheckPolicy().alarm_warmup)
        for r in g.sort_values("step").itertuples(index=False):
            numbers = {b.metric: getattr(r, _col(b.metric)) for b in ALARM_BOUNDS}
            result = alarm.observe(r.step, {k: v for k, v in numbers.items() if v == v})
            if result is not None and not result.passed:
                fired.append((source, run, int(r.step), r.kind))
    return fired


def _col(metric: str) -> str:
    return metric.replace("/", "_")


def test_the_default_bounds_raise_nothing_on_every_clean_step_measured_and_see_the_expert_faults_above_them():
    """The per-step numbers of the clean runs the bounds were chosen from (docs/correctness.md, The behavioural
    alarm; measured on an Intel Xeon, 2 cores): `make run`'s 30 runs, the results sweeps dense-matching (12 runs ×
    8 steps), moe-grids (12 × 8) and dense-matching-small (seeds 0, 1), verl's runs of CI's sweeps and of the verl
    smoke (8 × 2); and the native MoE test mini's series with a negated expert copy at three placements
    (tests/core/test_correctness.py)."""
    rows = pd.read_csv(MEASURED).rename(columns=_col)
    assert set(rows["source"]) == {"make run", "dense-matching", "moe-grids", "dense-matching-small",
                                   "verl (CI sweeps)", "verl smoke", "test mini, expert fault"}
    clean = rows[rows["kind"] != "fault"]
    floor = {_col(b.metric): b.floor for b in ALARM_BOUNDS}
    assert len(clean) > 300 and all(clean[c].max() < floor[c] for c in floor), clean.max(numeric_only=True)
    fired = _replay(rows)
    assert [f for f in fired if f[3] != "fault"] == []  # zero false alarms, faulted training included
    assert [f[2] for f in fired] == [11, 17]  # the expert fault's k3 0.25 and 0.15; at step 5 (0.014) it is unseen
