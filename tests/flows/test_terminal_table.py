"""The table of runs at a terminal's width (flows.terminal_table): rendered by rich at 80 and 160 columns,
every run name and number whole, the optional columns left out in their order and named."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from flows.terminal_table import Column, fitted_table

#: the columns of `fp8rl runs`: sweep, run, run id, status, started, the five headline numbers
COLUMNS = [Column("sweep", hide=3), Column("run"), Column("run id", hide=1), Column("status", wraps=True),
           Column("started", hide=2), Column("KL k3 µnats", numeric=True), Column("full KL µnats", numeric=True),
           Column("|Δlogp| ×1e3", numeric=True), Column("reward", numeric=True), Column("warm step s", numeric=True)]
ROWS = [
    ["smoke", "dense-mini·bf16-sampler·s0", "abcdef123456", "FINISHED", "2026-12-01 14:02", "812.3", "790.1", "1.234", "0.8125", "3.21"],
    ["smoke", "moe-mini·other-grid·s2", "0123456789ab", "FINISHED", "2026-12-01 14:05", "1.523e+04", "9876", "0.01235", "1", "12.5"],
    ["smoke", "moe-mini·half·s1", "fedcba987654", "FAILED", "2026-12-01 14:06", "–", "–", "–", "–", "–"],
    ["smoke", "smoke·3f9a1c", "(sweep)", "SKIPPED (done)", "2026-12-01 14:00", "–", "–", "–", "–", "–"],
]


def render(width: int, columns=COLUMNS, rows=ROWS) -> list[str]:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(fitted_table("4 most recent runs — sqlite:///mlflow.db", columns, rows, width))
    return console.export_text().splitlines()


def row_line(lines: list[str], name: str) -> str:
    (line,) = [l for l in lines if name in l]
    return line


@pytest.mark.parametrize("width", [80, 160])
def test_every_name_and_number_is_whole_on_its_rows_line(width):
    lines = render(width)
    assert all(len(l) <= width for l in lines)
    assert not any("…" in l for l in lines)
    for row in ROWS:
        line = row_line(lines, row[1])
        # the numbers in their order, each a whole word of the line
        assert [w for w in line.split() if w in row[5:]] == row[5:]
        assert row[3].split()[0] in line.split()
    header = " ".join(lines[1:lines.index(next(l for l in lines if l.startswith("─")))])
    for _, label in ((c.hide, c.label) for c in COLUMNS if c.numeric):
        assert all(word in header.split() for word in label.split())


def test_at_80_columns_the_optional_columns_are_left_out_and_named():
    lines = render(80)
    assert lines[-1].strip() == "not shown in 80 columns: sweep, run id, started"
    assert not any("abcdef123456" in l or "2026-12-01" in l for l in lines)
    line = row_line(lines, "smoke·3f9a1c")  # a wrapping column wraps at its space, the next line holds the rest
    assert "SKIPPED" in line.split() and "(done)" in lines[lines.index(line) + 1].split()


def test_at_160_columns_every_column_is_shown_on_one_line_each():
    lines = render(160)
    assert not any(l.strip().startswith("not shown") for l in lines)
    header = lines[1].split()
    assert header[:5] == ["sweep", "run", "run", "id", "status"] and "full" in header and "µnats" in header
    line = row_line(lines, "dense-mini·bf16-sampler·s0")
    assert line.split()[:6] == ["smoke", "dense-mini·bf16-sampler·s0", "abcdef123456", "FINISHED", "2026-12-01", "14:02"]
    assert row_line(lines, "smoke·3f9a1c").split()[3:5] == ["SKIPPED", "(done)"]


def test_columns_are_left_out_lowest_hide_first_only_when_wrapping_headers_is_not_enough():
    def hidden(width: int) -> str | None:
        last = render(width)[-1].strip()
        return last.split(": ", 1)[1] if last.startswith("not shown") else None

    widest = next(w for w in range(160, 0, -1) if hidden(w) is not None) + 1  # all shown, headers wrapped
    assert hidden(widest) is None and len(render(widest)[1].split()) < 10  # some header words on lines above
    assert hidden(widest - 1) == "run id"
    assert "2026-12-01" in row_line(render(widest - 1), "dense-mini·bf16-sampler·s0")
    assert hidden(80) == "sweep, run id, started"


def test_too_narrow_for_the_kept_columns_folds_the_name_and_keeps_the_numbers():
    lines = render(60)
    assert all(len(l) <= 60 for l in lines) and hidden_line(lines) == "not shown in 60 columns: sweep, run id, started"
    body = lines[lines.index(next(l for l in lines if l.startswith("─"))) + 1:-1]
    firsts = "".join(l.split()[0] for l in body if not l.startswith(" "))
    starts = [l for l in body if l.split()[-1] in {r[-1] for r in ROWS}]  # each row's first line: its numbers
    assert len(starts) == len(ROWS)
    for row, line in zip(ROWS, starts):
        assert row[1] in firsts and row[1].startswith(line.split()[0])  # folded over lines, every character kept
        assert [w for w in line.split() if w in row[5:]] == row[5:]


def hidden_line(lines: list[str]) -> str:
    return lines[-1].strip()
