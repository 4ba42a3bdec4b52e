"""Prefect flows: one experiment, a fixed-weights matching run, a sweep of either, the nightly correctness run.

Flows only compose tasks (:mod:`tasks.stages`, :mod:`tasks.verl_run`), the tracking calls that open and
end an MLflow run (:func:`adapters.tracking.ending`: FINISHED, FAILED with the ``error`` tag, KILLED on a
signal) and the dispatcher that runs a sweep's experiments on Ray (:mod:`adapters.dispatch`).
"""

# annotations evaluated at definition (no postponed ones): Prefect validates the experiment flow's
# parameters against them on a Ray worker, where a postponed name (``Run``) does not resolve
import logging
import os
import signal
from pathlib import Path

from adapters.logs import TO_API, configure_vllm_logging, engines_here, lines_stay_off_a_temporary_api, quiet_process

# a Ray worker imports this module to run a task: the CLI's quiet defaults before the libraries load, and
# vLLM's logging configured before any task run logs (adapters.logs.configure_vllm_logging) — except in a
# process that only drives the runs on Ray (adapters.logs.driving_only: `fp8rl run` without --inline)
quiet_process()
if engines_here():
    configure_vllm_logging()

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.runtime import flow_run as runtime_flow_run  # noqa: E402

from adapters import cluster, dispatch, engines, pool, tracking  # noqa: E402
from adapters.tracking import RunRow  # noqa: E402
from flows import console  # noqa: E402
from flows.native_correctness import native_correctness  # noqa: E402
from fp8rl_core.config.runs import Run, Sweep  # noqa: E402
from fp8rl_core.config.sweep import MatchingSection  # noqa: E402
from fp8rl_core.schedule import dispatch_order, engine_group  # noqa: E402
from fp8rl_core.sampler.pool import release_all  # noqa: E402
from fp8rl_core.verl.payload import NO_VERL_HOOKS, VerlHooks  # noqa: E402
from tasks import reporting, stages  # noqa: E402

__all__ = ["RunsFailed", "experiment", "fixed_weights", "mxfp8_sweep", "nightly_correctness", "verl_run"]

WARMSTART_CACHE = os.environ.get("FP8RL_CACHE", ".cache/warmstart")
REPORTS = os.environ.get("FP8RL_REPORTS", "reports")


def _open(run: Run, sweep: str, sweep_id: str, flow_run: str | None, parent: str | None = None) -> str:
    params = tracking.flatten(run.config.model_dump(mode="json", exclude={"models_dir"}))
    return tracking.open_run(sweep, sweep_id, run.id, run.name, params, flow_run, parent=parent, tags=run.tags,
                             description=run.description)


def _flow_run() -> str:
    return str(runtime_flow_run.id or "none")


@flow(name="experiment", log_prints=True)
def experiment(run: Run, sweep: str = "adhoc", sweep_id: str = "adhoc", mlflow_run: str | None = None) -> RunRow:
    """One run (as :meth:`fp8rl_core.config.runs.Sweep.load` expanded it): warm start (or ``model_path``) → sampler-grid setup →
    (train step → weight sync → checks) × steps → KL and timing extraction → record. Returns the run's row
    with its summary metrics. ``mlflow_run``: the MLflow run the sweep opened for it (SCHEDULED; on Ray the
    sweep opens runs before dispatch), else a new one."""
    cfg, key = run.config, run.id
    flow_run = _flow_run()
    if mlflow_run is None:
        mlflow_run = _open(run, sweep, sweep_id, flow_run)
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run})
    try:
        with tracking.ending(mlflow_run), tracking.captured_logs(mlflow_run):
            ckpt = cfg.model_path or stages.warm_start_checkpoint(run.spec.model_dump(mode="json"),
                                                                  cfg.warmstart.model_dump(mode="json"), WARMSTART_CACHE)
            setup = stages.setup_sampler_grid(key, cfg, str(Path(ckpt).expanduser().resolve()))
            tracking.log_json(mlflow_run, "layers.json", {k: setup[k] for k in ("learner_layers", "sampler_schemes")})
            tracking.log_json(mlflow_run, "config.json", cfg.model_dump(mode="json"))
            tracking.log_metrics(mlflow_run, {"time/setup_s": setup["setup_s"],
                                              "time/engine_startup_s": setup["engine_startup_s"]})
            get_run_logger().info("run %s: set up in %.1f s (%s)", run.name, setup["setup_s"],
                                  f"engine started in {setup['engine_startup_s']:.1f} s" if setup["engine_startup_s"]
                                  else "engine reused")
            for step in range(1, cfg.loop.steps + 1):
                row = stages.train_step(key, step)
                row |= stages.weight_sync(key)
                row |= stages.invariant_checks(key, [[row["version"], row["new_version"] - 1]], row)  # + total_s
                stages.record_step(key, mlflow_run, row)
            summary = stages.extract_kl_timing(key)
            stages.record_run(key, mlflow_run, summary)
        return RunRow(key, mlflow_run, run.name, "FINISHED", summary)
    except BaseException:
        live = stages.LIVE.get(key)
        if live is not None:  # what the engine last held that passed every check
            tracking.set_tag(mlflow_run, "last_good_version", str(live.last_good_version))
        raise
    finally:
        stages.LIVE.pop(key, None)


