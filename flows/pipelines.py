"""Prefect flows: one experiment, a sweep of experiments, the nightly correctness run.

Flows only compose tasks (:mod:`tasks.stages`) and the tracking calls that open and close an MLflow
run. An experiment is one MLflow run; a failure ends it FAILED with the exception as the ``error`` tag,
and SIGTERM/SIGINT end it KILLED — metrics and artifacts logged before stay.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from flows.logs import configure_vllm_logging, engines_here, quiet_process

# a Ray worker imports this module to run a task: the CLI's quiet defaults before the libraries load, and
# vLLM's logging configured before any task run logs (flows.logs.configure_vllm_logging) — except in a
# process that only drives the runs on Ray (flows.logs.driving_only: `fp8rl run` without --inline)
quiet_process()
if engines_here():
    configure_vllm_logging()

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.runtime import flow_run as runtime_flow_run  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from fp8rl_core.config import (  # noqa: E402
    RunConfig, SweepConfig, dispatch_order, engine_group, load_sweep, next_run, run_id,
)
from fp8rl_core.sampler.pool import release_all  # noqa: E402
from fp8rl_core.vocabulary import CONDITIONS  # noqa: E402
from tasks import cluster, reporting, stages, tracking  # noqa: E402

__all__ = ["experiment", "mxfp8_sweep", "nightly_correctness"]

WARMSTART_CACHE = os.environ.get("FP8RL_CACHE", ".cache/warmstart")
REPORTS = os.environ.get("FP8RL_REPORTS", "reports")


def short_model(model: str) -> str:
    """A model's name without its family (``qwen3-dense-mini`` → ``dense-mini``) when two parts remain: the
    narrow name column of the UI shows the part that differs; the full name is the run's ``model`` tag."""
    family, _, rest = model.partition("-")
    return rest if "-" in rest else model


def run_name(cfg: RunConfig) -> str:
    """The run's short, distinct name: ``dense-mini·bf16-sampler·s0`` (model·preset·seed)."""
    return f"{short_model(cfg.model)}·{cfg.preset}·s{cfg.seed}"


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """The tags a user groups and filters runs by (the full names)."""
    from fp8rl_core.sampler.presets import PRESETS

    return {"model": cfg.model, "preset": cfg.preset, "seed": str(cfg.seed), "backend": cfg.backend,
            "learner_precision": PRESETS[cfg.preset].learner_precision if cfg.preset in PRESETS else ""}


def run_description(cfg: RunConfig) -> str:
    """The run's one line in the UI: what it ran."""
    from fp8rl_core.sampler.presets import PRESETS

    what = PRESETS[cfg.preset].what if cfg.preset in PRESETS else cfg.preset
    return f"{cfg.model}, preset {cfg.preset} ({what}), seed {cfg.seed}, {cfg.loop.steps} RL steps"


def _open(cfg: RunConfig, sweep: str, sweep_id: str, flow_run: str | None, parent: str | None = None) -> str:
    params = tracking.flatten(cfg.model_dump(mode="json", exclude={"models_dir"}))
    return tracking.open_run(sweep, sweep_id, run_id(cfg), run_name(cfg), params, flow_run, parent=parent,
                             tags=run_tags(cfg), description=run_description(cfg))


