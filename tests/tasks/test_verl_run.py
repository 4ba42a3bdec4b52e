"""tasks.verl_run: the launch of verl's trainer for a backend: verl run — its overrides are the ones
``fp8rl verl-config`` prints, and a real ``python -m verl.trainer.main_ppo`` that verl itself refuses ends with
verl's exit status and verl's own error line (how that line is made from verl's output:
tests/adapters/test_verl_process.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapters import tracking
from fp8rl_core.config.runs import Sweep
from fp8rl_core.verl.payload import VerlPayload
from tasks.verl_run import launch_overrides, launch_payload, payload_path, run_verl, work_dir


@pytest.fixture(autouse=True)
def _gsm8k_files(gsm8k_home):
    """configs/gpu/*.yaml read ~/data/gsm8k: the test's GSM8K files there."""


ROOT = Path(__file__).resolve().parents[2]
GPU8B = str(ROOT / "configs" / "gpu" / "qwen3-8b.yaml")


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("FP8RL_VERL_WORK", str(tmp_path / "verl"))
    return tmp_path


def test_verl_config_prints_exactly_the_launchers_overrides(store, gsm8k_home):
    from flows.cli import app

    args = [GPU8B, "axes.seed=[1]", "axes.preset=[half]"]
    res = CliRunner().invoke(app, ["verl-config", *args, "--mlflow-run", "0123abcd", "--ray-address", "10.0.0.1:6379"])
    assert res.exit_code == 0, res.output
    loaded = Sweep.load(args[0], args[1:])
    sweep, (run,) = loaded.config, loaded.runs
    printed = [line.split("    # ")[0] for line in res.output.splitlines()[2:] if not line.startswith("#")]
    printed = printed[:printed.index("model_engine: megatron")]  # the overrides, before the composed config
    payload = launch_payload(run, sweep.sweep)
    launched = launch_overrides(run, sweep.sweep, payload, mlflow_run_id="0123abcd", ray_address="10.0.0.1:6379")
    assert printed == [o.hydra() for o in launched]
    assert (f"writes the payload into {work_dir(sweep.sweep, run)} and runs: "  # the GSM8K files stay where they are
            "python -m verl.trainer.main_ppo") in res.output
    # the payload, as comment lines after the overrides: where it is and what it holds
    lines = res.output.splitlines()
    at = lines.index(f"# --- the payload verl's processes read (FP8RL_VERL_PAYLOAD={payload_path(sweep.sweep, run)}) ---")
    shown = "\n".join(x[2:] for x in lines[at + 1:lines.index("# --- verl's ppo_trainer composed with them ---")])
    assert VerlPayload.model_validate_json(shown) == payload
    assert f"data.train_files={(Path(gsm8k_home) / 'data' / 'gsm8k' / 'train.parquet').resolve()}" in printed
    assert "+ray_kwargs.ray_init.address='10.0.0.1:6379'" in printed
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID='0123abcd'" in printed
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_TRACKING_URI='{tracking.tracking_uri()}'" in printed


def test_a_run_verl_refuses_ends_with_verls_status_and_its_own_message(store):
    """The real ``python -m verl.trainer.main_ppo`` with the launcher's overrides: verl composes them and its
    ``validate_config`` refuses 3-way tensor parallelism on 8 GPUs — before it starts Ray, so the test
    needs neither a cluster nor a GPU."""
    loaded = Sweep.load(GPU8B, ["axes.seed=[0]", "axes.preset=[all]", "verl.tensor_parallel=3",
                                "verl.micro_batch_size_per_gpu=1"])
    sweep, (expanded,) = loaded.config, loaded.runs
    run = expanded
    mlflow_run = tracking.open_run(sweep.sweep, "s", run.id, "r", {}, None)
    out = run_verl.fn(run, sweep.sweep, mlflow_run)
    assert out.returncode == 1
    assert out.reason.startswith("verl's main_ppo exited with status 1: ")
    assert "n_gpus (8) must be divisible by model_parallel_size (3)" in out.reason  # verl's own words
    assert len(out.reason) < 1000 and "model_engine=megatron" not in out.reason  # not Hydra's echo of the overrides
    assert "Traceback" not in out.reason  # its exception line alone (tests/adapters/test_verl_process.py)
    work = work_dir(sweep.sweep, run)
    assert out.log == work / "main_ppo.log"
    # it ran with the launcher's overrides and payload (what `fp8rl verl-config --mlflow-run` prints), on the GSM8K
    # files where they are (nothing written beside the payload)
    payload = launch_payload(run, sweep.sweep)
    expect = [o.hydra() for o in launch_overrides(run, sweep.sweep, payload, mlflow_run_id=mlflow_run)]
    assert (work / "main_ppo.args").read_text().splitlines() == expect
    assert VerlPayload.read(work / "payload.json") == payload
    assert not (work / "train.parquet").exists() and f"data.train_files={Path(run.config.data.train).expanduser().resolve()}" in expect
    files = {f.path for f in tracking.client().list_artifacts(mlflow_run, "verl")}
    assert files == {"verl/main_ppo.args", "verl/main_ppo.log", "verl/payload.json", "verl/config.yaml"}  # Hydra composed it


def test_record_logs_fp8rls_parts_per_step_and_their_share_of_verls_step(store):
    from fp8rl_core.verl.costs import COSTS_FILE, append_cost, read_costs
    from tasks.verl_run import record

    mlflow_run = tracking.open_run("s", "s", "r1", "r", {}, None)
    tracking.log_metrics(mlflow_run, {"timing_s/step": 10.0}, step=1)
    tracking.log_metrics(mlflow_run, {"timing_s/step": 30.0}, step=2)
    path = store / COSTS_FILE
    for step in (1, 2):  # the adapter's line and the trainer's capture line of each step
        append_cost(path, step, {"export_s": 0.5, "update_s": 2.0, "keep_s": 0.25, "checks_s": float(step)})
        append_cost(path, step, {"capture_s": 0.25})
    out = record(mlflow_run, [], None, (), read_costs(path))
    assert out["fp8rl/checks_s"] == 1.5 and out["fp8rl/added_s"] == pytest.approx(0.5 + 0.25 + 1.5 + 0.25)
    assert out["fp8rl/added_share"] == pytest.approx(2.5 / 20.0)
    history = tracking.client().get_metric_history(mlflow_run, "fp8rl/checks_s")
    assert sorted((m.step, m.value) for m in history if m.step > 0) == [(1, 1.0), (2, 2.0)]


def test_record_logs_where_the_runs_wall_went(store):
    from fp8rl_core.verl.startup import STARTUP_FILE, mark, read_milestones
    from tasks.verl_run import record

    mlflow_run = tracking.open_run("s", "s", "r2", "r", {}, None)
    path = store / STARTUP_FILE
    t0 = 1_800_000_000.0
    for name, dt in (("run_start", 0.0), ("dataset", 1.0), ("model", 3.0), ("payload", 3.5), ("config", 4.0), ("launch", 4.0)):
        mark(path, name, t0 + dt)
    mark(path, "register", t0 + 20.0, pid=2, role="TaskRunnerV1", process_start=t0 + 15.0, raylet_start=t0 + 12.0, seconds=0.5)
    mark(path, "server", t0 + 30.0)
    mark(path, "server_up", t0 + 50.0)
    for v, (a, b) in enumerate(((55.0, 57.0), (60.0, 61.0), (64.0, 65.0))):
        mark(path, "sync_start", t0 + a, version=v)
        mark(path, "sync_done", t0 + b, version=v)
        if v == 0:  # verl starts the agent loop's worker at the first step
            mark(path, "register", t0 + 58.0, pid=3, role="AgentLoopWorkerTQ", process_start=t0 + 57.0, raylet_start=t0 + 12.0, seconds=0.5)
    mark(path, "run_end", t0 + 75.0)
    out = record(mlflow_run, [], None, (), (), read_milestones(path))
    logged = tracking.client().get_run(mlflow_run).data.metrics
    expect = {"preparation": 4.0, "verl_driver": 8.0, "taskrunner": 8.0, "workers": 10.0, "vllm_server": 20.0,
              "first_sync": 7.0, "agent_loop": 1.0, "steps": 7.0, "end": 10.0}
    for name, seconds in expect.items():
        assert out[f"time/startup/{name}_s"] == logged[f"time/startup/{name}_s"] == seconds, name
    assert logged["time/startup/wall_s"] == 75.0 and logged["time/startup/warm_step_s"] == 4.0
    assert logged["time/startup/projected_200_steps_s"] == 75.0 + 198 * 4.0
    assert logged["time/startup/fp8rl/preparation/warm_start_copy_s"] == 2.0


def test_record_logs_the_captured_nemo_numbers_at_their_step(tmp_path, monkeypatch):
    """fp8rl's own per-step numbers of the trainer's capture (NeMo-RL's token_mult_prob_error and gen_kl_error) reach
    the run's record at their RL step; the captured numbers verl logs itself (rollout_corr/*) are not logged again.
    MLflow's client is a stand-in here (no store): what record hands it is the subject."""
    from fp8rl_core.verl import capture
    from tasks import verl_run

    logged: list[tuple[int, dict]] = []

    class _Client:
        def get_metric_history(self, run, key):
            return []

    monkeypatch.setattr(verl_run.tracking, "client", lambda: _Client())
    monkeypatch.setattr(verl_run.tracking, "log_metrics", lambda run, metrics, step=0: logged.append((step, dict(metrics))))
    folder = tmp_path / "tokens"
    for step, (mult, gen) in {1: (1.02, 0.004), 2: (1.5, 0.25)}.items():
        capture.write_step(folder, step, [], {"rollout_corr/k3_kl": gen, "mismatch/token_mult_prob_error": mult,
                                              "mismatch/gen_kl_error": gen, "tokens": 10.0})
    verl_run.record("r", [], None, (), (), (), capture.read_step_metrics(folder))
    assert [(s, m) for s, m in logged if s > 0] == [
        (1, {"mismatch/token_mult_prob_error": 1.02, "mismatch/gen_kl_error": 0.004}),
        (2, {"mismatch/token_mult_prob_error": 1.5, "mismatch/gen_kl_error": 0.25})]