@flow(name="fixed-weights", log_prints=True)
def fixed_weights(run: Run, matching: MatchingSection, sweep: str = "adhoc", sweep_id: str = "adhoc",
                  mlflow_run: str | None = None) -> RunRow:
    """One fixed-weights matching run (a sweep with a ``matching`` section): warm start (or ``model_path``) →
    the checkpoints (it, the learner after each of ``matching.steps`` RL steps; or the ``matching.checkpoints``
    named, without a warm start) → every variant synced in at each, W1–W7, exact KL on the paired probe set →
    record. Returns the run's row with its summary metrics."""
    cfg, key = run.config, run.id
    flow_run = _flow_run()
    if mlflow_run is None:
        mlflow_run = _open(run, sweep, sweep_id, flow_run)
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run})
    with tracking.ending(mlflow_run), tracking.captured_logs(mlflow_run):
        ckpt = None if matching.checkpoints is not None else cfg.model_path or stages.warm_start_checkpoint(
            run.spec.model_dump(mode="json"), cfg.warmstart.model_dump(mode="json"), WARMSTART_CACHE)
        for i, ref in enumerate(matching.checkpoints or ()):  # what the run id hashes: the path and its weights
            tracking.set_tag(mlflow_run, f"checkpoint.{i}", f"{ref.name}: {ref.path} (weights {ref.weights})")
        tracking.log_json(mlflow_run, "config.json", cfg.model_dump(mode="json") | {"matching": matching.model_dump(mode="json")})
        size = stages.fixed_weights(key, cfg, matching, ckpt)
        get_run_logger().info("run %s: %d syncs measured, %d engines started, %.0f s", run.name, size["syncs"],
                              size["engines"], size["seconds"])
        summary = stages.record_fixed_weights(key, mlflow_run)
    return RunRow(key, mlflow_run, run.name, "FINISHED", summary)


@task(name="run-experiment", cache_policy=NO_CACHE)
def run_experiment(run: Run, sweep: str, sweep_id: str, mlflow_run: str, cwd: str,
                   matching: MatchingSection | None = None) -> RunRow:
    """One run on the Ray worker this task landed on: the experiment flow (the fixed-weights flow for a
    sweep with a ``matching`` section), a subflow of this task run. The worker keeps its engines for the
    next run it gets (the engine pool is per process)."""
    if Path(cwd).is_dir():  # the checkout's relative paths (configs, caches) as on the driver
        os.chdir(cwd)
    if matching is not None:
        return fixed_weights(run, matching, sweep, sweep_id, mlflow_run)
    return experiment(run, sweep, sweep_id, mlflow_run)


