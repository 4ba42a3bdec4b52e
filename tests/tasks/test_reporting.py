"""The sweep report from an MLflow store: several finished runs with their logged tables (as the flow
logs them, one table per run), a failed run and an older duplicate left out, the report written and
logged as the experiment's ``report`` run or the sweep's parent run; its preset order from the sweep's
config as the flow holds it or as the parent run logged it (``sweep.json``), never from a config file."""

from __future__ import annotations

import pytest

from adapters import tracking
from fp8rl_core.metrics.summary import run_kl_summary
from tasks import reporting
from tests.core.report.sweeps import check_rows, step_rows, token_rows

DENSE = "qwen3-dense-mini"
DELTA = {"bf16-sampler": 0.1, "all": 0.1 * 0.84 ** 0.5}  # k3 ∝ δ²: all's KL is 0.84 × the BF16 sampler's


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path


def _log_run(sweep: str, preset: str, seed: int, status: str = "FINISHED", rid: str | None = None,
             sweep_id: str = "sid", parent: str | None = None) -> str:
    rid = rid or f"{preset}-{seed}"
    params = {"preset": preset, "model": DENSE, "seed": str(seed), "learner.tokens_per_microbatch": "4096",
              "learner.group_size": "4"}
    run = tracking.open_run(sweep, sweep_id, rid, f"{DENSE}-{preset}-s{seed}", params, None, parent=parent)
    tokens = token_rows(preset, seed, delta=DELTA[preset])
    tracking.log_table(run, "tokens", tokens)
    tracking.log_table(run, "steps", step_rows(preset, DENSE, seed))
    tracking.log_table(run, "checks", check_rows())
    tracking.log_table(run, "kl_summary", run_kl_summary(tokens, run_id=rid, preset=preset, model=DENSE, seed=seed,
                                                         n_boot=50))
    tracking.log_metrics(run, {"kl/k3": 1.0})
    tracking.terminate(run, status)
    return run


def test_a_sweep_report_from_mlflow(store):
    sweep = "dense-matching"
    _log_run(sweep, "all", 5, rid="old-config", sweep_id="older")  # another expansion of the config (an older sweep): left out
    _log_run(sweep, "all", 0, rid="all-0")  # an older run of the same id: superseded by the newer one below
    for seed in (0, 1, 2):
        for preset in ("bf16-sampler", "all"):
            _log_run(sweep, preset, seed)
    _log_run(sweep, "all", 7, status="FAILED")
    data = reporting.sweep_data(sweep, store / "dl")
    every = reporting.sweep_data(sweep, store / "dl2", sweep_id=None)
    assert "old-config" in set(every.runs["run_id"]) and "old-config" not in set(data.runs["run_id"])
    assert sorted(data.runs["run_id"]) == sorted(f"{p}-{s}" for p in DELTA for s in (0, 1, 2))
    assert set(data.runs["learner_precision"]) == {"mxfp8"} and set(data.runs["seed"]) == {0, 1, 2}
    assert len(data.tokens) == 6 * len(token_rows("all", 0, delta=0.1)) and data.tokens["run_id"].nunique() == 6
    assert data.steps["run_id"].nunique() == 6 and len(data.kl_summary) == 6 * 3

    out = store / "report"
    summary = reporting.write_sweep_report(sweep, out)
    text = summary.read_text()
    assert text.startswith("# fp8rl report: dense-matching") and "16%" in text
    assert "reproduced" in text and any(p.suffix == ".png" for p in out.iterdir())
    c = tracking.client()
    reports = [r for r in c.search_runs([c.get_experiment_by_name(sweep).experiment_id])
               if r.data.tags.get("fp8rl.kind") == "report"]
    assert len(reports) == 1 and reports[0].info.status == "FINISHED"  # no parent run (an older store): a run of its own
    assert "report/summary.md" in {f.path for f in c.list_artifacts(reports[0].info.run_id, "report")}


