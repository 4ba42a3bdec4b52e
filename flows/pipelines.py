"""Prefect flows: one experiment, a fixed-weights matching run, a sweep of either, the nightly correctness run.

Flows only compose tasks (:mod:`tasks.stages`, :mod:`tasks.verl_run`), the tracking calls that open and
end an MLflow run (:func:`adapters.tracking.ending`: FINISHED, FAILED with the ``error`` tag, KILLED on a
signal) and a sweep's dispatch: the strategy :mod:`adapters.sweeps` chooses, handed what runs one run here
(:func:`experiment`, :func:`fixed_weights`, :func:`_verl_run`) and on a Ray worker (:func:`run_experiment`).
"""

# annotations evaluated at definition (no postponed ones): Prefect validates the experiment flow's
# parameters against them on a Ray worker, where a postponed name (``Run``) does not resolve
import logging
import os
from pathlib import Path

from adapters.logs import configure_vllm_logging, engines_here, lines_stay_off_a_temporary_api, quiet_process

# a Ray worker imports this module to run a task: the CLI's quiet defaults before the libraries load, and
# vLLM's logging configured before any task run logs (adapters.logs.configure_vllm_logging) — except in a
# process that only drives the runs on Ray (adapters.logs.driving_only: `fp8rl run` without --inline)
quiet_process()
if engines_here():
    configure_vllm_logging()

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.runtime import flow_run as runtime_flow_run  # noqa: E402

from adapters import cluster, notify, pool, sweeps, tracking  # noqa: E402
from adapters.sweep_load import load_sweep  # noqa: E402
from adapters.sweep_record import ParentRun, open_run, skip_finished  # noqa: E402
from adapters.tracking import RunRow  # noqa: E402
from flows import console  # noqa: E402
from flows.native_correctness import native_correctness  # noqa: E402
from fp8rl_core.config.runs import Run, Sweep  # noqa: E402
from fp8rl_core.config.sweep import MatchingSection  # noqa: E402
from fp8rl_core.verl.payload import NO_VERL_HOOKS, VerlHooks  # noqa: E402
from tasks import gate, reporting, stages  # noqa: E402

__all__ = ["NightFailed", "RunsFailed", "experiment", "fixed_weights", "mxfp8_sweep", "nightly_correctness", "verl_run"]

WARMSTART_CACHE = os.environ.get("FP8RL_CACHE", ".cache/warmstart")
REPORTS = os.environ.get("FP8RL_REPORTS", "reports")
#: this file's folder when a deployment loaded it as the script module ``pipelines`` (Ray workers must import it
#: under that name too: :func:`adapters.sweeps.worker_env`), else None
_SCRIPT_DIR = None if __name__ == "flows.pipelines" else str(Path(__file__).resolve().parent)


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
        mlflow_run = open_run(run, sweep, sweep_id, flow_run)
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
        mlflow_run = open_run(run, sweep, sweep_id, flow_run)
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


class RunsFailed(RuntimeError):
    """A sweep ended with failed runs (each told in its own line as it ended, and in its MLflow run)."""


def _raise_if_failed(rows: list[RunRow], what: str = "runs") -> None:
    failed = [r.name for r in rows if r.failed]
    if failed:
        raise RunsFailed(f"{len(failed)} of {len(rows)} {what} failed: {', '.join(failed)}; rerun the sweep to retry "
                           "them (their MLflow runs say why)")


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
        mlflow_run = open_run(run, sweep, sweep_id, flow_run, parent)
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run, "verl.launch": "subprocess"}
                   | ({"fp8rl.fault": ", ".join(faults)} if faults else {}))
    # verl's own MLflow logger may end the run too: fp8rl's is the last word; a signal ends it KILLED, naming a
    # cancel in Prefect when its flow run (a verl-run on a worker, or the sweep's) was cancelled
    with tracking.ending(mlflow_run, pool.killed_by) as end:
        out = run_verl(run, sweep, mlflow_run, ray_address, WARMSTART_CACHE, hooks)
        if out.reason:
            end.fail(out.reason)
    get_run_logger().log(logging.ERROR if out.reason and not faults else logging.INFO, "run %s: %s (log: %s)",
                         run.name, out.reason or "verl's trainer finished", out.log)
    status = "FAILED: verl exit status " + str(out.returncode) if out.reason else "FINISHED"
    return RunRow(run.id, mlflow_run, run.name, status, tracking.headline_metrics(out.summary)), out


def _finish(sweep: Sweep, rows: list[RunRow], parent: ParentRun, report: bool, what: str = "runs") -> list[RunRow]:
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


def _sweep(sweep: Sweep, resume: bool = True, report: bool = False, ray_address: str | None = None,
           inline: bool = False, work_pool: str | None = None) -> list[RunRow]:
    """A sweep's runs through the strategy :func:`adapters.sweeps.strategy_for` chooses (inline, on Ray, a work
    pool's workers, verl runs side by side or one after another on this machine): checked before anything is
    recorded, runs already FINISHED skipped when ``resume``, the others' rows under the sweep's parent run,
    which an interrupt ends KILLED; then :func:`_finish`."""
    get_run_logger().info("sweep %s (%s): %d runs from %s", sweep.name, sweep.id, len(sweep.runs), sweep.source)
    strategy = sweeps.strategy_for(sweep, inline=inline, ray_address=ray_address, work_pool=work_pool)
    parent, flow_run = ParentRun(sweep), _flow_run()
    how = sweeps.Context(run_one=_run_one(sweep, parent, flow_run, ray_address), remote_task=_remote_task,
                         parent=parent.get, progress=console.progress, flow_run=flow_run,
                         warmstart_cache=WARMSTART_CACHE, script_dir=_SCRIPT_DIR, ray_address=ray_address,
                         work_pool=work_pool or sweep.config.resources.work_pool)
    strategy.check(sweep, how)  # before any MLflow run is opened
    rows, pending = skip_finished(sweep, resume)
    try:
        for row in strategy(sweep, pending, how) if pending else ():
            rows[row.run_id] = row
    except BaseException as e:  # interrupted (or its flow run cancelled in Prefect), or the sweep broke: its parent run says so
        parent.end(list(rows.values()), interrupted=strategy.interrupted(e))
        raise
    return _finish(sweep, [rows[r.id] for r in sweep.runs], parent, report, strategy.what)


