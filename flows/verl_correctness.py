"""The nightly correctness stage through verl's trainer (``backend: verl``, docs/correctness.md): per model, the
fault series :func:`fp8rl_core.correctness_series.verl_series` plans, run as one verl run and judged by
:meth:`~fp8rl_core.correctness_series.VerlSeries.judge`; called by :func:`flows.pipelines.nightly_correctness`
with the function that runs each verl run. Composes only: the plan, verdicts and metrics are the library's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import get_run_logger

from adapters import tracking
from adapters.tracking import RunRow
from fp8rl_core import correctness_series as series
from fp8rl_core.config.runs import Sweep

__all__ = ["verl_correctness"]


def verl_correctness(sweep: Sweep, wanted: list, mlflow_run: str, flow_run: str,
                     verl_run: Callable[..., tuple[RunRow, Any]]) -> dict:
    """The correctness stage through verl's trainer: one verl run per model of the sweep's correctness section
    (its runs as :meth:`fp8rl_core.config.runs.Sweep.load` made them), its fault series
    (:func:`fp8rl_core.correctness_series.verl_series`), run by ``verl_run(run, sweep, sweep_id, flow_run,
    parent, hooks=...)`` (its row and how verl ended), nested under the ``correctness`` run ``mlflow_run``, which
    holds the table of the faults (``verl_faults``: the plants' verdicts and the stops'), its metrics and the
    false alarms; it ends FAILED with :func:`~fp8rl_core.correctness_series.verl_verdict`'s line when a fault was
    missed or a clean sync raised an alarm."""
    logger = get_run_logger()
    section = sweep.config.correctness
    rows: list[dict] = []
    alarms: list[str] = []
    stops: list[dict] = []
    with tracking.ending(mlflow_run):
        with tracking.captured_logs(mlflow_run):
            for kind, base in sweep.correctness.items():
                plan = series.verl_series(section, kind, wanted)
                row, out = verl_run(plan.run(base), sweep.name, section.id(), flow_run, mlflow_run, hooks=plan.hooks)
                seen = plan.judge(list(out.checks), row.failed, out.reason, row.mlflow_run)
                for line in seen.lines:
                    logger.info("%s", line)
                rows += seen.rows
                stops += seen.stops
                alarms += seen.alarms
            tracking.log_table(mlflow_run, "verl_faults", rows + stops)
            tracking.log_metrics(mlflow_run, series.verl_metrics(rows, alarms))
            skipped = series.not_plantable(wanted)
            if skipped:
                tracking.set_tag(mlflow_run, "verl_faults.not_plantable", ", ".join(skipped))
        verdict = series.verl_verdict(rows, stops, alarms)
        if verdict.error:
            raise RuntimeError(verdict.error)
    return {"mlflow_run": mlflow_run, "faults": rows, "stops": stops, "false_alarms": alarms}
