"""The requantization comparison: requant/all KL ratio with its CI and verdict sentence per model and measure,
W2's byte-difference fractions from the steps table, and "not run" when a sweep lacks a preset."""

from __future__ import annotations

import math

import pytest

from fp8rl_core.report import requant_rows, write_report
from fp8rl_core.report.requant import requant_bytes, requant_verdict

from .sweeps import DENSE, LEVELS, MOE, expected_k3_ratio, make_sweep

N_BOOT = 300
#: measured on the minis' warm starts (docs/results/README.md): the fractions a requant run's W2 logs
BYTES = {"requant/data_bytes_differ": 0.0343, "requant/scale_bytes_differ": 0.0034,
         "requant/data_bytes_differ/attention": 0.0334, "requant/scale_bytes_differ/attention": 0.0026,
         "requant/data_bytes_differ/mlp": 0.0346, "requant/scale_bytes_differ/mlp": 0.0037}


def _sweep(requant_level: float, models=(DENSE,)):
    data = make_sweep(presets=("all", "requant"), models=models, levels={"requant": requant_level}, checks=False)
    ids = data.runs.loc[data.runs["preset"] == "requant", "run_id"]
    for col, v in BYTES.items():
        data.steps[col] = None
        data.steps.loc[data.steps["run_id"].isin(ids), col] = v
    return data


def test_a_resolved_difference_says_what_shipping_the_bytes_buys():
    data = _sweep(LEVELS["all"] * math.sqrt(1.5))  # planted: requant has 1.5x the KL of all
    [row] = requant_rows(data, n_boot=N_BOOT)
    assert (row.model, row.measure) == (DENSE, "k3")
    assert row.ratio == pytest.approx(expected_k3_ratio(data, DENSE, "all", "requant"), rel=1e-9)
    assert row.lo > 1 and row.ratio == pytest.approx(1.5, rel=0.05)
    assert row.verdict.startswith(f"shipping the learner's bytes instead of requantizing buys {1 - 1 / row.ratio:.0%} "
                                  f"lower sampled-token k3 on {DENSE}")
    assert row.bytes_differ == pytest.approx(BYTES)


def test_no_difference_resolved_at_this_power():
    data = _sweep(LEVELS["all"])
    [row] = requant_rows(data, n_boot=N_BOOT)
    assert row.lo < 1 < row.hi
    assert row.verdict.startswith(f"no difference resolved at this power on {DENSE}")


def test_the_sentence_for_each_side_of_one():
    assert requant_verdict(0.8, 0.7, 0.9, 0.95, MOE, "probe_kl") == (
        f"requantizing from BF16 gave 20% lower exact probe KL than the learner's bytes on {MOE} (requant/all 0.8, "
        "95% CI 0.7–0.9)")
    assert requant_verdict(2.0, 1.5, 2.5, 0.95, MOE, "k3").startswith("shipping the learner's bytes instead of "
                                                                      "requantizing buys 50% lower")


def test_bytes_are_the_requant_runs_means_per_model():
    data = _sweep(LEVELS["all"], models=(DENSE, MOE))
    assert requant_bytes(data, DENSE) == pytest.approx(BYTES) and requant_bytes(data, "other") == {}
    assert [r.model for r in requant_rows(data, n_boot=N_BOOT)] == [DENSE, MOE]


def test_the_report_has_the_row_or_says_not_run(tmp_path):
    text = write_report(_sweep(LEVELS["all"] * math.sqrt(1.5)), tmp_path / "with", n_boot=N_BOOT).read_text()
    section = text.split("## Requantization: requant vs all", 1)[1].split("\n## ", 1)[0]
    assert "| model | measure | requant / all (95% CI) | bytes differing: data / scale | verdict |" in section
    assert "3.43% / 0.34% (attention 3.34% / 0.26%; mlp 3.46% / 0.37%)" in section
    assert "shipping the learner's bytes instead of requantizing buys" in section
    without = write_report(make_sweep(presets=("all", "bf16-sampler"), models=(DENSE,)), tmp_path / "without",
                           n_boot=N_BOOT).read_text()
    assert "Not run: this sweep has no `requant` runs, so the requant/all KL ratio is not measured here." in without
