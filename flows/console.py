"""What a sweep prints to the terminal: its progress (one line per run as it ends) and the table of its
runs with the headline metrics (:data:`adapters.tracking.HEADLINE`, each KL with its interval), fitted to the
terminal's width. Everything else goes to the log files (:mod:`adapters.logs`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.tracking import RunRow
from flows.terminal_table import KL_NOTE, Column, fitted_table, headline_cells, headline_columns

__all__ = ["HEADLINE_HIDE", "console", "progress", "sweep_table"]


def console() -> Console:
    """The terminal's console; 140 columns where output is not a terminal (logs, CI: room for the run names)."""
    out = Console()
    return out if out.is_terminal else Console(width=140)


#: the headline columns left out first when a table does not fit (lowest first): the least read ones
HEADLINE_HIDE = {"warm step s": 10, "|Δlogp| ×1e3": 11}


def sweep_table(sweep: str, rows: Sequence[RunRow], width: int) -> Table:
    """One row per run at most ``width`` characters wide (:func:`~flows.terminal_table.fitted_table`): name,
    status and the headline metrics, each KL with its 95% interval and marked when it is no finding
    (:func:`~flows.terminal_table.headline_cells`; ``–`` where a run has none)."""
    columns = [Column("run"), Column("status", wraps=True), *headline_columns(HEADLINE_HIDE)]
    body, marked = [], False
    for r in rows:
        cells, noise = headline_cells(r.metrics)
        body.append([r.name, r.status, *cells])
        marked |= noise
    return fitted_table(f"sweep {sweep}: {len(rows)} runs", columns, body, width, [KL_NOTE] if marked else [])


@contextmanager
def progress(sweep: str, total: int) -> Iterator[Callable[[RunRow], None]]:
    """A progress bar over ``total`` runs while the block runs; yields ``done(row)``, which advances it and
    prints the run's line (``n/total name: status (after s)``): the progress in a log too."""
    bar = Progress(TextColumn(f"sweep {sweep}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = bar.add_task("", total=total)
    t0 = time.monotonic()

    def done(row: RunRow) -> None:
        bar.advance(task)
        n = int(bar.tasks[0].completed)
        bar.console.print(f"{n:>3}/{total} {row.name}: {row.status} (after {time.monotonic() - t0:.0f} s)",
                          markup=False, highlight=False)

    with bar:
        yield done