def _worker_env() -> dict[str, str]:
    """What a Ray worker needs to run an experiment as the driver would: the tracking store, the artifact
    root and the warm-start cache (absolute), an engine venv's interpreter where the sweep runs that engine (SGLang)
    (:mod:`adapters.engines`), Prefect's ``logging.to_api`` when the driver's is off (:mod:`adapters.logs`), and
    — when a deployment loaded this file as the script module ``pipelines`` — its folder on ``PYTHONPATH`` (the
    flow in the task runs' context is pickled by reference to that module, so the workers must import it under
    that name too)."""
    from prefect.settings import get_current_settings

    env = {"MLFLOW_TRACKING_URI": tracking.tracking_uri(), "FP8RL_ARTIFACTS": str(tracking.artifact_root().resolve()),
           "FP8RL_CACHE": str(Path(WARMSTART_CACHE).resolve())}
    if not get_current_settings().logging.to_api.enabled:  # the driver's lines stay off the API: the workers' too
        env[TO_API] = "false"
    for var in engines.python_envs():  # set by _load for a sweep that runs an engine in its own venv (adapters.engines)
        if os.environ.get(var):
            env[var] = os.environ[var]
    if __name__ != "flows.pipelines":
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _inline(sweep: Sweep, todo: list[tuple[Run, str]], done) -> list[RunRow]:
    """The runs one after another in this process (``inline=True``): for a debugger, and the baseline of
    bench/orchestration.py. No Ray."""
    rows = []
    try:
        for run, mlflow_run in todo:
            try:
                matching = sweep.config.matching
                row = experiment(run, sweep.name, sweep.id, mlflow_run) if matching is None else \
                    fixed_weights(run, matching, sweep.name, sweep.id, mlflow_run)
            except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
                get_run_logger().error("run %s failed: %s: %s", run.name, type(e).__name__, e)
                row = RunRow(run.id, mlflow_run, run.name, f"FAILED: {type(e).__name__}")
            rows.append(row)
            done(row)
    except BaseException as e:
        for _, mlflow_run in todo:
            tracking.end_unfinished(mlflow_run, "KILLED", f"the sweep was interrupted ({type(e).__name__}: {e})")
        raise
    finally:
        release_all()
    return rows


def _on_ray(sweep: Sweep, todo: list[tuple[Run, str]], ray_cluster: dispatch.RayCluster, done) -> list[RunRow]:
    """The runs as ``run-experiment`` task runs on Ray, warm starts side by side first."""
    # the task as the importable module holds it: a deployment loads this file under a script-module name
    # that a Ray worker cannot import back (the task's function is pickled by reference)
    from flows.pipelines import run_experiment as task_fn

    todo = [todo[i] for i in dispatch_order([run for run, _ in todo])]
    jobs = [dispatch.Job(run.id, run.name, mlflow_run, engine_group(run),
                         {"run": run, "sweep": sweep.name, "sweep_id": sweep.id, "mlflow_run": mlflow_run,
                          "cwd": os.getcwd(), "matching": sweep.config.matching})
            for run, mlflow_run in todo]
    return ray_cluster.run(task_fn, jobs, sweep.config.resources.ray_options(), done)


def _skip_finished(sweep: Sweep, resume: bool) -> tuple[dict[str, RunRow], list[Run]]:
    """The rows of the runs already FINISHED in MLflow (same run id; none unless ``resume``), and the runs
    still to run, in sweep order."""
    logger = get_run_logger()
    rows: dict[str, RunRow] = {}
    pending: list[Run] = []
    for run in sweep.runs:
        found = tracking.find_finished(sweep.name, run.id) if resume else None
        if found is not None:
            logger.info("run %s (%s) already finished as MLflow run %s: skipped", run.name, run.id, found)
            rows[run.id] = RunRow(run.id, found, run.name, "SKIPPED (done)")
        else:
            pending.append(run)
    return rows, pending


