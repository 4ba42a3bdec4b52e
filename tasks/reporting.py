"""The sweep report: gather a sweep's finished runs from MLflow, write the Markdown summary and the
figures (:func:`fp8rl_core.report.write_report`), and log them to the sweep's parent MLflow run (the run the
sweep's runs are nested under): ``summary.md``, the PNGs, ``summary.html`` (the same summary with its
figures inside, which MLflow's artifact view renders) and the per-model × preset aggregates with their 95%
CIs as metrics ``agg/<model>/<preset>/<measure>`` (``_lo``/``_hi``).

Thin: :func:`sweep_data` turns what :func:`adapters.tracking.sweep_tables` downloaded into
:class:`fp8rl_core.report.SweepData` (run-level columns from the logged params), and the task writes and
logs. ``fp8rl report SWEEP`` and the end of the ``mxfp8-sweep`` flow both call it. The figures follow the
sweep's preset axis: the flow passes the sweep's validated config; ``fp8rl report`` reads it from the
``sweep.json`` the reported expansion's parent run logged (no config file is read).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from fp8rl_core.config.sweep import SweepConfig
from fp8rl_core.report import SweepData, interval_table, write_report
from fp8rl_core.sampler.presets import PRESETS
from fp8rl_core.schemas import validate

from adapters import tracking

__all__ = ["AGGREGATES", "aggregate_metrics", "logged_axes", "preset_axis", "summary_html", "sweep_data", "sweep_report",
           "write_sweep_report"]


def preset_axis(axes: Mapping[str, Any] | None) -> list[str] | None:
    """The sweep's preset axis in file order (the figures follow it) from its ``axes``, if it has one."""
    axis = (axes or {}).get("preset")
    return [str(p) for p in axis] if isinstance(axis, list) else None


def logged_axes(sweep: str, sweep_id: str | None) -> Mapping[str, Any] | None:
    """The ``axes`` of the expansion ``sweep_id`` of ``sweep`` (None: its newest) as its parent run's
    ``sweep.json`` holds them; None for a sweep recorded without one."""
    parent = tracking.find_sweep_run(sweep, sweep_id)
    logged = tracking.sweep_json(parent) if parent is not None else None
    return None if logged is None else logged.get("axes")


def sweep_data(sweep: str, dest: str | Path, sweep_id: str | None = "latest",
               config: SweepConfig | None = None) -> SweepData:
    """The sweep's finished runs and their tables as :class:`SweepData` (tables validated on the way in).
    ``sweep_id``: which expansion of the config (see :func:`adapters.tracking.sweep_tables`; default the
    latest, so a report never mixes runs of an edited config with older ones). ``config``: the sweep's
    validated config, whose preset axis the figures follow; None: the axes its parent run logged
    (:func:`logged_axes`)."""
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
            "model": p.get("model", ""), "seed": int(p.get("seed", 0)), "backend": p.get("backend", "native"),
            "learner_precision": PRESETS[preset].learner_precision if preset in PRESETS else "",
            "tokens_per_microbatch": int(p.get("learner.tokens_per_microbatch", 0)),
            "group_size": int(p.get("learner.group_size", 0)), "status": "FINISHED",
        } | r["metrics"])
    tables = {}
    for name in tracking.RUN_TABLES:
        if raw[name]:
            frame = pd.DataFrame(raw[name])
            validate(name, frame)  # every run's rows at once, by their run_id: a report is only as good as its tables
            tables[name] = frame
        else:
            tables[name] = pd.DataFrame()
    axes = config.axes if config is not None else logged_axes(sweep, raw["sweep_id"])
    return SweepData(sweep=sweep, runs=pd.DataFrame(rows), presets=preset_axis(axes), **tables)


#: the aggregates logged to the parent run: report measure → (metric name, factor) — the headline units
AGGREGATES = {"k3": ("kl_k3_micronats", 1e6), "probe_kl": ("full_kl_micronats", 1e6),
              "mean_abs_logprob_diff": ("abs_dlogp_x1e3", 1e3)}


def aggregate_metrics(data: SweepData, n_boot: int = 2000, seed: int = 0) -> dict[str, float]:
    """Each model × preset's :data:`AGGREGATES` over its seeds with the 95% bootstrap interval (seeds, then
    sequences: :func:`fp8rl_core.report.interval_table`) as metrics ``agg/<model>/<preset>/<name>`` with
    ``_lo`` and ``_hi``."""
    wanted = [m for m in AGGREGATES if m != "probe_kl" or not data.probe.empty]
    table = interval_table(data, wanted, by=("model", "preset"), n_boot=n_boot, seed=seed) if not data.tokens.empty \
        else pd.DataFrame()
    out = {}
    for r in table.to_dict("records"):
        name, factor = AGGREGATES[r["metric"]]
        key = f"agg/{r['model']}/{r['preset']}/{name}"
        out |= {key: r["estimate"] * factor, f"{key}_lo": r["lo"] * factor, f"{key}_hi": r["hi"] * factor}
    return out


def summary_html(summary: Path) -> Path:
    """``summary.html`` beside ``summary.md``: the Markdown rendered, each figure it links embedded (a data
    URI), so the page shows its figures wherever it is opened — MLflow's artifact view included."""
    import base64
    import re

    import markdown

    folder = summary.parent

    def embed(m: re.Match) -> str:
        png = folder / m.group(2)
        if not png.is_file():
            return m.group(0)
        return f"![{m.group(1)}](data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()})"

    text = re.sub(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)", embed, summary.read_text())
    body = markdown.markdown(text, extensions=["tables"])
    style = ("body{font-family:sans-serif;max-width:60em;margin:1em auto;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}")
    out = folder / "summary.html"
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head>"
                   f"<body>{body}</body></html>", encoding="utf-8")
    return out


def write_sweep_report(sweep: str, out_dir: str | Path, *, config: SweepConfig | None = None, log: bool = True,
                       trace_paths=None, run: str | None = None) -> Path:
    """Write ``summary.md``, ``summary.html`` + PNGs of ``sweep`` into ``out_dir``; with ``log``, also log
    them and the :func:`aggregate_metrics` to the MLflow run ``run`` — default the parent run of the
    reported expansion (:func:`adapters.tracking.find_sweep_run`), or a new ``report`` run when the sweep has
    none (recorded before parent runs). ``config``: as in :func:`sweep_data`. Returns the summary's path."""
    with tempfile.TemporaryDirectory(prefix="fp8rl-report-") as tmp:
        data = sweep_data(sweep, tmp, config=config)
        summary = write_report(data, out_dir, trace_paths=trace_paths)
        aggregates = aggregate_metrics(data) if log else {}
    html = summary_html(summary)
    if log:
        sweep_id = tracking.client().get_run(str(data.runs["mlflow_run"].iloc[0])).data.tags.get("fp8rl.sweep_id")
        target = run or tracking.find_sweep_run(sweep, sweep_id)
        own = target is None
        if own:
            target = tracking.open_report_run(sweep)
        for f in sorted(Path(out_dir).iterdir()):
            if f.suffix in (".md", ".png") or f == html:
                tracking.log_file(target, f, "report")
        tracking.log_metrics(target, aggregates)
        if own:
            tracking.terminate(target, "FINISHED")
    return summary


@task(name="sweep-report", cache_policy=NO_CACHE)
def sweep_report(sweep: str, out_dir: str, run: str | None = None, config: SweepConfig | None = None) -> str:
    """The sweep's report (summary + figures), written to ``out_dir`` and logged to MLflow (to ``run``:
    the sweep's parent run; ``config``: the sweep's validated config)."""
    return str(write_sweep_report(sweep, out_dir, config=config, run=run))
