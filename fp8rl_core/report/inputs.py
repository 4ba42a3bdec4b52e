"""A report's inputs stored beside it, and the check that its tables are what today's code makes of them.

:func:`save_inputs` writes the :class:`~.data.SweepData` a report was made from into ``<report>/inputs/``
(one Parquet file per non-empty table, ``report.json`` with the sweep's name, preset axis, ``emulated``,
the detection matrix and the bootstrap settings); :func:`load_inputs` reads it back as it was.
:func:`~.markdown.check_tables` renders the report again from those inputs (figures off) and
:func:`compare_tables` compares every table line of the stored ``summary.md`` with today's, byte for byte. Rule and use: docs/results/README.md
("Are the committed reports today's?").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from .data import SweepData

__all__ = ["INPUTS", "TableCheck", "compare_tables", "load_inputs", "save_inputs", "table_lines"]

#: the folder beside summary.md that holds a report's inputs
INPUTS = "inputs"
_META = "report.json"
_TABLES = tuple(f.name for f in fields(SweepData) if f.name not in ("sweep", "matrix", "presets", "emulated"))


def save_inputs(data: SweepData, report_dir: str | Path, *, n_boot: int, seed: int, metrics: Sequence[str],
                traces: bool = False) -> Path:
    """Write ``data`` and the settings the report used (bootstrap, mismatch-table metrics, whether GPU traces
    were given — they are not stored) into ``report_dir/inputs/``, replacing what was there; return that
    folder."""
    folder = Path(report_dir) / INPUTS
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.parquet"):
        old.unlink()
    for name in _TABLES:
        frame: pd.DataFrame = getattr(data, name)
        if not frame.empty:
            frame.to_parquet(folder / f"{name}.parquet", compression="zstd", index=False)
    meta = {"sweep": data.sweep, "presets": None if data.presets is None else list(data.presets),
            "emulated": bool(data.emulated), "matrix": data.matrix, "n_boot": int(n_boot), "seed": int(seed),
            "metrics": list(metrics), "traces": bool(traces)}
    (folder / _META).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return folder


def load_inputs(report_dir: str | Path) -> tuple[SweepData, dict]:
    """The :class:`SweepData` stored in ``report_dir/inputs/`` and the report's settings (``n_boot``,
    ``seed``, ``metrics``). Raises FileNotFoundError naming the folder when the report has no stored inputs,
    ValueError when it was written with GPU traces (not stored)."""
    folder = Path(report_dir) / INPUTS
    if not (folder / _META).is_file():
        raise FileNotFoundError(f"{folder}: no stored inputs ({_META} missing) — this report was written without "
                                "them; regenerate it with `fp8rl report SWEEP --out <folder>` from its runs")
    meta = json.loads((folder / _META).read_text(encoding="utf-8"))
    tables = {n: pd.read_parquet(folder / f"{n}.parquet") for n in _TABLES if (folder / f"{n}.parquet").is_file()}
    data = SweepData(sweep=meta["sweep"], presets=meta["presets"], emulated=meta["emulated"], matrix=meta["matrix"],
                     runs=tables.pop("runs", pd.DataFrame()), **tables)
    if meta["traces"]:
        raise ValueError(f"{folder}: the report was written with GPU profiler traces, which are not stored; "
                         "its claim (g) row cannot be rendered again from these inputs")
    return data, {"n_boot": meta["n_boot"], "seed": meta["seed"], "metrics": tuple(meta["metrics"])}


def table_lines(markdown: str) -> list[str]:
    """The Markdown table lines of a summary (every line that starts with ``|``), in order."""
    return [ln for ln in markdown.splitlines() if ln.startswith("|")]


@dataclass(frozen=True)
class TableCheck:
    """A stored report against today's rendering of its inputs: ``lines`` table lines compared;
    ``differences``: (line number among the table lines, stored, today's) where they differ (a side that
    has fewer lines reads ``None``)."""

    report: str
    lines: int
    differences: tuple[tuple[int, str | None, str | None], ...]

    @property
    def same(self) -> bool:
        return not self.differences


def compare_tables(report: str, stored: str, today: str) -> TableCheck:
    """The table lines of two renderings of one report (``stored`` and ``today``'s summary text) compared
    byte for byte (:func:`~.markdown.check_tables` renders today's)."""
    a, b = table_lines(stored), table_lines(today)
    diffs = tuple((i + 1, s, t) for i, (s, t) in enumerate(_zip_longest(a, b)) if s != t)
    return TableCheck(report, max(len(a), len(b)), diffs)


def _zip_longest(a: list[str], b: list[str]) -> list[tuple[str | None, str | None]]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else None, b[i] if i < len(b) else None) for i in range(n)]
