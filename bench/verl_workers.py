"""What more workers buy a verl sweep: the same sweep dispatched by Prefect (docs/deploy.md, verl runs on workers)
on a process work pool served by one worker, then by two, in this invocation — the wall clock of each pass, their
ratio, and the CPU time every process of each pass used (sampled; a process's last ~2 s are missed).

Each pass: a fresh Prefect server on loopback, a fresh pool with every deployment of deployments/prefect.yaml
on it, ``--work-queue verl --limit 1`` workers as a node would start them and one worker on queue ``default``
for the sweep's own flow run, a fresh MLflow store (so no run is skipped); the sweep is started as a user starts
it, ``prefect deployment run mxfp8-sweep/verl-smoke --watch`` (with the overrides as its ``overrides``
parameter), and its wall time is from that command's start to its end, the report included. The warm starts
are trained before either pass.

What 2 cores can show: two verl runs side by side on one 2-core machine share the same two cores, so the ratio
here is the overlap of what does not compute (process and Ray start-up, imports, waits) — not what a second
node gives. With one worker per node, runs do not share cores: n workers run a sweep of R runs of ~t each in
about ceil(R / n) × t plus the sweep's own start (the projection printed at the end uses the one-worker pass's
seconds per run).

    .venv/bin/python bench/verl_workers.py                                      # the whole verl smoke (8 runs)
    .venv/bin/python bench/verl_workers.py axes.model=[qwen3-dense-mini] 'axes.preset=[half, all]'   # 2 of them

The last line is ``wall_ratio=<two workers / one worker>``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PREFECT = str(Path(sys.executable).with_name("prefect"))
CONFIG = "configs/verl-smoke.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _CpuMeter:
    """Samples, every 2 s, the CPU seconds of this process's descendants (the last value seen per process)."""

    def __init__(self) -> None:
        import psutil

        self._me, self._seen, self._stop = psutil.Process(), {}, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            for p in self._me.children(recursive=True):
                try:
                    t = p.cpu_times()
                    self._seen[(p.pid, p.create_time())] = t.user + t.system
                except psutil.Error:
                    pass
            self._stop.wait(2)

    def seconds(self) -> float:
        self._stop.set()
        self._t.join()
        return sum(self._seen.values())


def _prepare(overrides: list[str], work: Path) -> None:
    """Train (or load) the runs' warm starts into the warm-start cache before anything is timed."""
    from fp8rl_core.config.runs import Sweep
    from tasks.verl_run import prepare_model

    os.environ["FP8RL_VERL_WORK"] = str(work)
    for run in Sweep.load(CONFIG, overrides).runs:
        prepare_model(run, "bench-warm", os.environ.get("FP8RL_CACHE", ".cache/warmstart"))


def one_pass(workers: int, overrides: list[str], root: Path) -> tuple[float, float, int]:
    """The sweep on a pool of ``workers`` workers: (wall seconds of the sweep, CPU seconds of every process, runs)."""
    import json

    root.mkdir(parents=True)
    port, pool = _free_port(), f"bench-{workers}w"
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))} | {
        "PREFECT_HOME": str(root / "prefect-home"), "PREFECT_SERVER_DATABASE_CONNECTION_URL":
            f"sqlite+aiosqlite:///{root / 'prefect.db'}", "PREFECT_SERVER_MEMO_STORE_PATH": str(root / "memo.toml"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(root / "storage"), "PREFECT_API_URL": api, "DO_NOT_TRACK": "1",
        "FP8RL_WORK_POOL": pool, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "FP8RL_ARTIFACTS": str(root / "artifacts"), "FP8RL_VERL_WORK": str(root / "verl"),
        "FP8RL_REPORTS": str(root / "reports"), "PYTHONPATH": str(ROOT), "PREFECT_WORKER_QUERY_SECONDS": "2"}
    os.environ.update({k: env[k] for k in ("MLFLOW_TRACKING_URI", "FP8RL_ARTIFACTS", "FP8RL_VERL_WORK")})
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port),
                                       "--no-scheduler", "--no-late-runs", "--no-ui"], cwd=ROOT, env=env,
                                      stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        import httpx

        for _ in range(360):
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        for cmd in (["work-pool", "create", pool, "--type", "process"],
                    ["deploy", "--all", "--prefect-file", "deployments/prefect.yaml"]):
            subprocess.run([PREFECT, "--no-prompt", *cmd], cwd=ROOT, env=env, check=True, capture_output=True, timeout=900)
        meter = _CpuMeter()
        procs.append(subprocess.Popen([PREFECT, "--no-prompt", "worker", "start", "--pool", pool, "--type", "process",
                                       "--work-queue", "default", "--limit", "1", "--name", "sweeps"], cwd=ROOT,
                                      env=env, stdout=open(root / "worker-sweeps.log", "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        for i in range(workers):
            procs.append(subprocess.Popen([PREFECT, "--no-prompt", "worker", "start", "--pool", pool, "--type", "process",
                                           "--work-queue", "verl", "--limit", "1", "--name", f"w{i}"], cwd=ROOT, env=env,
                                          stdout=open(root / f"worker{i}.log", "w"), stderr=subprocess.STDOUT,
                                          start_new_session=True))
        t0 = time.monotonic()
        done = subprocess.run([PREFECT, "--no-prompt", "deployment", "run", "mxfp8-sweep/verl-smoke", "--watch",
                               "--params", json.dumps({"overrides": overrides})], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=4 * 3600)
        wall = time.monotonic() - t0
        (root / "deployment-run.log").write_text(done.stdout + done.stderr)
        if done.returncode:
            raise SystemExit(f"{workers} worker(s): the sweep's flow run did not complete (logs in {root}):\n"
                             + "\n".join((done.stdout + done.stderr).splitlines()[-15:]))
        rows = _finished_runs(root / "mlflow.db")
        cpu = meter.seconds()
        for p in procs[1:]:  # the workers: asked to stop, killed if they take longer than a minute
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs[1:]:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        return wall, cpu, len(rows)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _finished_runs(db: Path) -> list[str]:
    """The child runs the sweep recorded FINISHED in this pass's MLflow store (the sweep's parent run excluded)."""
    import sqlite3

    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute(
            "SELECT r.name FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId' "
            "WHERE r.status = 'FINISHED'")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", default=[], help=f"sweep overrides of {CONFIG} (default: none, all its runs)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, stores)")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2],
                    help="the passes, by workers (default 1,2; the ratio needs both)")
    args = ap.parse_args()
    os.chdir(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="fp8rl-verl-workers-"))
    try:
        _prepare(args.overrides, tmp / "warm")
        out = {}
        for workers in args.workers:
            wall, cpu, runs = one_pass(workers, args.overrides, tmp / f"{workers}w")
            out[workers] = (wall, cpu)
            print(f"{workers} worker(s): {runs} runs, wall {wall:.0f} s, CPU {cpu:.0f} s", flush=True)
        if 1 in out:
            per_run = out[1][0] / runs
            for n in (1, 2, 4, 8):
                print(f"projected, {n} node(s) with a worker each, {runs} runs: ~{math.ceil(runs / n) * per_run:.0f} s "
                      f"(ceil({runs}/{n}) x {per_run:.0f} s a run)")
        if 1 in out and 2 in out:
            print(f"cores here: {os.cpu_count()}; CPU time two workers / one: {out[2][1] / out[1][1]:.2f}")
            print(f"wall_ratio={out[2][0] / out[1][0]:.3f}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
