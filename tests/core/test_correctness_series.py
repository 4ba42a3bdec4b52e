"""fp8rl_core.correctness_series: the nightly correctness stage's plan and verdicts, on the real fault catalogue
and the real configs (configs/nightly-verl.yaml, configs/nightly.yaml), judged on check reports in the form
fp8rl_core.verl.checking.SyncChecks writes them."""

from __future__ import annotations

import pytest

from fp8rl_core import correctness_series as series
from fp8rl_core.checks.faults import fault
from fp8rl_core.config.runs import Run, Sweep


@pytest.fixture(scope="module")
def verl_sweep() -> Sweep:
    return Sweep.load("configs/nightly-verl.yaml", [])


def _result(cond: str, passed: bool = True, offenders=(), ranks=()) -> dict:
    return {"condition": cond, "passed": passed, "measured": 0.0, "bound": 0.0, "offenders": list(offenders),
            "count": len(offenders), "seconds": 0.0, "detail": "", "failing_ranks": list(ranks)}


def _reports(last: int, failing: dict[int, dict]) -> list[dict]:
    """A run's reports for versions 0 … ``last``: every condition passing but ``failing[version]``."""
    out = []
    for v in range(last + 1):
        results = [_result(c) for c in ("W1", "W2", "W6", "W7")]
        if v in failing:
            results = [failing[v] if r["condition"] == failing[v]["condition"] else r for r in results]
        out.append({"version": v, "sync": v + 1, "tier": "full", "why": "", "seconds": 0.1, "results": results})
    return out


def test_the_verl_series_plants_the_blind_fault_first_each_fault_at_a_sync_of_its_own_and_stops_last(verl_sweep):
    section = verl_sweep.config.correctness
    wanted = series.wanted_faults(section)
    assert [f.name for f in wanted] == ["sampler-requantizes-floor", "post-load-twice", "derived-copy-stale",
                                        "expert-copy-negated", "rotary-cache-nudged", "norm-eps-changed"]  # catalogue order
    plan = series.verl_series(section, "moe", wanted)
    # 3 clean syncs, then a plant every other sync (a clean one after each); the dense mini's faults too
    # (the rotary cache's sync, a fault of cheap_faults, checked at the cheap tier)
    assert [(p.fault.name, p.version, p.rank, p.checks_off, p.cheap_tier) for p in plan.plants] == [
        ("expert-copy-negated", 3, 1, ("compute_copy",), False), ("sampler-requantizes-floor", 5, 1, (), False),
        ("post-load-twice", 7, None, (), False), ("derived-copy-stale", 9, None, (), False),
        ("expert-copy-negated", 11, 1, (), False), ("rotary-cache-nudged", 13, 1, (), True),
        ("norm-eps-changed", 15, 1, (), True)]
    assert (plan.stop.fault.name, plan.stop.version, plan.stop.rank, plan.stop.on_failure) == \
        ("sampler-requantizes-floor", 17, 1, "fail")
    assert plan.steps == 17 and plan.planted_at == {3, 5, 7, 9, 11, 13, 15, 17}
    assert [(h.name, h.version, h.on_failure, h.cheap_tier) for h in plan.hooks.faults][-2:] == [
        ("norm-eps-changed", 15, None, True), ("sampler-requantizes-floor", 17, "fail", False)]
    base = verl_sweep.correctness["moe"]
    run = plan.run(base)  # the series' own config hashed, marked: the id the stage has always given it
    assert (run.id, run.name) == (f"{Run.of(plan.config(base.config), base.spec).id}-faults", f"{base.name}·faults")
    checks = run.config.checks
    assert (run.config.loop.steps, checks.on_failure, checks.full_every, checks.engine_checksums) == (17, "warn", 1, True)
    assert series.not_plantable(wanted) == [] and series.not_plantable([fault("qkv-order-swapped")]) == ["qkv-order-swapped"]


def _caught(plan) -> dict[int, dict]:
    """Each plant's sync failing as it should: the blind plant by the alarm at the next sync, the others by
    their condition's check naming the rank."""
    out = {}
    for p in (*plan.plants, plan.stop):
        if p.checks_off:
            out[p.version + 1] = _result("W7", False, [f"step {p.version + 1}: k3 0.5 above the alarm's floor"])
        else:
            rank = [] if p.rank is None else [p.rank]
            out[p.version] = _result(p.fault.condition, False, [f"tp rank {p.rank}/2, layer x"], rank)
    return out


