"""A table of runs that fits the terminal: :func:`fitted_table` (the table of ``fp8rl runs``) shows every
cell it shows whole — run names and numbers are never cut.

To fit a width, headers wrap at their spaces (and a wrappable column's cells), then the columns a caller
marks optional are left out in its order and named under the table; only when the always-shown columns
still cannot fit does the widest text column fold (docs/configs.md, The fp8rl command).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table

__all__ = ["Column", "fitted_table"]


@dataclass(frozen=True)
class Column:
    """One column: its header; ``numeric`` (right-aligned, never wrapped); ``wraps`` (its cells may wrap at
    spaces); ``hide`` (None: always shown; else left out to fit, lowest ``hide`` first)."""

    label: str
    numeric: bool = False
    wraps: bool = False
    hide: int | None = None


#: the characters a column costs beyond its text: a divider (a space) and one space of padding on its
#: right, less those of the last column (:func:`fitted_table` draws no edges)
_PER_COLUMN = 2
_EDGES = -2
#: the narrowest a folded text column gets
_FOLDED = 8


def _words(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def _bounds(column: Column, cells: Sequence[str]) -> tuple[int, int]:
    """(narrowest, natural) text width of a column: whole words (or whole cells) vs every line unwrapped."""
    longest = max((cell_len(c) for c in cells), default=0)
    narrow = max(_words(column.label), max((_words(c) for c in cells), default=0) if column.wraps else longest)
    return max(narrow, 1), max(cell_len(column.label), longest, 1)


def fitted_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Table:
    """A table of ``rows`` (one string per column) at most ``width`` characters wide."""
    bounds = [_bounds(c, [r[i] for r in rows]) for i, c in enumerate(columns)]
    shown = list(range(len(columns)))

    def needed(cols: list[int]) -> int:
        return sum(bounds[i][0] for i in cols) + _PER_COLUMN * len(cols) + _EDGES

    for i in sorted((i for i, c in enumerate(columns) if c.hide is not None), key=lambda i: columns[i].hide):
        if needed(shown) <= width:
            break
        shown.remove(i)
    widths = {i: bounds[i][0] for i in shown}
    spare = width - needed(shown)
    for i in sorted(shown, key=lambda i: bounds[i][1] - bounds[i][0]):  # the room left unwraps columns, cheapest first
        extra = bounds[i][1] - bounds[i][0]
        if extra <= spare:
            widths[i] += extra
            spare -= extra
    if spare < 0:  # the always-shown columns alone are too wide: the widest text column folds
        i = max((i for i in shown if not columns[i].numeric), key=lambda i: widths[i], default=None)
        if i is not None:
            widths[i] = max(widths[i] + spare, _FOLDED)
    hidden = [columns[i].label for i in range(len(columns)) if i not in shown]
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  caption=f"not shown in {width} columns: {', '.join(hidden)}" if hidden else None)
    for i in shown:
        c = columns[i]
        table.add_column(c.label, justify="right" if c.numeric else "left", width=widths[i],
                         overflow="fold")
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table
