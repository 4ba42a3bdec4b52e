"""The claims' verdicts (fp8rl_core.report.verdicts) on synthetic sweeps whose answer is known by construction
(the builders: tests/core/report/sweeps.py)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from fp8rl_core.report import (CLAIM_KINDS, CLAIMS, EVALUATORS, VERDICTS, ClaimRow, SweepData, absent_claims,
                               cost_models, direction_verdict, evaluate_claims)
from fp8rl_core.schemas import validate

from .sweeps import BASE_DELTA, DENSE, LEVELS, MOE, by_id, cost_sweep, expected_k3_ratio, make_sweep


@pytest.fixture(scope="module")
def sweep() -> SweepData:
    return make_sweep()


@pytest.fixture(scope="module")
def rows(sweep) -> list[ClaimRow]:
    return evaluate_claims(sweep, n_boot=1000)


def test_the_synthetic_tables_satisfy_their_schemas(sweep):
    one = sweep.runs["run_id"].iloc[0]
    validate("tokens", sweep.tokens[sweep.tokens["run_id"] == one].drop(columns="run_id"))
    validate("steps", sweep.steps[sweep.steps["run_id"] == one].drop(columns="run_id"))
    validate("checks", sweep.checks[sweep.checks["run_id"] == one].drop(columns="run_id"))
    validate("microbatches", cost_sweep((2e-3, 3e-6), (6e-3, 1e-6)).microbatches)


# ------------------------------------------------------------------------------------ KL claims

@pytest.mark.parametrize("cid,baseline,candidate,paper", [
    ("a", "bf16-sampler", "half", 0.89),
    ("b", "bf16-sampler", "all", 0.84),
    ("e", "bf16-e2e", "all", None),
])
@pytest.mark.parametrize("model", [DENSE, MOE])
def test_planted_kl_ratios_are_measured_and_reproduced(sweep, rows, cid, baseline, candidate, paper, model):
    row = by_id(rows, cid, model)
    expected = expected_k3_ratio(sweep, model, baseline, candidate)
    assert row.ratio == pytest.approx(expected, rel=1e-9)
    assert row.lo < row.ratio < row.hi
    assert row.verdict == "reproduced"
    if paper is not None:
        assert expected == pytest.approx(paper, rel=0.03)  # the plant works
        assert row.paper_in_ci is (row.lo <= paper <= row.hi)
    else:  # (e): planted ≈ 4, inside the paper's 2.5–10
        assert row.paper_in_ci is True and "overlaps the paper's range 2.5–10" in row.why
        assert "most consistent FP8 pipeline" in row.why
    assert "paired by prompt over 48 sequences, 3 seeds" in row.measured
    assert "lower" in row.measured if cid != "e" else "× as high" in row.measured


def test_claim_b_reads_16_percent_lower(rows):
    row = by_id(rows, "b", DENSE)
    assert row.ratio == pytest.approx(0.84, abs=0.02)
    assert "% lower (95% CI" in row.measured
    assert row.why.startswith("the 95% CI [") and "lies entirely below 1" in row.why


@pytest.mark.parametrize("case", ["identical", "same level, other draws"])
def test_equal_kl_is_unresolved(case):
    # identical: every unit equal → ratio exactly 1, the CI is [1, 1] and includes 1;
    # same level with independent per-prompt factors → the CI straddles 1
    shared = case == "identical"
    data = make_sweep(presets=("bf16-sampler", "all"), models=(DENSE,), levels={"all": BASE_DELTA}, shared=shared,
                      steps=False, checks=False)
    if shared:  # make the two runs' tokens identical, jitter included
        t = data.tokens
        base = t[t["run_id"].str.contains("bf16-sampler")].reset_index(drop=True)
        other = base.assign(run_id=base["run_id"].str.replace("bf16-sampler", "all"))
        data.tokens = pd.concat([base, other], ignore_index=True)
    row = by_id(evaluate_claims(data, n_boot=1000), "b")
    assert row.verdict == "unresolved"
    assert row.lo <= 1.0 <= row.hi
    assert "no difference resolved" in row.why
    if shared:
        assert row.ratio == 1.0 and row.lo == row.hi == 1.0


def test_a_one_seed_sweep_reads_unresolved_with_the_sequences_a_resolution_needs():
    # the verl smoke's shape: one seed, sampled tokens only; (a) on the dense mini with no planted difference
    data = make_sweep(presets=("bf16-sampler", "half"), models=(DENSE,), seeds=(0,), levels={"half": BASE_DELTA},
                      shared=False, steps=False, checks=False)
    row = by_id(evaluate_claims(data, n_boot=500), "a")
    assert row.verdict == "unresolved" and row.lo <= 0.89 <= row.hi  # the CI holds the paper's own 0.89
    from fp8rl_core.report.power import claim_power
    from fp8rl_core.report.compare import units_of

    p = claim_power(units_of(data, "k3"), next(c for c in CLAIMS if c.id == "a"), DENSE)
    need = p.estimate.needed
    assert need.groups is None and need.units > 16  # 16 sequences of one seed: far from enough
    assert row.why.endswith(f"; a resolution of the paper's 0.89 at 80% power needs at least {need.units} sequences "
                            "(one seed: the spread between seeds is unknown, so more seeds may be needed)")
    assert "power:" not in row.why  # one seed: no design power without σ²_between


def test_an_unresolved_first_step_claim_sizes_its_first_step():
    # (d) with no planted difference: both intervals include 1; the power note is the first step's (8 sequences a seed)
    data = make_sweep(presets=("all", "other-grid"), models=(MOE,), levels={"other-grid": LEVELS["all"]}, shared=False,
                      steps=False, checks=False)
    row = by_id(evaluate_claims(data, n_boot=300), "d")
    assert row.verdict == "unresolved" and "; step 1: no difference resolved" in row.why
    assert "; power at step 1: 3 seeds × 8 sequences resolve only ratios ≤ " in row.why
    assert "; at step 1: this design (3 seeds × 8 sequences) had 80% power for the paper's 2 (" in row.why


def test_opposite_direction_is_a_contradiction():
    data = make_sweep(presets=("bf16-sampler", "half"), models=(DENSE,), levels={"half": BASE_DELTA * 1.5},
                      steps=False, checks=False)
    row = by_id(evaluate_claims(data, n_boot=500), "a")
    assert row.verdict == "contradicted" and row.lo > 1.0
    assert "the opposite direction" in row.why


def test_other_grid_doubles_kl_on_the_moe_model_from_the_first_step(sweep, rows):
    row = by_id(rows, "d")
    assert row.model == MOE  # the dense model is not part of claim (d)
    assert row.ratio == pytest.approx(expected_k3_ratio(sweep, MOE, "all", "other-grid"), rel=1e-9)
    assert row.ratio == pytest.approx(2.0, rel=0.03)
    assert row.verdict == "reproduced"
    assert "whole run:" in row.measured and "step 1:" in row.measured
    assert "step 1: the 95% CI" in row.why


def test_a_zero_baseline_kl_is_not_measurable():
    data = make_sweep(presets=("bf16-e2e", "all"), models=(DENSE,), levels={"bf16-e2e": 0.0}, steps=False,
                      checks=False)
    row = by_id(evaluate_claims(data, n_boot=200), "e")
    assert row.verdict == "not measurable here" and "undefined" in row.why


# ------------------------------------------------------------------------------------ sync claim

@pytest.mark.parametrize("backend", ["native", "verl"])
@pytest.mark.parametrize("fail,verdict", [(False, "reproduced"), (True, "contradicted")])
def test_byte_identity_follows_the_w2_rows_of_the_syncs_on_the_learners_grid(fail, verdict, backend):
    data = make_sweep(presets=("bf16-sampler", "all"), models=(DENSE,), seeds=(0, 1), fail_w2=fail, steps=False)
    data.runs = data.runs.assign(backend=backend)  # the same rule for both backends
    row = by_id(evaluate_claims(data, n_boot=200), "c")
    assert row.verdict == verdict
    # on the grid: the 2 `all` runs × 2 syncs; the 2 bf16-sampler runs' 4 syncs are stated, not counted
    passed = 4 - int(fail)
    assert row.measured == (f"{passed}/4 W2 checks passed at the 4 syncs of 2 runs on the learner's grid (all); "
                            f"all conditions there: {20 - int(fail)}/20 checks passed")
    assert row.value == pytest.approx(passed / 4)
    assert row.why.endswith("; not on the learner's grid, so not counted in (c): BF16 sampler (bf16-sampler): "
                            "4 syncs of 2 runs, W4 4/4 passed, all conditions 20/20 — every tensor the sampler holds "
                            "equals the learner's BF16 view (no layer on an FP8 grid, so W2 compares no tensor)")
    if fail:
        assert row.why.startswith("1 W2 check(s) on the learner's grid failed, e.g. dense-mini/all/s0 sync 2 "
                                  "(model.layers.0.mlp.down_proj); ")
    else:
        assert row.why.startswith("every W2 check on the learner's grid passed: at each of the 4 syncs of all the "
                                  "sampler's FP8 data and scale bytes read back equal the learner's rowwise "
                                  "quantization of its master weights; ")


def test_a_failure_off_the_learners_grid_is_stated_and_does_not_count_in_c():
    # the failing run is the last preset's seed 0: other-grid, whose sampler quantizes the BF16 view itself
    data = make_sweep(presets=("half", "all", "other-grid"), models=(DENSE,), seeds=(0,), fail_w2=True, steps=False)
    row = by_id(evaluate_claims(data, n_boot=200), "c")
    assert row.verdict == "reproduced" and row.value == 1.0
    assert row.measured.startswith("4/4 W2 checks passed at the 4 syncs of 2 runs on the learner's grid (half, all)")
    assert ("another grid (128×128 block FP8) (other-grid): 2 syncs of 1 run, W4 2/2 passed, all conditions 9/10 — "
            in row.why)
    assert row.why.endswith("; failed: dense-mini/other-grid/s0 sync 2 (model.layers.0.mlp.down_proj)")


def test_a_sweep_without_syncs_on_the_learners_grid_does_not_test_c():
    data = make_sweep(presets=("bf16-e2e", "bf16-sampler", "other-grid"), models=(DENSE,), seeds=(0,), steps=False)
    rows = evaluate_claims(data, n_boot=200)
    assert "c" not in {r.id for r in rows}
    absent = {a.id: a.needs for a in absent_claims(data, rows)}
    assert absent["c"] == "W2 checks of runs whose sampler holds layers on the learner's grid (presets half, all)"


# ------------------------------------------------------------------------------------ cost claims

def test_negative_saving_says_no_break_even():
    data = cost_sweep(bf16=(2e-3, 1e-6), mxfp8=(5e-3, 1.5e-6))
    rows = evaluate_claims(data, n_boot=300)
    f2 = by_id(rows, "f2")
    assert f2.verdict == "not measurable here"
    assert "no break-even" in f2.why and "no FP8 tensor cores" in f2.why
    assert "status no_break_even" in f2.measured
    f1 = by_id(rows, "f1")  # Δfixed = 3 ms, resolved above 0: the part that transfers
    assert f1.verdict == "reproduced" and f1.value == pytest.approx(3e-3, rel=0.05)


@pytest.mark.parametrize("emulated,verdict", [(False, "reproduced"), (True, "not measurable here")])
def test_planted_break_even_at_2000_tokens(emulated, verdict):
    # Δfixed = 6 − 2 = 4 ms, saving = 3 − 1 = 2 µs/token → break-even 2000 tokens per micro-batch
    data = cost_sweep(bf16=(2e-3, 3e-6), mxfp8=(6e-3, 1e-6), emulated=emulated)
    f2 = by_id(evaluate_claims(data, n_boot=300), "f2")
    assert f2.value == pytest.approx(2000, rel=0.05)
    assert f2.verdict == verdict and "status break_even" in f2.measured
    if not emulated:
        assert f2.paper_in_ci is False and "the paper's 4500 lies outside" in f2.why
    else:  # the cost model's headline, not a piece cut out of its sentence
        ((_, cm),) = cost_models(data, n_boot=300)
        assert cm.headline.startswith("mxfp8 pays off above ≈") and ": " not in cm.headline
        assert f2.why.endswith(f"the cost model's finding: {cm.headline}")


def test_a_single_token_budget_cannot_be_fitted():
    data = cost_sweep(bf16=(2e-3, 3e-6), mxfp8=(6e-3, 1e-6))
    data.microbatches = data.microbatches[data.microbatches["tokens"] == 1024]
    f1 = by_id(evaluate_claims(data, n_boot=100), "f1")
    assert f1.verdict == "not measurable here" and "2 distinct token budgets" in f1.why


# ------------------------------------------------------------------------------------ trace and timing

def test_trace_claim_needs_a_trace(rows):
    row = by_id(rows, "g")
    assert row.verdict == "not measurable here" and "no GPU profiler trace" in row.why


def _trace(kernels: list[tuple[float, float, float]]) -> dict:
    """A minimal Chrome trace: each kernel (launch_ts, kernel_ts, kernel_dur) µs with its launch call."""
    ev = []
    for i, (launch, start, dur) in enumerate(kernels):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch,
                   "dur": 1.0, "args": {"correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": start, "dur": dur,
                   "args": {"correlation": i, "device": 0}})
    return {"traceEvents": ev}


def test_trace_claim_with_a_gpu_trace_pair():
    # BF16: two back-to-back kernels over 0–20 µs. MXFP8: the same, then a 30 µs gap the host causes
    # (the next launch starts after the device went idle), then a 10 µs kernel: 40 µs added, 30 of
    # them host-bound idle → 75%
    bf16 = _trace([(0, 1, 10), (5, 11, 10)])
    mx = _trace([(0, 1, 10), (5, 11, 10), (40, 51, 10)])
    row = by_id(evaluate_claims(make_sweep(models=(DENSE,), presets=("all",), seeds=(0,)), n_boot=100,
                                trace_paths={"mxfp8": mx, "bf16": bf16}), "g")
    assert row.value == pytest.approx(30 / 40)
    assert row.verdict == "reproduced" and "75%" in row.measured


@pytest.mark.parametrize("cid,model,planted", [("h1", MOE, 0.893), ("h2", MOE, 0.76), ("h3", DENSE, 1.05)])
@pytest.mark.parametrize("emulated", [True, False])
def test_end_to_end_times(sweep, cid, model, planted, emulated):
    data = sweep if emulated else SweepData(**{**sweep.__dict__, "emulated": False})
    row = by_id(evaluate_claims(data, n_boot=500, claims=[c for c in CLAIMS if c.id == cid]), cid)
    assert row.model == model
    assert row.ratio == pytest.approx(planted, rel=0.01)
    assert row.lo <= row.ratio <= row.hi
    assert "paired by (seed, step) over 6 units" in row.measured
    if emulated:
        assert row.verdict == "not measurable here" and "emulated on CPU" in row.why
    else:
        assert row.verdict == "reproduced"


# ------------------------------------------------------------------------------------ bookkeeping

def test_every_row_has_the_documented_fields_and_a_known_verdict(rows):
    keys = ("id", "claim", "model", "measure", "paper", "measured", "ratio", "lo", "hi", "value", "paper_in_ci",
            "verdict", "why")
    assert tuple(f.name for f in dataclasses.fields(ClaimRow)) == keys
    assert rows and all(isinstance(r, ClaimRow) and r.verdict in VERDICTS for r in rows)
    assert [r.id for r in rows] == sorted((r.id for r in rows), key=[c.id for c in CLAIMS].index)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows[0].why = "edited"


def test_a_row_with_an_unknown_verdict_is_refused(rows):
    with pytest.raises(ValueError, match="claim 'a': unknown verdict 'maybe'; valid: reproduced, contradicted, unresolved, "):
        dataclasses.replace(rows[0], verdict="maybe")


def test_every_claim_kind_has_one_evaluator():
    assert set(EVALUATORS) == set(CLAIM_KINDS) and len(EVALUATORS) == len(CLAIM_KINDS)


def test_claims_missing_their_presets_are_listed_as_absent():
    data = make_sweep(presets=("bf16-sampler", "all"), models=(DENSE,), checks=False, steps=False)
    rows = evaluate_claims(data, n_boot=200)
    assert {r.id for r in rows} == {"b", "g"}
    absent = {a.id: a.needs for a in absent_claims(data, rows)}
    assert set(absent) == {"a", "c", "d", "e", "f1", "f2", "h1", "h2", "h3"}
    assert absent["d"] == "a MoE model, presets other-grid and all with their tokens table"


def test_evaluation_is_deterministic(sweep):
    assert evaluate_claims(sweep, n_boot=300) == evaluate_claims(sweep, n_boot=300)


@pytest.mark.parametrize("lo,hi,direction,verdict,phrase", [
    (0.80, 0.90, "lower", "reproduced", "lies entirely below 1"),
    (0.95, 1.05, "lower", "unresolved", "no difference resolved"),
    (1.10, 1.30, "lower", "contradicted", "the opposite direction"),
    (1.10, 1.30, "higher", "reproduced", "lies entirely above 1"),
])
def test_direction_rule(lo, hi, direction, verdict, phrase):
    v, why, inside = direction_verdict(lo, hi, direction, paper=0.84)
    assert v == verdict and phrase in why
    assert inside is (lo <= 0.84 <= hi)


def test_times_fall_back_to_the_run_metrics_without_a_steps_table():
    data = make_sweep(presets=("bf16-e2e", "all"), models=(MOE,), steps=False, checks=False, emulated=False)
    data.runs.loc[data.runs["preset"] == "all", "time/step_s"] = 2.0 * 0.893
    rows = evaluate_claims(data, n_boot=200)
    h1 = by_id(rows, "h1")
    assert h1.ratio == pytest.approx(0.893, rel=1e-12) and h1.lo == pytest.approx(h1.hi)
    assert "paired by (seed, step) over 3 units (run metric time/step_s)" in h1.measured
    assert h1.verdict == "reproduced"
    assert not [r for r in rows if r.id == "h2"]  # no time/generate_s column: not tested