@contextmanager
def _on_signals(react):
    """While the block runs, SIGTERM and SIGINT call ``react(signum, frame, previous_handler)``; the previous
    handlers come back after. Main thread only (elsewhere Python cannot install handlers: a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, frame: react(signum, frame, previous[signum]))
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def _killed_on_signal(mlflow_run: str):
    """Mark the MLflow run KILLED on SIGTERM/SIGINT (main thread only), then let the signal act."""

    def react(signum, frame, previous):
        tracking.set_tag(mlflow_run, "error", f"interrupted by signal {signal.Signals(signum).name}")
        tracking.terminate(mlflow_run, "KILLED")
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt(f"signal {signum}")

    with _on_signals(react):
        yield


@flow(name="experiment", log_prints=True)
def experiment(run: dict, sweep: str = "adhoc", sweep_id: str = "adhoc", mlflow_run: str | None = None) -> dict:
    """One run: warm start → sampler-grid setup → (train step → weight sync → checks) × steps → KL and
    timing extraction → record. Returns the run's summary metrics. ``mlflow_run``: the MLflow run the
    sweep opened for it (SCHEDULED; on Ray the sweep opens runs before dispatch), else a new one."""
    cfg = RunConfig.model_validate(run)
    key = run_id(cfg)
    flow_run = str(runtime_flow_run.id or "none")
    if mlflow_run is None:
        mlflow_run = _open(cfg, sweep, sweep_id, flow_run)
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run})
    try:
        with tracking.captured_logs(mlflow_run), _killed_on_signal(mlflow_run):
            ckpt = stages.warm_start_checkpoint(cfg.spec().model_dump(mode="json"),
                                                cfg.warmstart.model_dump(mode="json"), WARMSTART_CACHE)
            setup = stages.setup_sampler_grid(key, cfg.model_dump(mode="json"), ckpt)
            tracking.log_json(mlflow_run, "layers.json", {k: setup[k] for k in ("learner_layers", "sampler_schemes")})
            tracking.log_json(mlflow_run, "config.json", cfg.model_dump(mode="json"))
            tracking.log_metrics(mlflow_run, {"time/setup_s": setup["setup_s"],
                                              "time/engine_startup_s": setup["engine_startup_s"]})
            get_run_logger().info("run %s: set up in %.1f s (%s)", run_name(cfg), setup["setup_s"],
                                  f"engine started in {setup['engine_startup_s']:.1f} s" if setup["engine_startup_s"]
                                  else "engine reused")
            for step in range(1, cfg.loop.steps + 1):
                row = stages.train_step(key, step)
                row |= stages.weight_sync(key)
                row |= stages.invariant_checks(key, [[row["version"], row["new_version"] - 1]])
                row["total_s"] = row["train_stage_s"] + row["export_s"] + row["transport_s"] + row["load_s"] \
                    + row["reset_s"] + row["checks_s"]
                stages.record_step(key, mlflow_run, row)
            summary = stages.extract_kl_timing(key)
            stages.record_run(key, mlflow_run, summary)
        tracking.terminate(mlflow_run, "FINISHED")
        return {"run_id": key, "mlflow_run": mlflow_run, "name": run_name(cfg), "status": "FINISHED"} | summary
    except BaseException as e:
        live = stages.LIVE.get(key)
        if live is not None:  # what the engine last held that passed every check
            tracking.set_tag(mlflow_run, "last_good_version", str(live.last_good_version))
        if tracking.client().get_run(mlflow_run).info.status == "RUNNING":  # not already KILLED by a signal
            tracking.set_tag(mlflow_run, "error", f"{type(e).__name__}: {e}")
            tracking.terminate(mlflow_run, "FAILED")
        raise
    finally:
        stages.LIVE.pop(key, None)


def _table(sweep: str, rows: list[dict]) -> Table:
    t = Table(title=f"sweep {sweep}: {len(rows)} runs")
    t.add_column("run", no_wrap=True)
    t.add_column("status")
    for _, label, *_ in tracking.HEADLINE:
        t.add_column(label, justify="right")
    for r in rows:
        t.add_row(r["name"], r["status"], *(f"{r[k]:.4g}" if isinstance(r.get(k), float) else "–" for k, *_ in tracking.HEADLINE))
    return t


def _portable(cfg: RunConfig) -> dict:
    """The run as a dict a worker on any node can load: the model-spec folder as an absolute path (a
    worker's working directory is not the driver's; every host has the checkout at the same path)."""
    return cfg.model_dump(mode="json") | {"models_dir": str(Path(cfg.models_dir).resolve())}


@task(name="run-experiment", cache_policy=NO_CACHE)
def run_experiment(run: dict, sweep: str, sweep_id: str, mlflow_run: str, cwd: str) -> dict:
    """One run on the Ray worker this task landed on: the experiment flow, a subflow of this task run.
    The worker keeps its engines for the next run it gets (the engine pool is per process)."""
    if Path(cwd).is_dir():  # the checkout's relative paths (configs, caches) as on the driver
        os.chdir(cwd)
    return experiment(run, sweep, sweep_id, mlflow_run)


def _prefect_api_url() -> str:
    """The Prefect API the sweep reports to — the configured server, or this process's temporary one."""
    from prefect import get_client

    with get_client(sync_client=True) as c:
        return str(c.api_url)


