"""Scale-out for real: a small sweep of the smoke minis dispatched by the mxfp8-sweep flow on a two-node
Ray cluster on this machine (a head and a worker node, each started with ``ray start`` on loopback with one
CPU), tracked by an MLflow server on PostgreSQL. Every run finishes with its record readable through the
server, both nodes are used, killing one run's Ray worker fails that run (and only it) with the cause,
PostgreSQL stopped and started again while a run logs is ridden out, and reruns skip what finished."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from adapters import tracking
from adapters import tracking_server as ts

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
#: four runs of the dense mini from the session's 100-step warm start (tests/flows/conftest.py; nothing here
#: depends on how well it answers), which the other flow tests share: Ray's workers on both nodes load it
FOUR_RUNS = ["axes.seed=[0]", "axes.preset=[all,bf16-e2e,half,other-grid]", "axes.model=[qwen3-dense-mini]",
             "loop.steps=1", "sweep=scale-out", "warmstart.steps=100"]


def _ray_exe() -> str:
    exe = Path(sys.executable).with_name("ray")
    assert exe.is_file(), f"no `ray` next to {sys.executable}"
    return str(exe)


def _alive_nodes(address: str) -> int:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return sum(1 for n in ray.nodes() if n["Alive"])
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head and a worker node, one CPU each, on loopback ports of their own; stopped (and every process
    they started) after the module."""
    tmp = tmp_path_factory.mktemp("ray")
    sessions = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    port = ts.free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--block", "--disable-usage-stats"]
    head = subprocess.Popen([_ray_exe(), "start", "--head", f"--port={port}", "--include-dashboard=false",
                             f"--ray-client-server-port={ts.free_port()}", f"--dashboard-agent-listen-port={ts.free_port()}",
                             f"--temp-dir={sessions}", *common],
                            cwd=ROOT, env=env, stdout=open(tmp / "head.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    procs = [head]
    address = f"127.0.0.1:{port}"

    def worker_node(attempt: int) -> subprocess.Popen:
        return subprocess.Popen(
            [_ray_exe(), "start", f"--address={address}", f"--dashboard-agent-listen-port={ts.free_port()}", *common],
            cwd=ROOT, env=env, stdout=open(tmp / f"worker{attempt}.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)

    try:
        deadline, attempts = time.time() + 300, 0
        while time.time() < deadline:
            assert head.poll() is None, (tmp / "head.log").read_text()[-3000:]
            if len(procs) == 1 and "Ray runtime started" in (tmp / "head.log").read_text():
                procs.append(worker_node(attempts := attempts + 1))
            if len(procs) == 2 and procs[1].poll() is not None and attempts < 3:
                # `ray start` gives a node 30 s (hard-coded in ray/_private/node.py) to register with the head's
                # GCS, which a loaded 2-core machine can exceed: that node is gone (its log says why), start it again
                try:
                    os.killpg(procs[1].pid, signal.SIGKILL)  # whatever that start left of its node
                except ProcessLookupError:
                    pass
                procs[1] = worker_node(attempts := attempts + 1)
            if (len(procs) == 2 and procs[1].poll() is None and "Ray runtime started" in
                    (tmp / f"worker{attempts}.log").read_text() and _alive_nodes(address) == 2):
                break
            time.sleep(2)
        else:
            logs = "".join((tmp / f"worker{i}.log").read_text()[-1500:] for i in range(1, attempts + 1))
            pytest.fail(f"the two-node Ray cluster did not come up:\n{(tmp / 'head.log').read_text()[-1500:]}\n{logs}")
        yield address
    finally:
        for p in reversed(procs):  # `ray start --block` stops its node's processes on SIGTERM
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(sessions, ignore_errors=True)


@pytest.fixture()
def env(servers, ray_cluster, tmp_path_factory, warmstart_cache, monkeypatch):
    import flows.pipelines as pipelines

    db, server = servers
    root = tmp_path_factory.mktemp("scale-out")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setattr(pipelines, "WARMSTART_CACHE", str(warmstart_cache))
    monkeypatch.setattr(pipelines, "REPORTS", str(root / "reports"))
    return {"db": db, "server": server, "address": ray_cluster, "root": root}


def _runs(sweep: str, kind: str | None = None) -> list:
    """The sweep's experiment runs (``kind='sweep'``: its parent runs instead)."""
    c = tracking.client()
    exp = c.get_experiment_by_name(sweep)
    found = [] if exp is None else c.search_runs([exp.experiment_id])
    return [r for r in found if r.data.tags.get("fp8rl.kind") == kind]


def _kill_when_running(preset: str, killed: list, stop: threading.Event) -> None:
    """Kill (SIGKILL) the Ray worker of the run of ``preset`` once it has logged its set-up: mid-run."""
    while not stop.is_set():
        for r in _runs("scale-out"):
            if r.data.params.get("preset") == preset and r.info.status == "RUNNING" and "time/setup_s" in r.data.metrics:
                pid = int(r.data.tags["fp8rl.pid"])
                killed.append((r.info.run_id, pid, [c.pid for c in psutil.Process(pid).children(recursive=True)]))
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.5)


def _outage_when_running(db: ts.Postgres, seen: list, stop: threading.Event) -> None:
    """Stop PostgreSQL for 5 s as soon as a run is RUNNING (it is logging), then start it again."""
    while not stop.is_set():
        if any(r.info.status == "RUNNING" for r in _runs("scale-out")):
            db.stop()
            seen.append(time.time())
            time.sleep(5)
            db.start()
            seen.append(time.time())
            return
        time.sleep(0.5)


def test_a_sweep_on_two_ray_nodes_tracked_by_mlflow_on_postgres(env):
    from flows.pipelines import mxfp8_sweep

    # 1. four runs on the cluster; the worker of the `half` run is killed mid-run
    killed: list = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_running, args=("half", killed, stop), daemon=True)
    killer.start()
    try:
        with pytest.raises(RuntimeError, match="1 of 4 runs failed: dense-mini·half·s0"):
            mxfp8_sweep(SMOKE, FOUR_RUNS, report=False, ray_address=env["address"])
    finally:
        stop.set()
        killer.join(timeout=10)
    assert killed, "the half run was never seen running"
    victim, pid, children = killed[0]
    (parent,) = _runs("scale-out", "sweep")  # the sweep's parent run says which run failed on the cluster
    assert parent.info.status == "FAILED" and "dense-mini·half·s0" in parent.data.tags["error"], parent.data.tags
    first_parent = parent.info.run_id
    runs = {r.data.params["preset"]: r for r in _runs("scale-out")}
    assert set(runs) == {"all", "bf16-e2e", "half", "other-grid"}
    assert runs["half"].info.run_id == victim and runs["half"].info.status == "FAILED"
    assert runs["half"].data.tags["error"].startswith("the Ray worker running this run died: ")
    assert "time/setup_s" in runs["half"].data.metrics  # logged before the kill: kept
    finished = [r for p, r in runs.items() if p != "half"]
    assert all(r.info.status == "FINISHED" for r in finished)
    # both nodes ran runs, and the runs say where
    assert len({r.data.tags["ray.node_id"] for r in runs.values()}) == 2
    # records readable through the server: metrics, tables (proxied artifacts)
    c = tracking.client()
    for r in finished:
        assert {"kl/k3", "reward/final", "time/step_s"} <= set(r.data.metrics)
        steps = pq.read_table(c.download_artifacts(r.info.run_id, "tables/steps.parquet", str(env["root"]))).to_pylist()
        assert [s["step"] for s in steps] == [1]
    # the killed worker's engine processes did not outlive it
    deadline = time.time() + 60
    while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                         for p in children):
        time.sleep(1)
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    # 2. the rerun runs only the failed run — with PostgreSQL stopped for 5 s while it logs
    outage: list = []
    stop = threading.Event()
    stopper = threading.Thread(target=_outage_when_running, args=(env["db"], outage, stop), daemon=True)
    stopper.start()
    try:
        rows = mxfp8_sweep(SMOKE, FOUR_RUNS, report=False, ray_address=env["address"])
    finally:
        stop.set()
        stopper.join(timeout=60)
    assert len(outage) == 2, "the outage never happened"
    assert sorted(r.status for r in rows) == ["FINISHED"] + ["SKIPPED (done)"] * 3
    (rerun,) = [r for r in rows if r.status == "FINISHED"]
    assert rerun.name == "dense-mini·half·s0" and c.get_run(rerun.mlflow_run).info.status == "FINISHED"

    # 3. and a third time nothing runs
    rows = mxfp8_sweep(SMOKE, FOUR_RUNS, report=False, ray_address=env["address"])
    assert [r.status for r in rows] == ["SKIPPED (done)"] * 4
    assert not [r for r in _runs("scale-out") if r.info.status in ("RUNNING", "SCHEDULED")]
    # the sweep's one parent run (reopened by each rerun) ends FINISHED once the rerun repaired the failure
    (parent,) = _runs("scale-out", "sweep")
    assert parent.info.run_id == first_parent and parent.info.status == "FINISHED" and "error" not in parent.data.tags
