"""A run's life in MLflow: opened (its params and the tags every run carries), SCHEDULED, RUNNING, and
ended FINISHED, FAILED (tag ``error``) or KILLED — one context manager, :func:`ending`, for every run a
flow executes — and the sweep's parent run with the runs nested under it. The tags a sweep finds its
runs by (``fp8rl.run_id``, ``fp8rl.sweep``, ``fp8rl.sweep_id``) are specified in docs/metrics.md.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from adapters.signals import on_signals

from .readback import find_sweep_run
from .record import log_metrics, log_params, set_tag
from .store import client, experiment_id
from .ui import NOTE, PARENT, describe_experiment
from .versions import git_commit as _git_commit
from .versions import run_versions

__all__ = ["RunEnd", "RunRow", "end_sweep_run", "end_unfinished", "ending", "open_check_run", "open_report_run",
           "open_run", "open_sweep_run", "schedule", "start", "status", "terminate"]


@dataclass(frozen=True)
class RunRow:
    """What a sweep keeps of one of its runs: its fp8rl run id, MLflow run, name, how it ended
    (``FINISHED``, ``SKIPPED (done)``, ``FAILED: <why>``) and, when it ran here, its summary metrics."""

    run_id: str
    mlflow_run: str
    name: str
    status: str
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status.startswith("FAILED")


def open_run(sweep: str, sweep_id: str, run_id: str, run_name: str, params: Mapping[str, str],
             flow_run_id: str | None, *, parent: str | None = None, tags: Mapping[str, str] | None = None,
             description: str | None = None) -> str:
    """Create the MLflow run with its params and tags; returns the MLflow run id. ``parent``: the sweep's
    parent run (:func:`open_sweep_run`) the run is nested under; ``tags``: more tags (``model``, ``preset``,
    ``seed`` …); ``description``: the run's one line in the UI."""
    c = client()
    exp = experiment_id(c, sweep)
    every = {
        "fp8rl.run_id": run_id, "fp8rl.sweep": sweep, "fp8rl.sweep_id": sweep_id, "sweep": sweep,
        "prefect.flow_run_id": flow_run_id or "none", "mlflow.runName": run_name,
    } | run_versions()
    every |= {k: str(v) for k, v in (tags or {}).items()}
    if parent:
        every[PARENT] = parent
    if description:
        every[NOTE] = description
    run = c.create_run(exp, run_name=run_name, tags=every)
    log_params(run.info.run_id, params)
    return run.info.run_id


def open_sweep_run(sweep: str, sweep_id: str, params: Mapping[str, str], description: str = "") -> str:
    """The parent run of one expansion of the sweep (``fp8rl.kind = sweep``, no ``fp8rl.run_id``): its runs
    are nested under it and the report and aggregates are logged to it. A sweep run again (resume, retry
    of failed runs) reopens the parent of the same expansion (RUNNING again) rather than adding one."""
    found = find_sweep_run(sweep, sweep_id)
    c = client()
    if found is not None:
        c.update_run(found, status="RUNNING")
        return found
    exp = describe_experiment(sweep, description)
    text = f"sweep {sweep} ({sweep_id})" + (f": {description}" if description else "")
    run = c.create_run(exp, run_name=f"{sweep}·{sweep_id[:6]}",
                       tags={"fp8rl.kind": "sweep", "fp8rl.sweep": sweep, "fp8rl.sweep_id": sweep_id, "sweep": sweep,
                             "git.commit": _git_commit(), NOTE: text})
    log_params(run.info.run_id, params)
    return run.info.run_id


def end_sweep_run(parent: str, rows: Sequence[RunRow], interrupted: BaseException | str | None = None) -> str:
    """End the parent run: KILLED when the sweep was ``interrupted`` (the exception, or why in plain text: its
    ``error`` tag), FAILED naming the failed runs (tag
    ``error``), else FINISHED (an ``error`` an earlier pass of the same sweep left is removed: the rerun
    repaired it); with ``runs/*`` counts as metrics. Returns the status."""
    failed = [r.name for r in rows if r.failed]
    log_metrics(parent, {"runs/total": len(rows), "runs/failed": len(failed),
                         "runs/finished": sum(r.status.startswith(("FINISHED", "SKIPPED")) for r in rows)})
    if interrupted is not None:
        status = "KILLED"
        set_tag(parent, "error", interrupted if isinstance(interrupted, str) else
                f"the sweep was interrupted ({type(interrupted).__name__}: {interrupted})")
    elif failed:
        status = "FAILED"
        set_tag(parent, "error", f"{len(failed)} of {len(rows)} runs failed: {', '.join(failed)}")
    else:
        status = "FINISHED"
        if "error" in client().get_run(parent).data.tags:  # a rerun repaired what an earlier pass reported
            client().delete_tag(parent, "error")
    terminate(parent, status)
    return status


