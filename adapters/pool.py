"""A verl sweep's runs dispatched by Prefect: each run a flow run of the ``verl-run`` deployment on a work pool,
picked up by whichever of the pool's workers is free, which starts the run (and its own Ray) on its node.

Rule: a verl run gets a Ray cluster of its own (adapters.ray_guard says why); side by side means more workers,
one run each. The sweep's flow run creates the runs' flow runs as its child flow runs (``run_deployment``,
``as_subflow``), waits for each to end, and records how each ended: the MLflow run the child ended
(FINISHED, or FAILED with verl's reason), else — the child's process killed, its worker lost, its flow
run cancelled — FAILED or KILLED with the child's final Prefect state, its worker's host and the state's
message. Interrupted (a signal; the sweep's flow run cancelled in Prefect, whose worker then sends its process
SIGTERM), it cancels the children still queued or running (as Prefect's Cancel does: state Cancelling, which the
server turns into Cancelled for a child no worker holds, and a child's worker into SIGTERM to its process) and
ends their MLflow runs KILLED with the reason in plain text. Specified in docs/deploy.md ("verl runs on workers").
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prefect import get_run_logger

from adapters import tracking
from adapters.cluster import ClusterError
from adapters.logs import NO_ENGINES_ENV
from adapters.tracking import RunRow

__all__ = ["POLL_S", "VERL_RUN", "PoolJob", "cancelled", "check_deployment", "deployment_name", "interruption",
           "killed_by", "run_on_pool"]

#: the flow (and deployment) name of one verl run (flows/pipelines.py ``verl_run``; deployments/prefect.yaml)
VERL_RUN = "verl-run"
#: seconds between two reads of the children's states
POLL_S = 2.0
#: signal number → name, for a child whose process a signal ended (its exit status -N)
_SIGNALS = {s.value: s.name for s in signal.Signals}


def deployment_name(pool: str) -> str:
    """The ``verl-run`` deployment of work pool ``pool``: deployments/prefect.yaml names it after the pool."""
    return f"{VERL_RUN}/{pool}"


@dataclass(frozen=True)
class PoolJob:
    """One verl run to hand to the pool: its row's identity (fp8rl run id, name), the MLflow run opened for
    it (SCHEDULED) and the ``verl-run`` flow's parameters."""

    run_id: str
    name: str
    mlflow_run: str
    parameters: Mapping


def check_deployment(pool: str) -> int:
    """The number of the pool's workers online; :class:`~adapters.cluster.ClusterError` (nothing run) when the
    Prefect server has no ``verl-run`` deployment on ``pool``."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    name = deployment_name(pool)
    with get_client(sync_client=True) as c:
        try:
            d = c.read_deployment_by_name(name)
        except ObjectNotFound:
            raise ClusterError(f"work pool {pool}: the Prefect server at {c.api_url} has no deployment {name}; deploy it "
                               f"with `FP8RL_WORK_POOL={pool} prefect deploy --all --prefect-file deployments/prefect.yaml` "
                               "(docs/deploy.md). Nothing was run.") from None
        if d.work_pool_name != pool:
            raise ClusterError(f"deployment {name} runs on work pool {d.work_pool_name}, not {pool}; deploy it again "
                               f"with FP8RL_WORK_POOL={pool}. Nothing was run.")
        return sum(w.status is not None and str(w.status.value).upper() == "ONLINE"
                   for w in c.read_workers_for_work_pool(pool))


def cancelled() -> str | None:
    """When this process runs a flow run that was cancelled in Prefect (state Cancelling or Cancelled: the UI's
    Cancel, ``prefect flow-run cancel``, or the sweep cancelling its runs), that in plain text with the state's
    message; else (no flow run here, not cancelled, the server out of reach) None."""
    from prefect import get_client
    from prefect.runtime import flow_run as runtime_flow_run

    fid = runtime_flow_run.id
    if not fid:
        return None
    try:
        with get_client(sync_client=True) as c:
            me = c.read_flow_run(fid)
    except Exception:  # noqa: BLE001 — the caller says what it knows without it
        return None
    if me.state is None or not (me.state.is_cancelling() or me.state.is_cancelled()):
        return None
    message = tracking.plain_text(" ".join((me.state.message or "").split()))
    return f"flow run {me.name} was cancelled in Prefect" + (f" ({message})" if message else "")


def killed_by(signal_name: str) -> str:
    """Why a verl run's MLflow run ended KILLED: its flow run cancelled in Prefect (:func:`cancelled`) and the
    signal its worker sent, else the signal."""
    why = cancelled()
    return f"its {why}; stopped by signal {signal_name}" if why else f"interrupted by signal {signal_name}"


def interruption(e: BaseException) -> str:
    """Why a sweep stopped, in plain text: its flow run cancelled in Prefect (:func:`cancelled`), else the
    interrupt (``Type: message``)."""
    why = cancelled()
    return f"the sweep's {why}" if why else f"the sweep was interrupted ({type(e).__name__}: {e})"


def _where(flow_run, tags: Mapping[str, str]) -> str:
    """Where ``flow_run`` ran: its worker's host and its process, as the run tagged them when it started
    (``fp8rl.host``, ``fp8rl.pid``), else the process id its worker reported, else a phrase."""
    if "fp8rl.host" in tags:
        return f"{tags['fp8rl.host']} (process {tags.get('fp8rl.pid', '?')})"
    pid = getattr(flow_run, "infrastructure_pid", None)
    return f"a worker's process {pid} (it never started the run)" if pid else "no worker (it never started)"


def _collect(flow_run, job: PoolJob) -> RunRow:
    """The row of a child flow run that ended: the MLflow run as the child ended it, else (the child never
    ended it: its process killed, its worker lost, it was cancelled) ended here with the child's state."""
    c = tracking.client()
    mlflow = c.get_run(job.mlflow_run)
    state = flow_run.state
    if mlflow.info.status == "FINISHED":
        return RunRow(job.run_id, job.mlflow_run, job.name, "FINISHED",
                      {k: v for k, v in mlflow.data.metrics.items() if k.startswith("headline/")})
    if mlflow.info.status not in ("SCHEDULED", "RUNNING"):  # the child ended it (verl's reason in its error tag)
        error = mlflow.data.tags.get("error", mlflow.info.status)
        get_run_logger().error("run %s: %s", job.name, error)
        return RunRow(job.run_id, job.mlflow_run, job.name, f"FAILED: {error.split(':', 1)[0][:60]}")
    what = state.type.value.lower()
    message = tracking.plain_text(" ".join((state.message or "").split())) or "no message"
    code = re.search(r"status code (-\d+)", message)
    if code and -int(code[1]) in _SIGNALS:  # a process ended by a signal: name it
        message += f" (signal {_SIGNALS[-int(code[1])]})"
    reason = f"its {VERL_RUN} flow run {flow_run.name} on {_where(flow_run, mlflow.data.tags)} ended {what}: {message}"
    if state.is_cancelled():
        tracking.end_unfinished(job.mlflow_run, "KILLED", reason)
    elif tracking.end_unfinished(job.mlflow_run, "FAILED", reason):
        get_run_logger().error("run %s: %s", job.name, reason)
    return RunRow(job.run_id, job.mlflow_run, job.name, f"FAILED: {state.type.value}")


