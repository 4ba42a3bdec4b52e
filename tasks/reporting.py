"""The sweep report: gather a sweep's finished runs from MLflow, write the Markdown summary and the
figures (:func:`fp8rl_core.report.write_report`), and log them to the sweep's ``report`` MLflow run.

Thin: :func:`sweep_data` turns what :func:`tasks.tracking.sweep_tables` downloaded into
:class:`fp8rl_core.report.SweepData` (run-level columns from the logged params), and the task writes and
logs. ``fp8rl report SWEEP`` and the end of the ``mxfp8-sweep`` flow both call it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from fp8rl_core.report import SweepData, write_report
from fp8rl_core.sampler.presets import PRESETS
from fp8rl_core.schemas import validate

from . import tracking

__all__ = ["sweep_data", "sweep_report", "write_sweep_report"]


def _preset_axis(sweep: str, configs: Path) -> list[str] | None:
    """The preset axis of ``configs/<sweep>.yaml`` in file order (the figures follow it), if that file exists."""
    import yaml

    path = configs / f"{sweep}.yaml"
    if not path.is_file():
        return None
    doc = yaml.safe_load(path.read_text()) or {}
    axis = (doc.get("axes") or {}).get("preset")
    return [str(p) for p in axis] if isinstance(axis, list) else None


def sweep_data(sweep: str, dest: str | Path, configs: str | Path = "configs",
               sweep_id: str | None = "latest") -> SweepData:
    """The sweep's finished runs and their tables as :class:`SweepData` (tables validated on the way in).
    ``sweep_id``: which expansion of the config (see :func:`tasks.tracking.sweep_tables`; default the
    latest, so a report never mixes runs of an edited config with older ones)."""
    raw = tracking.sweep_tables(sweep, dest, sweep_id)
    if not raw["runs"]:
        raise LookupError(f"sweep {sweep!r} has no FINISHED run in {tracking.tracking_uri()}; run it first "
                          f"(fp8rl run configs/{sweep}.yaml)")
    rows = []
    for r in raw["runs"]:
        p = r["params"]
        preset = p.get("preset", "")
        rows.append({
            "run_id": r["run_id"], "mlflow_run": r["mlflow_run"], "name": r["name"], "preset": preset,
            "model": p.get("model", ""), "seed": int(p.get("seed", 0)),
            "learner_precision": PRESETS[preset].learner_precision if preset in PRESETS else "",
            "tokens_per_microbatch": int(p.get("learner.tokens_per_microbatch", 0)),
            "group_size": int(p.get("learner.group_size", 0)), "status": "FINISHED",
        } | r["metrics"])
    tables = {}
    for name in tracking.RUN_TABLES:
        if raw[name]:
            frame = pd.DataFrame(raw[name])
            for _, part in frame.groupby("run_id", sort=False):  # each run's table, as it was logged
                body = part.drop(columns=["run_id"]) if name in ("steps", "tokens", "checks") else part
                validate(name, body.reset_index(drop=True))  # a report is only as good as its tables
            tables[name] = frame
        else:
            tables[name] = pd.DataFrame()
    return SweepData(sweep=sweep, runs=pd.DataFrame(rows), presets=_preset_axis(sweep, Path(configs)), **tables)


def write_sweep_report(sweep: str, out_dir: str | Path, *, configs: str | Path = "configs", log: bool = True,
                       trace_paths=None) -> Path:
    """Write ``summary.md`` + PNGs of ``sweep`` into ``out_dir``; with ``log``, also as artifacts of a new
    ``report`` run in the sweep's MLflow experiment. Returns the summary's path."""
    with tempfile.TemporaryDirectory(prefix="fp8rl-report-") as tmp:
        data = sweep_data(sweep, tmp, configs)
        summary = write_report(data, out_dir, trace_paths=trace_paths)
    if log:
        run = tracking.open_report_run(sweep)
        for f in sorted(Path(out_dir).iterdir()):
            if f.suffix in (".md", ".png"):
                tracking.log_file(run, f)
        tracking.terminate(run, "FINISHED")
    return summary


@task(name="sweep-report", cache_policy=NO_CACHE)
def sweep_report(sweep: str, out_dir: str) -> str:
    """The sweep's report (summary + figures), written to ``out_dir`` and logged to MLflow."""
    return str(write_sweep_report(sweep, out_dir))
