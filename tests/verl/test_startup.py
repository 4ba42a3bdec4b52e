"""Where a verl run's wall time goes (fp8rl_core.verl.startup): milestones appended as JSON lines, the phases they
make, their sum, the projection; a run that was started twice; milestones out of order."""

from __future__ import annotations

import json
import os

import pytest

from fp8rl_core.verl.costs import COSTS_FILE, append_cost, read_costs
from fp8rl_core.verl.startup import (PHASES, STARTUP_FILE, mark, process_fields, read_milestones, wall_split)

T0 = 1_800_000_000.0


def _run(path, *, retry: bool = False) -> None:
    """A two-step run's milestones as fp8rl's pieces write them (times relative to T0)."""
    mark(path, "run_start", T0)
    mark(path, "dataset", T0 + 0.5)
    mark(path, "model", T0 + 2.5)
    mark(path, "payload", T0 + 2.75)
    mark(path, "config", T0 + 3.0)
    mark(path, "launch", T0 + 3.0)
    if retry:  # the first attempt: Ray up, its TaskRunner, then lost
        mark(path, "register", T0 + 9.0, pid=10, role="TaskRunner", process_start=T0 + 8.0, raylet_start=T0 + 7.0, seconds=0.5)
        mark(path, "launch", T0 + 10.0)
    base = T0 + 10.0 if retry else T0
    mark(path, "register", base + 20.0, pid=11, role="TaskRunnerV1", process_start=base + 18.0, raylet_start=base + 15.0, seconds=0.25)
    mark(path, "register", base + 30.0, pid=12, role="WorkerDict", process_start=base + 25.0, raylet_start=base + 15.0, seconds=0.5)
    mark(path, "server", base + 40.0, pid=13)
    mark(path, "register", base + 45.0, pid=13, role="Fp8rlHttpServer", process_start=base + 39.0, raylet_start=base + 15.0, seconds=0.25)
    mark(path, "server_up", base + 60.0, pid=13)
    mark(path, "sync_start", base + 70.0, version=0)
    mark(path, "sync_done", base + 72.0, version=0)
    mark(path, "register", base + 74.0, pid=14, role="AgentLoopWorkerTQ", process_start=base + 72.5, raylet_start=base + 15.0, seconds=0.125)
    mark(path, "capture", base + 75.0, step=1)
    mark(path, "sync_start", base + 77.0, version=1)
    mark(path, "sync_done", base + 78.0, version=1)
    mark(path, "capture", base + 80.0, step=2)
    mark(path, "sync_start", base + 81.0, version=2)
    mark(path, "sync_done", base + 82.0, version=2)
    mark(path, "run_end", base + 90.0)


def test_milestones_append_as_json_lines_and_unknown_ones_are_refused(tmp_path):
    path = tmp_path / STARTUP_FILE
    assert read_milestones(path) == []
    mark(path, "run_start", T0)
    mark(path, "sync_done", T0 + 1.5, version=0)
    assert [json.loads(x) for x in path.read_text().splitlines()] == [
        {"milestone": "run_start", "t": T0}, {"milestone": "sync_done", "t": T0 + 1.5, "version": 0}]
    with pytest.raises(ValueError, match="unknown milestone 'ready'; valid: .*'run_start'"):
        mark(path, "ready")


def test_the_phases_of_a_two_step_run_sum_to_its_wall(tmp_path):
    path = tmp_path / STARTUP_FILE
    _run(path)
    append_cost(tmp_path / COSTS_FILE, 0, {"export_s": 0.25, "update_s": 1.0, "keep_s": 0.125, "checks_s": 0.5})
    append_cost(tmp_path / COSTS_FILE, 1, {"capture_s": 0.25})
    split = wall_split(read_milestones(path), read_costs(tmp_path / COSTS_FILE))
    assert split.wall_s == 90.0
    assert [p.name for p in split.phases] == [name for name, _, _ in PHASES]
    assert {p.name: p.seconds for p in split.phases} == {
        "preparation": 3.0, "verl_driver": 12.0, "taskrunner": 5.0, "workers": 20.0, "vllm_server": 20.0,
        "first_sync": 12.0, "agent_loop": 2.0, "steps": 8.0, "end": 8.0}
    assert sum(p.seconds for p in split.phases) == split.wall_s
    assert split.phase("steps").share == pytest.approx(8.0 / 90.0)
    # two steps of 6 s and 4 s (sync to sync): the warm step is the second; 200 steps = this run + 198 warm steps
    assert split.steps == 2 and split.warm_step_s == 4.0
    assert split.startup_s == 82.0 and split.projected(200) == 90.0 + 198 * 4.0
    assert split.processes == ("TaskRunnerV1", "WorkerDict", "Fp8rlHttpServer", "AgentLoopWorkerTQ")
    assert split.fp8rl == {"preparation/dataset_s": 0.5, "preparation/warm_start_copy_s": 2.0,
                           "preparation/payload_s": 0.25, "preparation/config_s": 0.25, "register_s": 1.125,
                           "first_sync_s": 0.25 + 0.125 + 0.5}
    m = split.metrics()
    assert m["time/startup/vllm_server_s"] == 20.0 and m["time/startup/wall_s"] == 90.0
    assert m["time/startup/projected_200_steps_s"] == 882.0 and m["time/startup/fp8rl/register_s"] == 1.125
    assert m["time/startup/steps"] == 2.0 and m["time/startup/processes"] == 4.0


