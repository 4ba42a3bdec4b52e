"""fp8rl_core.verl.verdicts without verl: the reports file and the verdict on a planted fault (its condition
at its sync, its rank named, the next sync clean again)."""

from __future__ import annotations

import json

from fp8rl_core.verl.verdicts import alarm_verdict, failed_results, fault_verdict, read_reports, sync_results


def _report(sync: int, *results: dict) -> dict:
    return {"version": sync - 1, "sync": sync, "tier": "full", "why": "", "seconds": 0.1, "results": list(results)}


def _result(cond: str, passed: bool, offenders=(), ranks=()) -> dict:
    return {"condition": cond, "passed": passed, "measured": 0.0, "bound": 0.0, "offenders": list(offenders),
            "count": len(offenders), "seconds": 0.0, "detail": "", "failing_ranks": list(ranks)}


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
        "named_rank": True, "offenders": "tp rank 1/2, layer x", "repaired": None, "why": ""}
    # why its sync ran the tier it ran: the cheap tier's failure brought the full tier there
    cheap = [caught[0] | {"why": "cheap tier failed: W2"}]
    assert fault_verdict(cheap, "f", "W2", 1, version=0).why == "cheap tier failed: W2"


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


def test_the_alarm_on_the_faulted_versions_rollouts_at_the_next_sync_is_the_fault_seen_again():
    """At the sync after a fault, verl's trainer has rolled out on the faulted weights: the behavioural alarm
    (W7 offenders ``step …``) firing there is that fault, not a failed repair; a probe offender still counts."""
    alarm = _result("W7", False, ["step 2: rollout_corr/k3_kl = 0.41 above its bound 0.1"])
    probe = _result("W7", False, ["probe sequence 0 position 3: |Δlogp| 0.9"])
    series = [_report(1, _result("W2", False, ["tp rank 1/2, layer x"], [1])),  # version 0: the fault
              _report(2, _result("W2", True), alarm)]  # version 1: bytes repaired, the alarm on version 0's rollouts
    assert fault_verdict(series, "f", "W2", rank=1, version=0).repaired
    assert failed_results(series[1], after_fault=True) == [] and failed_results(series[1]) == [alarm]
    series[1] = _report(2, _result("W2", True), probe)
    assert fault_verdict(series, "f", "W2", rank=1, version=0).repaired is False


def test_a_fault_left_to_the_alarm_is_caught_at_the_next_sync_by_the_alarm_on_that_steps_numbers():
    """A plant at version 1 with the compute-copy check off there: the alarm at the sync of version 2 (its step
    2 rolled out on the fault) catches it; the plant's own sync fired nothing; the alarm cannot name a rank."""
    alarm = _result("W7", False, ["step 2: rollout_corr/k3_kl = 0.41 above its bound 0.1"])
    series = [_report(1, _result("W6", True)), _report(2, _result("W6", True)), _report(3, _result("W6", True), alarm)]
    v = alarm_verdict(series, "expert-copy-negated", 1, rank=1)
    assert (v.caught_first, v.fired, v.named_rank, v.repaired, v.condition) == (True, (), False, True, "W7")
    assert v.offenders == ("step 2: rollout_corr/k3_kl = 0.41 above its bound 0.1",)
    series[2] = _report(3, _result("W6", True), _result("W7", False, ["step 1: late"]))  # not this step's numbers
    assert not alarm_verdict(series, "f", 1).caught_first
    series[2] = _report(3, _result("W6", False, ["x"]), alarm)  # caught, but something else failed there
    assert alarm_verdict(series, "f", 1).repaired is False
    assert alarm_verdict(series, "f", 2).repaired is None and not alarm_verdict(series, "f", 2).caught_first


def test_the_engines_own_checksums_count_with_the_conditions_where_they_ran():
    """A report's ``vllm_checksum`` (vLLM's weight checker, ``checks.engine_checksums``) is one more result: it
    fires with the condition at a fault that changed the bytes, and a disagreement at a clean sync is a false
    alarm; a report without it (not run) has the conditions' results only."""
    vck = _result("vllm_checksum", False, ["tp rank 1/2: model.layers.0.mlp.down_proj.weight: vLLM's SHA-256 …"], [1])
    plant = _report(1, _result("W2", False, ["tp rank 1/2, layer x"], [1])) | {"vllm_checksum": vck}
    clean = _report(2, _result("W2", True)) | {"vllm_checksum": _result("vllm_checksum", True)}
    assert sync_results(plant)[-1] is vck and sync_results(_report(3, _result("W2", True))) == [_result("W2", True)]
    v = fault_verdict([plant, clean], "sampler-requantizes-floor", "W2", rank=1, version=0)
    assert v.caught_first and v.fired == ("W2", "vllm_checksum") and v.repaired
    assert failed_results(_report(2, _result("W2", True)) | {"vllm_checksum": vck}, after_fault=True) == [vck]
