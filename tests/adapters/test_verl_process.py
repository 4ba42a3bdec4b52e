"""adapters.verl_process: verl's trainer as a supervised subprocess, and how a failed verl run is told.

:func:`adapters.verl_process.failure_reason` makes verl's output — Ray's colour
escapes, worker prefixes, tracebacks quoting their ``raise`` lines, Hydra's echo — one line of plain text
naming the cause (a failed check: its condition, rank and layer), the line the terminal prints and the MLflow
run's ``error`` tag holds (:func:`adapters.tracking.plain_text`: tags are plain text). No MLflow store, no
verl process (a stand-in Python child for the supervision): the fast tier."""

from __future__ import annotations

import sys
import threading
import time

from adapters.tracking import plain_text
from adapters.verl_process import failure_reason, main_ppo, plain_lines, port_race, stop_all

E = "\x1b"
#: the end of a verl run's main_ppo.log on this machine: the stop run of the nightly correctness series (a W2
#: fault planted on tensor-parallel rank 1 from the first sync on, ``checks.on_failure: fail``), shortened
#: where it repeats (frames, Hydra's echo of ~60 overrides, the check's offenders)
STOPPED = f"""\
{E}[36m(Fp8rlHttpServer pid=29841){E}[0m /check/work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` instead.
{E}[36m(Fp8rlHttpServer pid=29841){E}[0m   return func(*args, **kwargs)
{E}[36m(TaskRunnerV1 pid=29231){E}[0m           'truncation': 'error',
Error executing job with overrides: ['model_engine=dp', 'algorithm.adv_estimator=grpo', 'critic.enable=false', 'trainer.nnodes=1']
Traceback (most recent call last):
  File "/check/work/main/.venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py", line 93, in run_ppo
    ray.get(runner.run.remote(config))
  File "/check/work/main/.venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1050, in get_objects
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(CheckFailedError): {E}[36mray::TaskRunnerV1.run(){E}[39m (pid=29231, ip=192.0.2.2, actor_id=cf3af6ae7af4974745a4afd901000000, repr=<main_ppo.TaskRunnerV1 object at 0x7f3e23c83e90>)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/check/work/main/.venv/lib/python3.11/site-packages/verl/checkpoint_engine/base.py", line 519, in update_weights
    ray.get(self.actor_wg.update_weights(global_steps=global_steps, mode=self.backend))
           ^^^^^^^^^^^^^^^^^^^
ray.exceptions.RayTaskError(CheckFailedError): {E}[36mray::WorkerDict.actor_rollout_update_weights(){E}[39m (pid=29515, ip=192.0.2.2, actor_id=2fa75c6ab22bf7c96192660201000000, repr=<verl.single_controller.ray.base.WorkerDict object at 0x7f6c36a0cad0>)
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/concurrent/futures/_base.py", line 401, in __get_result
    raise self._exception
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/check/work/main/fp8rl_core/verl/checking.py", line 192, in after_sync
    raise CheckFailedError(f"fp8rl checks failed at weight sync {{report.sync}} (version {{report.version}}): "
fp8rl_core.verl.checking.CheckFailedError: fp8rl checks failed at weight sync 1 (version 0): W2 failed: 32 offenders, e.g. ['tp rank 1/2, layer model.layers.0.mlp.down_proj, weight: fingerprint b8775989455a1725, expected 3d87e86cf8bdaafe'] (2 tensor-parallel ranks checked their own live shards (fingerprints); failing ranks [1]

Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""


def test_a_stopped_verl_run_is_one_plain_line_naming_condition_rank_and_layer():
    reason = failure_reason(1, STOPPED)
    assert reason == (
        "verl's main_ppo exited with status 1: fp8rl_core.verl.checking.CheckFailedError: fp8rl checks failed at "
        "weight sync 1 (version 0): W2 failed: 32 offenders, e.g. ['tp rank 1/2, layer model.layers.0.mlp.down_proj, "
        "weight: fingerprint b8775989455a1725, expected 3d87e86cf8bdaafe'] (2 tensor-parallel ranks checked their own "
        "live shards (fingerprints); failing ranks [1]")
    assert "\n" not in reason and E not in reason and "raise" not in reason and "Traceback" not in reason


def test_plain_lines_keep_what_verl_said_and_leave_out_the_traceback():
    text = plain_lines(STOPPED)
    assert text[:2] == ["/check/work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: "
                        "FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use "
                        "`torch.distributed.all_gather_single` instead.",
                        "ray.exceptions.RayTaskError(CheckFailedError): ray::TaskRunnerV1.run() (pid=29231, "
                        "ip=192.0.2.2, actor_id=cf3af6ae7af4974745a4afd901000000, repr=<main_ppo.TaskRunnerV1 object at "
                        "0x7f3e23c83e90>)"]
    assert len(text) == 4 and not any(x.startswith(("File ", "raise ", "^", "Traceback", "Set the", "Error executing"))
                                      for x in text)


def test_a_run_verl_refuses_is_its_exception_line():
    out = ("[validate_config] checking\nError executing job with overrides: ['a=1']\nTraceback (most recent call last):\n"
           "  File \"x.py\", line 1, in <module>\n    assert n_gpus % size == 0\n"
           "AssertionError: n_gpus (8) must be divisible by model_parallel_size (3)\n"
           "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert failure_reason(0, out) is None
    assert failure_reason(1, out) == ("verl's main_ppo exited with status 1: "
                                      "AssertionError: n_gpus (8) must be divisible by model_parallel_size (3)")
    assert failure_reason(1, "RuntimeError: " + "x" * 1000) == "verl's main_ppo exited with status 1: RuntimeError: " + \
        "x" * 386 + "…"
    assert failure_reason(-9, "step 3\nstep 4\n", lines=1) == "verl's main_ppo exited with status -9 (signal SIGKILL): step 4"
    assert failure_reason(2, "") == "verl's main_ppo exited with status 2: no output"


def test_a_tag_is_plain_text():
    assert plain_text(f"RayTaskError(CheckFailedError): {E}[36mray::WorkerDict.actor_rollout_update_weights(){E}[39m "
                      "(pid=29515)") == "RayTaskError(CheckFailedError): ray::WorkerDict.actor_rollout_update_weights() (pid=29515)"


#: the lines a verl run printed on this kind of machine when its actor ranks' TCPStore port had been taken
RACE = """(WorkerDict pid=21135) [W1201 17:59:05.348114067 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host 192.0.2.2:39157 - retrying (try=0, timeout=1800000ms, delay=628ms): Ping failed, invalid value returned from server. Expected: 21135, Got: 68681728
(WorkerDict pid=21135) Exception raised from ping at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/TCPStore.cpp:427 (most recent call first):
ray.exceptions.RayTaskError(DistNetworkError): ray::WorkerDict.actor_rollout_init_model()"""


def test_a_run_that_lost_a_port_race_before_its_first_sync_is_named_for_one_more_start():
    line = port_race(1, RACE, [])
    assert line.startswith("(WorkerDict pid=21135) [W1201") and "TCP client failed to connect/validate" in line
    assert port_race(1, "torch.distributed.DistNetworkError: EADDRINUSE: address already in use", []) is not None
    assert port_race(1, RACE, [{"sync": 1}]) is None  # it synced: the port was not the problem of its start
    assert port_race(0, RACE, []) is None  # it finished
    assert port_race(1, "fp8rl_core.verl.checking.CheckFailedError: W2 failed", []) is None  # any other failure


def test_the_trainer_runs_to_its_end_and_tells_its_ray_address_once(tmp_path):
    """:func:`main_ppo`: the child's output in the log, its exit status returned, the address its workers wrote
    (``RAY_ADDRESS_FILE``) told once."""
    from fp8rl_core.verl.payload import RAY_ADDRESS_FILE

    code = (f"import pathlib, time; pathlib.Path({RAY_ADDRESS_FILE!r}).write_text('10.0.0.1:6379\\n'); "
            "time.sleep(2.5); print('done'); raise SystemExit(3)")
    told = []
    status = main_ppo([sys.executable, "-c", code], {}, tmp_path, tmp_path / "main_ppo.log", told.append)
    assert status == 3 and told == ["10.0.0.1:6379"] and (tmp_path / "main_ppo.log").read_text() == "done\n"


def test_stop_all_terminates_the_trainers_that_still_run(tmp_path):
    """An interrupted sweep whose runs run in threads: :func:`stop_all` ends each trainer, its thread returns."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("status", main_ppo(
        [sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path, tmp_path / "main_ppo.log")))
    t.start()
    deadline = time.monotonic() + 30
    while t.is_alive() and time.monotonic() < deadline:
        stop_all()
        t.join(timeout=0.5)
    assert not t.is_alive() and out["status"] < 0  # ended by a signal (SIGTERM), long before its 60 s
