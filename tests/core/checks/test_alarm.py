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


def test_a_clean_history_raises_nothing_and_a_jump_is_a_suspicion_naming_step_metric_and_ratio():
    alarm = MismatchAlarm(jump=10.0, warmup=2)
    for step, v in enumerate([0.010, 0.030, 0.012, 0.025, 0.011], start=1):
        obs = alarm.observe(step, {M: v})
        assert not obs.suspicious and obs.reason() == "" and obs.result(confirmed=False).passed
    obs = alarm.observe(6, {M: 0.30})  # 25x the median 0.012 of the clean steps, under the absolute 0.5
    assert obs.suspicious and obs.nonfinite == ()
    (s,) = obs.suspicions
    assert (s.metric, s.reason, s.reference, s.history) == (M, "jump", 0.012, 5) and s.ratio == pytest.approx(25)
    assert obs.reason() == (f"behavioural alarm: step 6: {M} = 0.3 jumped 25× over the run's median 0.012 of 5 "
                            "earlier steps (alarm at 10×)")
    assert alarm.history[M] == [0.010, 0.030, 0.012, 0.025, 0.011]  # a suspect value waits for the full tier
    # dismissed by the full tier (every check passed): an event, and the value joins the history
    assert obs.result(confirmed=False).passed and "dismissed by the full tier" in obs.result(confirmed=False).detail
    alarm.dismiss(obs)
    assert alarm.history[M] == [0.010, 0.030, 0.012, 0.025, 0.011, 0.30]
    # confirmed (a check failed at that sync): the alarm's line is part of W7's failure
    r = alarm.observe(7, {M: 0.45}).result(confirmed=True)
    assert not r.passed and r.offenders == [f"step 7: {M} = 0.45 jumped 24.3× over the run's median 0.0185 of 6 "
                                            "earlier steps (alarm at 10×)"]


def test_the_absolute_bound_is_a_suspicion_from_the_first_step_and_only_a_non_finite_number_fails_on_its_own():
    alarm = MismatchAlarm()
    obs = alarm.observe(1, {M: 0.839, "rollout_corr/k3_kl": 0.41})
    assert [s.line(1) for s in obs.suspicions] == [f"step 1: {M} = 0.839 above its bound 0.5",
                                                   "step 1: rollout_corr/k3_kl = 0.41 above its bound 0.1"]
    assert obs.result(confirmed=False).passed and obs.result(confirmed=False).measured == pytest.approx(0.41 / 0.1)
    for bad in (math.nan, math.inf):
        obs = MismatchAlarm().observe(3, {M: bad, "mismatch/k3": 0.01})
        r = obs.result(confirmed=False)
        assert obs.nonfinite and not r.passed and r.offenders == [f"step 3: {M} = {bad} is not finite"]


def test_jumps_need_the_warmup_and_the_noise_floor():
    alarm = MismatchAlarm(jump=10.0, warmup=2)
    quiet = [6e-7, 9e-4, 8e-7, 9e-4, 0.04]  # 1500x after one step (warm-up); 1100x and 89x, under the floor 0.05
    for step, v in enumerate(quiet, start=1):
        assert not alarm.observe(step, {"rollout_corr/k3_kl": v}).suspicious
    assert alarm.history["rollout_corr/k3_kl"] == quiet
    obs = alarm.observe(6, {"rollout_corr/k3_kl": 0.08})  # median 9e-4 of five: 89x, above the floor
    assert obs.suspicious and "jumped 88.9×" in obs.suspicions[0].line(6)


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
    step it suspects (where the check runner runs the full tier)."""
    fired = []
    for (source, run), g in rows.groupby(["source", "run"], sort=False):
        alarm = MismatchAlarm(jump=CheckPolicy().alarm_jump, warmup=CheckPolicy().alarm_warmup)
        for r in g.sort_values("step").itertuples(index=False):
            numbers = {b.metric: getattr(r, _col(b.metric)) for b in ALARM_BOUNDS}
            obs = alarm.observe(r.step, {k: v for k, v in numbers.items() if v == v})
            if obs is not None and obs.suspicious:
                fired.append((source, run, int(r.step), r.kind))
                alarm.dismiss(obs)  # the worst case for what follows: every suspicion dismissed, its value kept
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


LONG = Path(__file__).with_name("measured_long_runs.csv")


def test_the_long_clean_runs_replayed_suspect_exactly_where_the_live_runs_recorded_events_and_fail_none():
    """The 18 clean runs of configs/clean-long.yaml (both minis × all, half, bf16-sampler × seeds 0–2, 40 RL steps,
    no fault; measured on this AMD EPYC, 2 cores — docs/correctness.md, The behavioural alarm): every run FINISHED.
    Replayed through the default alarm, with each suspicion dismissed as the live full tier dismissed it, the
    alarm suspects exactly the steps at which those runs recorded a mismatch event; no number is non-finite, so
    none would fail a run on its own. The rule before (a suspicion failing the run) would have ended 6 of the 18."""
    rows = pd.read_csv(LONG).rename(columns=_col)
    assert rows["run"].nunique() == 18 and (rows.groupby("run")["step"].max() == 40).all()
    assert set(rows["status"]) == {"FINISHED"}
    suspected: dict[tuple[str, int], int] = {}
    for run, g in rows.groupby("run", sort=False):
        alarm = MismatchAlarm(jump=CheckPolicy().alarm_jump, warmup=CheckPolicy().alarm_warmup)
        for r in g.sort_values("step").itertuples(index=False):
            obs = alarm.observe(r.step, {M: r.mismatch_mean_abs_logprob_diff, "mismatch/k3": r.mismatch_k3})
            assert obs is not None and not obs.nonfinite
            if obs.suspicious:
                suspected[(run, int(r.step))] = len(obs.suspicions)
                alarm.dismiss(obs)
    recorded = {(r.run, int(r.step)): int(r.alarm_events) for r in rows.itertuples(index=False) if r.alarm_events}
    assert suspected == recorded and sum(recorded.values()) == 16
    assert len({run for run, _ in suspected}) == 6  # the runs the old rule would have failed, at their first one
    # how far the numbers go in a clean run: single steps at k3 1.88 and mean |Δ log p| 1.98, above every bound
    assert rows["mismatch_k3"].max() == pytest.approx(1.8796, abs=1e-4)
    assert rows["mismatch_mean_abs_logprob_diff"].max() == pytest.approx(1.9782, abs=1e-4)
    # and W7's coarse probe (BF16 engines) above its bound once, every exact check passing: an event too
    assert rows["probe_events"].sum() == 1
