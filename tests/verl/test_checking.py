"""fp8rl_core.verl.checking without verl: the launcher's check settings read back, the reports file, and the
verdict on a planted fault (its condition at the first sync, its rank named)."""

from __future__ import annotations

import json

from fp8rl_core.config import RunConfig
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
        "fault": "f", "condition": "W2", "rank": 1, "caught_first": True, "fired": "W2", "named_rank": True,
        "offenders": "tp rank 1/2, layer x"}