class _ParentRun:
    """The sweep's parent run (:func:`adapters.tracking.open_sweep_run`), opened when first asked for — with
    the sweep's settings as params and ``sweep.json`` — so a sweep with nothing to run opens none."""

    def __init__(self, sweep: Sweep) -> None:
        self._sweep = sweep
        self.id: str | None = None

    def get(self) -> str:
        if self.id is None:
            sweep, config = self._sweep, self._sweep.config
            params = tracking.flatten(config.model_dump(mode="json", exclude={"correctness"})) | {"config": sweep.source}
            self.id = tracking.open_sweep_run(sweep.name, sweep.id, params, config.description)
            tracking.log_json(self.id, "sweep.json", config.model_dump(mode="json") | {
                "config": sweep.source, "overrides": list(sweep.overrides), "run_ids": [r.id for r in sweep.runs]})
        return self.id

    def end(self, rows: list[RunRow], interrupted: BaseException | str | None = None) -> None:
        """End it by its runs' rows (:func:`adapters.tracking.end_sweep_run`), if it was opened."""
        if self.id is not None:
            tracking.end_sweep_run(self.id, rows, interrupted=interrupted)


class RunsFailed(RuntimeError):
    """A sweep ended with failed runs (each told in its own line as it ended, and in its MLflow run)."""


def _raise_if_failed(rows: list[RunRow], what: str = "runs") -> None:
    failed = [r.name for r in rows if r.failed]
    if failed:
        raise RunsFailed(f"{len(failed)} of {len(rows)} {what} failed: {', '.join(failed)}; rerun the sweep to retry "
                           "them (their MLflow runs say why)")


def _verl_sweep(sweep: Sweep, resume: bool, report: bool, ray_address: str | None,
                work_pool: str | None = None) -> list[RunRow]:
    """A ``backend: verl`` sweep. With a work pool (``work_pool``, else ``resources.work_pool``): each run a
    child flow run of the pool's ``verl-run`` deployment (:mod:`adapters.pool`), as many at once as the pool
    has free workers, each starting its run on a Ray of its own on its node. Without one: check the cluster,
    then each run as verl's trainer (:func:`tasks.verl_run.run_verl`) in this process, one after another —
    each takes ``verl.nnodes × verl.gpus_per_node`` GPUs (on CPU, ``verl.hardware: cpu``, without a cluster
    address: that many slots of the Ray of its own verl starts). Nothing is opened in MLflow when the
    cluster or the pool cannot host the runs (:class:`adapters.cluster.ClusterError`). The runs are nested
    under the sweep's parent run, as a native sweep's; each ends FINISHED, or FAILED with verl's exit status
    and its error line (a failed check's line names condition, rank and layer), with the exception that
    stopped its launch, or with how its flow run ended (its process killed, its worker lost); KILLED when
    the sweep is interrupted or cancelled; runs already FINISHED are skipped when ``resume``; then the
    sweep's report."""
    runs = sweep.runs
    if any(r.config.backend != "verl" for r in runs):
        raise ValueError(f"{sweep.source}: a sweep runs all its runs on one backend; this one mixes native and verl")
    work_pool = work_pool or sweep.config.resources.work_pool
    if work_pool:
        online = pool.check_deployment(work_pool)
        get_run_logger().info("work pool %s: %d workers online; each run a flow run of %s", work_pool, online,
                              pool.deployment_name(work_pool))
    else:
        own_ray = ray_address is None and not os.environ.get("RAY_ADDRESS")
        on_cluster = [r for r in runs if not (own_ray and r.config.verl.hardware == "cpu")]
        if on_cluster:  # verl's main_ppo joins this cluster (or, locally, starts a Ray of its own) after the pre-flight
            with dispatch.connected(ray_address) as (where, found):
                cluster.preflight(found, [cluster.verl_fit_problem(r.config.verl.nnodes, r.config.verl.gpus_per_node,
                                                                   found, where) for r in on_cluster])
        else:  # each run's verl starts its own local Ray with the slots the run asks for
            cluster.preflight([], [])
    flow_run = _flow_run()
    rows, pending = _skip_finished(sweep, resume)
    parent = _ParentRun(sweep)
    try:
        if work_pool and pending:
            rows |= {r.run_id: r for r in _verl_on_pool(sweep, pending, work_pool, parent.get(), ray_address)}
        together = 1 if work_pool else _side_by_side(sweep, ray_address)
        if together > 1 and pending:
            rows |= _verl_side_by_side(sweep, pending, together, flow_run, parent.get())
        for run in [] if work_pool or together > 1 else pending:
            mlflow_run = _open(run, sweep.name, sweep.id, flow_run, parent.get())
            try:
                rows[run.id], _ = _verl_run(run, sweep.name, sweep.id, flow_run, parent.get(), ray_address,
                                            mlflow_run=mlflow_run)
            except Exception as e:  # noqa: BLE001 — its MLflow run ended FAILED with the error; the next one runs
                get_run_logger().error("run %s failed: %s: %s", run.name, type(e).__name__, tracking.plain_text(str(e)))
                rows[run.id] = RunRow(run.id, mlflow_run, run.name, f"FAILED: {type(e).__name__}")
    except BaseException as e:  # interrupted (its flow run cancelled in Prefect), or the sweep broke: its parent run says so
        parent.end(list(rows.values()), interrupted=pool.interruption(e))
        raise
    return _finish(sweep, [rows[r.id] for r in runs], parent, report, "verl runs")


