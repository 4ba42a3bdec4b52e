"""A sweep's bookkeeping in MLflow: each run's record opened (SCHEDULED before dispatch), the sweep's parent run
opened when first needed and ended by its runs' rows, the runs already FINISHED found and skipped.

Rule: every run a sweep dispatches has its MLflow record before it is handed to anything that can die (a Ray
worker, a pool's worker, a thread running verl's trainer), so whoever notices the death ends it with the cause;
the parent run exists only for a sweep that runs something (docs/metrics.md, where it goes).
"""

from __future__ import annotations

from prefect import get_run_logger

from adapters import tracking
from adapters.tracking import RunRow
from fp8rl_core.config.runs import Run, Sweep

__all__ = ["ParentRun", "open_run", "open_scheduled", "skip_finished"]


def open_run(run: Run, sweep: str, sweep_id: str, flow_run: str | None, parent: str | None = None) -> str:
    """A new MLflow run for ``run`` of the sweep ``sweep`` (its config flattened as params, its tags and
    description), nested under ``parent`` when given; its id."""
    params = tracking.flatten(run.config.model_dump(mode="json", exclude={"models_dir"}))
    return tracking.open_run(sweep, sweep_id, run.id, run.name, params, flow_run, parent=parent, tags=run.tags,
                             description=run.description)


def open_scheduled(sweep: Sweep, runs: list[Run], parent: str, flow_run: str | None = None) -> list[tuple[Run, str]]:
    """Each of ``runs`` with its MLflow run, opened under ``parent`` and SCHEDULED, in order."""
    out = []
    for run in runs:
        mlflow_run = open_run(run, sweep.name, sweep.id, flow_run, parent)
        tracking.schedule(mlflow_run)
        out.append((run, mlflow_run))
    return out


def skip_finished(sweep: Sweep, resume: bool) -> tuple[dict[str, RunRow], list[Run]]:
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


class ParentRun:
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
