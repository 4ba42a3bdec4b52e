"""The mismatch tables (fp8rl_core.schemas.kl): kl_summary rows built from the real estimators pass, and
each constraint of kl_summary and probe, violated in turn, is named."""

from __future__ import annotations

import math

import pytest

from fp8rl_core.metrics import kl_estimators, mismatch
from fp8rl_core.schemas import validate

from .samples import KL_ROW, all_, assert_violation_named, case_ids, dup, set_


def test_kl_summary_from_the_real_estimators(real_run):
    _, _, tokens, _ = real_run
    rows = []
    for step in (1, 2, None):
        sel = [t for t in tokens if step is None or t["step"] == step]
        kl = kl_estimators([t["sampler_logprob"] for t in sel], [t["learner_logprob"] for t in sel])
        rev = kl_estimators([t["learner_logprob"] for t in sel], [t["sampler_logprob"] for t in sel])
        rows.append(KL_ROW | {"step": step, "tokens": len(sel),
                              "sequences": len({(t["step"], t["sequence"]) for t in sel}),
                              "k1": kl["k1"], "k2": kl["k2"], "k3": kl["k3"], "k1_rev": rev["k1"],
                              "k2_rev": rev["k2"], "k3_rev": rev["k3"],
                              "mean_abs_logprob_diff": kl["mean_abs_logprob_diff"],
                              "max_abs_logprob_diff": kl["max_abs_logprob_diff"],
                              "token_mult_prob_error": math.exp(kl["mean_abs_logprob_diff"])})
    out = validate("kl_summary", rows)
    assert str(out["step"].dtype) == "Int64" and out["step"].isna().tolist() == [False, False, True]


def test_kl_summary_rows_straight_from_token_mismatch(real_run):
    """A summary row = the run's identity | metrics.mismatch.token_mismatch(...) (counts come back as floats)."""
    _, _, tokens, _ = real_run
    rows = []
    for step in (1, 2, None):
        sel = [t for t in tokens if step is None or t["step"] == step]
        m = mismatch.token_mismatch([t["sampler_logprob"] for t in sel], [t["learner_logprob"] for t in sel],
                                    [[t["step"], t["sequence"]] for t in sel])
        rows.append({"run_id": "run-a", "preset": "mxfp8-all", "model": "qwen3-dense-mini", "seed": 0, "step": step} | m)
    out = validate("kl_summary", rows)
    assert out["tokens"].dtype == "int64" and out["chi2_seq_clamped"].dtype == "int64"


# (table, mutation, a column the error must name, the rows it must name, words the message must hold)
CASES = [
    # kl_summary
    *[("kl_summary", set_(0, **{c: -0.001}), c, [0], "non-negative KL estimator") for c in ("k2", "k3", "k2_rev", "k3_rev")],
    ("kl_summary", set_(1, mean_abs_logprob_diff=-0.1), "mean_abs_logprob_diff", [1], "an absolute value"),
    ("kl_summary", set_(1, mean_abs_logprob_diff=0.9), "max_abs_logprob_diff", [1], "never below its mean"),
    ("kl_summary", set_(1, mean_abs_prob_diff=0.5), "mean_abs_prob_diff", [1], "never below its mean"),
    ("kl_summary", set_(1, max_abs_prob_diff=1.5), "max_abs_prob_diff", [1], "must lie in [0, 1]"),
    ("kl_summary", set_(2, token_mult_prob_error=0.99), "token_mult_prob_error", [2], "must be ≥ 1"),
    ("kl_summary", set_(2, chi2_token=-1.0), "chi2_token", [2], "χ²"),
    ("kl_summary", set_(2, chi2_seq=-1.0), "chi2_seq", [2], "χ²"),
    ("kl_summary", set_(0, k1=math.inf), "k1", [0], "finite"),
    ("kl_summary", set_(0, log_ppl_diff=math.nan), "log_ppl_diff", [0], "must not be null"),
    ("kl_summary", set_(0, step=0), "step", [0], "must be ≥ 1"),
    ("kl_summary", set_(0, step=1.5), "step", [0], "whole numbers or null"),
    ("kl_summary", set_(1, step=1), "step", [0, 1], "unique together"),
    ("kl_summary", set_(1, step=None), "step", [1, 2], "one whole-run row"),
    ("kl_summary", set_(0, tokens=5), "tokens", [0], "'tokens' must be ≥ 'sequences'"),
    ("kl_summary", set_(0, chi2_seq_clamped=11), "chi2_seq_clamped", [0], "clamped sequences are some"),
    ("kl_summary", set_(0, chi2_seq_clamped=-1), "chi2_seq_clamped", [0], "a count of sequences"),
    ("kl_summary", set_(0, log_ppl_abs_diff=-0.5), "log_ppl_abs_diff", [0], "an absolute value"),
    ("kl_summary", set_(2, preset="bf16"), "preset", [2], "one preset"),
    ("kl_summary", set_(2, seed=7), "seed", [2], "one seed"),
    ("kl_summary", dup(0, 1, step=2, k3_lo=0.003, k3_hi=0.001), "k3_lo", [1], "'<metric>_lo' must be ≤"),
    ("kl_summary", all_(k3_lo=0.001), "k3_lo", None, "come in pairs"),
    # probe
    ("probe", set_(1, kl=-0.001), "kl", [1], "an exact KL divergence"),
    ("probe", set_(2, js=7.0), "js", [2], "bounded by ln 2"),
    ("probe", set_(2, sequence=0), "sequence", [0, 2], "one row per probe sequence"),
    ("probe", set_(1, positions=0), "positions", [1], "at least one next token"),
    ("probe", set_(1, seed=4), "seed", [1], "one seed"),
]


@pytest.mark.parametrize("name, mutate, column, rows, words", CASES, ids=case_ids(CASES))
def test_each_violation_names_the_table_the_column_and_the_rows(name, mutate, column, rows, words):
    assert_violation_named(name, mutate, column, rows, words)
