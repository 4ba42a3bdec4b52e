"""The nightly correctness stage on fp8rl's own loop (``backend: native``, docs/correctness.md): per model, a clean
sync series, then every fault of the catalogue through the real sync path, each judged at its first sync; the
detection matrix and verdicts recorded in the stage's MLflow run. Called by
:func:`flows.pipelines.nightly_correctness` (the verl stage: :mod:`flows.verl_correctness`)."""

from __future__ import annotations

from prefect import get_run_logger

from adapters import tracking
from fp8rl_core.config.runs import Sweep
from fp8rl_core.sampler.pool import release_all
from fp8rl_core.vocabulary import CONDITIONS
from tasks import stages

__all__ = ["native_correctness"]


def native_correctness(sweep: Sweep, wanted: list, mlflow_run: str, warmstart_cache: str) -> dict:
    """The stage on the engines of this process: for each model of the sweep's correctness section (its runs as
    :meth:`fp8rl_core.config.runs.Sweep.load` made them; warm starts from ``warmstart_cache``) ``clean_syncs``
    clean syncs, then each fault of ``wanted`` declared on that model (a fault with its own engine configuration
    or replicas on a pipeline of its own, after the shared one's). The detection matrix, clean rows and verdicts
    go to ``mlflow_run``, which ends FINISHED, or FAILED when a fault was not caught at its first sync by its
    condition's check or a clean sync raised an alarm."""
    logger = get_run_logger()
    runs, section = sweep.correctness, sweep.config.correctness
    wanted = [f for f in wanted if f.model in runs]
    try:
        with tracking.ending(mlflow_run):
            with tracking.captured_logs(mlflow_run):
                clean: list[dict] = []
                matrix: list[dict] = []
                for kind, run in runs.items():
                    cfg = run.config
                    ckpt = stages.warm_start_checkpoint(run.spec.model_dump(mode="json"),
                                                        cfg.warmstart.model_dump(mode="json"), warmstart_cache)
                    key = f"correctness-{kind}-{run.id}"
                    stages.correctness_setup(key, cfg, ckpt)
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
                            stages.correctness_setup(fkey, cfg, ckpt, f.name)
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
        return {"mlflow_run": mlflow_run, "matrix": matrix} | result
    finally:
        release_all()
