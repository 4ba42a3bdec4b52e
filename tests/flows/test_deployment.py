"""The deployments, for real: a Prefect server on loopback, the process work pool, `prefect deploy` from
deployments/prefect.yaml, `prefect deployment run`, a worker that runs the flow run once — then the flow
run is COMPLETED in Prefect and its experiment is a FINISHED MLflow run with metrics and artifacts.

Everything lives in a temporary folder: Prefect's home and SQLite database, the MLflow store and its
artifacts. Settings come from the project (prefect.toml, read from the project root where every command
runs) and from the environment this test builds — a person's PREFECT_* / MLFLOW_* variables and Prefect
profiles are not used. One tiny run (qwen3-dense-mini, preset `all`, seed 0, one RL step).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
PREFECT_FILE = "deployments/prefect.yaml"
POOL = "fp8rl-local"
#: one run; the 100-step warm start of the session's cache (tests/flows/conftest.py), which the other flow tests share
OVERRIDES = ["axes.seed=[0]", "axes.preset=[all]", "axes.model=[qwen3-dense-mini]", "loop.steps=1", "warmstart.steps=100"]

CLI_TIMEOUT_S = 180       # one CLI command (deploy imports the flows: torch, vLLM)
SERVER_START_S = 180      # until /api/health answers
WORKER_TIMEOUT_S = 1200   # the worker with its one flow run (about 60-90 s alone on 2 cores)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 200) -> str:
    if not path.exists():
        return f"({path.name}: not written)"
    lines = path.read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process group this test started `proc` in (start_new_session), if any of it is left."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


class Server:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.port = _free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        self.log = tmp / "server.log"
        home = tmp / "prefect-home"
        home.mkdir()
        # A clean environment: nothing of a person's Prefect/MLflow configuration (API URL, profile, keys).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env |= {
            "PREFECT_HOME": str(home),  # profiles.toml; and the two files prefect.toml puts under .prefect/:
            "PREFECT_SERVER_MEMO_STORE_PATH": str(home / "memo_store.toml"),
            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
            "PREFECT_API_URL": self.api,
            "DO_NOT_TRACK": "1",  # Prefect's SDK telemetry (server analytics: off in prefect.toml)
            "FP8RL_WORK_POOL": POOL,
        }
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # No scheduler (the nightly deployment's cron must not create runs a worker could pick up), no UI.
        cmd = [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
               "--no-scheduler", "--no-late-runs", "--no-ui"]
        with self.log.open("w") as f:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}:\n{_tail(self.log)}")
            try:
                if httpx.get(f"{self.api}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"prefect server not healthy after {SERVER_START_S} s:\n{_tail(self.log)}")

    def stop(self) -> None:
        if self.proc is None:
            return
        # the server's own process group (start_new_session): the CLI and the uvicorn process it runs
        _kill_group(self.proc, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def cli(self, *args: str, env: dict | None = None, timeout: float = CLI_TIMEOUT_S) -> str:
        """Run `prefect --no-prompt ARGS` in the project root; its output, or an error with it."""
        r = subprocess.run([PREFECT, "--no-prompt", *args], cwd=ROOT, env=env or self.env, capture_output=True,
                           text=True, timeout=timeout)
        out = r.stdout + r.stderr
        if r.returncode != 0:
            raise AssertionError(f"`prefect {' '.join(args)}` exited with {r.returncode}:\n{out}")
        return out

    def get(self, path: str) -> dict:
        r = httpx.get(f"{self.api}{path}", timeout=30)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: dict) -> list | dict:
        r = httpx.post(f"{self.api}{path}", json=body, timeout=30)
        r.raise_for_status()
        return r.json()

    def flow_run_logs(self, flow_run_id: str) -> str:
        try:
            logs = self.post("/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200,
                                              "sort": "TIMESTAMP_ASC"})
            return "\n".join(f"{x['timestamp']} {x['level']} {x['message']}" for x in logs)
        except Exception as e:  # noqa: BLE001 — diagnostics only
            return f"(flow run logs unavailable: {e})"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("prefect"))
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def test_deploy_run_worker_mlflow(server: Server, tmp_path: Path, warmstart_cache: Path):
    t0 = time.monotonic()
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    artifacts = tmp_path / "mlartifacts"
    worker_log = tmp_path / "worker.log"
    outputs: dict[str, str] = {}
    flow_run_id = None
    worker = None
    try:
        outputs["work-pool"] = server.cli("work-pool", "create", POOL, "--type", "process")

        outputs["deploy"] = server.cli("deploy", "--all", "--prefect-file", PREFECT_FILE)
        deployments = {f"{d['name']}@{d['entrypoint']}": d for d in server.post("/deployments/filter", {})}
        assert set(deployments) == {"default@flows/pipelines.py:mxfp8_sweep",
                                    "verl-smoke@flows/pipelines.py:mxfp8_sweep",
                                    f"{POOL}@flows/pipelines.py:verl_run",
                                    "default@flows/pipelines.py:nightly_correctness",
                                    "verl@flows/pipelines.py:nightly_correctness",
                                    "default@flows/upstream_drift.py:upstream_drift"}, deployments
        # a verl sweep's runs: flow runs of the pool's own verl-run deployment, on its queue `verl`
        verl_run = deployments[f"{POOL}@flows/pipelines.py:verl_run"]
        assert verl_run["work_queue_name"] == "verl" and verl_run["job_variables"]["working_dir"] == str(ROOT)
        assert deployments["verl-smoke@flows/pipelines.py:mxfp8_sweep"]["parameters"]["work_pool"] == POOL
        drift = deployments["default@flows/upstream_drift.py:upstream_drift"]
        assert [s["schedule"].get("cron") for s in drift["schedules"]] == ["0 4 * * *"]
        verl_nightly = deployments["verl@flows/pipelines.py:nightly_correctness"]
        assert verl_nightly["parameters"]["config"] == "configs/nightly-verl.yaml"
        assert [s["schedule"].get("cron") for s in verl_nightly["schedules"]] == ["0 3 * * *"]
        for d in deployments.values():
            assert d["work_pool_name"] == POOL
            assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {
                "directory": str(ROOT)}}], d["pull_steps"]
        nightly = deployments["default@flows/pipelines.py:nightly_correctness"]
        assert [s["schedule"].get("cron") for s in nightly["schedules"]] == ["0 2 * * *"]

        params = {"config": "configs/smoke.yaml", "overrides": OVERRIDES}
        outputs["run"] = server.cli("deployment", "run", "mxfp8-sweep/default", "--params", json.dumps(params))
        m = re.search(r"UUID:\s*([0-9a-f-]{36})", outputs["run"])
        assert m, outputs["run"]
        flow_run_id = m.group(1)

        worker_env = server.env | {"MLFLOW_TRACKING_URI": mlflow_uri, "FP8RL_ARTIFACTS": str(artifacts),
                                    "FP8RL_REPORTS": str(artifacts.parent / "reports"), "FP8RL_CACHE": str(warmstart_cache)}
        with worker_log.open("w") as f:
            worker = subprocess.Popen([PREFECT, "--no-prompt", "worker", "start", "--pool", POOL, "--type", "process",
                                       "--name", "test-worker", "--run-once"], cwd=ROOT, env=worker_env,
                                      stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        rc = worker.wait(timeout=WORKER_TIMEOUT_S)
        assert rc == 0, f"worker exited with {rc}"

        state = server.get(f"/flow_runs/{flow_run_id}")["state"]
        assert state["type"] == "COMPLETED", state

        c = MlflowClient(tracking_uri=mlflow_uri)
        exp = c.get_experiment_by_name("smoke")
        assert exp is not None, [e.name for e in c.search_experiments()]
        runs = c.search_runs([exp.experiment_id], filter_string="tags.`prefect.flow_run_id` != 'none'")
        assert len(runs) == 1, [(r.info.run_name, r.info.status) for r in runs]
        run = runs[0]
        assert run.info.status == "FINISHED", run.data.tags.get("error")
        assert run.data.tags["fp8rl.sweep"] == "smoke" and run.data.tags["fp8rl.run_id"]
        assert run.info.run_name == "dense-mini·all·s0"  # the short name (model without its family, preset, seed)
        parent = c.get_run(run.data.tags["mlflow.parentRunId"])  # nested under the sweep's parent run
        assert parent.data.tags["fp8rl.kind"] == "sweep" and parent.info.status == "FINISHED"
        # the experiment ran in a subflow of the deployment's flow run
        assert run.data.tags["prefect.flow_run_id"] != flow_run_id
        subflow = server.get(f"/flow_runs/{run.data.tags['prefect.flow_run_id']}")
        assert subflow["state"]["type"] == "COMPLETED"
        assert subflow["parent_task_run_id"] is not None
        assert run.data.params["loop.steps"] == "1"
        for key in ("reward/mean", "kl/k3", "time/step_s", "time/engine_startup_s"):
            assert key in run.data.metrics, sorted(run.data.metrics)
        root_files = {a.path for a in c.list_artifacts(run.info.run_id)}
        assert {"config.json", "layers.json", "tables"} <= root_files, root_files
        assert "tables/steps.parquet" in {a.path for a in c.list_artifacts(run.info.run_id, "tables")}
        # artifacts went to FP8RL_ARTIFACTS (not into the project)
        assert run.info.artifact_uri.startswith(artifacts.resolve().as_uri()), run.info.artifact_uri
        assert list(artifacts.rglob("steps.parquet"))
        print(f"deploy → run → worker → MLflow checks: {time.monotonic() - t0:.0f} s")
    except BaseException:
        for name, out in outputs.items():
            print(f"----- prefect {name} -----\n{out}")
        print(f"----- worker log -----\n{_tail(worker_log)}")
        if flow_run_id:
            print(f"----- flow run {flow_run_id} logs -----\n{server.flow_run_logs(flow_run_id)}")
        print(f"----- server log -----\n{_tail(server.log)}")
        raise
    finally:
        if worker is not None:  # whatever is left of the worker, its flow-run process and their children
            _kill_group(worker, signal.SIGKILL)
            worker.wait(timeout=30)
