"""The nightly correctness stage on fp8rl's own loop (``backend: native``, docs/correctness.md): per model, the
series :func:`fp8rl_core.correctness_series.native_series` plans — a clean sync series, then every fault of the
catalogue through the real sync path, each judged at its first sync — run as tasks; the detection matrix and
verdicts recorded in the stage's MLflow run. Called by :func:`flows.pipelines.nightly_correctness` (the verl
stage: :mod:`flows.verl_correctness`). Composes only: the plan and the verdict are the library's."""

from __future__ import annotations

from prefect import get_run_logger

from adapters import tracking
from fp8rl_core import correctness_series as series
from fp8rl_core.config.runs import Sweep
from fp8rl_core.sampler.pool import release_all
from tasks import stages

__all__ = ["native_correctness"]


def native_correctness(sweep: Sweep, wanted: list, mlflow_run: str, warmstart_cache: str) -> dict:
    """The stage on the engines of this process: for each model of the sweep's correctness section (its runs as
    :meth:`fp8rl_core.config.runs.Sweep.load` made them; warm starts from ``warmstart_cache``) its series of
    ``wanted`` faults. The detection matrix, clean rows and verdicts go to ``mlflow_run``, which ends FINISHED,
    or FAILED with :func:`~fp8rl_core.correctness_series.native_verdict`'s line."""
    logger = get_run_logger()
    runs, section = sweep.correctness, sweep.config.correctness
    try:
        with tracking.ending(mlflow_run):
            with tracking.captured_logs(mlflow_run):
                clean: list[dict] = []
                matrix: list[dict] = []
                for plan in series.native_series(section, runs, wanted):
                    run = runs[plan.kind]
                    ckpt = stages.warm_start_checkpoint(run.spec.model_dump(mode="json"),
                                                        run.config.warmstart.model_dump(mode="json"), warmstart_cache)
                    key = plan.key(run.id)
                    stages.correctness_setup(key, run.config, ckpt)
                    rows = stages.clean_sync_series(key, plan.clean_syncs)
                    clean += plan.clean_rows(rows)
                    logger.info("%s", plan.clean_line(rows))
                    for f in plan.faults:
                        fkey = plan.fault_key(key, f)
                        if fkey != key:
                            stages.correctness_setup(fkey, run.config, ckpt, f.name)
                        row = stages.inject_fault(fkey, f.name)
                        logger.info("%s", plan.fault_line(f, row))
                        matrix.append(row)
                    stages.LIVE.pop(key, None)
                result = stages.record_matrix(mlflow_run, matrix, clean)
            verdict = series.native_verdict(matrix, clean)
            if verdict.error:
                raise RuntimeError(verdict.error)
        return {"mlflow_run": mlflow_run, "matrix": matrix} | result
    finally:
        release_all()