def _side_by_side(sweep: Sweep, ray_address: str | None) -> int:
    """How many of a verl sweep's runs start together on this machine: on CPU (``verl.hardware: cpu``), each on
    a Ray of its own (no cluster address), as many as fit this machine by the sweep's ``resources`` (its cores,
    its memory: :func:`adapters.cluster.capacity`), at least one; else one (GPU runs on one host share its GPUs:
    give each a worker of its own)."""
    if ray_address or os.environ.get("RAY_ADDRESS") or any(r.config.verl.hardware != "cpu" for r in sweep.runs):
        return 1
    return max(1, cluster.capacity(sweep.config.resources.ray_options(), [cluster.this_machine()]))


def _verl_side_by_side(sweep: Sweep, pending: list[Run], together: int, flow_run: str, parent: str) -> dict[str, RunRow]:
    """The ``pending`` runs on this machine, ``together`` at a time, each in a thread of this process that runs
    verl's trainer on a Ray of its own (:func:`_verl_run`); their rows. Every MLflow record is opened first
    (SCHEDULED). SIGTERM/SIGINT: the trainers are terminated, the runs not finished end KILLED, and the
    interrupt is raised."""
    import concurrent.futures as cf
    import contextvars

    from adapters.signals import on_signals
    from tasks.verl_run import stop_all

    logger = get_run_logger()

    def one(run: Run, mlflow_run: str) -> RunRow:
        try:
            return _verl_run(run, sweep.name, sweep.id, flow_run, parent, None, mlflow_run=mlflow_run)[0]
        except Exception as e:  # noqa: BLE001 — its MLflow run ended FAILED with the error; the others go on
            logger.error("run %s failed: %s: %s", run.name, type(e).__name__, tracking.plain_text(str(e)))
            return RunRow(run.id, mlflow_run, run.name, f"FAILED: {type(e).__name__}")

    def interrupt(signum, frame, previous):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    todo = []
    for run in pending:
        mlflow_run = _open(run, sweep.name, sweep.id, flow_run, parent)
        tracking.schedule(mlflow_run)
        todo.append((run, mlflow_run))
    logger.info("%d verl runs, %d at a time on this machine (resources: %s)", len(todo), together,
                sweep.config.resources.describe())
    rows: dict[str, RunRow] = {}
    with cf.ThreadPoolExecutor(together, thread_name_prefix="verl-run") as pool_:
        futures = {pool_.submit(contextvars.copy_context().run, one, run, m): (run, m) for run, m in todo}
        try:
            with on_signals(interrupt), console.progress(sweep.name, len(todo)) as done:
                for f in cf.as_completed(futures):
                    row = f.result()
                    rows[row.run_id] = row
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


