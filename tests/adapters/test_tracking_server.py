"""The cluster's tracking store, real components only: PostgreSQL (the Debian binaries) and `mlflow server`
on it, started by :mod:`adapters.tracking_server` — one pair for the module. Runs are logged through the
server by :mod:`adapters.tracking`, read back through it and found in PostgreSQL; PostgreSQL is stopped while
a run logs (a short outage is ridden out by the client's retries, a long one fails naming the server and
the run can still be closed); ``fp8rl tracking-server`` starts and stops on SIGINT leaving no process."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import psycopg2
import pyarrow.parquet as pq
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from adapters import tracking
from adapters import tracking_server as ts

from .conftest import data_dir as _data_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def store(servers, monkeypatch):
    db, server = servers
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", raising=False)
    return db, server


def _rows(db: ts.Postgres, sql: str, *args) -> list[tuple]:
    with psycopg2.connect(host=db.host, port=db.port, user="postgres", dbname=db.database) as conn:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()


def test_a_run_logged_through_the_server_is_read_back_and_is_in_postgres(store, tmp_path):
    db, server = store
    run = tracking.open_run("srv-sweep", "sid1", "rid1", "dense-s0", {"learner.lr": "0.001"}, "flow-9")
    tracking.log_metrics(run, {"reward/mean": 0.5, "kl/k3": 1e-3}, step=3)
    tracking.log_table(run, "steps", [{"step": 1, "x": 0.5}, {"step": 2, "x": 0.25}])
    tracking.log_json(run, "config.json", {"a": 1})
    tracking.set_tag(run, "fp8rl.note", "via server")
    with tracking.captured_logs(run):
        import logging

        logging.getLogger().warning("a line for the run log")
    tracking.terminate(run, "FINISHED")

    c = tracking.client()
    info = c.get_run(run)
    assert info.info.status == "FINISHED"
    assert info.data.params == {"learner.lr": "0.001"}
    assert info.data.tags["fp8rl.note"] == "via server" and info.data.tags["fp8rl.run_id"] == "rid1"
    assert info.data.metrics == {"reward/mean": 0.5, "kl/k3": 1e-3}
    assert [(m.step, m.value) for m in c.get_metric_history(run, "kl/k3")] == [(3, 1e-3)]
    # artifacts go through the server's proxy into its artifact folder: no local location on the client
    exp = c.get_experiment_by_name("srv-sweep")
    assert exp.artifact_location.startswith("mlflow-artifacts:")
    files = {f.path for f in c.list_artifacts(run)} | {f.path for f in c.list_artifacts(run, "tables")}
    assert {"config.json", "run.log", "tables/steps.parquet"} <= files
    local = c.download_artifacts(run, "tables/steps.parquet", str(tmp_path))
    assert pq.read_table(local).to_pylist() == [{"step": 1, "x": 0.5}, {"step": 2, "x": 0.25}]
    assert "a line for the run log" in Path(c.download_artifacts(run, "run.log", str(tmp_path))).read_text()
    assert list(Path(server.artifacts).rglob("steps.parquet"))  # where the server keeps them
    assert tracking.find_finished("srv-sweep", "rid1") == run
    tables = tracking.sweep_tables("srv-sweep", tmp_path / "dl")
    assert [r["run_id"] for r in tables["runs"]] == ["rid1"]
    assert tables["steps"] == [{"step": 1, "x": 0.5, "run_id": "rid1"}, {"step": 2, "x": 0.25, "run_id": "rid1"}]
    # and the rows are PostgreSQL's
    assert _rows(db, "SELECT status FROM runs WHERE run_uuid = %s", run) == [("FINISHED",)]
    assert _rows(db, "SELECT value FROM params WHERE run_uuid = %s AND key = 'learner.lr'", run) == [("0.001",)]
    assert _rows(db, "SELECT step, value FROM metrics WHERE run_uuid = %s AND key = 'kl/k3'", run) == [(3, 1e-3)]


def _log_steps(run: str, steps: int, logged: list[int], errors: list[BaseException], started: threading.Event):
    try:
        for step in range(steps):
            tracking.log_metrics(run, {"loss": float(step)}, step=step)
            logged.append(step)
            if step == 4:
                started.set()
            time.sleep(0.1)
    except BaseException as e:  # noqa: BLE001 — reported by the test
        errors.append(e)
    finally:
        started.set()


def _server_503s(server: ts.TrackingServer) -> int:
    return len(re.findall(r'"POST /api/2\.0/mlflow/runs/log-batch HTTP/1\.1" 503', server.log.read_text()))


def test_a_sweeps_parent_run_and_its_nested_runs_through_the_server(store, tmp_path):
    from tests.adapters.test_tracking import parent_and_runs_round_trip

    parent_and_runs_round_trip(tmp_path)


def test_a_short_database_outage_is_ridden_out_and_the_run_finishes_with_every_step(store):
    db, server = store
    run = tracking.open_run("srv-outage", "sid", "short", "short", {}, None)
    logged, errors, started = [], [], threading.Event()
    before = _server_503s(server)
    worker = threading.Thread(target=_log_steps, args=(run, 30, logged, errors, started))
    worker.start()
    try:
        started.wait(120)
        db.stop()  # PostgreSQL gone while the run logs a step every 0.1 s
        time.sleep(5)
    finally:
        db.start()
        worker.join(300)
    assert not errors, errors
    tracking.terminate(run, "FINISHED")
    c = tracking.client()
    assert c.get_run(run).info.status == "FINISHED"
    assert sorted(m.step for m in c.get_metric_history(run, "loss")) == list(range(30)) == logged
    assert _server_503s(server) > before  # the server answered 503 while its database was down, the client retried


def test_a_long_outage_fails_naming_the_server_and_the_run_can_be_marked_failed(store, monkeypatch):
    db, server = store
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # gives up after ~2 s of retries, not ~4 min
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    run = tracking.open_run("srv-outage", "sid", "long", "long", {}, None)
    tracking.log_metrics(run, {"loss": 1.0}, step=0)
    db.stop()
    try:
        with pytest.raises(MlflowException) as failed:
            tracking.log_metrics(run, {"loss": 2.0}, step=1)
    finally:
        db.start()
    assert server.url in str(failed.value)
    tracking.set_tag(run, "error", str(failed.value)[:200])
    tracking.terminate(run, "FAILED")
    c = tracking.client()
    assert c.get_run(run).info.status == "FAILED"
    assert [(m.step, m.value) for m in c.get_metric_history(run, "loss")] == [(0, 1.0)]


def test_a_port_in_use_is_named(servers):
    db, server = servers
    with pytest.raises(ts.ServerError, match=rf"cannot listen on 127\.0\.0\.1:{server.port} .*--port"):
        ts.TrackingServer(db.uri, None, db.data_dir, port=server.port).start()
    with pytest.raises(ts.ServerError, match=rf"PostgreSQL: cannot listen on 127\.0\.0\.1:{db.port} .*--pg-port"):
        ts.Postgres(db.data_dir / "other", port=db.port).start()


def test_a_database_that_refuses_is_named(tmp_path):
    uri = f"postgresql://fp8rl:secret@127.0.0.1:{ts.free_port()}/mlflow"
    with pytest.raises(ts.ServerError, match=r"the database postgresql\+psycopg2://fp8rl:\*\*\*@127\.0\.0\.1:\d+/mlflow "
                                             r"refused the connection"):
        ts.TrackingServer(uri, None, tmp_path, port=ts.free_port()).start()


def test_a_server_that_exits_while_starting_names_its_log(tmp_path):
    port = ts.free_port()  # a MySQL store: its driver is not installed, so mlflow server exits
    with pytest.raises(ts.ServerError, match=rf"the MLflow server on 127\.0\.0\.1:{port} \(store mysql://u@127\.0\.0\.1:1/db\) "
                                             rf"exited \(code \d+\) while starting: see {re.escape(str(tmp_path / 'mlflow.log'))}"):
        ts.TrackingServer("mysql://u@127.0.0.1:1/db", None, tmp_path, port=port, workers=1).start()


def test_missing_binaries_say_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ts, "DEBIAN_BINS", tmp_path / "none")
    with pytest.raises(ts.ServerError, match=r"binaries \(postgres, initdb\) not found.*apt-get install -y postgresql"):
        ts.postgres_binaries()
    assert ts.sqlalchemy_uri("postgres://u@h/db") == ts.sqlalchemy_uri("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"


def _read_until(proc: subprocess.Popen, pattern: str, timeout_s: float) -> str:
    """The command's output up to the first line matching ``pattern`` (fails with what it printed)."""
    seen: list[str] = []
    done = threading.Event()

    def reader():
        for line in proc.stdout:
            seen.append(line)
            if re.search(pattern, line):
                done.set()
                return
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    done.wait(timeout_s)
    text = "".join(seen)
    assert re.search(pattern, text), f"no line matching {pattern!r}; printed:\n{text}"
    return text