def test_a_series_caught_everywhere_that_stopped_verl_passes(verl_sweep):
    section = verl_sweep.config.correctness
    plan = series.verl_series(section, "moe", series.wanted_faults(section))
    seen = plan.judge(_reports(17, _caught(plan)), True, "CheckFailedError: fp8rl checks failed at weight sync 18",
                      "mlflow-1")
    assert seen.alarms == ()
    assert [(r["fault"], r["version"], r["caught_first"], r["repaired"], r["checks_off"]) for r in seen.rows] == [
        ("expert-copy-negated", 3, True, True, "compute_copy"), ("sampler-requantizes-floor", 5, True, True, ""),
        ("post-load-twice", 7, True, True, ""), ("derived-copy-stale", 9, True, True, ""),
        ("expert-copy-negated", 11, True, True, ""), ("rotary-cache-nudged", 13, True, True, ""),
        ("norm-eps-changed", 15, True, True, "")]
    assert [(r["fault"], r["version"], r["caught_first"], r["stopped"]) for r in seen.stops] == [
        ("sampler-requantizes-floor", 17, True, True)]
    assert seen.lines[0] == "moe: 18 syncs through verl, 8 faults planted, 0 false alarms"
    assert series.verl_verdict(seen.rows, seen.stops, seen.alarms).error is None
    assert series.verl_metrics(seen.rows, seen.alarms) == {
        "verl_faults/planted": 7.0, "verl_faults/caught_first": 7.0, "verl_faults/repaired": 7.0,
        "verl_faults/false_alarms": 0.0}


def test_a_false_alarm_a_missed_fault_and_a_run_that_failed_early_fail_the_stage(verl_sweep):
    section = verl_sweep.config.correctness
    plan = series.verl_series(section, "moe", series.wanted_faults(section))
    failing = _caught(plan)
    failing[1] = _result("W2", False, ["tp rank 0/2, layer y"], [0])  # a clean sync
    del failing[7]  # post-load-twice not seen
    seen = plan.judge(_reports(9, failing), True, "RuntimeError: died", "mlflow-2")  # verl died at version 9
    assert seen.alarms == ("moe sync 2: W2", "moe: the fault series failed at sync version 9 (mlflow-2; its error "
                                             "tag says why)")
    missed = series.verl_verdict(seen.rows, seen.stops, seen.alarms)
    assert missed.missed == ("post-load-twice", "derived-copy-stale", "expert-copy-negated", "rotary-cache-nudged",
                             "norm-eps-changed", "sampler-requantizes-floor (did not stop verl)")
    assert missed.error.startswith("correctness through verl: 6 faults not caught at their sync")
    assert missed.error.endswith("2 false alarms on clean syncs, e.g. moe sync 2: W2")


def test_the_native_series_puts_faults_with_their_own_pipeline_last_and_judges_the_first_sync():
    sweep = Sweep.load("configs/nightly.yaml", [])
    section = sweep.config.correctness
    plans = series.native_series(section, sweep.correctness, series.wanted_faults(section))
    assert [p.kind for p in plans] == list(sweep.correctness)
    for p in plans:
        own = [series.own_pipeline(f) for f in p.faults]
        assert own == sorted(own) and all(f.model == p.kind for f in p.faults)  # shared pipeline first
        assert p.clean_syncs == section.clean_syncs[p.kind]
        for f in p.faults:
            assert p.fault_key("k", f) == (f"k-{f.name}" if series.own_pipeline(f) else "k")
    assert sum(len(p.faults) for p in plans) == len(series.wanted_faults(section))
    matrix = [{"fault": "a", "caught_first": True}, {"fault": "b", "caught_first": False}]
    clean = [{"false_alarm": False, "alarms": ""}, {"false_alarm": True, "alarms": "W2 failed: 1 offenders"}]
    v = series.native_verdict(matrix, clean)
    assert (v.missed, v.alarms) == (("b",), ("W2 failed: 1 offenders",))
    assert v.error == ("correctness: 1 faults not caught at their first sync by their condition's check (b); "
                       "1 false alarms on clean syncs, e.g. W2 failed: 1 offenders")
    assert series.native_verdict(matrix[:1], clean[:1]).error is None
