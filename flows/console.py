"""What a sweep prints to the terminal: its progress (one line per run as it ends) and the table of its
runs with the headline metrics (:data:`adapters.tracking.HEADLINE`). Everything else goes to the log files
(:mod:`adapters.logs`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.tracking import HEADLINE, RunRow

__all__ = ["console", "progress", "sweep_table"]


def console() -> Console:
    """The terminal's console; 140 columns where output is not a terminal (logs, CI: room for the run names)."""
    out = Console()
    return out if out.is_terminal else Console(width=140)


def sweep_table(sweep: str, rows: Sequence[RunRow]) -> Table:
    """One row per run: name, status and the headline metrics (``–`` where a run has none)."""
    t = Table(title=f"sweep {sweep}: {len(rows)} runs")
    t.add_column("run", no_wrap=True)
    t.add_column("status")
    for _, label, *_ in HEADLINE:
        t.add_column(label, justify="right")
    for r in rows:
        t.add_row(r.name, r.status, *(f"{r.metrics[k]:.4g}" if isinstance(r.metrics.get(k), float) else "–"
                                      for k, *_ in HEADLINE))
    return t


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
