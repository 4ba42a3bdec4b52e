"""A table of runs that fits the terminal: :func:`fitted_table` (the table of ``fp8rl runs`` and the one a sweep
prints at its end) shows every cell it shows whole — run names and numbers are never cut.

To fit a width, headers wrap at their spaces (and a wrappable column's cells), then the columns a caller
marks optional are left out in its order and named under the table; only when the always-shown columns
still cannot fit does the widest text column fold (docs/configs.md, The fp8rl command).

The headline columns (:func:`headline_columns`, :func:`headline_cells`): a KL with its 95% interval,
``812 (640–990)``, marked ``*`` — and :data:`KL_NOTE` under the table says why — when it is no finding:
no interval, one that includes 0, or fewer sampled sequences than ``adapters.tracking.MIN_KL_SEQUENCES``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.table import Table

from adapters.tracking import HEADLINE, KL_BASIS, MIN_KL_SEQUENCES

__all__ = ["KL_NOTE", "Column", "fitted_table", "headline_cells", "headline_columns", "kl_cell"]


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


def fitted_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int,
                 notes: Sequence[str] = ()) -> Table:
    """A table of ``rows`` (one string per column) at most ``width`` characters wide; ``notes``: lines under it
    (before the line naming the columns left out)."""
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
    caption = [*notes, *([f"not shown in {width} columns: {', '.join(hidden)}"] if hidden else [])]
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  caption="\n".join(caption) or None)
    for i in shown:
        c = columns[i]
        table.add_column(c.label, justify="right" if c.numeric else "left", width=widths[i],
                         overflow="fold")
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table


#: what a marked KL cell means (printed under a table with one)
KL_NOTE = ("KL: estimate (95% CI); * no finding: no CI, a CI that includes 0, or KL k3 from fewer than "
           f"{min(MIN_KL_SEQUENCES.values())} sampled sequences")


def _short(x: float, digits: int) -> str:
    """``x`` to ``digits`` significant digits, short in a column: no exponent from 0.001 to 10 000 (``640``,
    ``0.0123``), thousands as ``k`` and millions as ``M`` above (``15.2k``)."""
    for scale, suffix in ((1e6, "M"), (1e4, "k")):
        if abs(x) >= scale:
            div = 1e3 if suffix == "k" else 1e6
            return f"{float(f'{x / div:.{digits}g}'):g}{suffix}"
    return f"{float(f'{x:.{digits}g}'):g}"


def kl_cell(metrics: Mapping[str, float], key: str) -> tuple[str, bool]:
    """The cell of headline KL ``key`` of a run's ``metrics`` and whether it is marked: ``812 (640–990)`` — the
    estimate and its 95% interval (:data:`adapters.tracking.KL_BASIS`) — with ``*`` appended when it is no
    finding (:data:`KL_NOTE`); ``–`` without the KL."""
    est = metrics.get(key)
    if not isinstance(est, (int, float)):
        return "–", False
    lo_key, hi_key, n_key = KL_BASIS[key]
    lo, hi, n = metrics.get(lo_key), metrics.get(hi_key), metrics.get(n_key)
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        text = f"{_short(est, 3)} ({_short(lo, 2)}–{_short(hi, 2)})"
        noise = lo <= 0 < hi
    else:
        text, noise = _short(est, 4), True
    if key in MIN_KL_SEQUENCES and (not isinstance(n, (int, float)) or n < MIN_KL_SEQUENCES[key]):
        noise = True
    return text + ("*" if noise else ""), noise


def headline_columns(hide: Mapping[str, int] | None = None) -> list[Column]:
    """The headline columns (:data:`adapters.tracking.HEADLINE`), numeric; a KL's label says its interval;
    ``hide``: label → the column's ``hide`` rank (left out to fit, lowest first)."""
    hide = hide or {}
    return [Column(label + (" (95% CI)" if metric in KL_BASIS else ""), numeric=True, hide=hide.get(label))
            for metric, label, *_ in HEADLINE]


def headline_cells(metrics: Mapping[str, float]) -> tuple[list[str], bool]:
    """A run's headline cells (a KL with its interval: :func:`kl_cell`; ``–`` where it has none) and whether a
    KL cell is marked."""
    cells, marked = [], False
    for metric, *_ in HEADLINE:
        if metric in KL_BASIS:
            text, noise = kl_cell(metrics, metric)
            cells.append(text)
            marked |= noise
        else:
            v = metrics.get(metric)
            cells.append(f"{v:.4g}" if isinstance(v, (int, float)) else "–")
    return cells, marked
