"""How a failed verl run is told: :func:`tasks.verl_run.failure_reason` makes verl's output — Ray's colour
escapes, worker prefixes, tracebacks quoting their ``raise`` lines, Hydra's echo — one line of plain text
naming the cause (a failed check: its condition, rank and layer), the line the terminal prints and the MLflow
run's ``error`` tag holds (:func:`adapters.tracking.plain_text`: tags are plain text). No MLflow store, no
verl process: the fast tier."""

from __future__ import annotations

from adapters.tracking import plain_text
from tasks.verl_run import failure_reason, plain_lines

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
