"""A sweep's runs dispatched on Ray: connect (a local Ray, or a cluster), see its nodes, hand each run to a
worker as a Prefect task run, and record every run's end — its row, or its worker's death. The order
of the runs is :mod:`fp8rl_core.schedule`'s; the check of the cluster before anything runs is
:func:`adapters.cluster.preflight`. Specified in docs/deploy.md (Sweeps on Ray)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from prefect import get_run_logger

from adapters import cluster, tracking
from adapters.signals import on_signals
from adapters.tracking import RunRow
from fp8rl_core.schedule import next_run

__all__ = ["Job", "RayCluster", "connected", "on_ray", "started_again_once", "target"]


def target(address: str | None) -> tuple[bool, str]:
    """(whether it is a local Ray, how messages name it) for ``address`` — else ``RAY_ADDRESS``, else a
    local Ray on this machine."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        return True, "a local Ray (this machine)"
    return False, f"the Ray cluster at {address or os.environ['RAY_ADDRESS']}"


def _init_kwargs(local: bool) -> dict:
    """``ray.init``'s keywords: Ray's own output kept out of the driver's; a local Ray without a dashboard
    and with a small object store (the runs hand back rows only)."""
    out: dict = {"log_to_driver": False, "logging_level": logging.WARNING}
    if local:
        out |= {"include_dashboard": False, "object_store_memory": 256 * 2**20}
    return out


@dataclass(frozen=True)
class Job:
    """One run to hand to a Ray worker: its row's identity (fp8rl run id, name), the MLflow run opened for
    it (SCHEDULED), its engine group (:func:`fp8rl_core.schedule.engine_group`) and the task's parameters."""

    run_id: str
    name: str
    mlflow_run: str
    group: str
    params: Mapping


@contextmanager
def connected(address: str | None) -> Iterator[tuple[str, list[cluster.Node]]]:
    """Connected to Ray (``address`` as :func:`target`) for the length of the block; yields how messages
    name the cluster and its alive nodes. For a pre-flight whose runs something else starts (verl's
    trainer joins the cluster itself)."""
    import ray

    local, where = target(address)
    ray.init(address=address, **_init_kwargs(local))
    try:
        yield where, cluster.nodes()
    finally:
        ray.shutdown()


def _prefect_api_url() -> str:
    """The Prefect API the sweep reports to — the configured server, or this process's temporary one."""
    from prefect import get_client

    with get_client(sync_client=True) as c:
        return str(c.api_url)


class RayCluster:
    """The Ray cluster a sweep's runs go to (yielded by :func:`on_ray`): its ``nodes``, how messages name it
    (``where``), the Prefect API its task runs report to (``prefect_api``), and :meth:`run`."""

    def __init__(self, runner, where: str, nodes: list[cluster.Node], prefect_api: str) -> None:
        self._runner = runner
        self.where = where
        self.nodes = nodes
        self.prefect_api = prefect_api

    def run(self, task_fn, jobs: Sequence[Job], request: Mapping[str, float],
            done: Callable[[RunRow], None]) -> list[RunRow]:
        """Run ``jobs`` as task runs of ``task_fn`` (called with a job's ``params``; returns the run's
        :class:`RunRow`), each asking ``request`` of its node (Ray's options: ``num_cpus``, ``num_gpus``,
        ``memory``), as many at once as :func:`adapters.cluster.capacity` allows; the worker that finishes a run
        gets the next by :func:`fp8rl_core.schedule.next_run`. Returns one row per run as each ends
        (``done(row)`` each time). A run whose worker died (killed, out of memory, node lost) is ended
        FAILED with Ray's reason; on SIGTERM/SIGINT the runs still queued or running are cancelled and
        ended KILLED, and the interrupt is raised."""
        import ray
        from prefect.settings import PREFECT_API_URL, temporary_settings
        from prefect_ray.context import remote_options

        queue = list(jobs)
        futures: dict = {}

        def submit(i: int) -> None:
            job = queue.pop(i)
            with temporary_settings(updates={PREFECT_API_URL: self.prefect_api}), \
                    remote_options(**request, max_retries=0, max_calls=0):
                f = self._runner.submit(task_fn, dict(job.params))
            futures[f.wrapped_future] = (f, job)

        def running() -> list[str]:
            return [job.group for _, job in futures.values()]

        # ``capacity`` runs in flight; a finished run's worker is the free one, so the run handed out next
        # lands there — the next of its engine group when one is left
        for _ in range(min(cluster.capacity(request, self.nodes), len(queue))):
            submit(next_run([j.group for j in queue], None, running()))
        rows: list[RunRow] = []
        got: dict[str, str] = {}
        try:
            with _interrupts_raise() as got:
                while futures:  # a timeout, so a signal is handled within a second
                    ready, _ = ray.wait(list(futures), num_returns=1, timeout=1.0)
                    for ref in ready:
                        f, job = futures.pop(ref)
                        if queue:  # this worker is free: hand it its next run before recording this one
                            submit(next_run([j.group for j in queue], job.group, running()))
                        row = _collect(f, job)
                        rows.append(row)
                        done(row)
        except BaseException as e:  # interrupted: nothing keeps running, nothing is left SCHEDULED/RUNNING
            why = f"signal {got['signal']}" if "signal" in got else f"{type(e).__name__}: {e}"
            reason = f"the sweep was interrupted ({why}) before this run finished"
            for ref in futures:
                ray.cancel(ref, force=True)
            for _, job in futures.values():
                tracking.end_unfinished(job.mlflow_run, "KILLED", reason)
            for job in queue:  # never dispatched
                tracking.end_unfinished(job.mlflow_run, "KILLED", reason)
            if "signal" in got and not str(e):  # Ray re-raised it bare: the sweep's parent run names the signal
                raise KeyboardInterrupt(why) from e
            raise
        return rows


