"""A sweep's runs dispatched: five strategies with one signature, chosen from one table.

Rule: a strategy is called ``strategy(sweep, todo, how)`` — the sweep, its runs still to run (sweep order), and
the :class:`Context` the flow hands in (what runs one run here, the task a Ray worker runs, the parent run, the
progress) — and gives each run's row (an iterable: where runs end one after another in this process, each as it
ends, so an interrupted sweep's parent run counts those). Before anything is recorded, ``strategy.check(sweep,
how)`` refuses what cannot host the runs (:class:`adapters.cluster.ClusterError`). :data:`STRATEGIES` maps each
:class:`Mode` to its strategy; :func:`mode_of` reads the mode from the sweep (its backend, ``resources``) and the
flow's arguments. The modes:

- ``INLINE``: the runs one after another in this process (no Ray; a debugger, bench/orchestration.py's baseline);
- ``RAY``: each a Prefect task run on a Ray worker (:mod:`adapters.dispatch`), warm starts side by side first;
- ``POOL``: each verl run a flow run of a work pool's ``verl-run`` deployment (:mod:`adapters.pool`);
- ``SIDE_BY_SIDE``: verl runs on CPU on this machine, as many at once as it fits, each in a thread of this
  process that runs verl's trainer on a Ray of its own (why threads and not a Prefect task runner: docs/design.md,
  Dispatch);
- ``ONE_AFTER_ANOTHER``: verl runs one at a time, each verl's trainer on the cluster (or a Ray of its own).

Every run dispatched to something that can die has its MLflow record first (:mod:`adapters.sweep_record`); an
interrupted strategy ends its unfinished runs KILLED and raises. Specified in docs/deploy.md (Sweeps on Ray, verl
runs on workers).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from prefect import get_run_logger

from adapters import cluster, dispatch, pool, tracking
from adapters.engines import python_envs
from adapters.logs import TO_API
from adapters.sweep_record import open_run, open_scheduled
from adapters.tracking import RunRow
from fp8rl_core.config.runs import Run, Sweep
from fp8rl_core.schedule import dispatch_order, engine_group

__all__ = ["STRATEGIES", "Context", "Mode", "Strategy", "mode_of", "side_by_side", "strategy_for", "worker_env"]


@dataclass(frozen=True)
class Context:
    """What a flow hands a strategy. ``run_one(run, mlflow_run)``: one run in this process, its MLflow run
    opened — its row (raises when the run failed); ``remote_task()``: the Prefect task a Ray worker runs one run
    with (called with ``run``, ``sweep``, ``sweep_id``, ``mlflow_run``, ``cwd``, ``matching``), as an importable
    module holds it; ``parent()``: the sweep's parent run (opened on the first call); ``progress(sweep, n)``: a
    block showing the progress, yielding ``done(row)``; ``flow_run``: the sweep's flow run; ``warmstart_cache``,
    ``script_dir`` (the folder a deployment loaded the flows from as a script module, else None): for
    :func:`worker_env`; ``ray_address``: the cluster (else ``RAY_ADDRESS``, else a local Ray); ``work_pool``: the
    pool of a ``POOL`` sweep."""

    run_one: Callable[[Run, str], RunRow]
    remote_task: Callable[[], Callable]
    parent: Callable[[], str]
    progress: Callable[[str, int], AbstractContextManager[Callable[[RunRow], None]]]
    flow_run: str
    warmstart_cache: str
    script_dir: str | None = None
    ray_address: str | None = None
    work_pool: str | None = None


class Strategy(Protocol):
    """How a sweep's runs are dispatched (the module's rule). ``what``: how the sweep's end names its runs."""

    what: str

    def check(self, sweep: Sweep, how: Context) -> None:
        """Refuse, before anything is recorded, what cannot host the runs."""

    def interrupted(self, e: BaseException) -> BaseException | str:
        """Why the sweep stopped, as its parent run's ``error`` says it (:func:`adapters.tracking.end_sweep_run`)."""

    def __call__(self, sweep: Sweep, todo: list[Run], how: Context) -> Iterable[RunRow]:
        """The rows of the runs ``todo``."""