def _verl_on_pool(sweep: Sweep, pending: list[Run], work_pool: str, parent: str, ray_address: str | None) -> list[RunRow]:
    """The ``pending`` runs as child flow runs of the pool's ``verl-run`` deployment: every MLflow record
    opened first (SCHEDULED), then handed to Prefect; each child's process gets the tracking store, the
    artifact root, the warm-start cache and verl's work folder of this process (:func:`_worker_env`)."""
    env = _worker_env() | {"FP8RL_VERL_WORK": str(Path(os.environ.get("FP8RL_VERL_WORK", ".cache/verl")).resolve())}
    source = str(Path(sweep.source).resolve())
    jobs = []
    for run in pending:
        mlflow_run = _open(run, sweep.name, sweep.id, None, parent)
        tracking.schedule(mlflow_run)
        jobs.append(pool.PoolJob(run.id, run.name, mlflow_run, {
            "config": source, "overrides": list(sweep.overrides), "run_id": run.id, "mlflow_run": mlflow_run,
            "parent": parent, "ray_address": ray_address}))
    with console.progress(sweep.name, len(jobs)) as done:
        return pool.run_on_pool(work_pool, jobs, env, done)


@flow(name="verl-run", log_prints=True)
def verl_run(config: str, overrides: list[str], run_id: str, mlflow_run: str, parent: str,
             ray_address: str | None = None) -> str:
    """One run of a verl sweep, as a flow run of the ``verl-run`` deployment that a worker picked up: the run
    ``run_id`` of the sweep ``config`` with ``overrides`` (read and expanded here as the sweep did), through
    verl's trainer on a Ray of its own on this worker's node (``ray_address``: that cluster instead, after
    the guard of :mod:`adapters.ray_guard`), recorded in the MLflow run ``mlflow_run`` the sweep opened under
    its parent run ``parent`` (tags: this host, this process, verl's Ray address). Fails when the run
    failed (its MLflow run says why); returns its status."""
    sweep = Sweep.load(config, overrides)
    found = [r for r in sweep.runs if r.id == run_id]
    if not found:
        raise ValueError(f"{config} with {overrides} has no run {run_id}: the sweep changed since it was dispatched")
    row, out = _verl_run(found[0], sweep.name, sweep.id, _flow_run(), parent, ray_address, mlflow_run=mlflow_run)
    if row.failed:
        raise RuntimeError(out.reason)
    return row.status


def _verl_run(run: Run, sweep: str, sweep_id: str, flow_run: str, parent: str, ray_address: str | None = None,
              hooks: VerlHooks = NO_VERL_HOOKS, mlflow_run: str | None = None):
    """One run as verl's trainer (:func:`tasks.verl_run.run_verl`) in an MLflow run nested under ``parent``
    (``mlflow_run``: the one opened for it, else a new one), ended FINISHED or FAILED with verl's reason;
    returns its row and how verl ended. ``hooks``: the hooks of its syncs (no-op but in the correctness stage)."""
    from tasks.verl_run import run_verl

    faults = hooks.names()

    if mlflow_run is None:
        mlflow_run = _open(run, sweep, sweep_id, flow_run, parent)
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run, "verl.launch": "subprocess"}
                   | ({"fp8rl.fault": ", ".join(faults)} if faults else {}))
    # verl's own MLflow logger may end the run too: fp8rl's is the last word; a signal ends it KILLED, naming a
    # cancel in Prefect when its flow run (a verl-run on a worker, or the sweep's) was cancelled
    with tracking.ending(mlflow_run, _killed_by) as end:
        out = run_verl(run, sweep, mlflow_run, ray_address, WARMSTART_CACHE, hooks)
        if out.reason:
            end.fail(out.reason)
    get_run_logger().log(logging.ERROR if out.reason and not faults else logging.INFO, "run %s: %s (log: %s)",
                         run.name, out.reason or "verl's trainer finished", out.log)
    status = "FAILED: verl exit status " + str(out.returncode) if out.reason else "FINISHED"
    return RunRow(run.id, mlflow_run, run.name, status, tracking.headline_metrics(out.summary)), out


def _killed_by(signal_name: str) -> str:
    """Why a verl run's MLflow run ended KILLED: its flow run cancelled in Prefect (:func:`adapters.pool.cancelled`)
    and the signal its worker sent, else the signal."""
    why = pool.cancelled()
    return f"its {why}; stopped by signal {signal_name}" if why else f"interrupted by signal {signal_name}"


