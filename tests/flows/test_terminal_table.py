"""The table of runs at a terminal's width (flows.terminal_table): rendered by rich at 80 and 160 columns,
every run name and number whole, the optional columns left out in their order and named; the headline cells,
each KL with its interval and marked when it is no finding, and the sweep's table (flows.console) with them."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from adapters.tracking import MIN_KL_SEQUENCES, RunRow, headline_metrics
from flows.console import sweep_table
from flows.terminal_table import Column, fitted_table, kl_cell

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


# ------------------------------------------------------------------------------------ the headline cells

def _summary(k3, lo, hi, sequences, **more):
    return headline_metrics({"kl/k3": k3, "kl/k3_lo": lo, "kl/k3_hi": hi, "kl/sequences": sequences,
                             "kl/tokens": 4 * sequences, **more})


def test_a_kl_reads_with_its_interval_and_is_marked_when_it_is_no_finding():
    assert MIN_KL_SEQUENCES == {"headline/kl_k3_micronats": 100}
    key = "headline/kl_k3_micronats"
    # 512 sequences, an interval clear of 0: a finding
    assert kl_cell(_summary(8.123e-4, 6.4e-4, 9.9e-4, 512), key) == ("812 (640–990)", False)
    # the two-step smoke's 32 sequences: marked, whatever the interval
    assert kl_cell(_summary(5.7e-6, 3.1e-7, 2.1e-5, 32), key) == ("5.7 (0.31–21)*", True)
    # an interval that includes 0 (k1 can be negative): marked; an exact 0 everywhere is a finding
    assert kl_cell(_summary(2e-6, -1e-6, 5e-6, 400), key) == ("2 (-1–5)*", True)
    assert kl_cell(_summary(0.0, 0.0, 0.0, 400), key) == ("0 (0–0)", False)
    # no interval (bootstrap 0, a verl run without a tokens table): the number alone, marked; no KL: a dash
    assert kl_cell({key: 54.0, "headline/kl_sequences": 400.0}, key) == ("54*", True)
    assert kl_cell({}, key) == ("–", False)
    # large values stay short: thousands as k
    assert kl_cell(_summary(1.5234e-2, 1.1e-2, 2.03e-2, 512), key) == ("15.2k (11k–20k)", False)


def test_the_exact_probe_kl_has_an_interval_and_no_minimum_of_sequences():
    m = headline_metrics({"kl/full_kl": 7.9e-4, "kl/full_kl_lo": 7e-4, "kl/full_kl_hi": 8.8e-4, "kl/full_sequences": 16})
    assert m["headline/full_kl_sequences"] == 16.0
    assert kl_cell(m, "headline/full_kl_micronats") == ("790 (700–880)", False)


def test_headline_metrics_keep_counts_whole_and_round_the_rest():
    m = _summary(8.123456e-4, 6.41234e-4, 9.91234e-4, 12345, **{"reward/final": 0.81234567})
    assert m == {"headline/kl_k3_micronats": 812.3, "headline/kl_k3_lo_micronats": 641.2,
                 "headline/kl_k3_hi_micronats": 991.2, "headline/kl_sequences": 12345.0, "headline/kl_tokens": 49380.0,
                 "headline/reward_final": 0.8123}


@pytest.mark.parametrize("width", [80, 140])
def test_the_sweep_table_fits_and_says_why_a_kl_is_marked(width):
    smoke = _summary(5.7e-6, 3.1e-7, 2.1e-5, 32, **{"kl/mean_abs_logprob_diff": 1.2e-3, "reward/final": 0.8125,
                                                     "time/warm_step_s": 3.21})
    big = _summary(8.123e-4, 6.4e-4, 9.9e-4, 512, **{"kl/full_kl": 7.9e-4, "kl/full_kl_lo": 7e-4,
                                                      "kl/full_kl_hi": 8.8e-4, "kl/full_sequences": 16})
    rows = [RunRow("a", "m", "dense-mini·bf16-sampler·s0", "FINISHED", smoke),
            RunRow("b", "m", "moe-mini·other-grid·s2", "FINISHED", big),
            RunRow("c", "m", "moe-mini·half·s1", "FAILED: verl exit status 1")]
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(sweep_table("smoke", rows, width))
    lines = console.export_text().splitlines()
    assert all(len(l) <= width for l in lines) and not any("…" in l for l in lines)
    assert row_line(lines, "dense-mini·bf16-sampler·s0").split()[1:5] == ["FINISHED", "5.7", "(0.31–21)*", "–"]
    assert row_line(lines, "moe-mini·other-grid·s2").split()[1:6] == ["FINISHED", "812", "(640–990)", "790",
                                                                      "(700–880)"]
    text = " ".join(" ".join(lines).split())
    assert "KL: estimate (95% CI); * no finding: no CI, a CI that includes 0, or KL k3 from fewer than 100 sampled " \
           "sequences" in text
    if width == 80:
        assert lines[-1].strip() == "not shown in 80 columns: |Δlogp| ×1e3, warm step s"
    else:
        assert not any("not shown" in l for l in lines) and "3.21" in row_line(lines, "dense-mini·bf16-sampler·s0")
