"""The RL-run tables (fp8rl_core.schemas.steps): steps, tokens and microbatches from the real loop pass —
also as the flow writes and reads them back — and each of their constraints, violated in turn, is named."""

from __future__ import annotations

import copy
import math

import pytest

from fp8rl_core.metrics import mismatch
from fp8rl_core.schemas import TableError, validate
from fp8rl_core.vocabulary import LOGPROB_TOL

from .samples import (FLOW_KEYS, STEP_ROW, assert_violation_named, case_ids, microbatch_table, parquet, report,
                      set_, token_rows)


def flow_rows(steps: list[dict], tokens: list[dict]) -> list[dict]:
    """The experiment flow's step rows: train_stage_s, NeMo-RL's numbers from the step's tokens (as
    tasks.stages.train_step adds them), the checks' metrics, checks_s/full, its total_s."""
    rows = []
    for i, r in enumerate(copy.deepcopy(steps)):
        rep = report(r["new_version"], i + 1, full=(i == 0))
        r["train_stage_s"] = r["generate_s"] + r["learner_s"] + 0.001
        mine = [t for t in tokens if t["step"] == r["step"]]
        r |= mismatch.nemo_step_numbers([t["sampler_logprob"] for t in mine], [t["learner_logprob"] for t in mine])
        r |= rep.metrics() | {"checks_s": rep.seconds, "checks_full": float(rep.full)}
        r["total_s"] = r["train_stage_s"] + r["export_s"] + r["transport_s"] + r["load_s"] + r["reset_s"] + r["checks_s"]
        rows.append(r)
    return rows


def test_real_steps_tokens_and_microbatches_pass(real_run):
    precision, steps, tokens, mbs = real_run
    assert len(steps) == 2 and len(tokens) > 0 and len(mbs) >= 2
    assert len(validate("steps", steps)) == 2
    assert len(validate("tokens", tokens)) == len(tokens)
    out = validate("microbatches", mbs)
    assert set(out["precision"]) == {precision}


def test_flow_step_rows_pass_also_after_a_parquet_round_trip(real_run, tmp_path):
    _, steps, tokens, _ = real_run
    rows = flow_rows(steps, tokens)
    assert "check/W3" in rows[0] and "check/W3" not in rows[1]  # full tier first, then cheap
    out = validate("steps", rows)
    assert out["check/W3"].isna().tolist() == [False, True]
    validate("steps", parquet(rows, tmp_path))
    validate("tokens", parquet(tokens, tmp_path))


def test_real_rows_have_the_keys_the_hand_made_rows_have(real_run):
    """The hand-made valid rows carry exactly the keys the code produces."""
    _, steps, tokens, mbs = real_run
    assert set(steps[0]) == set(STEP_ROW) - FLOW_KEYS
    assert set(flow_rows(steps, tokens)[0]) == set(STEP_ROW) | {"check/W3", "check/W7"}
    assert set(tokens[0]) == set(token_rows()[0])
    assert set(mbs[0]) == set(microbatch_table()[0])


def test_the_log_prob_tolerance_is_the_metrics_one():
    """The tokens table and the KL estimators accept and refuse the same positive log-probs."""
    assert LOGPROB_TOL == 1e-4
    rows = token_rows()
    rows[0]["sampler_logprob"] = 5e-5  # float32 log_softmax rounding: accepted by both
    validate("tokens", rows)
    mismatch.kl_estimators([5e-5, -0.5], [-0.1, -0.4])
    rows[0]["sampler_logprob"] = 2e-4  # beyond rounding: refused by both
    with pytest.raises(TableError, match="row 0 \\(1 row\\) holds 0.0002"):
        validate("tokens", rows)
    with pytest.raises(ValueError, match="positive log-probs"):
        mismatch.kl_estimators([2e-4, -0.5], [-0.1, -0.4])