def test_the_report_goes_to_the_sweeps_parent_run_with_its_figures_inside_and_the_aggregates(store):
    import base64
    import re

    sweep = "dense-matching"
    parent = tracking.open_sweep_run(sweep, "sid", {"axes.seed": "[0, 1]"}, "two presets")
    for seed in (0, 1):
        for preset in ("bf16-sampler", "all"):
            _log_run(sweep, preset, seed, parent=parent)
    assert tracking.find_sweep_run(sweep, "sid") == parent and tracking.find_sweep_run(sweep, "other") is None
    tracking.end_sweep_run(parent, [tracking.RunRow("r", "m", "x", "FINISHED")] * 4)
    data = reporting.sweep_data(sweep, store / "dl")
    assert parent not in set(data.runs["mlflow_run"]) and len(data.runs) == 4  # the parent is no run of the sweep

    summary = reporting.write_sweep_report(sweep, store / "report")
    c = tracking.client()
    runs = c.search_runs([c.get_experiment_by_name(sweep).experiment_id])
    assert not [r for r in runs if r.data.tags.get("fp8rl.kind") == "report"]  # no sibling report run
    run = c.get_run(parent)
    assert run.info.status == "FINISHED" and run.data.tags["fp8rl.kind"] == "sweep"
    files = {f.path for f in c.list_artifacts(parent, "report")}
    assert {"report/summary.md", "report/summary.html", "report/kl_by_preset.png"} <= files
    html = summary.with_name("summary.html").read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', html)
    pngs = [p for p in summary.parent.iterdir() if p.suffix == ".png"]
    assert len(images) == len(pngs) > 0 and "](" not in html  # every figure inside, no link left as text
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    m = run.data.metrics
    for preset in ("bf16-sampler", "all"):
        key = f"agg/{DENSE}/{preset}/kl_k3_micronats"
        assert m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"] and m[key] > 0, key
    assert m[f"agg/{DENSE}/all/kl_k3_micronats"] < m[f"agg/{DENSE}/bf16-sampler/kl_k3_micronats"]


def test_an_unknown_or_empty_sweep_is_named(store):
    with pytest.raises(LookupError, match="no MLflow experiment named 'nope'"):
        reporting.sweep_data("nope", store / "dl")
    _log_run("empty", "all", 0, status="FAILED")
    with pytest.raises(LookupError, match="sweep 'empty' has no FINISHED run"):
        reporting.sweep_data("empty", store / "dl")


def test_the_figures_follow_the_preset_axis_the_sweep_carried_or_logged_not_a_config_file(store, monkeypatch):
    """``fp8rl report`` takes the preset axis from the ``sweep.json`` of the reported expansion's parent
    run, the flow from the sweep config it holds; a ``configs/<sweep>.yaml`` in the working directory (here
    one with another axis) is not read."""
    from fp8rl_core.config.sweep import SweepConfig

    sweep = "dense-matching"
    monkeypatch.chdir(store)
    (store / "configs").mkdir()
    (store / "configs" / f"{sweep}.yaml").write_text(f"sweep: {sweep}\naxes: {{preset: [bf16-sampler, all]}}\n")
    for preset in ("bf16-sampler", "all"):  # an expansion recorded without a parent run
        _log_run(sweep, preset, 0, rid=f"old-{preset}", sweep_id="old")
    assert reporting.sweep_data(sweep, store / "dl0").presets is None  # nothing logged: the canonical order
    parent = tracking.open_sweep_run(sweep, "sid", {}, "")
    tracking.log_json(parent, "sweep.json", {"sweep": sweep, "axes": {"preset": ["all", "bf16-sampler"], "seed": [0]},
                                             "config": "configs/dense-matching.yaml", "overrides": []})
    for preset in ("bf16-sampler", "all"):
        _log_run(sweep, preset, 0, parent=parent)
    assert tracking.sweep_json(parent)["axes"]["preset"] == ["all", "bf16-sampler"]
    assert reporting.sweep_data(sweep, store / "dl1").presets == ["all", "bf16-sampler"]
    held = SweepConfig(sweep=sweep, axes={"preset": ["requant", "bf16-sampler", "all"]})
    assert reporting.sweep_data(sweep, store / "dl2", config=held).presets == ["requant", "bf16-sampler", "all"]
    assert reporting.sweep_data(sweep, store / "dl3", config=SweepConfig(sweep=sweep)).presets is None
    summary = reporting.write_sweep_report(sweep, store / "report", log=False).read_text()
    assert summary.index("| all |") < summary.index("| bf16-sampler |")

