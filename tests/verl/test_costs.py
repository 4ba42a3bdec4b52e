"""fp8rl's parts inside a verl run: the costs file two processes append to, per-step sums and the run's share
of verl's step (fp8rl_core.verl.costs)."""

from __future__ import annotations

import pytest

from fp8rl_core.verl.costs import ADDED, COSTS_FILE, PARTS, append_cost, cost_summary, per_step, read_costs


def test_lines_append_and_read_back_in_order(tmp_path):
    path = tmp_path / COSTS_FILE
    assert read_costs(path) == []
    append_cost(path, 1, {"export_s": 0.25, "update_s": 1.0, "keep_s": 0.5, "checks_s": 2.0})
    append_cost(path, 1, {"capture_s": 0.25})  # the trainer's line of the same step
    append_cost(path, 2, {"export_s": 0.75, "update_s": 1.0, "keep_s": 0.5, "checks_s": 1.0})
    rows = read_costs(path)
    assert [r["step"] for r in rows] == [1, 1, 2] and rows[1] == {"step": 1, "capture_s": 0.25}
    assert per_step(rows) == {1: {"export_s": 0.25, "update_s": 1.0, "keep_s": 0.5, "checks_s": 2.0, "capture_s": 0.25},
                              2: {"export_s": 0.75, "update_s": 1.0, "keep_s": 0.5, "checks_s": 1.0}}


def test_the_summary_counts_what_fp8rl_adds_against_verls_mean_step(tmp_path):
    path = tmp_path / COSTS_FILE
    append_cost(path, 1, {"export_s": 0.25, "update_s": 1.0, "keep_s": 0.5, "checks_s": 2.0, "capture_s": 0.25})
    append_cost(path, 2, {"export_s": 0.75, "update_s": 3.0, "keep_s": 0.5, "checks_s": 1.0})
    s = cost_summary(read_costs(path), [10.0, 30.0])
    assert s["fp8rl/export_s"] == 0.5 and s["fp8rl/checks_s"] == 1.5 and s["fp8rl/capture_s"] == 0.125
    assert s["fp8rl/update_s"] == 2.0  # verl's own weight update (with fp8rl's load): reported, not added
    assert set(ADDED) == set(PARTS) - {"update_s"}
    assert s["fp8rl/added_s"] == pytest.approx(0.5 + 0.5 + 1.5 + 0.125)
    assert s["fp8rl/added_share"] == pytest.approx(2.625 / 20.0)
    assert "fp8rl/added_share" not in cost_summary(read_costs(path), [])  # no step times: no share
    assert cost_summary([], [1.0]) == {}


def test_an_unknown_part_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown cost parts \['load_s'\]; valid: \['export_s'"):
        append_cost(tmp_path / COSTS_FILE, 1, {"load_s": 1.0})