# (table, mutation, a column the error must name, the rows it must name, words the message must hold)
CASES = [
    # steps
    ("steps", set_(1, step=0), "step", [1], "must be ≥ 1"),
    ("steps", set_(2, step=2, version=1, new_version=2), "step", [1, 2], "unique"),
    ("steps", set_(1, new_version=5), "new_version", [1], "'version' + 1"),
    ("steps", set_(3, version=2, new_version=3), "version", [3], "previous step's 'new_version'"),
    ("steps", set_(0, sequences=0), "sequences", [0], "must be ≥ 1"),
    ("steps", set_(0, tokens=5, sequences=8), "tokens", [0], "'tokens' must be ≥ 'sequences'"),
    ("steps", set_(3, cached_tokens=-1), "cached_tokens", [3], "must be ≥ 0"),
    ("steps", set_(2, mean_reward=1.5), "mean_reward", [2], "must lie in [0, 1]"),
    ("steps", set_(1, loss=math.inf), "loss", [1], "finite"),
    ("steps", set_(1, loss=math.nan), "loss", [1], "must not be null"),
    ("steps", set_(1, grad_norm=-0.1), "grad_norm", [1], "a norm"),
    ("steps", set_(0, clip_fraction=2.0), "clip_fraction", [0], "a fraction"),
    ("steps", set_(0, mean_abs_logprob_diff=-0.1), "mean_abs_logprob_diff", [0], "an absolute value"),
    ("steps", set_(3, max_abs_logprob_diff=0.001), "max_abs_logprob_diff", [3], "never below its mean"),
    ("steps", set_(1, token_mult_prob_error=0.99), "token_mult_prob_error", [1], "must be ≥ 1"),
    ("steps", set_(1, token_mult_prob_error=math.inf), "token_mult_prob_error", [1], "finite"),
    ("steps", set_(2, token_mult_prob_error=1.005), "token_mult_prob_error", [2], "Jensen"),  # < exp(0.01)
    ("steps", set_(2, token_mult_prob_error=1.3), "token_mult_prob_error", [2], "never above its largest term"),  # > e^0.2
    ("steps", set_(0, gen_kl_error=-0.001), "gen_kl_error", [0], "must be ≥ 0"),
    ("steps", set_(0, gen_kl_error=math.inf), "gen_kl_error", [0], "finite"),
    ("steps", set_(3, gen_kl_error=0.0013), "gen_kl_error", [3], "must equal 'k3'"),
    ("steps", set_(2, generate_s=-1.0), "generate_s", [2], "a duration"),
    ("steps", set_(2, total_s=0.5), "total_s", [2], "disjoint parts"),
    ("steps", set_(1, microbatches=0), "microbatches", [1], "at least one micro-batch"),
    ("steps", set_(1, sync_bytes=0), "sync_bytes", [1], "must be ≥ 1"),
    ("steps", set_(1, sync_buckets=0), "sync_buckets", [1], "must be ≥ 1"),
    ("steps", set_(0, train_stage_s=0.5), "train_stage_s", [0], "inside the train stage"),
    ("steps", set_(0, checks_s=2.0), "checks_s", [0], "inside the step"),
    ("steps", set_(0, checks_full=0.5), "checks_full", [0], "must be one of"),
    ("steps", set_(3, **{"check/W2": 2.0}), "check/W2", [3], "must be one of"),
    ("steps", set_(3, step=4.5), "step", [3], "must hold whole numbers"),
    ("steps", set_(1, loss="low"), "loss", [1], "must hold real numbers"),
    # tokens
    ("tokens", set_(3, sampler_logprob=0.2), "sampler_logprob", [3], "a log-probability"),
    ("tokens", set_(4, learner_logprob=-math.inf), "learner_logprob", [4], "finite"),
    ("tokens", set_(4, learner_logprob=None), "learner_logprob", [4], "must not be null"),
    ("tokens", set_(2, token=-1), "token", [2], "a token id"),
    ("tokens", set_(2, sequence=-1), "sequence", [2], "must be ≥ 0"),
    ("tokens", set_(1, position=0), "position", [0, 1], "unique together"),
    ("tokens", set_(2, position=5), "position", [2], "0, 1, …, n−1"),
    ("tokens", set_(5, version=3), "version", [5], "one weight version"),
    ("tokens", set_(0, token=5.5), "token", [0], "whole numbers"),
    # microbatches
    ("microbatches", set_(0, precision="fp16"), "precision", [0], "'bf16', 'mxfp8'"),
    ("microbatches", set_(0, rows=0), "rows", [0], "at least one sequence"),
    ("microbatches", set_(0, real_tokens=10_000), "real_tokens", [0], "padding only adds"),
    ("microbatches", set_(0, tokens=25), "tokens", [0], "multiple of 'rows'"),
    ("microbatches", set_(0, tokens=40, real_tokens=20), "tokens_per_microbatch", [0], "packing rule"),
    ("microbatches", set_(1, gemm_s=0.5), "gemm_s", [1], "wall time"),
    ("microbatches", set_(5, quantize_s=0.01), "quantize_s", [5], "quantizes nothing"),
    ("microbatches", set_(2, tokens_per_microbatch=64), "tokens_per_microbatch", [2], "one packing budget per run"),
    ("microbatches", set_(1, microbatch=0), "microbatch", [0, 1], "unique together"),
    ("microbatches", set_(1, microbatch=7), "microbatch", [1], "indices run 0"),
    ("microbatches", set_(1, run_id=""), "run_id", [1], "empty text"),
    ("microbatches", set_(2, seconds=-0.1), "seconds", [2], "a duration"),
    ("microbatches", set_(2, precision="bf16"), "precision", [2], "one learner precision per run"),
]


@pytest.mark.parametrize("name, mutate, column, rows, words", CASES, ids=case_ids(CASES))
def test_each_violation_names_the_table_the_column_and_the_rows(name, mutate, column, rows, words):
    assert_violation_named(name, mutate, column, rows, words)


def test_a_requant_runs_byte_fractions_are_steps_columns():
    """A requant run's checks add W2's measured fractions to the step row (CheckReport.metrics): the
    steps table takes them as fractions, and refuses a value outside [0, 1] naming the column."""
    from fp8rl_core.checks.requant import RequantDifference, requant_measure
    from fp8rl_core.checks.runner import CheckReport

    diff = RequantDifference({"attention": (34, 1000), "mlp": (30, 1000)}, {"attention": (1, 100), "mlp": (0, 100)})
    rep = CheckReport(1, 1, False, "cadence: cheap", [requant_measure(diff)], 0.01)
    row = STEP_ROW | rep.metrics()
    assert row["requant/data_bytes_differ"] == 0.032 and row["requant/scale_bytes_differ/mlp"] == 0.0
    assert row["check/W2"] == 1.0
    out = validate("steps", [row])
    assert out["requant/data_bytes_differ/attention"].tolist() == [0.034]
    with pytest.raises(TableError, match="requant/scale_bytes_differ"):
        validate("steps", [row | {"requant/scale_bytes_differ": 1.5}])
