"""MLflow tracking helpers on a temporary SQLite store: runs, params, metrics, tables, resume lookup."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adapters import tracking


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FP8RL_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path


def test_flatten_makes_dotted_string_params():
    flat = tracking.flatten({"a": 1, "b": {"c": [1, 2], "d": {"e": "x"}}, "f": None})
    assert flat == {"a": "1", "b.c": "[1, 2]", "b.d.e": "x", "f": "None"}


def test_a_run_records_everything_and_is_found_only_when_finished(store):
    run = tracking.open_run("sweep-x", "sid", "abc123", "dense-all-s0", {"learner.lr": "0.001"}, "flow-1")
    c = tracking.client()
    info = c.get_run(run)
    assert info.data.params == {"learner.lr": "0.001"}
    assert info.data.tags["fp8rl.run_id"] == "abc123" and info.data.tags["prefect.flow_run_id"] == "flow-1"
    assert info.data.tags["versions.torch"].startswith("2.13") and "git.commit" in info.data.tags
    tracking.log_metrics(run, {"reward/mean": 0.5, "kl/k3": 1e-3}, step=2)
    tracking.log_table(run, "steps", [{"step": 1, "x": 0.5}, {"step": 2, "x": 0.25}])
    tracking.log_json(run, "config.json", {"a": 1})
    assert tracking.find_finished("sweep-x", "abc123") is None  # still RUNNING
    tracking.terminate(run, "FINISHED")
    assert tracking.find_finished("sweep-x", "abc123") == run
    assert tracking.find_finished("sweep-x", "other") is None and tracking.find_finished("no-such-sweep", "abc123") is None
    hist = c.get_metric_history(run, "reward/mean")
    assert [(m.step, m.value) for m in hist] == [(2, 0.5)]
    files = {f.path for f in c.list_artifacts(run)} | {f.path for f in c.list_artifacts(run, "tables")}
    assert {"config.json", "tables/steps.parquet"} <= files
    local = c.download_artifacts(run, "tables/steps.parquet", str(store))
    assert pq.read_table(local).to_pylist() == [{"step": 1, "x": 0.5}, {"step": 2, "x": 0.25}]
    exp = c.get_experiment_by_name("sweep-x")
    assert exp.artifact_location.startswith((store / "artifacts").as_uri())


def test_a_sweeps_runs_nest_under_its_parent_which_resume_and_reports_ignore(store):
    parent_and_runs_round_trip(store)


def parent_and_runs_round_trip(store: Path) -> None:
    """A sweep's parent run, a run nested under it, a second sweep in the same experiment, ends of every
    kind — read back from whatever store ``MLFLOW_TRACKING_URI`` names (also run against a tracking
    server: tests/adapters/test_tracking_server.py)."""
    c = tracking.client()
    parent = tracking.open_sweep_run("sweep-p", "sid1", {"axes.seed": "[0]"}, "every preset")
    child = tracking.open_run("sweep-p", "sid1", "r1", "dense-mini·all·s0", {"preset": "all"}, None, parent=parent,
                              tags={"model": "qwen3-dense-mini", "preset": "all", "seed": 0}, description="one line")
    run = c.get_run(child)
    assert run.data.tags[tracking.PARENT] == parent and run.data.tags[tracking.NOTE] == "one line"
    assert {k: run.data.tags[k] for k in ("model", "preset", "seed", "sweep")} == {
        "model": "qwen3-dense-mini", "preset": "all", "seed": "0", "sweep": "sweep-p"}
    tracking.log_table(child, "steps", [{"step": 1, "x": 0.5}])
    tracking.terminate(child, "FINISHED")
    assert tracking.end_sweep_run(parent, [tracking.RunRow("r", "m", "dense-mini·all·s0", "FINISHED")]) == "FINISHED"
    # the experiment: described, a model-training experiment in the UI, a shared view of the headline columns
    exp = c.get_experiment_by_name("sweep-p")
    assert "every preset" in exp.tags[tracking.NOTE] and exp.tags[tracking.EXPERIMENT_KIND] == "custom_model_development"
    view = json.loads(exp.tags[tracking.SHARED_VIEW + tracking.VIEW_KEY])
    assert [f"metrics.`{m}`" for m, *_ in (*tracking.HEADLINE, *tracking.HEADLINE_BASIS)] == [
        k for k in view["selectedColumns"] if k.startswith("metrics")]
    # the parent has no fp8rl run id: resume and the report's tables see only the run
    assert tracking.find_finished("sweep-p", "r1") == child
    assert [r["mlflow_run"] for r in tracking.sweep_tables("sweep-p", store / "dl")["runs"]] == [child]
    # a second sweep (another expansion) in the same experiment: its own parent; the same one reopens its parent
    other = tracking.open_sweep_run("sweep-p", "sid2", {}, "")
    assert other != parent and tracking.find_sweep_run("sweep-p") == other
    assert tracking.open_sweep_run("sweep-p", "sid1", {}, "") == parent and tracking.status(parent) == "RUNNING"
    failed = tracking.open_run("sweep-p", "sid1", "r2", "moe-mini·all·s0", {}, None, parent=parent)
    tracking.terminate(failed, "FAILED")
    assert tracking.end_sweep_run(parent, [tracking.RunRow("r", "m", "moe-mini·all·s0", "FAILED: RuntimeError")]) == "FAILED"
    assert c.get_run(parent).data.tags["error"] == "1 of 1 runs failed: moe-mini·all·s0"
    # the rerun repairs it: the reopened parent ends FINISHED without the earlier pass's error
    assert tracking.open_sweep_run("sweep-p", "sid1", {}, "") == parent
    assert tracking.end_sweep_run(parent, [tracking.RunRow("r", "m", "moe-mini·all·s0", "FINISHED")]) == "FINISHED"
    assert "error" not in c.get_run(parent).data.tags and tracking.status(parent) == "FINISHED"
    assert tracking.end_sweep_run(other, [], interrupted=KeyboardInterrupt("signal SIGTERM")) == "KILLED"
    assert c.get_run(other).data.tags["error"] == "the sweep was interrupted (KeyboardInterrupt: signal SIGTERM)"
    assert tracking.end_sweep_run(other, [], interrupted="the sweep's flow run x was cancelled in Prefect") == "KILLED"
    assert c.get_run(other).data.tags["error"] == "the sweep's flow run x was cancelled in Prefect"  # as given
    assert tracking.find_finished("sweep-p", "r1") == child


def test_a_sweep_extended_by_more_seeds_reports_the_runs_an_earlier_expansion_finished(store):
    """Seeds 0-1 ran as one expansion; the config extended to seeds 0-2 is another, which skips the two finished
    runs and runs only seed 2: its report pools all three (the run ids its parent's sweep.json lists), the
    first expansion's report still its own two, and a parent without that list its tagged runs only."""
    def expansion(sid, ids, ran):
        parent = tracking.open_sweep_run("sweep-e", sid, {}, "")
        tracking.log_json(parent, "sweep.json", {"axes": {"seed": list(range(len(ids)))}, "run_ids": ids})
        for rid in ran:
            run = tracking.open_run("sweep-e", sid, rid, f"run·{rid}", {"seed": rid[-1]}, None, parent=parent)
            tracking.log_table(run, "steps", [{"step": 1, "x": float(rid[-1])}])
            tracking.terminate(run, "FINISHED")
            time.sleep(0.01)  # start times in order
        return parent

    expansion("first", ["s0", "s1"], ["s0", "s1"])
    expansion("second", ["s0", "s1", "s2"], ["s2"])
    latest = tracking.sweep_tables("sweep-e", store / "dl")
    assert latest["sweep_id"] == "second" and sorted(r["run_id"] for r in latest["runs"]) == ["s0", "s1", "s2"]
    assert sorted(row["run_id"] for row in latest["steps"]) == ["s0", "s1", "s2"]
    assert sorted(r["run_id"] for r in tracking.sweep_tables("sweep-e", store / "dl", "first")["runs"]) == ["s0", "s1"]
    # a parent recorded before sweep.json listed its runs: the runs tagged with its expansion
    tracking.log_json(tracking.find_sweep_run("sweep-e", "second"), "sweep.json", {"axes": {}})
    assert [r["run_id"] for r in tracking.sweep_tables("sweep-e", store / "dl")["runs"]] == ["s2"]


def test_captured_logs_write_each_line_once_with_its_task_and_nothing_of_an_earlier_run(store):
    import logging

    c = tracking.client()
    first, second = (tracking.open_run("sweep-l", "sid", f"r{i}", f"n{i}", {}, None) for i in (1, 2))
    stale = logging.FileHandler(store / "stale.log")  # as a run killed inside the block would leave it
    stale.fp8rl_run_log = True
    logging.getLogger().addHandler(stale)
    # INFO as Prefect's logging config sets it (configured only once some test has run a flow)
    task_logger = logging.getLogger("prefect.fp8rl_test")
    level, task_logger.level = task_logger.level, logging.INFO
    with tracking.captured_logs(first):
        logging.getLogger("prefect.fp8rl_test").info("from a task", extra={"task_run_name": "train-step-0"})
        logging.getLogger("fp8rl.example").warning("a library line")
    assert stale not in logging.getLogger().handlers
    with tracking.captured_logs(second):
        logging.getLogger("prefect.fp8rl_test").info("second run", extra={"flow_run_name": "bold-cat"})
    one = Path(c.download_artifacts(first, "run.log", str(store / "a"))).read_text().splitlines()
    two = Path(c.download_artifacts(second, "run.log", str(store / "b"))).read_text().splitlines()
    assert len(one) == 2 and "[train-step-0] prefect.fp8rl_test: from a task" in one[0] and "a library line" in one[1]
    assert len(two) == 1 and "[bold-cat] prefect.fp8rl_test: second run" in two[0]
    task_logger.setLevel(level)


def test_a_failed_run_is_not_resumed(store):
    run = tracking.open_run("sweep-y", "sid", "r1", "n", {}, None)
    tracking.set_tag(run, "error", "RuntimeError: boom")
    tracking.terminate(run, "FAILED")
    assert tracking.find_finished("sweep-y", "r1") is None
    assert tracking.client().get_run(run).data.tags["error"] == "RuntimeError: boom"


@pytest.mark.parametrize(("uri", "expect"), [
    ("sqlite:////data/mlflow.db", "a SQLite file as the tracking store would corrupt or scatter the store"),
    ("file:///data/mlruns", "a local folder as the tracking store would corrupt or scatter the store"),
    ("/data/mlruns", "a local folder as the tracking store would corrupt or scatter the store"),
    ("mlruns", "a local folder as the tracking store would corrupt or scatter the store"),
    ("postgresql://u@db:5432/mlflow", "a database URI shares the runs but each node would keep its artifacts"),
])
def test_a_sweep_on_several_nodes_needs_a_tracking_server(uri, expect):
    with pytest.raises(ValueError) as e:
        tracking.require_shared_store(2, uri)
    msg = str(e.value)
    assert msg.startswith(f"a sweep on 2 nodes with MLFLOW_TRACKING_URI={uri}: {expect}")
    assert "fp8rl tracking-server --host 0.0.0.0" in msg and "MLFLOW_TRACKING_URI=http://<host>:<port>" in msg
    tracking.require_shared_store(1, uri)  # one node: any store


def test_a_remote_tracking_server_serves_every_node():
    for uri in ("http://10.0.0.5:5000", "https://mlflow.example.org", "http://head-node:5000", "databricks"):
        tracking.require_shared_store(8, uri, node_ips=["10.0.0.5", "10.0.0.6"])


def test_a_loopback_server_only_when_every_node_is_this_host():
    mine = {"127.0.0.1", "::1", "192.0.2.2"}
    for uri in ("http://127.0.0.1:5000", "http://localhost:5000", "http://[::1]:5000"):
        tracking.require_shared_store(3, uri, node_ips=["192.0.2.2", "192.0.2.2", "127.0.0.1"], local_ips=mine)
        with pytest.raises(ValueError, match=r"reaches this host only, and nodes run elsewhere \(10\.0\.0\.7\)"):
            tracking.require_shared_store(3, uri, node_ips=["192.0.2.2", "10.0.0.7"], local_ips=mine)
        with pytest.raises(ValueError, match="the nodes' addresses were not given"):
            tracking.require_shared_store(3, uri)
    assert "127.0.0.1" in tracking.this_host_ips()  # this host's real interfaces
    tracking.require_shared_store(2, "http://127.0.0.1:5000", node_ips=sorted(tracking.this_host_ips()))


@pytest.mark.parametrize("host", [
    "", "localhost", "LOCALHOST", "localhost.", "ip6-localhost", "ip6-loopback", "mlflow.localhost", "127.0.0.1",
    "127.8.9.10", "::1", "[::1]", "::ffff:127.0.0.1", "fe80::1%lo",
])
def test_loopback_hosts_reach_this_host_only(host):
    # both of its callers' cases: a URL's host (the tracking store, the Prefect API) and a node's address
    assert tracking.is_loopback(host) is (host != "fe80::1%lo")


@pytest.mark.parametrize("host", ["10.0.0.5", "head-node", "mlflow.example.org", "0:0:0:0:0:0:0:2", "localhost-2", "?"])
def test_other_hosts_are_not_loopback(host):
    assert not tracking.is_loopback(host)


def test_a_loopback_store_in_any_spelling_is_refused_when_nodes_run_elsewhere():
    for uri in ("http://LOCALHOST:5000", "http://ip6-localhost:5000", "http://[::ffff:127.0.0.1]:5000"):
        with pytest.raises(ValueError, match=r"reaches this host only, and nodes run elsewhere \(10\.0\.0\.7\)"):
            tracking.require_shared_store(2, uri, node_ips=["10.0.0.7"], local_ips={"192.0.2.2"})


def _status_and_error(run: str) -> tuple[str, str | None]:
    got = tracking.client().get_run(run)
    return got.info.status, got.data.tags.get("error")


def test_a_run_ends_finished_failed_or_killed_by_how_its_block_ends(store):
    # SIGTERM's default action before the block (a library an earlier test ran may have left a handler of its
    # own, which the block calls after ending the run: "the signal acts as before")
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        _ends(store)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ends(store):
    runs = [tracking.open_run("sweep-e", "sid", f"r{i}", f"n{i}", {}, None) for i in range(6)]
    with tracking.ending(runs[0]):
        tracking.log_metrics(runs[0], {"x": 1.0})
    assert _status_and_error(runs[0]) == ("FINISHED", None)
    with pytest.raises(RuntimeError), tracking.ending(runs[1]):
        raise RuntimeError("the engine died")
    assert _status_and_error(runs[1]) == ("FAILED", "RuntimeError: the engine died")
    with tracking.ending(runs[2]) as end:  # no exception, but the work says it failed
        end.fail("verl's main_ppo exited with status 1: boom")
    assert _status_and_error(runs[2]) == ("FAILED", "verl's main_ppo exited with status 1: boom")
    with pytest.raises(KeyboardInterrupt), tracking.ending(runs[3]):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here, in the main thread
    assert _status_and_error(runs[3]) == ("KILLED", "interrupted by signal SIGTERM")  # not overwritten as FAILED
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the previous handler is back
    # the reason a caller gives for a signal (a flow run cancelled in Prefect)
    with pytest.raises(KeyboardInterrupt), tracking.ending(runs[4], lambda name: f"cancelled; stopped by {name}"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert _status_and_error(runs[4]) == ("KILLED", "cancelled; stopped by SIGTERM")
    # a run its sweep ended KILLED first (cancelling it) keeps the sweep's reason when its own signal comes
    with pytest.raises(KeyboardInterrupt), tracking.ending(runs[5]):
        tracking.end_unfinished(runs[5], "KILLED", "the sweep's flow run x was cancelled in Prefect")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert _status_and_error(runs[5]) == ("KILLED", "the sweep's flow run x was cancelled in Prefect")
    # a run its sweep ended KILLED before its process started it (a cancel racing a slow start) stays KILLED: the
    # process may be SIGKILLed next and could not end it again
    late = tracking.open_run("sweep-e", "sid", "r6", "n6", {}, None)
    tracking.end_unfinished(late, "KILLED", "the sweep's flow run x was cancelled in Prefect")
    assert tracking.start(late, {"fp8rl.pid": "1"}) is False
    assert _status_and_error(late) == ("KILLED", "the sweep's flow run x was cancelled in Prefect")
    assert tracking.client().get_run(late).data.tags["fp8rl.pid"] == "1"
    assert tracking.start(runs[0], {}) is True  # any other run: RUNNING
    assert tracking.status(runs[0]) == "RUNNING"


def test_a_run_recorded_under_its_pinned_id_is_found_as_its_config_loads_today(store):
    """Resume across code changes: a FINISHED run recorded with the id the smoke sweep's first run had when
    it was recorded (tests/core/test_identity.py pins it) is the run the sweep finds, and skips, now."""
    from fp8rl_core.config.runs import Sweep

    recorded = tracking.open_run("smoke", "5b64a9bd10df", "ab4233665176", "dense-mini·bf16-e2e·s0", {}, None)
    tracking.terminate(recorded, "FINISHED")
    runs = Sweep.load(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml").runs
    assert tracking.find_finished("smoke", runs[0].id) == recorded
    assert tracking.find_finished("smoke", runs[1].id) is None


def test_the_default_store_is_checked(store):
    with pytest.raises(ValueError, match="a SQLite file"):
        tracking.require_shared_store(2)
