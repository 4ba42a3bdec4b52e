"""A real Prefect server for the flow tests that deploy (tests/flows/test_verl.py's sweep): on loopback, with
its home, SQLite database and results in a temporary folder and an environment without a person's
PREFECT_* / MLFLOW_* settings (prefect.toml is read from the project root, where every command runs); and
what `prefect deploy --all` of deployments/prefect.yaml must have declared."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
PREFECT_FILE = "deployments/prefect.yaml"

CLI_TIMEOUT_S = 180       # one CLI command (deploy imports the flows: torch, vLLM)
SERVER_START_S = 180      # until /api/health answers

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
    """A Prefect server on loopback in ``tmp`` (its home and SQLite database there), a clean environment with
    ``FP8RL_WORK_POOL`` = ``pool``; ``cli``/``get``/``post`` talk to it."""

    def __init__(self, tmp: Path, pool: str):
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
            "FP8RL_WORK_POOL": pool,
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


def assert_deployments(server: Server, pool: str) -> None:
    """What `prefect deploy --all --prefect-file deployments/prefect.yaml` declared on ``server`` for ``pool``
    (``FP8RL_WORK_POOL``): the six deployments by name and entrypoint, a verl sweep's runs as flow runs of the
    pool's own `verl-run` deployment on queue `verl`, the nightly schedules, the project root as every flow run's
    working directory."""
    deployments = {f"{d['name']}@{d['entrypoint']}": d for d in server.post("/deployments/filter", {})}
    assert set(deployments) == {"default@flows/pipelines.py:mxfp8_sweep",
                                "verl-smoke@flows/pipelines.py:mxfp8_sweep",
                                f"{pool}@flows/pipelines.py:verl_run",
                                "default@flows/pipelines.py:nightly_correctness",
                                "verl@flows/pipelines.py:nightly_correctness",
                                "default@flows/upstream_drift.py:upstream_drift"}, deployments
    verl_run = deployments[f"{pool}@flows/pipelines.py:verl_run"]
    assert verl_run["work_queue_name"] == "verl" and verl_run["job_variables"]["working_dir"] == str(ROOT)
    assert verl_run["job_variables"]["env"] == {"FP8RL_NO_ENGINES": "1"}  # adapters.logs.NO_ENGINES_ENV
    assert deployments["verl-smoke@flows/pipelines.py:mxfp8_sweep"]["parameters"]["work_pool"] == pool
    drift = deployments["default@flows/upstream_drift.py:upstream_drift"]
    assert [s["schedule"].get("cron") for s in drift["schedules"]] == ["0 4 * * *"]
    verl_nightly = deployments["verl@flows/pipelines.py:nightly_correctness"]
    assert verl_nightly["parameters"]["config"] == "configs/nightly-verl.yaml"
    assert [s["schedule"].get("cron") for s in verl_nightly["schedules"]] == ["0 3 * * *"]
    nightly = deployments["default@flows/pipelines.py:nightly_correctness"]
    assert [s["schedule"].get("cron") for s in nightly["schedules"]] == ["0 2 * * *"]
    for d in deployments.values():
        assert d["work_pool_name"] == pool
        assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}], d["pull_steps"]