def _finish(sweep: Sweep, rows: list[RunRow], parent: "_ParentRun", report: bool, what: str = "runs") -> list[RunRow]:
    """The end of a sweep: the runs' table, the report of the finished runs (even if some failed; it can be
    rebuilt with ``fp8rl report``), the parent run ended by its runs, an error naming the failed ones."""
    logger = get_run_logger()
    out = console.console()
    out.print(console.sweep_table(sweep.name, rows, out.width))
    if report and not all(r.failed for r in rows):
        try:
            path = reporting.sweep_report(sweep.name, str(Path(REPORTS) / sweep.name), parent.get(), sweep.config)
            where = f"also in MLflow: the parent run {sweep.name}·{sweep.id[:6]} of experiment {sweep.name}"
            logger.info("sweep report: %s (%s)", path, where)
            out.print(f"report: {path} ({where})", markup=False, highlight=False)  # the log line reaches the log file only
        except Exception as e:  # noqa: BLE001 — the runs are recorded; a report can be rebuilt with `fp8rl report`
            logger.error("the sweep report failed (rebuild it with `fp8rl report %s`): %s: %s",
                         sweep.name, type(e).__name__, e)
    parent.end(rows)
    _raise_if_failed(rows, what)
    return rows


def _load(config: str | Sweep, overrides: list[str] | None) -> Sweep:
    """The sweep a flow runs: the one its caller read, expanded and checked (``fp8rl run``), as it is; else the
    file ``config`` (a deployment's parameter) with ``overrides``, read, expanded and checked here, once
    (:func:`fp8rl_core.verl.preflight.preflight`)."""
    if isinstance(config, Sweep):
        if overrides:
            raise ValueError(f"overrides {overrides} given with the expanded sweep {config.name} ({config.source}), "
                             "which carries its own; apply them when loading it")
        engines.engine_pythons(config.runs)  # an engine venv's interpreter (SGLang's), for this process and the Ray workers
        return config
    from fp8rl_core.verl.preflight import preflight

    sweep = Sweep.load(config, overrides or [])
    preflight(sweep.runs)  # a dataset's scorers, verl.overrides composed by verl (as `fp8rl run` does)
    engines.engine_pythons(sweep.runs)
    return sweep


def _sweep(sweep: Sweep, resume: bool = True, report: bool = False, ray_address: str | None = None,
           inline: bool = False, work_pool: str | None = None) -> list[RunRow]:
    logger = get_run_logger()
    logger.info("sweep %s (%s): %d runs from %s", sweep.name, sweep.id, len(sweep.runs), sweep.source)
    if any(r.config.backend == "verl" for r in sweep.runs):  # verl's trainer runs them: never fall back to native
        return _verl_sweep(sweep, resume=resume, report=report, ray_address=ray_address, work_pool=work_pool)
    if work_pool or sweep.config.resources.work_pool:
        raise ValueError(f"{sweep.source}: a work pool (resources.work_pool, --work-pool) dispatches backend verl "
                         "runs; a native sweep's runs go to Ray (--ray-address)")

    rows, pending = _skip_finished(sweep, resume)
    parent = _ParentRun(sweep)
    resources = sweep.config.resources

    def opened() -> list[tuple[Run, str]]:  # every run gets its MLflow record before any is dispatched
        out = []
        for run in pending:
            mlflow_run = _open(run, sweep.name, sweep.id, None, parent.get())
            tracking.schedule(mlflow_run)
            out.append((run, mlflow_run))
        return out

    try:
        if pending and inline:
            with console.progress(sweep.name, len(pending)) as done:
                rows |= {r.run_id: r for r in _inline(sweep, opened(), done)}
        elif pending:
            with dispatch.on_ray(ray_address, _worker_env()) as ray_cluster:
                cluster.preflight(ray_cluster.nodes, [cluster.fit_problem(resources.ray_options(), ray_cluster.nodes,
                                                                         ray_cluster.where)],
                                  prefect_api=ray_cluster.prefect_api)  # before any MLflow run is opened
                logger.info("%s: %d nodes; each run asks for %s", ray_cluster.where, len(ray_cluster.nodes),
                            resources.describe())
                todo = opened()
                with console.progress(sweep.name, len(pending)) as done:
                    rows |= {r.run_id: r for r in _on_ray(sweep, todo, ray_cluster, done)}
    except BaseException as e:  # interrupted, or the sweep itself broke: its parent run says so
        parent.end(list(rows.values()), interrupted=e)
        raise
    return _finish(sweep, [rows[r.id] for r in sweep.runs], parent, report)