@contextmanager
def on_ray(address: str | None, env: Mapping[str, str]) -> Iterator[RayCluster]:
    """Connect to Ray through Prefect's ``RayTaskRunner`` — a local Ray without an address (or
    ``RAY_ADDRESS``), else that cluster — its workers with ``env`` set, and yield the
    :class:`RayCluster` to check (:func:`adapters.cluster.preflight`) and run the sweep on."""
    from prefect_ray import RayTaskRunner

    local, where = target(address)
    init = _init_kwargs(local) | {"runtime_env": {"env_vars": dict(env)}}
    api = _prefect_api_url()

    def start():
        runner = RayTaskRunner(address=address, init_kwargs=init)
        runner.__enter__()  # ray.init
        return runner

    runner = started_again_once(start) if local else start()
    try:
        yield RayCluster(runner, where, cluster.nodes(), api)
    except BaseException:
        runner.__exit__(*sys.exc_info())
        raise
    runner.__exit__(None, None, None)


#: what Ray 2.58 raises when a local node's raylet has not registered with its GCS within its fixed 30 s
#: (``ray/_private/node.py``, ``raylet_start_wait_time_s``): seen on 2 busy cores, a start that is slow, not broken
SLOW_START = "The current node timed out during startup"


def started_again_once(start: Callable):
    """``start()`` (a local Ray's start), and once more when Ray gave up on it as :data:`SLOW_START` — after
    ending the processes that attempt left (the children this process gained during it: GCS, raylet,
    agents; Ray had not recorded a node to shut down). Any other failure, or a second slow start, is raised."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        return start()
    except Exception as e:
        if SLOW_START not in str(e):
            raise
        left = [p for p in me.children(recursive=True) if p.pid not in before]
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        import ray

        ray.shutdown()  # whatever of the attempt Ray did record
        logging.getLogger(__name__).warning("a local Ray did not start within Ray's 30 s (%s); %d processes of that "
                                            "attempt ended, starting it once more", e, len(left))
        return start()


def _crash(future, reason: str) -> None:
    """Tell Prefect a task run whose Ray worker died is over (nobody else will: it stays Running)."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as c:
            c.set_task_run_state(future.task_run_id, Crashed(message=reason), force=True)
    except Exception as e:  # noqa: BLE001 — the MLflow record is what matters; say why Prefect's is stale
        get_run_logger().warning("could not mark task run %s Crashed: %s", future.task_run_id, e)


def _collect(f, job: Job) -> RunRow:
    """The row of a finished task run: its result, the run's own failure, or its worker's death."""
    import ray

    try:
        return f.result()
    except ray.exceptions.RayError as e:  # the worker died, or Ray could not run the task: nobody ended the MLflow run
        died = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError)
        cause = getattr(e, "cause", None) or e  # a RayTaskError wraps what happened in the worker
        lines = [x for x in str(cause).splitlines() if x.strip()] or [""]
        what = "the Ray worker running this run died" if isinstance(e, died) else "Ray could not run this run"
        reason = f"{what}: {type(cause).__name__}: {lines[-1] if cause is not e else lines[0]}"
        get_run_logger().error("run %s: %s", job.name, reason)
        tracking.end_unfinished(job.mlflow_run, "FAILED", reason)
        _crash(f, reason)
        return RunRow(job.run_id, job.mlflow_run, job.name, f"FAILED: {type(e).__name__}")
    except Exception as e:  # noqa: BLE001 — the run failed (and its experiment flow ended it FAILED)
        get_run_logger().error("run %s failed: %s: %s", job.name, type(e).__name__, e)
        tracking.end_unfinished(job.mlflow_run, "FAILED", f"{type(e).__name__}: {e}")
        return RunRow(job.run_id, job.mlflow_run, job.name, f"FAILED: {type(e).__name__}")


@contextmanager
def _interrupts_raise():
    """SIGTERM (and SIGINT) raise KeyboardInterrupt in the driver's main thread while it waits on Ray; the
    yielded dict gets the signal's name (Ray's wait re-raises the interrupt without its message)."""
    got: dict[str, str] = {}

    def react(signum, frame, previous):
        got["signal"] = signal.Signals(signum).name
        raise KeyboardInterrupt(f"signal {got['signal']}")

    with on_signals(react):
        yield got
