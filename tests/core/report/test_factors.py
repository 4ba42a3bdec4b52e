"""A claim's factor across a sweep's models (fp8rl_core.report.factors.factors_across_models): the
block-size ablation of the MoE sweeps, on planted probe tables."""

from __future__ import annotations

import pytest

from fp8rl_core.metrics import compare_factors, paired_units
from fp8rl_core.report import SweepData, factors_across_models, probe_units, write_report

from .sweeps import MOE, make_sweep
from .test_probe import with_probe

SMALL = "qwen3-moe-small"


def _scaled(data: SweepData, model: str, preset: str, factor: float) -> SweepData:
    """``preset``'s probe KL on ``model`` multiplied by ``factor`` (every sequence)."""
    probe = data.probe.copy()
    hit = (probe["model"] == model) & (probe["preset"] == preset)
    probe.loc[hit, "kl"] = probe.loc[hit, "kl"] * factor
    return SweepData(**{**data.__dict__, "probe": probe})


@pytest.fixture(scope="module")
def two_moes():
    return with_probe(make_sweep(models=(MOE, SMALL), seeds=(0, 1, 2), steps=False, checks=False))


def _row(rows, cid):
    hits = [r for r in rows if r.claim.startswith(f"({cid})")]
    assert len(hits) == 1, [r.claim for r in rows]
    return hits[0]


def test_the_same_planted_factor_on_both_models_is_no_change(two_moes):
    rows = factors_across_models(two_moes, n_boot=400)
    assert {r.claim[:3] for r in rows} == {"(a)", "(b)", "(d)", "(e)"}
    d = _row(rows, "d")
    assert (d.reference, d.model, d.candidate, d.baseline) == (MOE, SMALL, "other-grid", "all")
    assert d.comparison.ratio == pytest.approx(1.0, abs=0.05) and d.comparison.lo < 1 < d.comparison.hi
    assert d.seeds == (3, 3) and d.verdict.startswith("no change resolved")


def test_a_factor_that_shrinks_on_the_model_with_more_blocks_is_resolved(two_moes):
    # the other-grid sampler's KL on the small model a quarter as high: its factor (≈2 planted) falls to ≈0.5
    data = _scaled(two_moes, SMALL, "other-grid", 0.25)
    d = _row(factors_across_models(data, n_boot=400), "d")
    units = probe_units(data, "probe_kl")
    sides = []
    for model in (MOE, SMALL):
        ua, ub = units[(model, "all")], units[(model, "other-grid")]
        a, b, keys = paired_units(ua.keys, (ua.num, ua.den), ub.keys, (ub.num, ub.den))
        sides.append((a, b, keys[:, 0]))
    assert d.comparison == compare_factors(*sides, n_boot=400)      # exactly the metrics function's numbers
    before = _row(factors_across_models(two_moes, n_boot=400), "d").comparison
    assert d.comparison.ratio == pytest.approx(0.25 * before.ratio, rel=1e-9)  # every sequence scaled by 0.25
    assert d.comparison.a == before.a and d.comparison.b == pytest.approx(0.25 * before.b, rel=1e-9)
    assert d.comparison.hi < 1 and d.verdict.startswith(f"the factor is smaller on {SMALL}")


def test_one_model_or_no_probe_table_gives_no_rows(two_moes):
    one = with_probe(make_sweep(models=(MOE,), seeds=(0, 1), steps=False, checks=False))
    assert factors_across_models(one, n_boot=100) == []
    assert factors_across_models(SweepData(**{**two_moes.__dict__, "probe": None}), n_boot=100) == []


def test_the_report_has_the_section_with_each_row(two_moes, tmp_path):
    data = _scaled(two_moes, SMALL, "other-grid", 0.25)
    text = write_report(data, tmp_path, n_boot=200).read_text()
    assert "## Factors across models" in text
    section = text.split("## Factors across models")[1].split("\n## ")[0]
    d = _row(factors_across_models(data, n_boot=200), "d")
    assert f"| {d.claim} | other-grid / all | {MOE}: " in section and d.verdict in section
    assert "## Factors across models" not in write_report(
        with_probe(make_sweep(models=(MOE,), seeds=(0, 1), steps=False, checks=False)), tmp_path / "one",
        n_boot=100).read_text()