def _crash(future, reason: str) -> None:
    """Tell Prefect a task run whose Ray worker died is over (nobody else will: it stays Running)."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as c:
            c.set_task_run_state(future.task_run_id, Crashed(message=reason), force=True)
    except Exception as e:  # noqa: BLE001 — the MLflow record is what matters; say why Prefect's is stale
        get_run_logger().warning("could not mark task run %s Crashed: %s", future.task_run_id, e)


@contextmanager
def _on_ray(sweep: SweepConfig, sweep_id: str, address: str | None):
    """Connect to Ray — a local Ray without an address (or ``RAY_ADDRESS``), else that cluster — check
    that the sweep can run there, and yield ``dispatch(todo, done)``: it runs ``todo`` (run config, MLflow
    run opened SCHEDULED) as Prefect task runs on Ray and returns one row per run as each ends
    (``done(row)`` each time). Raises :class:`ClusterError` before anything is dispatched when one run
    fits on no node, or when a multi-node cluster could not reach the tracking store or the Prefect API.
    A run whose worker died (killed, out of memory, node lost) is ended FAILED in MLflow with Ray's
    reason; on SIGTERM/SIGINT the runs still scheduled or running are cancelled and ended KILLED."""
    import ray
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    logger = get_run_logger()
    env = {"MLFLOW_TRACKING_URI": tracking.tracking_uri(), "FP8RL_ARTIFACTS": str(tracking.artifact_root().resolve()),
           "FP8RL_CACHE": str(Path(WARMSTART_CACHE).resolve())}
    if __name__ != "flows.pipelines":
        # a deployment loads this file as the script module `pipelines`; the flow in the task runs' context
        # is pickled by reference to it, so the workers must be able to import it under that name too
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    local = address is None and not os.environ.get("RAY_ADDRESS")
    init = {"log_to_driver": False, "logging_level": logging.WARNING, "runtime_env": {"env_vars": env}}
    if local:  # the embedded default: this machine's cores, no dashboard, a small object store (rows only)
        init |= {"include_dashboard": False, "object_store_memory": 256 * 2**20}
    api = _prefect_api_url()
    with RayTaskRunner(address=address, init_kwargs=init) as runner:
        where = "a local Ray" if local else f"the Ray cluster at {address or os.environ['RAY_ADDRESS']}"
        found = cluster.nodes()
        problems = [cluster.fit_problem(sweep.resources.ray_options(), found, where),
                    cluster.loopback_problem("the Prefect API (PREFECT_API_URL)", api, found, tracking.this_host_ips())]
        try:
            tracking.require_shared_store(len(found), node_ips=[n.ip for n in found])
        except ValueError as e:
            problems.append(str(e))
        problems = [p for p in problems if p]
        if problems:
            raise ClusterError("\n".join(problems))
        logger.info("%s: %d nodes; each run asks for %s", where, len(found), sweep.resources.describe())

        slots = cluster.capacity(sweep.resources.ray_options(), found)

        def dispatch(todo: list[tuple[RunConfig, str]], done) -> list[dict]:
            # the task as the importable module holds it: a deployment loads this file under a script-module
            # name that a Ray worker cannot import back (the task's function is pickled by reference)
            from flows.pipelines import run_experiment as task_fn

            # ``slots`` runs in flight; a finished run's worker is the free one, so the run handed out next
            # lands there — the next of its engine group when one is left (fp8rl_core.config.next_run)
            queue = list(todo)
            groups = [engine_group(cfg) for cfg, _ in queue]
            futures: dict = {}

            def submit(i: int) -> None:
                cfg, mlflow_run = queue.pop(i)
                group = groups.pop(i)
                with temporary_settings(updates={PREFECT_API_URL: api}), \
                        remote_options(**sweep.resources.ray_options(), max_retries=0, max_calls=0):
                    f = runner.submit(task_fn, {"run": _portable(cfg), "sweep": sweep.sweep, "sweep_id": sweep_id,
                                                "mlflow_run": mlflow_run, "cwd": os.getcwd()})
                futures[f.wrapped_future] = (f, cfg, mlflow_run, group)

            for _ in range(min(slots, len(queue))):
                submit(next_run(groups, None, [g for *_, g in futures.values()]))
            rows: list[dict] = []
            got: dict[str, str] = {}
            try:
                with _interrupts_raise() as got:
                    while futures:  # a timeout, so a signal is handled within a second
                        ready, _ = ray.wait(list(futures), num_returns=1, timeout=1.0)
                        for ref in ready:
                            f, cfg, mlflow_run, group = futures.pop(ref)
                            if queue:  # this worker is free: hand it its next run before recording this one
                                submit(next_run(groups, group, [g for *_, g in futures.values()]))
                            row = _collect(f, cfg, mlflow_run)
                            rows.append(row)
                            done(row)
            except BaseException as e:  # interrupted: nothing keeps running, nothing is left SCHEDULED/RUNNING
                why = f"signal {got['signal']}" if "signal" in got else f"{type(e).__name__}: {e}"
                reason = f"the sweep was interrupted ({why}) before this run finished"
                for ref in futures:
                    ray.cancel(ref, force=True)
                for _, _, mlflow_run, _ in futures.values():
                    tracking.end_unfinished(mlflow_run, "KILLED", reason)
                for _, mlflow_run in queue:  # never dispatched
                    tracking.end_unfinished(mlflow_run, "KILLED", reason)
                if "signal" in got and not str(e):  # Ray re-raised it bare: the sweep's parent run names the signal
                    raise KeyboardInterrupt(why) from e
                raise
            return rows

        yield dispatch


class ClusterError(RuntimeError):
    """The sweep cannot run on this cluster as configured (nothing was run)."""


def _collect(f, cfg: RunConfig, mlflow_run: str) -> dict:
    """The row of a finished task run: its result, the run's own failure, or its worker's death."""
    import ray

    key = run_id(cfg)
    try:
        return f.result()
    except ray.exceptions.RayError as e:  # the worker died, or Ray could not run the task: nobody ended the MLflow run
        died = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError)
        cause = getattr(e, "cause", None) or e  # a RayTaskError wraps what happened in the worker
        lines = [x for x in str(cause).splitlines() if x.strip()] or [""]
        what = "the Ray worker running this run died" if isinstance(e, died) else "Ray could not run this run"
        reason = f"{what}: {type(cause).__name__}: {lines[-1] if cause is not e else lines[0]}"
        get_run_logger().error("run %s: %s", run_name(cfg), reason)
        tracking.end_unfinished(mlflow_run, "FAILED", reason)
        _crash(f, reason)
        return {"run_id": key, "mlflow_run": mlflow_run, "name": run_name(cfg), "status": f"FAILED: {type(e).__name__}"}
    except Exception as e:  # noqa: BLE001 — the run failed (and its experiment flow ended it FAILED)
        get_run_logger().error("run %s failed: %s: %s", run_name(cfg), type(e).__name__, e)
        tracking.end_unfinished(mlflow_run, "FAILED", f"{type(e).__name__}: {e}")
        return {"run_id": key, "mlflow_run": mlflow_run, "name": run_name(cfg), "status": f"FAILED: {type(e).__name__}"}


@contextmanager
def _interrupts_raise():
    """SIGTERM (and SIGINT) raise KeyboardInterrupt in the driver's main thread while it waits on Ray; the
    yielded dict gets the signal's name (Ray's wait re-raises the interrupt without its message)."""
    got: dict[str, str] = {}

    def react(signum, frame, previous):
        got["signal"] = signal.Signals(signum).name
        raise KeyboardInterrupt(f"signal {got['signal']}")

    with _on_signals(react):
        yield got


def _inline(sweep: SweepConfig, sweep_id: str, todo: list[tuple[RunConfig, str]], done: callable) -> list[dict]:
    """The runs one after another in this process (``inline=True``): for a debugger, and the baseline of
    bench/orchestration.py. No Ray."""
    rows = []
    try:
        for cfg, mlflow_run in todo:
            try:
                row = experiment(cfg.model_dump(mode="json"), sweep.sweep, sweep_id, mlflow_run)
            except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
                get_run_logger().error("run %s failed: %s: %s", run_name(cfg), type(e).__name__, e)
                row = {"run_id": run_id(cfg), "mlflow_run": mlflow_run, "name": run_name(cfg),
                       "status": f"FAILED: {type(e).__name__}"}
            rows.append(row)
            done(row)
    except BaseException as e:
        for _, mlflow_run in todo:
            tracking.end_unfinished(mlflow_run, "KILLED", f"the sweep was interrupted ({type(e).__name__}: {e})")
        raise
    finally:
        release_all()
    return rows


def _verl_sweep(sweep: SweepConfig, runs: list[RunConfig], sweep_id: str, config: str, resume: bool,
                ray_address: str | None) -> list[dict]:
    """A ``backend: verl`` sweep: check the cluster, then each run as verl's trainer
    (:func:`tasks.verl_run.run_verl`), one after another — each takes ``verl.nnodes × verl.gpus_per_node``
    GPUs, the whole cluster as configured. Nothing is opened in MLflow when the cluster cannot host the runs
    (:class:`ClusterError`: too few GPUs per node, a tracking store other nodes cannot share). Each run's
    MLflow run ends FINISHED, or FAILED with verl's exit status and last error lines (KILLED on a signal);
    runs already FINISHED are skipped when ``resume``."""
    import ray

    from tasks.verl_run import run_verl

    logger = get_run_logger()
    if any(r.backend != "verl" for r in runs):
        raise ValueError(f"{config}: a sweep runs all its runs on one backend; this one mixes native and verl")
    local = ray_address is None and not os.environ.get("RAY_ADDRESS")
    where = "a local Ray (this machine)" if local else f"the Ray cluster at {ray_address or os.environ['RAY_ADDRESS']}"
    ray.init(address=ray_address, log_to_driver=False, logging_level=logging.WARNING,
             **({"include_dashboard": False, "object_store_memory": 256 * 2**20} if local else {}))
    try:  # the pre-flight: verl's main_ppo joins this cluster (or, locally, starts the same Ray) after it
        found = cluster.nodes()
        problems = {cluster.verl_fit_problem(r.verl.nnodes, r.verl.gpus_per_node, found, where) for r in runs}
        try:
            tracking.require_shared_store(len(found), node_ips=[n.ip for n in found])
        except ValueError as e:
            problems.add(str(e))
    finally:
        ray.shutdown()
    problems.discard(None)
    if problems:
        raise ClusterError("\n".join(sorted(problems)))
    flow_run = str(runtime_flow_run.id or "none")
    rows = []
    for cfg in runs:
        key = run_id(cfg)
        done = tracking.find_finished(sweep.sweep, key) if resume else None
        if done is not None:
            rows.append({"run_id": key, "mlflow_run": done, "name": run_name(cfg), "status": "SKIPPED (done)"})
            continue
        mlflow_run = _open(cfg, sweep.sweep, sweep_id, flow_run)
        tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run, "verl.launch": "subprocess"})
        try:
            with _killed_on_signal(mlflow_run):
                out = run_verl(_portable(cfg), sweep.sweep, mlflow_run, ray_address)
        except BaseException as e:  # the launch itself failed, or a signal (the run is KILLED already)
            tracking.end_unfinished(mlflow_run, "FAILED", f"{type(e).__name__}: {e}")
            raise
        if out.reason:  # verl's own MLflow logger may have ended the run already: fp8rl's verdict is the last word
            tracking.set_tag(mlflow_run, "error", out.reason)
        tracking.terminate(mlflow_run, "FAILED" if out.reason else "FINISHED")
        logger.log(logging.ERROR if out.reason else logging.INFO, "run %s: %s (log: %s)", run_name(cfg),
                   out.reason or "verl's trainer finished", out.log)
        rows.append({"run_id": key, "mlflow_run": mlflow_run, "name": run_name(cfg),
                     "status": "FAILED: verl exit status " + str(out.returncode) if out.reason else "FINISHED"})
    Console(width=140).print(_table(sweep.sweep, rows))
    failed = [r["name"] for r in rows if r["status"].startswith("FAILED")]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} verl runs failed: {', '.join(failed)} (their MLflow runs "
                           "say why); rerun the sweep to retry them")
    return rows


def _sweep(config: str, overrides: list[str], resume: bool = True, report: bool = False,
           ray_address: str | None = None, inline: bool = False) -> list[dict]:
    logger = get_run_logger()
    sweep, runs = load_sweep(config, overrides)
    ids = [run_id(r) for r in runs]
    sweep_id = hashlib.sha256(",".join(ids).encode()).hexdigest()[:12]
    logger.info("sweep %s (%s): %d runs from %s", sweep.sweep, sweep_id, len(runs), config)
    if any(r.backend == "verl" for r in runs):  # verl's trainer runs them: never fall back to native
        return _verl_sweep(sweep, runs, sweep_id, config, resume=resume, ray_address=ray_address)

    rows: dict[str, dict] = {}
    pending: list[RunConfig] = []
    for cfg in runs:
        key = run_id(cfg)
        found = tracking.find_finished(sweep.sweep, key) if resume else None
        if found is not None:
            logger.info("run %s (%s) already finished as MLflow run %s: skipped", run_name(cfg), key, found)
            rows[key] = {"run_id": key, "mlflow_run": found, "name": run_name(cfg), "status": "SKIPPED (done)"}
        else:
            pending.append(cfg)

    parent: list[str] = []  # the sweep's parent run, opened with the first run (tracking.open_sweep_run)

    def sweep_run() -> str:
        if not parent:
            params = tracking.flatten(sweep.model_dump(mode="json", exclude={"correctness"})) | {"config": str(config)}
            parent.append(tracking.open_sweep_run(sweep.sweep, sweep_id, params, sweep.description))
            tracking.log_json(parent[0], "sweep.json", sweep.model_dump(mode="json") | {"config": str(config),
                                                                                       "overrides": overrides})
        return parent[0]

    def opened() -> list[tuple[RunConfig, str]]:  # every run gets its MLflow record before any is dispatched
        out = []
        for cfg in pending:
            mlflow_run = _open(cfg, sweep.sweep, sweep_id, None, sweep_run())
            tracking.schedule(mlflow_run)
            out.append((cfg, mlflow_run))
        return out

    progress = Progress(TextColumn(f"sweep {sweep.sweep}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = progress.add_task("", total=len(pending))
    t0 = time.monotonic()

    def done(row: dict) -> None:  # one line per run as it ends: the progress in a log too
        progress.advance(bar)
        n = int(progress.tasks[0].completed)
        progress.console.print(f"{n:>3}/{len(pending)} {row['name']}: {row['status']} (after {time.monotonic() - t0:.0f} s)",
                               markup=False, highlight=False)

    try:
        if pending and inline:
            with progress:
                rows |= {r["run_id"]: r for r in _inline(sweep, sweep_id, opened(), done)}
        elif pending:
            with _on_ray(sweep, sweep_id, ray_address) as dispatch:  # checks the cluster before opening runs
                todo = opened()
                todo = [todo[i] for i in dispatch_order([cfg for cfg, _ in todo])]  # warm starts side by side
                with progress:
                    rows |= {r["run_id"]: r for r in dispatch(todo, done)}
    except BaseException as e:  # interrupted, or the sweep itself broke: its parent run says so
        if parent:
            tracking.end_sweep_run(parent[0], list(rows.values()), interrupted=e)
        raise
    rows = [rows[k] for k in ids]
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # logs and CI: room for the full run names
    console.print(_table(sweep.sweep, rows))
    failed = [r["name"] for r in rows if r["status"].startswith("FAILED")]
    if report and len(failed) < len(rows):  # the finished runs' summary + figures, even if some failed
        try:
            path = reporting.sweep_report(sweep.sweep, str(Path(REPORTS) / sweep.sweep), sweep_run())
            where = f"also in MLflow: the parent run {sweep.sweep}·{sweep_id[:6]} of experiment {sweep.sweep}"
            logger.info("sweep report: %s (%s)", path, where)
            console.print(f"report: {path} ({where})", markup=False, highlight=False)  # the log line reaches the log file only
        except Exception as e:  # noqa: BLE001 — the runs are recorded; a report can be rebuilt with `fp8rl report`
            logger.error("the sweep report failed (rebuild it with `fp8rl report %s`): %s: %s",
                         sweep.sweep, type(e).__name__, e)
    if parent:
        tracking.end_sweep_run(parent[0], rows)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} runs failed: {', '.join(failed)}; rerun the sweep to retry them")
    return rows


@flow(name="mxfp8-sweep", log_prints=True)
def mxfp8_sweep(config: str = "configs/smoke.yaml", overrides: list[str] | None = None, report: bool = True,
                ray_address: str | None = None, inline: bool = False) -> list[dict]:
    """Expand the sweep config (with ``key=value`` overrides) and run its experiments, each a task run on
    Ray (``ray_address``: join that cluster — ``auto``, ``host:port``, ``ray://host:10001``; else
    ``RAY_ADDRESS``; else a local Ray on this machine), placed by the sweep's ``resources``. Runs already
    FINISHED in MLflow (same run id) are skipped, failed ones run again. ``report``: then write the
    sweep's report (Markdown summary with the paper's claims, PNG figures) to ``reports/<sweep>/`` and
    log it to MLflow. ``inline``: no Ray, the runs one after another in this process (debugging)."""
    return _sweep(config, list(overrides or []), report=report, ray_address=ray_address, inline=inline)


@flow(name="nightly-correctness", log_prints=True)
def nightly_correctness(config: str = "configs/nightly.yaml", overrides: list[str] | None = None,
                        stages_to_run: list[str] | None = None, ray_address: str | None = None) -> dict:
    """The nightly correctness run (no resume): the sweep of every preset with the checks on, then the
    correctness stage — clean sync series on the dense and MoE models and every fault of the catalogue
    through the real sync path — whose detection matrix (CSV + PNG), verdicts and summary metrics go to
    one MLflow run named ``correctness``. Fails when a fault is not caught at its first sync by the
    check of its condition, or a clean sync raised an alarm. ``stages_to_run``: ``sweep``, ``correctness``
    (default both). ``ray_address``: where the sweep's runs go (as in mxfp8-sweep); the correctness stage
    runs in this process."""
    which = set(stages_to_run or ("sweep", "correctness"))
    out: dict = {}
    if "sweep" in which:
        out["sweep"] = _sweep(config, list(overrides or []), resume=False, ray_address=ray_address)
    if "correctness" in which:
        out["correctness"] = _correctness(config, list(overrides or []))
    return out


def _correctness(config: str, overrides: list[str]) -> dict:
    from fp8rl_core.checks.faults import FAULTS
    from fp8rl_core.config import correctness_runs, run_id

    logger = get_run_logger()
    sweep, _ = load_sweep(config, overrides)
    runs = correctness_runs(sweep, config)
    if not runs:
        raise ValueError(f"{config}: no 'correctness' section; nothing to check")
    section = sweep.correctness
    wanted = [f for f in FAULTS if section.faults is None or f.name in section.faults]
    wanted = [f for f in wanted if f.model in runs]
    params = tracking.flatten(section.model_dump(mode="json"))
    sweep_id = hashlib.sha256(json.dumps(section.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:12]
    mlflow_run = tracking.open_run(sweep.sweep, sweep_id, f"correctness-{sweep_id}", "correctness", params,
                                   str(runtime_flow_run.id or "none"))
    try:
        with tracking.captured_logs(mlflow_run), _killed_on_signal(mlflow_run):
            clean: list[dict] = []
            matrix: list[dict] = []
            for kind, cfg in runs.items():
                ckpt = stages.warm_start_checkpoint(cfg.spec().model_dump(mode="json"),
                                                    cfg.warmstart.model_dump(mode="json"), WARMSTART_CACHE)
                key = f"correctness-{kind}-{run_id(cfg)}"
                stages.correctness_setup(key, cfg.model_dump(mode="json"), ckpt)
                rows = stages.clean_sync_series(key, section.clean_syncs[kind])
                clean += [r | {"model": kind} for r in rows]
                logger.info("%s: %d clean syncs, %d false alarms", kind, len(rows), sum(r["false_alarm"] for r in rows))
                # faults on the shared pipeline first: a fault with its own engine configuration or replicas
                # starts a pipeline that may take over (and resync) the shared engine
                own = lambda f: f.replicas > 1 or f.engine_schemes is not None  # noqa: E731
                for f in sorted((f for f in wanted if f.model == kind), key=own):
                    fkey = key
                    if f.replicas > 1 or f.engine_schemes is not None:
                        fkey = f"{key}-{f.name}"
                        stages.correctness_setup(fkey, cfg.model_dump(mode="json"), ckpt, f.name)
                    row = stages.inject_fault(fkey, f.name)
                    logger.info("fault %s (%s): caught at first sync: %s; fired: %s", f.name, f.condition,
                                row["caught_first"], [c for c in CONDITIONS if row.get(c)])
                    matrix.append(row)
                stages.LIVE.pop(key, None)
            result = stages.record_matrix(mlflow_run, matrix, clean)
        missed = [r["fault"] for r in matrix if not r["caught_first"]]
        alarms = [r for r in clean if r["false_alarm"]]
        if missed or alarms:
            msg = (f"correctness: {len(missed)} faults not caught at their first sync by their condition's check "
                   f"({', '.join(missed) or 'none'}); {len(alarms)} false alarms on clean syncs"
                   + (f", e.g. {alarms[0]['alarms']}" if alarms else ""))
            raise RuntimeError(msg)
        tracking.terminate(mlflow_run, "FINISHED")
        return {"mlflow_run": mlflow_run, "matrix": matrix} | result
    except BaseException as e:
        if tracking.client().get_run(mlflow_run).info.status == "RUNNING":
            tracking.set_tag(mlflow_run, "error", f"{type(e).__name__}: {e}")
            tracking.terminate(mlflow_run, "FAILED")
        raise
    finally:
        release_all()


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]