def test_a_second_start_takes_its_own_processes_the_first_attempt_falls_in_the_driver_phase(tmp_path):
    path = tmp_path / STARTUP_FILE
    _run(path, retry=True)
    split = wall_split(read_milestones(path))
    assert split.wall_s == 100.0
    phases = {p.name: p.seconds for p in split.phases}
    assert phases["verl_driver"] == 22.0 and phases["taskrunner"] == 5.0  # Ray of the second start: T0 + 25
    assert sum(phases.values()) == 100.0
    assert split.processes == ("TaskRunnerV1", "WorkerDict", "Fp8rlHttpServer", "AgentLoopWorkerTQ")
    assert "first_sync_s" not in split.fp8rl  # no costs given


def test_a_milestone_before_the_previous_one_ends_its_phase_where_that_one_ended(tmp_path):
    """A cluster the run joined was up before the run: its raylet's start is no phase of this run; a run that
    ended before its first sync has zero-second phases after it."""
    path = tmp_path / STARTUP_FILE
    mark(path, "run_start", T0)
    mark(path, "config", T0 + 1.0)
    mark(path, "launch", T0 + 1.0)
    mark(path, "register", T0 + 6.0, pid=1, role="TaskRunner", process_start=T0 + 5.0, raylet_start=T0 - 500.0, seconds=0.1)
    mark(path, "run_end", T0 + 8.0)
    split = wall_split(read_milestones(path))
    phases = {p.name: p.seconds for p in split.phases}
    assert phases["verl_driver"] == 0.0 and phases["taskrunner"] == 5.0
    assert phases["workers"] == phases["steps"] == 0.0 and phases["end"] == 2.0
    assert sum(phases.values()) == split.wall_s == 8.0
    assert split.steps == 0 and split.warm_step_s == 0.0
    with pytest.raises(ValueError, match="needs its run_start and run_end"):
        wall_split(read_milestones(path)[:-1])


def test_a_processs_role_is_its_title_as_ray_or_vllm_set_it():
    from fp8rl_core.verl.startup import _role

    # the titles a verl run's processes had (ps, 2026-12-04): Ray's actors, named or not, vLLM's engine, the driver
    assert _role(["ray::TaskRunnerV1.run", ""]) == "TaskRunnerV1"
    assert _role(["ray::WorkerDict"]) == "WorkerDict"
    assert _role(["ray::vllm_server_0_0:Fp8rlHttpServer.launch_server"]) == "Fp8rlHttpServer"
    assert _role(["ray::agent_loop_worker_0_8313ce44:AgentLoopWorkerTQ"]) == "AgentLoopWorkerTQ"
    assert _role(["VLLM::EngineCore"]) == "EngineCore"
    assert _role(["/venv/bin/python", "-m", "verl.trainer.main_ppo", "model_engine=dp"]) == "verl.trainer.main_ppo"


def test_this_process_knows_its_role_and_start():
    import psutil

    fields = process_fields()
    assert fields["pid"] == os.getpid() and fields["process_start"] == psutil.Process().create_time()
    # pytest's own title, or the one pytest-xdist gives its workers ("[pytest-xdist running] …")
    assert fields["role"] in ("pytest", "python", "python3", "python3.11") or fields["role"].startswith(("pytest", "[pytest-xdist"))
    assert "raylet_start" not in fields  # not a Ray worker
