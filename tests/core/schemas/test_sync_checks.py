"""The weight-sync check tables (fp8rl_core.schemas.sync_checks): checks flattened from real reports
(fp8rl_core.checks.check_rows), clean syncs and detection-matrix rows from the real correctness driver
pass — also read back from their files — and each constraint, violated in turn, is named."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest

from fp8rl_core.checks import check_rows
from fp8rl_core import correctness as fault_matrix
from fp8rl_core.checks.faults import fault as lookup_fault
from fp8rl_core.schemas import validate

from .samples import CHECK_ROW, MATRIX_ROW, TASK, assert_violation_named, case_ids, parquet, report, set_


def test_checks_from_reports_objects_dicts_and_json():
    reports = [report(1, 1, True), report(2, 2, False), report(3, 3, True, failed=("W3",))]
    rows = check_rows(reports)
    assert len(rows) == 7 + 6 + 7 and set(rows[0]) == set(CHECK_ROW)  # the cheap tier: all but W3
    failed = [r for r in rows if not r["passed"]]
    assert [(r["sync"], r["condition"], r["count"], r["offenders"]) for r in failed] == [
        (3, "W3", 3, "layer.W3; layer.W3; layer.W3")]
    assert len(validate("checks", rows)) == 20
    assert len(validate("checks", reports)) == 20  # reports are flattened first
    dicts = json.loads(json.dumps([r.as_dict() for r in reports]))  # what checks.json holds
    assert check_rows(dicts) == rows
    assert len(validate("checks", dicts)) == 20


class _Learner:
    def __init__(self):
        self.version = 0


class _Pipe:
    def __init__(self):
        self.learner = _Learner()
        self.samplers = []


def _fake_step(monkeypatch, faulty: tuple[str, ...] = ()):
    """matrix.step without the engine: the version advances, the checks report ``faulty`` conditions on a
    faulty sync (full tier, as an escalated cheap failure would)."""
    syncs = {"n": 0}

    def step(pipe, runner, task, index, *, prompts_per_step, seed, fault=None):
        pipe.learner.version += 1
        syncs["n"] += 1
        row = {"step": index, "version": index - 1, "new_version": index, "mean_reward": 0.25, "generate_s": 0.1,
               "learner_s": 0.2, "export_s": 0.01, "transport_s": 0.02, "load_s": 0.03, "reset_s": 0.001}
        full = fault is not None or syncs["n"] == 1
        rep = report(pipe.learner.version, syncs["n"], full, failed=faulty if fault is not None else ())
        row["checks_s"] = rep.seconds
        row["total_s"] = sum(v for k, v in row.items() if k.endswith("_s"))  # what loop.RLStep measures
        return row, rep, None  # no engine: vLLM's checksums not run

    monkeypatch.setattr(fault_matrix, "step", step)


def test_clean_syncs_from_the_real_clean_series(monkeypatch, tmp_path):
    _fake_step(monkeypatch)
    rows = fault_matrix.clean_series(_Pipe(), None, TASK, 4)
    rows = [r | {"model": "dense"} for r in rows] + [r | {"model": "moe"} for r in rows]  # as the nightly flow does
    assert len(validate("clean_syncs", rows)) == 8
    validate("clean_syncs", parquet(rows, tmp_path))


@pytest.mark.parametrize("name", ["qkv-order-swapped", "prefix-cache-kept", "router-quantized"])
def test_detection_matrix_from_the_real_inject_and_its_csv(monkeypatch, tmp_path, name):
    f = lookup_fault(name)
    _fake_step(monkeypatch, faulty=(f.condition, "W7"))
    monkeypatch.setattr(fault_matrix, "sync_weights", lambda pipe, fault=None: {})

    class Runner:
        def check(self, pipe, tags, plan=None):
            return report(pipe.learner.version, 9, False)

    row = fault_matrix.inject(_Pipe(), Runner(), TASK, f, warmup=f.engine_schemes is None)
    assert row["caught_first"] and set(row) <= set(MATRIX_ROW) | {"repaired"}
    rows = [row, dict(MATRIX_ROW)]
    assert len(validate("detection_matrix", rows)) == 2
    # what record_matrix writes (CSV), read back: None → NaN, '' → NaN
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(tmp_path / "m.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    validate("detection_matrix", pd.read_csv(tmp_path / "m.csv"))


# (table, mutation, a column the error must name, the rows it must name, words the message must hold)
CASES = [
    # checks
    ("checks", set_(0, tier="medium"), "tier", [0], "'cheap', 'full'"),
    ("checks", set_(0, condition="W8"), "condition", [0], "seven conditions"),
    ("checks", set_(3, count=2), "count", [3], "a passed check has no offenders"),
    ("checks", set_(8, count=-1, passed=False), "count", [8], "must be ≥ 0"),
    ("checks", set_(1, seconds=-0.5), "seconds", [1], "a duration"),
    ("checks", set_(1, bound=-0.5), "bound", [1], "a tolerance"),
    ("checks", set_(1, measured=-2.0), "measured", [1], "must be ≥ 0"),
    ("checks", set_(1, condition="W1"), "condition", [0, 1], "unique together"),
    ("checks", set_(2, version=9), "version", [2], "one report per sync"),
    ("checks", set_(2, tier="cheap"), "tier", [2], "one report per sync"),
    ("checks", set_(7, condition="W3"), "condition", [7], "full tier only"),
    ("checks", set_(0, passed="yes"), "passed", [0], "True/False"),
    # clean_syncs
    ("clean_syncs", set_(0, false_alarm=True, alarms="W2 failed"), "false_alarm", [0], "'check/W*' column is False"),
    ("clean_syncs", set_(1, **{"check/W2": False}), "false_alarm", [1], "'check/W*' column is False"),
    ("clean_syncs", set_(0, alarms="W1 failed"), "alarms", [0], "non-empty exactly when"),
    ("clean_syncs", set_(1, **{"check/W3": True}), "check/W3", [1], "cheap-tier rows"),
    ("clean_syncs", set_(1, sync=1), "sync", [0, 1], "unique together"),
    ("clean_syncs", set_(2, model="big"), "model", [2], "'dense', 'moe'"),
    ("clean_syncs", set_(2, mean_reward=2.0), "mean_reward", [2], "must lie in [0, 1]"),
    ("clean_syncs", set_(0, **{"check/W5": 1}), "check/W5", [0], "True/False or null"),
    ("clean_syncs", set_(0, **{"check/vllm_checksum": False}), "false_alarm", [0], "(or 'check/vllm_checksum')"),
    ("clean_syncs", set_(1, vllm_checksum_s=-1.0), "vllm_checksum_s", [1], "a duration"),
    # detection_matrix
    ("detection_matrix", set_(0, condition="W9"), "condition", [0], "must be one of"),
    ("detection_matrix", set_(0, stage="network"), "stage", [0], "'post-load'"),
    ("detection_matrix", set_(2, model="huge"), "model", [2], "'dense', 'moe'"),
    ("detection_matrix", set_(0, W1=0), "caught_first", [0], "the column named by 'condition' is 1"),
    ("detection_matrix", set_(1, caught_first=False), "caught_first", [1], "the column named by 'condition' is 1"),
    ("detection_matrix", set_(0, declared_offenders=""), "declared_offenders", [0], "names what failed"),
    ("detection_matrix", set_(1, W3=0), "W3", [1], "cheap-tier rows"),
    ("detection_matrix", set_(2, W2=2), "W2", [2], "1 fired, 0 passed"),
    ("detection_matrix", set_(0, vllm_checksum=2), "vllm_checksum", [0], "1 disagreed, 0 agreed"),
    ("detection_matrix", set_(1, fault="dropped-bucket"), "fault", [0, 1], "one row per fault"),
    ("detection_matrix", set_(1, tier="x"), "tier", [1], "'cheap', 'full'"),
    ("detection_matrix", set_(1, caught_first=None), "caught_first", [1], "True/False"),
]


@pytest.mark.parametrize("name, mutate, column, rows, words", CASES, ids=case_ids(CASES))
def test_each_violation_names_the_table_the_column_and_the_rows(name, mutate, column, rows, words):
    assert_violation_named(name, mutate, column, rows, words)