def _run_one(sweep: Sweep, parent: ParentRun, flow_run: str, ray_address: str | None):
    """What runs one of ``sweep``'s runs in this process, its MLflow run opened: verl's trainer (:func:`_verl_run`,
    under the parent run), else the fixed-weights flow for a sweep with a ``matching`` section, else the experiment."""
    def one(run: Run, mlflow_run: str) -> RunRow:
        if run.config.backend == "verl":
            return _verl_run(run, sweep.name, sweep.id, flow_run, parent.get(), ray_address, mlflow_run=mlflow_run)[0]
        if sweep.config.matching is not None:
            return fixed_weights(run, sweep.config.matching, sweep.name, sweep.id, mlflow_run)
        return experiment(run, sweep.name, sweep.id, mlflow_run)
    return one


def _remote_task():
    """:func:`run_experiment` as the importable module holds it: a deployment loads this file under a script-module
    name that a Ray worker cannot import back (the task's function is pickled by reference)."""
    from flows.pipelines import run_experiment

    return run_experiment


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
        return _sweep(load_sweep(config, overrides), report=report, ray_address=ray_address, inline=inline,
                      work_pool=work_pool)


@flow(name="nightly-correctness", log_prints=True)
def nightly_correctness(config: str | Sweep = "configs/nightly.yaml", overrides: list[str] | None = None,
                        stages_to_run: list[str] | None = None, ray_address: str | None = None) -> dict:
    """The nightly correctness run (no resume): the sweep of every preset with the checks on, then the
    correctness stage — clean sync series on the dense and MoE models and every fault of the catalogue
    through the real sync path — whose detection matrix (CSV + PNG), verdicts and summary metrics go to
    one MLflow run named ``correctness``. Fails when a fault is not caught at its first sync by the
    check of its condition, or a clean sync raised an alarm. After the sweep, the history gate
    (:mod:`tasks.gate`) judges the night against the deployment's earlier trusted nights: a rule in mode ``fail``
    breached fails it (one line per breach: metric, value, band, what changed), ``warn`` and ``shadow`` are
    logged; the :class:`~fp8rl_core.metrics.history.NightVerdict` is ``out["verdict"]``. ``stages_to_run``: ``sweep``, ``correctness``
    (default both). ``ray_address``: where the sweep's runs go (as in mxfp8-sweep); the correctness stage
    runs in this process. ``config``: as in mxfp8-sweep; the sweep is read and expanded once for both stages."""
    which = set(stages_to_run or ("sweep", "correctness"))
    sweep = load_sweep(config, overrides)
    # the night's MLflow link on its flow run: a failed night's message names it (adapters/notify.py)
    notify.mark_night(tracking.experiment_url(tracking.experiment_id(tracking.client(), sweep.name)))
    out: dict = {}
    with lines_stay_off_a_temporary_api():
        night = gate.open_night(sweep.name, _deployment(sweep), _flow_run()) if "sweep" in which else None
        try:
            if "sweep" in which:
                out["sweep"] = _sweep(sweep, resume=False, ray_address=ray_address)
            if "correctness" in which:
                out["correctness"] = _correctness(sweep)
        except BaseException as e:  # the night is recorded FAILED, not trusted, and fails as before
            if night is not None:
                try:
                    _judge(sweep, night, out.get("sweep", ()), f"{type(e).__name__}: {e}")
                except Exception as g:  # noqa: BLE001 — the night's own failure is what is raised
                    get_run_logger().error("the failed night %s was not judged: %s: %s", night, type(g).__name__, g)
            raise
        if night is not None:
            out["verdict"] = verdict = _judge(sweep, night, out["sweep"])
            if verdict.status == "FAILED":  # the failed-night automation tells the team (adapters/notify.py)
                raise NightFailed("\n".join(verdict.lines()))
            if any(b.mode == "warn" for b in verdict.breaches):  # a night that only warns: the breach event
                notify.announce_night(verdict.deployment, "breached", [b.line() for b in verdict.breaches
                                                                       if b.mode == "warn"], verdict.mlflow_url)
    return out


class NightFailed(RuntimeError):
    """A night whose history gate failed: one line per breach, with its value, band and what changed."""


def _deployment(sweep: Sweep) -> str:
    """The nightly's deployment (``nightly-correctness/default``), or the sweep's name when not run by one."""
    from prefect.runtime import deployment as runtime_deployment

    return f"nightly-correctness/{runtime_deployment.name or 'adhoc ' + sweep.name}"


def _judge(sweep: Sweep, night: str, rows, failed: str = ""):
    runs = [(r.run_id, r.mlflow_run, r.name) for r in rows if not r.failed]
    return gate.judge_tonight(sweep.name, _deployment(sweep), night, runs,
                              str(Path(REPORTS) / sweep.name / "nights" / night), failed)


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
