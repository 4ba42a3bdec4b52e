"""``fp8rl runs``' body: the recent MLflow runs with their headline metrics in a table fitted to the terminal,
and, for one sweep, the MLflow UI's links (its runs with the headline view; per model and seed the page comparing
its presets). :mod:`flows.cli` registers the command."""

from __future__ import annotations

from datetime import datetime

from mlflow.entities import ViewType
from rich.console import Console

from adapters import tracking
from flows.console import HEADLINE_HIDE
from flows.terminal_table import KL_NOTE, Column, fitted_table, headline_cells, headline_columns

__all__ = ["show_runs", "ui_links"]


def show_runs(sweep: str | None, limit: int) -> None:
    """Print the ``limit`` newest runs (of ``sweep`` only, when given, then its UI links); an unknown sweep:
    LookupError naming the known ones."""
    c = tracking.client()
    if sweep is not None:
        exp = c.get_experiment_by_name(sweep)
        if exp is None:
            known = sorted(e.name for e in c.search_experiments(view_type=ViewType.ALL) if e.name != "Default")
            raise LookupError(f"no sweep {sweep!r} in {tracking.tracking_uri()}; known sweeps: {', '.join(known) or 'none'}")
        exps = [exp]
    else:
        exps = c.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    names = {e.experiment_id: e.name for e in exps}
    found = c.search_runs(list(names), order_by=["attributes.start_time DESC"], max_results=limit) if names else []

    # a narrow terminal leaves out the run id, then the start time, then the sweep, then the warm step time and
    # |Δlogp|: names and numbers stay whole
    columns = [Column("sweep", hide=3), Column("run"), Column("run id", hide=1), Column("status", wraps=True),
               Column("started", hide=2), *headline_columns(HEADLINE_HIDE)]
    rows, marked = [], False
    for r in found:
        started = datetime.fromtimestamp(r.info.start_time / 1000).strftime("%Y-%m-%d %H:%M") if r.info.start_time else "–"
        kind = r.data.tags.get("fp8rl.kind")
        cells, noise = headline_cells(r.data.metrics)
        marked |= noise
        rows.append([names.get(r.info.experiment_id, r.info.experiment_id), r.info.run_name or r.info.run_id,
                     r.data.tags.get("fp8rl.run_id", f"({kind})" if kind else "–"), r.info.status, started, *cells])
    console = Console()
    title = (f"{len(found)} most recent runs" + (f" of sweep {sweep}" if sweep else "")
             + f" — {tracking.tracking_uri()}")
    console.print(fitted_table(title, columns, rows, console.width, [KL_NOTE] if marked else []))
    if sweep is not None:
        for line in ui_links(c, exps[0].experiment_id):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def ui_links(c, experiment: str) -> list[str]:
    """The MLflow UI's links for a sweep: its runs with the headline view, then per (model, seed) of its
    latest expansion with two presets or more the compare page of those runs."""
    lines = [f"MLflow UI (`fp8rl ui` first for a local store): {tracking.experiment_url(experiment)}"]
    latest = c.search_runs([experiment], filter_string="tags.`fp8rl.kind` = 'sweep'",
                           order_by=["attributes.start_time DESC"], max_results=1)
    where = "attributes.status = 'FINISHED'" + (
        f" and tags.`fp8rl.sweep_id` = '{latest[0].data.tags['fp8rl.sweep_id']}'" if latest else "")
    groups: dict[tuple[str, str], dict[str, str]] = {}
    for r in c.search_runs([experiment], filter_string=where, order_by=["attributes.start_time DESC"], max_results=5000):
        t, p = r.data.tags, r.data.params
        if "fp8rl.run_id" not in t:
            continue
        key = (t.get("model", p.get("model", "?")), t.get("seed", p.get("seed", "?")))
        groups.setdefault(key, {}).setdefault(t.get("preset", p.get("preset", "?")), r.info.run_id)  # newest wins
    for (model, seed), by_preset in sorted(groups.items()):
        if len(by_preset) > 1:
            lines.append(f"compare the {len(by_preset)} presets of {model}, seed {seed}: "
                         f"{tracking.compare_url(experiment, by_preset.values())}")
    return lines
