"""The nightly correctness stage for real (embedded Prefect, a temporary MLflow store, real vLLM engines):
a reduced clean series and every fault of the catalogue; the detection matrix must show each fault
caught at its first sync by the check of its declared condition and no false alarm; vLLM's own weight
checksums agree with the learner's bytes at every clean sync and disagree where a fault changed them."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from adapters import tracking
from fp8rl_core.checks.faults import FAULTS
from fp8rl_core.vocabulary import ENGINE_CHECKSUM

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = str(ROOT / "configs" / "nightly.yaml")
REDUCED = ["correctness.clean_syncs.dense=3", "correctness.clean_syncs.moe=2"]


@pytest.fixture()
def env(tmp_path, monkeypatch):
    import flows.pipelines as pipelines

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setattr(pipelines, "WARMSTART_CACHE", str(tmp_path / "warmstart"))
    monkeypatch.setattr(pipelines, "REPORTS", str(tmp_path / "reports"))
    return tmp_path


def test_every_fault_is_caught_at_its_first_sync_and_clean_syncs_raise_no_alarm(env):
    from flows.pipelines import nightly_correctness

    out = nightly_correctness(NIGHTLY, REDUCED, stages_to_run=["correctness"])["correctness"]
    matrix = out["matrix"]
    assert sorted(r["fault"] for r in matrix) == sorted(f.name for f in FAULTS)
    for r in matrix:
        assert r["caught_first"] and r[r["condition"]] == 1, r
        assert r["tier"] == "full" and r.get("repaired", True) is not False, r
        assert r["warmup_clean"] in (None, True), r
    assert out["faults/caught_first"] == out["faults/total"] == len(FAULTS)
    assert out["clean/false_alarms"] == 0 and out["clean/syncs"] == 5
    checks = out["checks"]
    assert checks["W6"]["unique"] and checks["W4"]["necessary"] and checks["W2"]["necessary"]
    for c, v in checks.items():  # every check is necessary or the matrix says why not
        assert v["necessary"] or v["why_redundant"], c
    # vLLM's own checksums: at every clean sync and every fault's sync; they see changed bytes, not compute copies
    second = out[ENGINE_CHECKSUM]
    assert (second["clean_syncs_run"], second["clean_disagreements"], second["faults_run"]) == (5, 0, len(FAULTS))
    assert {"sampler-requantizes-floor", "qkv-order-swapped", "pre-step-weights"} <= set(second["fired_on"]), second
    assert not {"expert-copy-negated", "compute-copy-stale", "copy-on-other-grid"} & set(second["fired_on"]), second

    c = tracking.client()
    (run,) = c.search_runs([c.get_experiment_by_name("nightly").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "correctness"
    m = run.data.metrics
    assert (m["faults/caught_first"], m["faults/total"], m["clean/false_alarms"]) == (len(FAULTS), len(FAULTS), 0)
    assert 0 < m["time/checks_s"] < m["time/step_s"]
    assert (m["vllm_checksum/clean_syncs"], m["vllm_checksum/clean_disagreements"]) == (5, 0)
    assert 0 < m["time/vllm_checksum_s"] < m["time/checks_s"]
    files = {f.path for f in c.list_artifacts(run.info.run_id)}
    assert {"detection_matrix.csv", "detection_matrix.png", "matrix_summary.json", "run.log"} <= files
    rows = list(csv.DictReader(open(c.download_artifacts(run.info.run_id, "detection_matrix.csv", str(env)))))
    assert len(rows) == len(FAULTS) and all(r["caught_first"] == "True" for r in rows)
    assert {r["fault"] for r in rows if r[ENGINE_CHECKSUM] == "1"} == set(second["fired_on"])
    png = Path(c.download_artifacts(run.info.run_id, "detection_matrix.png", str(env))).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
