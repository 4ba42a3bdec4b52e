"""MLflow as the place users compare runs: one small sweep (two presets of the dense mini model, one seed,
two RL steps, with its report) recorded once per module, then read back through MLflow's API — the parent
run and its nested runs, tags, names, descriptions, one ``reward/mean`` value per step, the headline
metrics, figures, previewable tables, a clean ``run.log`` — and looked at in a real browser: ``mlflow ui``
on loopback against the store, Debian's headless Chromium driven by Selenium, opening the links that
``fp8rl runs`` prints. On a failed browser check the page's screenshot is saved under
``$FP8RL_TEST_ARTIFACTS`` (default ``test-artifacts/``); the compare view's screenshot is saved there
always (the README's picture is one)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adapters import tracking

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
PRESETS = ("bf16-sampler", "all")
#: a short warm start: what the UI shows does not depend on how well the model answers
TWO_PRESETS = ["axes.seed=[0]", f"axes.preset=[{','.join(PRESETS)}]", "axes.model=[qwen3-dense-mini]", "loop.steps=2",
               "warmstart.steps=100"]
NAMES = [f"dense-mini·{p}·s0" for p in PRESETS]
ARTIFACTS = Path(os.environ.get("FP8RL_TEST_ARTIFACTS", ROOT / "test-artifacts"))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, warmstart_cache):
    """The sweep, recorded in a SQLite store of its own (its runs in this process, one after another: the
    second run's log must not carry the first's lines). Yields the store's settings and the flow's rows."""
    import flows.pipelines as pipelines

    root = tmp_path_factory.mktemp("ui")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "FP8RL_ARTIFACTS": str(root / "artifacts")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cache, reports = pipelines.WARMSTART_CACHE, pipelines.REPORTS
    pipelines.WARMSTART_CACHE, pipelines.REPORTS = str(warmstart_cache), str(root / "reports")
    try:
        rows = pipelines.mxfp8_sweep(SMOKE, TWO_PRESETS, inline=True)
        yield {"root": root, "rows": rows} | env
    finally:
        pipelines.WARMSTART_CACHE, pipelines.REPORTS = cache, reports
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _experiment_runs(name: str):
    c = tracking.client()
    exp = c.get_experiment_by_name(name)
    return exp, c.search_runs([exp.experiment_id])


def test_the_sweep_reads_back_as_a_parent_with_its_runs_named_tagged_and_described(sweep):
    assert [r.status for r in sweep["rows"]] == ["FINISHED", "FINISHED"]
    exp, runs = _experiment_runs("smoke")
    (parent,) = [r for r in runs if r.data.tags.get("fp8rl.kind") == "sweep"]
    children = sorted((r for r in runs if r.data.tags.get("fp8rl.run_id")), key=lambda r: NAMES.index(r.info.run_name))
    assert len(runs) == 3 and [r.info.run_name for r in children] == NAMES  # no sibling report run
    assert parent.info.status == "FINISHED" and parent.info.run_name.startswith("smoke·")
    assert parent.data.params["axes.preset"] == '["bf16-sampler", "all"]'  # the sweep's config
    assert "five presets" in parent.data.tags["mlflow.note.content"]  # the sweep's description
    assert "five presets" in exp.tags["mlflow.note.content"] and exp.tags["mlflow.experimentKind"] == "custom_model_development"
    for run, preset in zip(children, PRESETS):
        t = run.data.tags
        assert t["mlflow.parentRunId"] == parent.info.run_id and run.info.status == "FINISHED"
        assert {k: t[k] for k in ("model", "preset", "seed", "sweep")} == {
            "model": "qwen3-dense-mini", "preset": preset, "seed": "0", "sweep": "smoke"}
        assert t["mlflow.note.content"].startswith(f"qwen3-dense-mini, preset {preset} (") and "2 RL steps" in t["mlflow.note.content"]
    # the report and the per-model × preset aggregates with CIs are the parent's
    files = {f.path for f in tracking.client().list_artifacts(parent.info.run_id, "report")}
    assert {"report/summary.md", "report/summary.html", "report/kl_by_preset.png"} <= files
    m = parent.data.metrics
    for preset in PRESETS:
        key = f"agg/qwen3-dense-mini/{preset}/kl_k3_micronats"
        assert m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"], key
    assert m["runs/total"] == 2 and m["runs/finished"] == 2 and m["runs/failed"] == 0


def test_each_run_has_one_reward_per_step_headline_metrics_figures_tables_and_a_clean_log(sweep):
    c = tracking.client()
    _, runs = _experiment_runs("smoke")
    children = {r.info.run_name: r for r in runs if r.data.tags.get("fp8rl.run_id")}
    for name, run in children.items():
        rid = run.info.run_id
        history = c.get_metric_history(rid, "reward/mean")
        assert sorted(h.step for h in history) == [1, 2], name  # exactly one value per step, the run mean apart
        steps = pq.read_table(c.download_artifacts(rid, "tables/steps.parquet", str(sweep["root"] / name))).to_pylist()
        assert {h.step: h.value for h in history} == {s["step"]: pytest.approx(s["mean_reward"]) for s in steps}
        m = run.data.metrics
        assert m["reward/run_mean"] == pytest.approx(sum(s["mean_reward"] for s in steps) / 2)
        assert m["reward/mean"] == pytest.approx(steps[-1]["mean_reward"])  # "latest" is the last step's
        four = {"rel": 5e-4}  # the headline values are rounded to four significant digits
        assert m["headline/kl_k3_micronats"] == pytest.approx(m["kl/k3"] * 1e6, **four)
        assert m["headline/full_kl_micronats"] == pytest.approx(m["kl/full_kl"] * 1e6, **four)
        assert m["headline/abs_dlogp_x1e3"] == pytest.approx(m["kl/mean_abs_logprob_diff"] * 1e3, **four)
        assert m["headline/reward_final"] == pytest.approx(m["reward/final"], **four)
        assert m["headline/warm_step_s"] == pytest.approx(steps[1]["total_s"], **four)  # the second step: no warm-up
        assert len(f"{m['headline/kl_k3_micronats']:g}") <= 7  # short in a narrow column
        # what the KLs rest on: their intervals, and the sequences as whole counts
        assert m["headline/kl_k3_lo_micronats"] == pytest.approx(m["kl/k3_lo"] * 1e6, **four)
        assert m["headline/full_kl_hi_micronats"] == pytest.approx(m["kl/full_kl_hi"] * 1e6, **four)
        assert m["headline/kl_sequences"] == m["kl/sequences"] == 32  # 2 steps × 4 prompts × 4 samples
        assert m["headline/kl_tokens"] == m["kl/tokens"] and m["headline/full_kl_sequences"] == m["kl/full_sequences"]
        assert m["check/passed"] == 1.0 and not any(re.fullmatch(r"check/W\d", k) for k in m)
        files = {f.path for f in c.list_artifacts(rid)} | {f.path for d in ("tables", "figures")
                                                          for f in c.list_artifacts(rid, d)}
        assert {"figures/kl_reward_per_step.png", "figures/abs_dlogp_hist.png", "tables/steps.csv",
                "tables/kl_summary.csv", "tables/checks.csv", "run.log"} <= files
        csv = Path(c.download_artifacts(rid, "tables/steps.csv", str(sweep["root"] / name))).read_text().splitlines()
        assert len(csv) == 3 and csv[0].startswith("step,")
        log = Path(c.download_artifacts(rid, "run.log", str(sweep["root"] / name))).read_text().splitlines()
        assert len(log) == len(set(log)), [l for l in log if log.count(l) > 1][:3]  # each line once
        assert any("[train-step-" in l for l in log) and any("step 2/2: reward" in l for l in log)
        assert any(f"run {name}: set up in" in l for l in log)
        other = next(n for n in children if n != name)
        assert not any(other in l for l in log)  # nothing from the other run (the same process ran both)


# ---------------------------------------------------------------------------------------- the browser

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _mlflow_ui(env: dict, log: Path):
    """``mlflow ui`` on a free loopback port against the sweep's store; yields its base URL."""
    import urllib.request

    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", env["MLFLOW_TRACKING_URI"],
           "--default-artifact-root", Path(env["FP8RL_ARTIFACTS"]).as_uri(), "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow ui exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"mlflow ui did not answer on {base} within 2 min: {log.read_text()[-2000:]}")
        yield base
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def _chromium():
    """Debian's Chromium and its driver, headless (``.ci/run`` installs them: ``chromium chromium-driver``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    missing = [p for p in (browser, driver) if not Path(p).is_file()]
    assert not missing, f"{missing} not found: apt-get install -y chromium chromium-driver (.ci/run does)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1600,1000"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def _wait_for_text(driver, texts: list[str], seconds: float = 90.0) -> None:
    """Until every text is shown on the page (in a displayed element), or fail naming what is missing."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + seconds
    missing = texts
    while time.monotonic() < deadline:
        missing = []
        for t in texts:
            els = driver.find_elements(By.XPATH, f"//*[text()[contains(normalize-space(.), {_xpath_literal(t)})]]")
            if not any(e.is_displayed() for e in els):
                missing.append(t)
        if not missing:
            return
        time.sleep(1.0)
    raise AssertionError(f"not shown on {driver.current_url} after {seconds:.0f} s: {missing}")


