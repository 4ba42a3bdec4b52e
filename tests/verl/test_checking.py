"""fp8rl_core.verl.checking without verl: the launcher's check settings read back, the reports file, the
verdict on a planted fault (its condition at its sync, its rank named, the next sync clean again), and which
fault the workers plant at which sync on which rank."""

from __future__ import annotations

import json

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.verl.checking import CheckSettings, fault_verdict, read_reports
from fp8rl_core.verl.overrides import CHECKS_ENV


def _report(sync: int, *results: dict) -> dict:
    return {"version": sync - 1, "sync": sync, "tier": "full", "why": "", "seconds": 0.1, "results": list(results)}


def _result(cond: str, passed: bool, offenders=(), ranks=()) -> dict:
    return {"condition": cond, "passed": passed, "measured": 0.0, "bound": 0.0, "offenders": list(offenders),
            "count": len(offenders), "seconds": 0.0, "detail": "", "failing_ranks": list(ranks)}


def test_settings_read_back_what_the_overrides_send():
    run = RunConfig(model="qwen3-dense-mini", preset="all")
    probe = run.check_probe().tolist()
    env = {CHECKS_ENV: json.dumps({"full_every": 3, "on_failure": "warn", "w7_mean": 0.5, "w7_max": 8.0,
                                   "probe": probe, "probe_sequences": 16})}
    s = CheckSettings.from_env(env)
    assert (s.full_every, s.on_failure, s.w7_mean, s.w7_max) == (3, "warn", 0.5, 8.0)
    assert [list(r) for r in s.probe] == probe and s.policy().full_every == 3
    assert CheckSettings.from_env({}) is None  # no checks section sent: no checks


def test_reports_are_read_in_sync_order_and_a_missing_file_is_none(tmp_path):
    path = tmp_path / "checks.jsonl"
    assert read_reports(path) == []
    path.write_text("\n".join(json.dumps(_report(k, _result("W1", True))) for k in (1, 2)) + "\n\n")
    assert [r["sync"] for r in read_reports(path)] == [1, 2]


def test_a_fault_is_caught_by_its_condition_at_the_first_sync_naming_its_rank():
    caught = [_report(1, _result("W1", True), _result("W2", False, ["tp rank 1/2, layer x"], [1]))]
    v = fault_verdict(caught, "sampler-requantizes-floor", "W2", rank=1)
    assert v.caught_first and v.fired == ("W2",) and v.named_rank and v.offenders == ("tp rank 1/2, layer x",)
    assert not fault_verdict(caught, "sampler-requantizes-floor", "W2", rank=0).caught_first  # another rank named
    assert fault_verdict(caught, "any", "W2").caught_first  # planted on every rank: no rank to name
    assert not fault_verdict(caught, "post-load-twice", "W6").caught_first  # another condition fired
    late = [_report(1, _result("W2", True)), _report(2, _result("W2", False, ["x"], [1]))]
    assert not fault_verdict(late, "f", "W2").caught_first and not fault_verdict([], "f", "W2").caught_first
    assert fault_verdict(caught, "f", "W2", 1).as_row() == {
        "fault": "f", "condition": "W2", "rank": 1, "version": -1, "caught_first": True, "fired": "W2",
        "named_rank": True, "offenders": "tp rank 1/2, layer x", "repaired": None}


def test_a_fault_planted_at_one_sync_is_judged_there_and_repaired_by_the_next():
    series = [_report(1, _result("W2", True), _result("W6", True)),  # version 0: clean
              _report(2, _result("W2", True), _result("W6", False, ["layer 3: processed 2 times"])),  # version 1
              _report(3, _result("W2", True), _result("W6", True)),  # version 2: repaired
              _report(4, _result("W2", False, ["tp rank 1/2, layer x"], [1]), _result("W6", True)),  # version 3
              _report(5, _result("W2", False, ["tp rank 1/2, layer x"], [1]), _result("W6", True))]  # still broken
    twice = fault_verdict(series, "post-load-twice", "W6", version=1)
    assert twice.caught_first and twice.fired == ("W6",) and twice.repaired and twice.as_row()["version"] == 1
    floor = fault_verdict(series, "sampler-requantizes-floor", "W2", rank=1, version=3)
    assert floor.caught_first and floor.named_rank and floor.repaired is False  # the next sync still fails
    assert fault_verdict(series, "f", "W2", version=4).repaired is None  # no sync after it
    assert not fault_verdict(series, "f", "W6", version=2).caught_first  # nothing fired at that sync
    assert not fault_verdict(series, "f", "W6", version=9).caught_first  # no sync of that version


def test_a_planted_fault_acts_on_its_rank_at_its_version(monkeypatch):
    import pytest

    from fp8rl_core.checks.faults import fault
    from fp8rl_core.verl.overrides import FAULT_ENV
    from fp8rl_core.verl.rollout import planted_fault

    assert planted_fault(0, 0) is None  # nothing planted
    schedule = [{"name": "sampler-requantizes-floor", "rank": 1, "version": 1},
                {"name": "post-load-twice", "rank": None, "version": 3},
                {"name": "derived-copy-stale", "rank": None, "version": None}]
    monkeypatch.setenv(FAULT_ENV, json.dumps(schedule))
    floor, twice, stale = (fault(f["name"]).worker for f in schedule)
    assert planted_fault(1, 1) == floor and planted_fault(0, 1) == stale  # rank 0: only the every-sync fault
    assert planted_fault(0, 3) == planted_fault(1, 3) == twice and planted_fault(1, 0) == stale
    monkeypatch.setenv(FAULT_ENV, json.dumps([{"name": "dropped-bucket", "rank": None, "version": None}]))
    with pytest.raises(ValueError, match="dropped-bucket.*only worker faults"):
        planted_fault(0, 0)