def run_on_pool(pool: str, jobs: Sequence[PoolJob], env: Mapping[str, str],
                done: Callable[[RunRow], None]) -> list[RunRow]:
    """Each job as a child flow run of :func:`deployment_name` (``pool``), ``env`` set in its process (the
    process pool's ``env`` job variable, which replaces the deployment's: with ``FP8RL_NO_ENGINES=1`` as the
    deployment's own, since verl's trainer starts the engines in processes of its own); wait for all, ``done(row)`` as each ends; the rows in the order the
    runs ended. Interrupted: the children still queued or running are cancelled (state Cancelling, as Prefect's
    Cancel sets it), their MLflow runs KILLED with :func:`interruption`'s reason, and the interrupt raised."""
    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    logger = get_run_logger()
    waiting: dict = {}
    rows: list[RunRow] = []
    try:
        for job in jobs:
            child = run_deployment(deployment_name(pool), parameters=dict(job.parameters), timeout=0, as_subflow=True,
                                   flow_run_name=job.name, job_variables={"env": {**env, NO_ENGINES_ENV: "1"}})
            waiting[child.id] = job
            logger.info("run %s: flow run %s queued on work pool %s", job.name, child.name, pool)
        with get_client(sync_client=True) as c:
            while waiting:
                for fid, job in list(waiting.items()):
                    child = c.read_flow_run(fid)
                    if child.state is not None and child.state.is_final():
                        del waiting[fid]
                        row = _collect(child, job)
                        rows.append(row)
                        done(row)
                if waiting:
                    time.sleep(POLL_S)
    except BaseException as e:  # interrupted: nothing of the sweep keeps running, nothing is left SCHEDULED/RUNNING
        reason = f"{interruption(e)}, before this run finished"
        with get_client(sync_client=True) as c:
            for fid, job in waiting.items():
                try:  # orchestrated, not forced: a child no worker holds yet goes straight to Cancelled
                    c.set_flow_run_state(fid, Cancelling(message=reason))
                except Exception as err:  # noqa: BLE001 — its MLflow record is ended all the same
                    logger.warning("could not cancel the flow run of %s: %s", job.name, err)
        ended = {r.run_id for r in rows}
        for job in jobs:  # queued in Prefect, or not handed to it yet
            if job.run_id not in ended:
                tracking.end_unfinished(job.mlflow_run, "KILLED", reason)
        raise
    return rows