@flow(name="mxfp8-sweep", log_prints=True)
def mxfp8_sweep(config: str | Sweep = "configs/smoke.yaml", overrides: list[str] | None = None, report: bool = True,
                ray_address: str | None = None, inline: bool = False, work_pool: str | None = None) -> list[RunRow]:
    """Run a sweep's experiments — ``config``: the sweep as ``fp8rl run`` expanded it (a
    :class:`~fp8rl_core.config.runs.Sweep`), or a sweep config file, expanded here with the ``key=value``
    ``overrides`` (a deployment's parameters) — each a task run on
    Ray (``ray_address``: join that cluster — ``auto``, ``host:port``, ``ray://host:10001``; else
    ``RAY_ADDRESS``; else a local Ray on this machine), placed by the sweep's ``resources``. Runs already
    FINISHED in MLflow (same run id) are skipped, failed ones run again. ``report``: then write the
    sweep's report (Markdown summary with the paper's claims, PNG figures) to ``reports/<sweep>/`` and
    log it to MLflow. ``inline``: no Ray, the runs one after another in this process (debugging).
    ``work_pool`` (else ``resources.work_pool``): a ``backend: verl`` sweep's runs as flow runs of that
    pool's ``verl-run`` deployment, one per free worker (docs/deploy.md, verl runs on workers)."""
    with lines_stay_off_a_temporary_api():
        return _sweep(_load(config, overrides), report=report, ray_address=ray_address, inline=inline,
                      work_pool=work_pool)


@flow(name="nightly-correctness", log_prints=True)
def nightly_correctness(config: str | Sweep = "configs/nightly.yaml", overrides: list[str] | None = None,
                        stages_to_run: list[str] | None = None, ray_address: str | None = None) -> dict:
    """The nightly correctness run (no resume): the sweep of every preset with the checks on, then the
    correctness stage — clean sync series on the dense and MoE models and every fault of the catalogue
    through the real sync path — whose detection matrix (CSV + PNG), verdicts and summary metrics go to
    one MLflow run named ``correctness``. Fails when a fault is not caught at its first sync by the
    check of its condition, or a clean sync raised an alarm. ``stages_to_run``: ``sweep``, ``correctness``
    (default both). ``ray_address``: where the sweep's runs go (as in mxfp8-sweep); the correctness stage
    runs in this process. ``config``: as in mxfp8-sweep; the sweep is read and expanded once for both stages."""
    which = set(stages_to_run or ("sweep", "correctness"))
    sweep = _load(config, overrides)
    out: dict = {}
    with lines_stay_off_a_temporary_api():
        if "sweep" in which:
            out["sweep"] = _sweep(sweep, resume=False, ray_address=ray_address)
        if "correctness" in which:
            out["correctness"] = _correctness(sweep)
    return out


def _correctness(sweep: Sweep) -> dict:
    from fp8rl_core.correctness_series import wanted_faults

    runs = sweep.correctness
    if not runs:
        raise ValueError(f"{sweep.source}: no 'correctness' section; nothing to check")
    section = sweep.config.correctness
    wanted = wanted_faults(section)
    params = tracking.flatten(section.model_dump(mode="json"))
    stage = section.id()
    mlflow_run = tracking.open_run(sweep.name, stage, f"correctness-{stage}", "correctness", params, _flow_run())
    if any(run.config.backend == "verl" for run in runs.values()):
        from flows.verl_correctness import verl_correctness

        return verl_correctness(sweep, wanted, mlflow_run, _flow_run(), _verl_run)  # it picks each model's faults
    return native_correctness(sweep, wanted, mlflow_run, WARMSTART_CACHE)


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]