def worker_env(how: Context) -> dict[str, str]:
    """What a worker's process needs to run a run as this one would: the tracking store, the artifact root and
    the warm-start cache (absolute), an engine venv's interpreter where the sweep runs that engine (SGLang)
    (:mod:`adapters.engines`), Prefect's ``logging.to_api`` when this process's is off (:mod:`adapters.logs`), and
    ``how.script_dir`` on ``PYTHONPATH`` (a deployment loaded the flows as the script module ``pipelines``: the
    flow in the task runs' context is pickled by reference to that module, so the workers must import it too)."""
    from prefect.settings import get_current_settings

    env = {"MLFLOW_TRACKING_URI": tracking.tracking_uri(), "FP8RL_ARTIFACTS": str(tracking.artifact_root().resolve()),
           "FP8RL_CACHE": str(Path(how.warmstart_cache).resolve())}
    if not get_current_settings().logging.to_api.enabled:  # this process's lines stay off the API: the workers' too
        env[TO_API] = "false"
    for var in python_envs():  # set by adapters.sweep_load for a sweep that runs an engine in its own venv (SGLang)
        if os.environ.get(var):
            env[var] = os.environ[var]
    if how.script_dir:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (how.script_dir, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _failed(run: Run, mlflow_run: str, e: Exception, plain: bool = True) -> RunRow:
    """The row of a run that raised (its MLflow run ended FAILED with the error), the error logged."""
    get_run_logger().error("run %s failed: %s: %s", run.name, type(e).__name__, tracking.plain_text(str(e)) if plain else e)
    return RunRow(run.id, mlflow_run, run.name, f"FAILED: {type(e).__name__}")


class _Native:
    """A native sweep: nothing to check before its runs (Ray's pre-flight needs the connection they go through)."""

    what = "runs"

    def check(self, sweep: Sweep, how: Context) -> None:
        pass

    def interrupted(self, e: BaseException) -> BaseException | str:
        return e


class Inline(_Native):
    """The runs one after another in this process, each ``how.run_one``; a failed run does not stop the others;
    interrupted, the runs not finished end KILLED. No Ray."""

    def __call__(self, sweep: Sweep, todo: list[Run], how: Context) -> list[RunRow]:
        from fp8rl_core.sampler.pool import release_all

        with how.progress(sweep.name, len(todo)) as done:
            opened = open_scheduled(sweep, todo, how.parent())  # every run's record before any runs
            rows = []
            try:
                for run, mlflow_run in opened:
                    try:
                        row = how.run_one(run, mlflow_run)
                    except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
                        row = _failed(run, mlflow_run, e, plain=False)
                    rows.append(row)
                    done(row)
            except BaseException as e:
                for _, mlflow_run in opened:
                    tracking.end_unfinished(mlflow_run, "KILLED", f"the sweep was interrupted ({type(e).__name__}: {e})")
                raise
            finally:
                release_all()
        return rows


class OnRay(_Native):
    """The runs as ``how.remote_task()`` task runs on Ray (:meth:`adapters.dispatch.RayCluster.run`), after the
    cluster's pre-flight (:func:`adapters.cluster.preflight`: before any MLflow run is opened), in
    :func:`fp8rl_core.schedule.dispatch_order` (warm starts side by side first)."""

    def __call__(self, sweep: Sweep, todo: list[Run], how: Context) -> list[RunRow]:
        resources = sweep.config.resources
        with dispatch.on_ray(how.ray_address, worker_env(how)) as ray_cluster:
            cluster.preflight(ray_cluster.nodes, [cluster.fit_problem(resources.ray_options(), ray_cluster.nodes,
                                                                     ray_cluster.where)],
                              prefect_api=ray_cluster.prefect_api)  # before any MLflow run is opened
            get_run_logger().info("%s: %d nodes; each run asks for %s", ray_cluster.where, len(ray_cluster.nodes),
                                  resources.describe())
            opened = open_scheduled(sweep, todo, how.parent())
            with how.progress(sweep.name, len(todo)) as done:
                opened = [opened[i] for i in dispatch_order([run for run, _ in opened])]
                jobs = [dispatch.Job(run.id, run.name, mlflow_run, engine_group(run),
                                     {"run": run, "sweep": sweep.name, "sweep_id": sweep.id, "mlflow_run": mlflow_run,
                                      "cwd": os.getcwd(), "matching": sweep.config.matching})
                        for run, mlflow_run in opened]
                return ray_cluster.run(how.remote_task(), jobs, resources.ray_options(), done)


class _Verl:
    """A ``backend: verl`` sweep whose trainers this process starts: the cluster they join checked first — each
    run takes ``verl.nnodes × verl.gpus_per_node`` GPUs; on CPU without a cluster address, each starts a Ray of
    its own with the slots it asks for. Interrupted: its flow run cancelled in Prefect, or the interrupt."""

    what = "verl runs"

    def check(self, sweep: Sweep, how: Context) -> None:
        own_ray = how.ray_address is None and not os.environ.get("RAY_ADDRESS")
        on_cluster = [r for r in sweep.runs if not (own_ray and r.config.verl.hardware == "cpu")]
        if on_cluster:  # verl's main_ppo joins this cluster (or, locally, starts a Ray of its own) after the pre-flight
            with dispatch.connected(how.ray_address) as (where, found):
                cluster.preflight(found, [cluster.verl_fit_problem(r.config.verl.nnodes, r.config.verl.gpus_per_node,
                                                                   found, where) for r in on_cluster])
        else:  # each run's verl starts its own local Ray with the slots the run asks for
            cluster.preflight([], [])

    def interrupted(self, e: BaseException) -> BaseException | str:
        return pool.interruption(e)


class OnPool(_Verl):
    """Each run a child flow run of the pool's ``verl-run`` deployment (:func:`adapters.pool.run_on_pool`), as many
    at once as the pool has free workers: every MLflow record opened first (SCHEDULED); each child's process gets
    :func:`worker_env` and verl's work folder of this process."""

    def check(self, sweep: Sweep, how: Context) -> None:
        online = pool.check_deployment(how.work_pool)
        get_run_logger().info("work pool %s: %d workers online; each run a flow run of %s", how.work_pool, online,
                              pool.deployment_name(how.work_pool))

    def __call__(self, sweep: Sweep, todo: list[Run], how: Context) -> list[RunRow]:
        parent = how.parent()
        env = worker_env(how) | {"FP8RL_VERL_WORK": str(Path(os.environ.get("FP8RL_VERL_WORK", ".cache/verl")).resolve())}
        source = str(Path(sweep.source).resolve())
        jobs = [pool.PoolJob(run.id, run.name, mlflow_run, {
            "config": source, "overrides": list(sweep.overrides), "run_id": run.id, "mlflow_run": mlflow_run,
            "parent": parent, "ray_address": how.ray_address}) for run, mlflow_run in open_scheduled(sweep, todo, parent)]
        with how.progress(sweep.name, len(jobs)) as done:
            return pool.run_on_pool(how.work_pool, jobs, env, done)


class SideBySide(_Verl):
    """The runs on this machine, :func:`side_by_side` at a time, each in a thread of this process running
    ``how.run_one`` (verl's trainer on a Ray of its own). Every MLflow record is opened first (SCHEDULED).
    SIGTERM/SIGINT: the trainers are terminated (:func:`adapters.verl_process.stop_all`), the runs not finished
    end KILLED, and the interrupt is raised."""

    def __call__(self, sweep: Sweep, todo: list[Run], how: Context) -> list[RunRow]:
        import concurrent.futures as cf
        import contextvars

        from adapters.signals import on_signals
        from adapters.verl_process import stop_all

        logger = get_run_logger()
        together = side_by_side(sweep, how.ray_address)

        def one(run: Run, mlflow_run: str) -> RunRow:
            try:
                return how.run_one(run, mlflow_run)
            except Exception as e:  # noqa: BLE001 — its MLflow run ended FAILED with the error; the others go on
                logger.error("run %s failed: %s: %s", run.name, type(e).__name__, tracking.plain_text(str(e)))
                return RunRow(run.id, mlflow_run, run.name, f"FAILED: {type(e).__name__}")

        def interrupt(signum, frame, previous):
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        opened = open_scheduled(sweep, todo, how.parent(), how.flow_run)
        logger.info("%d verl runs, %d at a time on this machine (resources: %s)", len(opened), together,
                    sweep.config.resources.describe())
        rows: list[RunRow] = []
        with cf.ThreadPoolExecutor(together, thread_name_prefix="verl-run") as threads:
            futures = {threads.submit(contextvars.copy_context().run, one, run, m): (run, m) for run, m in opened}
            try:
                with on_signals(interrupt), how.progress(sweep.name, len(opened)) as done:
                    for f in cf.as_completed(futures):
                        row = f.result()
                        rows.append(row)
                        done(row)
            except BaseException as e:
                reason = f"the sweep was interrupted ({type(e).__name__}: {e}) before this run finished"
                for f in futures:
                    f.cancel()
                stop_all()
                for run, m in futures.values():
                    tracking.end_unfinished(m, "KILLED", reason)
                raise
        return rows


class OneAfterAnother(_Verl):
    """The runs one at a time, each ``how.run_one`` in this process (verl's trainer on the cluster, or a Ray of
    its own), its MLflow record opened as it starts; a failed run does not stop the next. Gives each row as its
    run ends."""

    def __call__(self, sweep: Sweep, todo: list[Run], how: Context) -> Iterator[RunRow]:
        for run in todo:
            mlflow_run = open_run(run, sweep.name, sweep.id, how.flow_run, how.parent())
            try:
                yield how.run_one(run, mlflow_run)
            except Exception as e:  # noqa: BLE001 — its MLflow run ended FAILED with the error; the next one runs
                yield _failed(run, mlflow_run, e)


class Mode(Enum):
    """Where a sweep's runs go (the module's rule)."""

    INLINE = "inline"
    RAY = "ray"
    POOL = "work pool"
    SIDE_BY_SIDE = "verl side by side"
    ONE_AFTER_ANOTHER = "verl one after another"


#: each mode's strategy: the one place a mode is turned into what runs the sweep
STRATEGIES: Mapping[Mode, Strategy] = MappingProxyType({
    Mode.INLINE: Inline(), Mode.RAY: OnRay(), Mode.POOL: OnPool(), Mode.SIDE_BY_SIDE: SideBySide(),
    Mode.ONE_AFTER_ANOTHER: OneAfterAnother()})


def side_by_side(sweep: Sweep, ray_address: str | None) -> int:
    """How many of a verl sweep's runs start together on this machine: on CPU (``verl.hardware: cpu``), each on
    a Ray of its own (no cluster address), as many as fit this machine by the sweep's ``resources`` (its cores,
    its memory: :func:`adapters.cluster.capacity`), at least one; else one (GPU runs on one host share its GPUs:
    give each a worker of its own)."""
    if ray_address or os.environ.get("RAY_ADDRESS") or any(r.config.verl.hardware != "cpu" for r in sweep.runs):
        return 1
    return max(1, cluster.capacity(sweep.config.resources.ray_options(), [cluster.this_machine()]))


def mode_of(sweep: Sweep, *, inline: bool = False, ray_address: str | None = None, work_pool: str | None = None) -> Mode:
    """The mode of ``sweep`` run with the flow's ``inline``, ``ray_address`` and ``work_pool`` (else
    ``resources.work_pool``): a ``backend: verl`` sweep (never falling back to native) on the work pool, else side
    by side when this machine fits more than one run at once (:func:`side_by_side`), else one after another; a
    native sweep inline, else on Ray. ``ValueError`` for a sweep mixing backends or a native one given a pool."""
    pooled = bool(work_pool or sweep.config.resources.work_pool)
    if any(r.config.backend == "verl" for r in sweep.runs):
        if any(r.config.backend != "verl" for r in sweep.runs):
            raise ValueError(f"{sweep.source}: a sweep runs all its runs on one backend; this one mixes native and verl")
        if pooled:
            return Mode.POOL
        return Mode.SIDE_BY_SIDE if side_by_side(sweep, ray_address) > 1 else Mode.ONE_AFTER_ANOTHER
    if pooled:
        raise ValueError(f"{sweep.source}: a work pool (resources.work_pool, --work-pool) dispatches backend verl "
                         "runs; a native sweep's runs go to Ray (--ray-address)")
    return Mode.INLINE if inline else Mode.RAY


def strategy_for(sweep: Sweep, **how) -> Strategy:
    """The strategy of :func:`mode_of` (``how``: its keywords), from :data:`STRATEGIES`."""
    return STRATEGIES[mode_of(sweep, **how)]