def _close_assistant(driver) -> None:
    """Close MLflow's assistant panel if it opened (it covers a third of the page)."""
    from selenium.webdriver.common.by import By

    for b in driver.find_elements(By.CSS_SELECTOR, 'button[data-component-id="mlflow.assistant.chat_panel.close"]'):
        if b.is_displayed():
            b.click()


def _xpath_literal(s: str) -> str:
    return f"'{s}'" if "'" not in s else "concat('" + s.replace("'", "',\"'\",'") + "')"


def test_the_mlflow_ui_shows_the_headline_columns_run_names_and_the_reports_figures(sweep, request):
    from selenium.webdriver.common.by import By
    from typer.testing import CliRunner

    from flows import cli

    result = CliRunner().invoke(cli.app, ["runs", "--sweep", "smoke"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    exp_url = next(l.split(": ", 1)[1] for l in result.output.splitlines() if l.startswith("MLflow UI"))
    compare = next(l.split(": ", 1)[1] for l in result.output.splitlines()
                   if l.startswith("compare the 2 presets of qwen3-dense-mini, seed 0"))
    exp, runs = _experiment_runs("smoke")
    (parent,) = [r for r in runs if r.data.tags.get("fp8rl.kind") == "sweep"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with _mlflow_ui(sweep, ARTIFACTS / "mlflow-ui.log") as base:
        driver = _chromium()
        page = "start"
        try:
            page = "experiment"  # the shared view: the runs flat, sorted by KL, the tags and headline columns
            driver.get(exp_url.replace(tracking.ui_url(), base))
            _wait_for_text(driver, ["Model training", "five presets", *NAMES, parent.info.run_name])
            _close_assistant(driver)
            # wide enough for every column of the view at once (the UI renders only the columns in sight; it
            # orders the metric columns by name, the KLs' intervals and counts among the headline ones)
            driver.set_window_size(3200, 1000)
            _wait_for_text(driver, ["Sort: headline/kl_k3_micronats", "preset", "seed",
                                    *(m for m, *_ in tracking.HEADLINE), *(m for m, *_ in tracking.HEADLINE_BASIS)],
                           seconds=30)
            driver.save_screenshot(str(ARTIFACTS / "mlflow-experiment.png"))
            driver.set_window_size(1600, 1000)

            page = "compare"  # the presets of one model and seed side by side
            driver.get(compare.replace(tracking.ui_url(), base))
            _wait_for_text(driver, ["Comparing 2 Runs", *NAMES])
            _close_assistant(driver)
            _wait_for_text(driver, ["headline/abs_dlogp_x1e3"], seconds=30)  # the metrics table's first headline row
            # and the others below it: the metrics table scrolls inside a box of its own and renders only the rows
            # in sight (ordered by name, check/* and others before the headline ones), so scroll it down and collect
            from selenium.webdriver.common.by import By

            first = driver.find_element(By.XPATH, "//*[text()[contains(normalize-space(.), 'headline/abs_dlogp_x1e3')]]")
            want = {m for m, *_ in tracking.HEADLINE}
            seen: set[str] = set()
            for _ in range(40):
                seen |= {m for m in want if m in driver.page_source}
                if seen == want:
                    break
                driver.execute_script(
                    "let e = arguments[0]; while (e && !(e.scrollHeight > e.clientHeight + 2 && "
                    "getComputedStyle(e).overflowY !== 'visible')) e = e.parentElement; if (e) e.scrollTop += 80;", first)
                time.sleep(0.3)
            assert seen == want, want - seen
            driver.set_window_size(1600, 1700)  # run names, params and the metrics' headline rows in one picture
            heading = driver.find_elements(By.XPATH, "//*[text()[normalize-space(.)='Run details']]")[-1]
            driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", heading)
            time.sleep(1.0)
            driver.save_screenshot(str(ARTIFACTS / "mlflow-compare.png"))
            driver.set_window_size(1600, 1000)

            page = "report"
            driver.get(f"{base}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}/artifacts/report/kl_by_preset.png"
                       "?workflowType=machine_learning")
            deadline = time.monotonic() + 90
            loaded = []
            while time.monotonic() < deadline and not loaded:
                loaded = driver.execute_script("return Array.from(document.images).filter("
                                               "i => i.complete && i.naturalWidth > 300).map(i => i.src)")
                time.sleep(1.0)
            assert loaded, f"no figure loaded on {driver.current_url}"
            driver.save_screenshot(str(ARTIFACTS / "mlflow-report.png"))
        except BaseException:
            driver.save_screenshot(str(ARTIFACTS / f"failed-{request.node.name}-{page}.png"))
            (ARTIFACTS / f"failed-{request.node.name}-{page}.html").write_text(driver.page_source)
            raise
        finally:
            driver.quit()
