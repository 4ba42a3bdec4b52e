"""Prefect flows: one experiment, a sweep of experiments, the nightly correctness run.

Flows only compose tasks (:mod:`tasks.stages`) and the tracking calls that open and close an MLflow
run. An experiment is one MLflow run; a failure ends it FAILED with the exception as the ``error`` tag,
and SIGTERM/SIGINT end it KILLED — metrics and artifacts logged before stay.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as runtime_flow_run
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fp8rl_core.config import RunConfig, load_sweep, run_id
from fp8rl_core.sampler.engine import release_all
from tasks import stages, tracking

__all__ = ["experiment", "mxfp8_sweep", "nightly_correctness"]

WARMSTART_CACHE = os.environ.get("FP8RL_CACHE", ".cache/warmstart")


def run_name(cfg: RunConfig) -> str:
    return f"{cfg.model}-{cfg.preset}-s{cfg.seed}"


@contextmanager
def _killed_on_signal(mlflow_run: str):
    """Mark the MLflow run KILLED on SIGTERM/SIGINT (main thread only), then let the signal act."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        tracking.set_tag(mlflow_run, "error", f"interrupted by signal {signal.Signals(signum).name}")
        tracking.terminate(mlflow_run, "KILLED")
        prev = previous[signum]
        if callable(prev):
            prev(signum, frame)
        raise KeyboardInterrupt(f"signal {signum}")

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@flow(name="experiment", log_prints=True)
def experiment(run: dict, sweep: str = "adhoc", sweep_id: str = "adhoc") -> dict:
    """One run: warm start → sampler-grid setup → (train step → weight sync → checks) × steps → KL and
    timing extraction → record. Returns the run's summary metrics."""
    cfg = RunConfig.model_validate(run)
    key = run_id(cfg)
    params = tracking.flatten(cfg.model_dump(mode="json", exclude={"models_dir"}))
    mlflow_run = tracking.open_run(sweep, sweep_id, key, run_name(cfg), params, str(runtime_flow_run.id or "none"))
    try:
        with tracking.captured_logs(mlflow_run), _killed_on_signal(mlflow_run):
            ckpt = stages.warm_start_checkpoint(cfg.spec().model_dump(mode="json"),
                                                cfg.warmstart.model_dump(mode="json"), WARMSTART_CACHE)
            setup = stages.setup_sampler_grid(key, cfg.model_dump(mode="json"), ckpt)
            tracking.log_json(mlflow_run, "layers.json", {k: setup[k] for k in ("learner_layers", "sampler_schemes")})
            tracking.log_json(mlflow_run, "config.json", cfg.model_dump(mode="json"))
            tracking.log_metrics(mlflow_run, {"time/setup_s": setup["setup_s"],
                                              "time/engine_startup_s": setup["engine_startup_s"]})
            for step in range(1, cfg.loop.steps + 1):
                row = stages.train_step(key, step)
                row |= stages.weight_sync(key)
                row |= stages.invariant_checks(key)
                row["total_s"] = row["train_stage_s"] + row["export_s"] + row["transport_s"] + row["load_s"] \
                    + row["reset_s"] + row["checks_s"]
                stages.record_step(key, mlflow_run, row)
            summary = stages.extract_kl_timing(key)
            stages.record_run(key, mlflow_run, summary)
        tracking.terminate(mlflow_run, "FINISHED")
        return {"run_id": key, "mlflow_run": mlflow_run, "name": run_name(cfg), "status": "FINISHED"} | summary
    except BaseException as e:
        if tracking.client().get_run(mlflow_run).info.status == "RUNNING":  # not already KILLED by a signal
            tracking.set_tag(mlflow_run, "error", f"{type(e).__name__}: {e}")
            tracking.terminate(mlflow_run, "FAILED")
        raise
    finally:
        stages.LIVE.pop(key, None)


HEADLINE = (("kl/k3", "KL k3"), ("kl/mean_abs_logprob_diff", "|Δlogp|"), ("reward/final", "reward"),
            ("time/total_s", "time s"))


def _table(sweep: str, rows: list[dict]) -> Table:
    t = Table(title=f"sweep {sweep}: {len(rows)} runs")
    t.add_column("run", no_wrap=True)
    t.add_column("status")
    for _, label in HEADLINE:
        t.add_column(label, justify="right")
    for r in rows:
        t.add_row(r["name"], r["status"], *(f"{r[k]:.4g}" if isinstance(r.get(k), float) else "–" for k, _ in HEADLINE))
    return t


def _sweep(config: str, overrides: list[str], resume: bool = True) -> list[dict]:
    logger = get_run_logger()
    sweep, runs = load_sweep(config, overrides)
    ids = [run_id(r) for r in runs]
    sweep_id = hashlib.sha256(",".join(ids).encode()).hexdigest()[:12]
    logger.info("sweep %s (%s): %d runs from %s", sweep.sweep, sweep_id, len(runs), config)

    def one(cfg: RunConfig) -> dict:
        key = run_id(cfg)
        done = tracking.find_finished(sweep.sweep, key) if resume else None
        if done is not None:
            logger.info("run %s (%s) already finished as MLflow run %s: skipped", run_name(cfg), key, done)
            return {"run_id": key, "mlflow_run": done, "name": run_name(cfg), "status": "SKIPPED (done)"}
        try:
            return experiment(cfg.model_dump(mode="json"), sweep.sweep, sweep_id)
        except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
            logger.error("run %s failed: %s: %s", run_name(cfg), type(e).__name__, e)
            return {"run_id": key, "name": run_name(cfg), "status": f"FAILED: {type(e).__name__}"}

    progress = Progress(TextColumn(f"sweep {sweep.sweep}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn())
    bar = progress.add_task("", total=len(runs))

    def tracked(cfg: RunConfig) -> dict:
        progress.update(bar, description=run_name(cfg))
        row = one(cfg)
        progress.advance(bar)
        return row

    try:
        with progress:
            if sweep.concurrency == 1:
                rows = [tracked(cfg) for cfg in runs]
            else:
                with ThreadPoolExecutor(max_workers=sweep.concurrency) as pool:
                    rows = list(pool.map(tracked, runs))
    finally:
        release_all()
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # logs and CI: room for the full run names
    console.print(_table(sweep.sweep, rows))
    failed = [r["name"] for r in rows if r["status"].startswith("FAILED")]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} runs failed: {', '.join(failed)}; rerun the sweep to retry them")
    return rows


@flow(name="mxfp8-sweep", log_prints=True)
def mxfp8_sweep(config: str = "configs/smoke.yaml", overrides: list[str] | None = None) -> list[dict]:
    """Expand the sweep config (with ``key=value`` overrides) and run its experiments; runs already
    FINISHED in MLflow (same run id) are skipped, failed ones run again."""
    return _sweep(config, list(overrides or []))


@flow(name="nightly-correctness", log_prints=True)
def nightly_correctness(config: str = "configs/nightly.yaml", overrides: list[str] | None = None) -> list[dict]:
    """The nightly correctness sweep: every preset on the dense and MoE models with the checks on; every
    night runs everything again (no resume)."""
    return _sweep(config, list(overrides or []), resume=False)


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]
