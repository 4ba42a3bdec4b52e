"""Programs run as Ray Jobs on a real local Ray started with its dashboard (adapters.ray_jobs): Python one-liners
stand in for verl's trainer — the job's environment and output, its exit status, a job stopped from outside,
a job stopped by its sweep."""

from __future__ import annotations

import shlex
import sys
import threading
import time

import pytest

from adapters.ray_jobs import JobsStopped, job_server


def _py(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


@pytest.fixture(scope="module")
def jobs():
    with job_server(None, {"num_cpus": 2, "num_gpus": 0}) as server:
        yield server


def test_a_job_runs_with_its_env_its_output_read_while_it_runs_and_its_node(jobs, tmp_path):
    seen: list[tuple[str, ...]] = []
    log = tmp_path / "out.log"
    code = "import os, time; print('hello', os.environ['FP8RL_X'], flush=True); time.sleep(3); print('bye')"
    end = jobs.run("ok", _py(code), {"FP8RL_X": "42"}, log, on_log=seen.append, every=0.5)
    assert (end.status, end.returncode, end.cause) == ("SUCCEEDED", 0, None)
    assert "hello 42" in end.output and "bye" in end.output and log.read_text() == end.output
    ips = {n.ip for n in jobs.nodes}
    assert len(seen) >= 2 and seen[-1] == end.nodes and set(end.nodes) <= ips and end.nodes


def test_a_failing_job_ends_with_its_exit_status_and_output(jobs, tmp_path):
    end = jobs.run("fails", _py("import sys; print('ValueError: broken', flush=True); sys.exit(3)"), {},
                   tmp_path / "out.log")
    assert (end.status, end.returncode, end.cause) == ("FAILED", 3, None)
    assert "ValueError: broken" in end.output


def test_a_job_stopped_from_outside_ends_stopped_with_its_output_so_far(jobs, tmp_path):
    log = tmp_path / "out.log"
    stopper = threading.Thread(target=lambda: _stop_when_started(jobs, log))
    stopper.start()
    end = jobs.run("stopped", _py("import time; print('started', flush=True); time.sleep(40)"), {}, log, every=0.5)
    stopper.join()
    assert end.status == "STOPPED" and end.cause == "stopped" and "started" in end.output


def _stop_when_started(jobs, log, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "started" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.2)
    (job,) = [j for j in jobs._client.list_jobs() if (j.submission_id or "").startswith("stopped-")]
    jobs._client.stop_job(job.submission_id)


def test_stop_all_stops_every_running_job_and_raises_in_its_watcher(jobs, tmp_path):
    errors: list[BaseException] = []

    def watch(i: int) -> None:
        try:
            jobs.run(f"sweep{i}", _py("import time; time.sleep(40)"), {}, tmp_path / f"{i}.log", num_cpus=0.5)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(3)
    jobs.stop_all()
    for t in threads:
        t.join(timeout=90)
    assert [type(e) for e in errors] == [JobsStopped, JobsStopped]
    mine = [j for j in jobs._client.list_jobs() if (j.submission_id or "").startswith("sweep")]
    assert len(mine) == 2 and all(j.status == "STOPPED" for j in mine)
