"""A report's stored inputs (fp8rl_core.report.inputs): write_report stores the tables it was made from beside
summary.md, they read back as they were, and check_tables renders the report again and compares its tables
byte for byte — on a report written here, on one edited by hand (the line named), on the small reports
stored in tests/core/report/stored/ (written by the code of their commit: a change to what a report prints shows
up here first), and on every committed report under docs/results (those whose inputs pass :data:`LARGE` in the
``results`` tier: ``make check-results``). Regenerate the stored ones after an intended change of the report's
output: ``PYTHONPATH=. .venv/bin/python -m tests.core.report.test_inputs``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from fp8rl_core.report import SweepData, check_tables, load_inputs, write_report
from fp8rl_core.schemas import validate

from .sweeps import BASE_DELTA, DENSE, make_sweep
from .test_matching import _checks, _rows

STORED = Path(__file__).parent / "stored"
RESULTS = Path(__file__).parents[3] / "docs" / "results"
N_BOOT = 200

#: committed reports under docs/results without their inputs (written before reports stored them): none since
#: 2026-12-05, when every one was regenerated; a name here needs the rerun (`make results`, `make results-small`),
#: and docs/results/README.md says so
WITHOUT_INPUTS: set[str] = set()
#: stored inputs larger than this (bytes) take a minute or more to check on one core — the bootstrap over the
#: per-sequence KL table (`matching-fixed-weights` 4.8 MB, 78–95 s; `matching-fixed-weights-a` 6.5 MB, 94 s):
#: their check is the ``results`` tier (tests/conftest.py), which ``make check-results`` runs and ``make test``
#: (CI's 30 minutes) leaves out; the stored fixed-weights example above keeps that report's code under ``make test``
LARGE = 2_000_000


def _fixed_weights() -> SweepData:  # three seeds: the report's "One seed left out" needs three
    seeds = (0, 1, 2)
    runs = pd.DataFrame([{"run_id": f"r{s}", "name": f"dense-small·fixed-weights·s{s}", "preset": "all",
                          "model": "qwen3-dense-small", "seed": s} for s in seeds])
    m = pd.concat([validate("matching", _rows(f"r{s}", s, n=60)) for s in seeds], ignore_index=True)
    c = pd.concat([validate("matching_checks", _checks(f"r{s}", s)) for s in seeds], ignore_index=True)
    return SweepData(sweep="stored-fixed-weights", runs=runs, matching=m, matching_checks=c)


#: the stored examples: folder name → the sweep it reports
EXAMPLES = {  # the RL sweep plants no difference for (a), with its own per-prompt factors: an unresolved row
    "rl-sweep": lambda: make_sweep(name="stored-rl-sweep", levels={"half": BASE_DELTA}, shared=False),
    "fixed-weights": _fixed_weights}


def test_a_report_stores_its_inputs_and_the_check_passes_on_it_and_names_an_edited_line(tmp_path):
    data = make_sweep(models=(DENSE,), name="inputs")
    write_report(data, tmp_path, n_boot=N_BOOT, figures=False)
    back, settings = load_inputs(tmp_path)
    assert settings["n_boot"] == N_BOOT and settings["seed"] == 0
    assert back.sweep == "inputs" and back.emulated is True and back.presets is None
    for name in ("runs", "tokens", "steps", "checks"):
        pd.testing.assert_frame_equal(getattr(back, name), getattr(data, name).reset_index(drop=True))
    assert back.probe.empty and back.matching.empty
    ok = check_tables(tmp_path)
    assert ok.same and ok.lines > 20
    summary = tmp_path / "summary.md"
    text = summary.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| (b) ") and "**reproduced**" in ln)
    summary.write_text(text.replace(row, row.replace("**reproduced**", "**unresolved**")))
    bad = check_tables(tmp_path)
    (diff,) = bad.differences
    assert not bad.same and diff[1] == row.replace("**reproduced**", "**unresolved**") and diff[2] == row


def test_a_report_without_stored_inputs_says_so(tmp_path):
    (tmp_path / "summary.md").write_text("# old\n")
    with pytest.raises(FileNotFoundError, match="no stored inputs .* regenerate it with `fp8rl report SWEEP"):
        check_tables(tmp_path)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_stored_reports_are_what_todays_code_makes_of_their_inputs(name):
    result = check_tables(STORED / name)
    assert result.lines > 10
    assert result.same, "\n".join(f"table line {i}:\n  stored: {a}\n  today:  {b}" for i, a, b in result.differences[:5])


def _committed(large: bool) -> list[str]:
    """The committed reports that store their inputs, those larger than :data:`LARGE` or the others."""
    def size(folder: Path) -> int:
        return sum(f.stat().st_size for f in folder.iterdir())
    return sorted(p.parent.parent.name for p in RESULTS.glob("*/inputs/report.json") if (size(p.parent) > LARGE) == large)


def _check_committed(name: str) -> None:
    """`fp8rl report SWEEP --out docs/results/SWEEP --check`: every table line of the committed summary (claims
    with numbers and verdicts, per-preset, power, checks; 54 to 150 of them a report) byte for byte."""
    result = check_tables(RESULTS / name)
    assert result.lines == sum(line.startswith("|") for line in (RESULTS / name / "summary.md").read_text().splitlines())
    assert result.same, "\n".join(f"table line {i}:\n  stored: {a}\n  today:  {b}" for i, a, b in result.differences[:5])


@pytest.mark.parametrize("name", _committed(large=False))
def test_the_committed_reports_with_inputs_are_what_todays_code_makes_of_them(name):
    _check_committed(name)


@pytest.mark.parametrize("name", _committed(large=True))
def test_the_large_committed_reports_are_what_todays_code_makes_of_them(name):
    """The ``results`` tier (``make check-results``)."""
    _check_committed(name)


def test_the_committed_reports_are_split_between_make_test_and_check_results():
    small, large = _committed(large=False), _committed(large=True)
    assert len(small) >= 5 and {"matching-fixed-weights", "matching-fixed-weights-a"} <= set(large)
    assert not set(small) & set(large)


def test_every_committed_report_either_has_inputs_or_is_listed_as_needing_the_rerun():
    reports = {p.parent.name for p in RESULTS.glob("*/summary.md")}
    with_inputs = {n for n in reports if (RESULTS / n / "inputs" / "report.json").is_file()}
    assert reports - with_inputs == WITHOUT_INPUTS  # `fp8rl report SWEEP --out docs/results/SWEEP --check` for the rest
    assert WITHOUT_INPUTS <= reports


if __name__ == "__main__":  # regenerate the stored examples
    for folder, make in EXAMPLES.items():
        shutil.rmtree(STORED / folder, ignore_errors=True)
        print(write_report(make(), STORED / folder, n_boot=N_BOOT, figures=False))