def test_the_command_serves_until_sigint_then_stops_everything():
    d = _data_dir()
    port = ts.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "tracking-server", "--data-dir", str(d),
                             "--port", str(port), "--workers", "1"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=os.environ | {"PYTHONPATH": str(ROOT)})
    try:
        out = _read_until(proc, r"export MLFLOW_TRACKING_URI=", 300)
        assert f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{port}\n" in out
        children = psutil.Process(proc.pid).children(recursive=True)
        postmaster = int((d / "pgdata" / "postmaster.pid").read_text().split()[0])
        assert postmaster in {p.pid for p in children}
        assert any("mlflow" in " ".join(p.cmdline()) for p in children)
        c = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
        assert c.get_experiment_by_name("Default") is not None  # it answers, on PostgreSQL
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + rest
        assert "stopped the MLflow server and PostgreSQL" in rest
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, [p.pid for p in alive]
        assert not (d / "pgdata" / "postmaster.pid").exists()  # PostgreSQL shut down cleanly
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands PostgreSQL to the postgres user")
def test_a_data_dir_the_postgres_user_cannot_reach_is_named(tmp_path):
    with pytest.raises(ts.ServerError, match=rf"the postgres user cannot write {re.escape(str(tmp_path))}/pg/pgdata"):
        ts.Postgres(tmp_path / "pg").start()  # pytest's tmp folders are 0700 root