def open_report_run(sweep: str) -> str:
    """A new MLflow run ``report`` in the sweep's experiment (tag ``fp8rl.kind = report``) for a report of a
    sweep that has no parent run (one recorded before parent runs existed); it carries no fp8rl run id,
    so resume and reports ignore it."""
    c = client()
    run = c.create_run(experiment_id(c, sweep), run_name="report",
                       tags={"fp8rl.kind": "report", "fp8rl.sweep": sweep, "git.commit": _git_commit()})
    return run.info.run_id


def open_check_run(experiment: str, run_name: str, kind: str, params: Mapping[str, str], flow_run_id: str | None,
                   description: str = "") -> str:
    """A run of a check that is not an experiment of a sweep (``fp8rl.kind`` = ``kind``, no ``fp8rl.run_id``:
    resume and reports ignore it), in the experiment ``experiment``, with its params; returns its id."""
    c = client()
    tags = {"fp8rl.kind": kind, "prefect.flow_run_id": flow_run_id or "none"} | run_versions() | (
        {NOTE: description} if description else {})
    run = c.create_run(experiment_id(c, experiment), run_name=run_name, tags=tags)
    log_params(run.info.run_id, params)
    return run.info.run_id


def schedule(mlflow_run: str) -> None:
    """Mark a run opened ahead of its execution SCHEDULED (a sweep on Ray opens every run before dispatch,
    so a run whose worker dies before it starts still has a record to mark FAILED)."""
    client().update_run(mlflow_run, status="SCHEDULED")


def start(mlflow_run: str, tags: Mapping[str, str]) -> bool:
    """The run starts executing: RUNNING, with where it runs (host, pid, Ray node) and its flow run as tags; True.
    A run its sweep already ended KILLED (cancelled while its process was still starting: the sweep's reason in
    its ``error`` tag) stays KILLED — its process is being stopped, and one stopped by SIGKILL could never end it
    again — and gets the tags only; False."""
    c = client()
    killed = c.get_run(mlflow_run).info.status == "KILLED"
    if not killed:
        c.update_run(mlflow_run, status="RUNNING")
    for k, v in tags.items():
        c.set_tag(mlflow_run, k, v)
    return not killed


def terminate(mlflow_run: str, status: str) -> None:
    client().set_terminated(mlflow_run, status=status)


def status(mlflow_run: str) -> str:
    return client().get_run(mlflow_run).info.status


def end_unfinished(mlflow_run: str, status: str, reason: str) -> bool:
    """End a run that is still SCHEDULED or RUNNING as ``status`` (FAILED, KILLED) with ``reason`` as its
    ``error`` tag; True if it was unfinished. Runs that already ended keep their status and reason."""
    if client().get_run(mlflow_run).info.status not in ("SCHEDULED", "RUNNING"):
        return False
    set_tag(mlflow_run, "error", reason)
    terminate(mlflow_run, status)
    return True



class RunEnd:
    """The end :func:`ending` gives its run: FINISHED unless :meth:`fail` names why it failed."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def fail(self, reason: str) -> None:
        """End the run FAILED with ``reason`` as its ``error`` tag (when the block ends without an exception)."""
        self.reason = reason


def _by_signal(name: str) -> str:
    return f"interrupted by signal {name}"


@contextmanager
def ending(mlflow_run: str, killed_by: Callable[[str], str] = _by_signal):
    """Run the block as the MLflow run's execution and end the run by how the block ends: FINISHED; FAILED
    with ``error`` = the exception (``Type: message``), or the reason given to the yielded
    :class:`RunEnd`'s ``fail``; KILLED on SIGTERM/SIGINT (main thread only) with ``error`` =
    ``killed_by(signal name)`` (default: ``interrupted by signal SIGTERM``), unless the run is KILLED already
    (a sweep that cancelled it ended it with its reason), after which the signal acts as before. A run
    something else already ended (a signal) keeps that end when the block raises; metrics and artifacts
    logged before stay."""
    end = RunEnd()

    def killed(signum, frame, previous):
        if status(mlflow_run) != "KILLED":
            set_tag(mlflow_run, "error", killed_by(signal.Signals(signum).name))
            terminate(mlflow_run, "KILLED")
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        with on_signals(killed):
            yield end
    except BaseException as e:
        end_unfinished(mlflow_run, "FAILED", f"{type(e).__name__}: {e}")
        raise
    if end.reason is not None:
        set_tag(mlflow_run, "error", end.reason)
    terminate(mlflow_run, "FAILED" if end.reason is not None else "FINISHED")
