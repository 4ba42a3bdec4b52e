"""The tables of an RL run, each rule of a table naming what it protects (docs/metrics.md, tables).

``steps``: one row per RL step — :func:`fp8rl_core.loop.rollout_and_learn` and
:func:`fp8rl_core.loop.sync_weights` write it, the flow (``tasks.stages``) adds its optional stage
times, NeMo-RL's ``token_mult_prob_error`` and ``gen_kl_error`` of the step and ``check/W*`` verdicts. ``tokens``: one row per sampled token, both log-probs (from
``rollout_and_learn``). ``microbatches``: one row per learner micro-batch
(:func:`fp8rl_core.learner.grpo.microbatch_rows`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp8rl_core.vocabulary import PRECISIONS, STEP_TIMES, TIME_TOL

from .dsl import (CHECK_COLUMNS, REQUANT_COLUMNS, FINITE, LOGPROB, NONEMPTY, SECONDS, Table, at_least, between, col, constant_per, ge,
                  isin, num, pattern, rule, unique)

__all__ = ["MICROBATCHES", "STEPS", "TOKENS"]


def _stale_rollout(df: pd.DataFrame) -> pd.Series:
    """A step's rollout version ≠ the previous step's new_version (consecutive step numbers of one run only)."""
    runs = ["run_id"] if "run_id" in df.columns else []
    order = df.sort_values([*runs, "step"])
    step, v, nv = num(order, "step"), num(order, "version"), num(order, "new_version")
    follows = step.diff() == 1
    if runs:
        follows &= order["run_id"].eq(order["run_id"].shift(1))
    bad = follows & (v != nv.shift(1))
    return bad.reindex(df.index)


#: relative slack between a step's numbers from the same tokens computed along two paths: the loop's mean/max
#: |Δlogp| and k3 start from a float32 difference of the log-probs, the NeMo-RL numbers from a float64 one
_F32_REL = 1e-5


STEPS = Table("steps", {
    "run_id": col("str", NONEMPTY, required=False, doc="the run's id (added when read back from several runs)"),
    "step": col("int", ge(1, "steps count from 1"), doc="RL step number"),
    "version": col("int", ge(0, "weight versions count from 0"), doc="weight version the rollout ran on"),
    "new_version": col("int", ge(1, "a version after an update"), doc="learner version after the update"),
    "sequences": col("int", ge(1, "a rollout samples at least one sequence"), doc="sampled sequences"),
    "tokens": col("int", ge(1, "sampled completion tokens, EOS included"), doc="sampled tokens"),
    "cached_tokens": col("int", ge(0, "a count"), doc="prompt tokens served from the prefix cache"),
    "mean_reward": col("float", between(0, 1, "the task's reward is 0, 0.5·fraction or 1"), doc="mean reward"),
    "loss": col("float", FINITE, doc="GRPO loss"),
    "grad_norm": col("float", ge(0, "a norm"), FINITE, doc="gradient norm before clipping"),
    "clip_fraction": col("float", between(0, 1, "a fraction of tokens"), doc="fraction of clipped ratios"),
    "mean_abs_logprob_diff": col("float", ge(0, "an absolute value"), FINITE, doc="mean |Δlogp| sampler vs learner"),
    "max_abs_logprob_diff": col("float", ge(0, "an absolute value"), FINITE, doc="max |Δlogp| sampler vs learner"),
    "k3": col("float", ge(0, "k3 = (r − 1) − log r ≥ 0 per token"), FINITE,
              doc="k3 estimate of KL(sampler ‖ learner), token mean over the step's sampled tokens"),
    "token_mult_prob_error": col("float", ge(1, "a mean of exp(|log r|) ≥ 1"), FINITE, required=False,
                                 doc="NeMo-RL's token_mult_prob_error: token mean of exp(|Δlogp|) over the step's "
                                     "sampled tokens (fp8rl_core.metrics.mismatch.token_mult_prob_error; added by "
                                     "the experiment flow's train stage)"),
    "gen_kl_error": col("float", ge(0, "k3 = (r − 1) − log r ≥ 0 per token"), FINITE, required=False,
                        doc="NeMo-RL's gen_kl_error with its default kl_type k3, token mean over the step's sampled "
                            "tokens (fp8rl_core.metrics.mismatch.gen_kl_error; added by the experiment flow's train "
                            "stage)"),
    **{t: col("float", *SECONDS, doc="seconds") for t in STEP_TIMES},
    "total_s": col("float", *SECONDS, doc="seconds of the whole step"),
    "microbatches": col("int", ge(1, "a step runs at least one micro-batch"), doc="learner micro-batches"),
    "sync_bytes": col("int", ge(1, "a sync writes the weights"), doc="bytes written by the sync"),
    "sync_buckets": col("int", ge(1, "a sync writes at least one bucket"), doc="buckets written by the sync"),
    "train_stage_s": col("float", *SECONDS, required=False, doc="seconds of the flow's train stage"),
    "checks_s": col("float", *SECONDS, required=False, doc="seconds of the checks after the sync"),
    "checks_full": col("float", isin([0.0, 1.0], "1.0: the full tier ran"), required=False, doc="full tier ran"),
    "check/alarm_events": col("float", ge(0, "a count"), required=False,
                              doc="the alarm's suspicions at this sync that the full tier dismissed: mismatch events "
                                  "of the policy (fp8rl_core.checks.alarm; absent where the alarm did not run)"),
    "rollout_tail_mass": col("float", between(0, 1, "a probability"), required=False,
                             doc="the learner's mean probability on the ids the sampler cannot emit, over the step's "
                                 "sampled positions (excluded from mean_abs_logprob_diff, k3 and the tokens' "
                                 "learner_logprob; 0: no tail)"),
    "tail_mass": col("float", between(0, 1, "a probability"), required=False,
                     doc="the learner's mean probability on the ids the sampler cannot emit, over the W7 probe batch "
                         "after the sync (fp8rl_core.learner.vocab_tail; 0: no tail)"),
    CHECK_COLUMNS: pattern("float", isin([0.0, 1.0], "1.0 passed, 0.0 failed, null: not run"),
                           doc="check verdict of condition W*"),
    REQUANT_COLUMNS: pattern("float", between(0, 1, "a fraction of bytes"),
                             doc="preset requant: fraction of the sampler's own MXFP8 bytes that differ from the "
                                 "learner's (W2, measured)"),
}, (
    unique("step", optional=("run_id",), what="one row per step: a retried record must not double a step"),
    rule("new_version = version + 1", "'new_version' must equal 'version' + 1 (one learner update per rollout, "
         "and the rollout ran on the learner's weights: W5)", ("version", "new_version"),
         lambda d: num(d, "new_version") != num(d, "version") + 1),
    rule("rollout on the previous step's weights", "'version' must equal the previous step's 'new_version' (each "
         "rollout runs on the weights the previous step synced: W5)", ("step", "version", "new_version"),
         _stale_rollout),
    at_least("tokens", "sequences", "every completion has at least one sampled token"),
    at_least("max_abs_logprob_diff", "mean_abs_logprob_diff", "a maximum is never below its mean", 1e-12),
    rule("token_mult_prob_error ≥ exp(mean |Δlogp|)", "'token_mult_prob_error' must be ≥ exp('mean_abs_logprob_diff') "
         "(a mean of exp(|Δlogp|) is at least exp of the mean |Δlogp|: Jensen)",
         ("token_mult_prob_error", "mean_abs_logprob_diff"),
         lambda d: num(d, "token_mult_prob_error") < np.exp(num(d, "mean_abs_logprob_diff")) * (1 - _F32_REL)),
    rule("token_mult_prob_error ≤ exp(max |Δlogp|)", "'token_mult_prob_error' must be ≤ exp('max_abs_logprob_diff') "
         "(a mean is never above its largest term)", ("token_mult_prob_error", "max_abs_logprob_diff"),
         lambda d: num(d, "token_mult_prob_error") > np.exp(num(d, "max_abs_logprob_diff")) * (1 + _F32_REL)),
    rule("gen_kl_error = k3", "'gen_kl_error' must equal 'k3' (NeMo-RL's default kl_type k3 on the same tokens is "
         "fp8rl's k3)", ("gen_kl_error", "k3"),
         lambda d: (num(d, "gen_kl_error") - num(d, "k3")).abs() > 1e-12 + _F32_REL * num(d, "k3").abs()),
    rule("total_s covers its parts", f"'total_s' must be ≥ the sum of {', '.join(STEP_TIMES)} (disjoint parts "
         "of the step)", ("total_s", *STEP_TIMES),
         lambda d: num(d, "total_s") < sum(num(d, c) for c in STEP_TIMES) - TIME_TOL),
    rule("train_stage_s covers generate and learner", "'train_stage_s' must be ≥ 'generate_s' + 'learner_s' (both "
         "run inside the train stage)", ("train_stage_s", "generate_s", "learner_s"),
         lambda d: num(d, "train_stage_s") < num(d, "generate_s") + num(d, "learner_s") - TIME_TOL),
    at_least("total_s", "checks_s", "the checks run inside the step", TIME_TOL),
), "one row per RL step (loop.rollout_and_learn + sync_weights + the flow)")


def _gapped_positions(df: pd.DataFrame) -> pd.Series:
    """n distinct non-negative positions (their own rules) run 0 … n−1 iff none is ≥ n: flag those."""
    runs = ["run_id"] if "run_id" in df.columns else []
    return num(df, "position") >= df.groupby([*runs, "step", "sequence"])["position"].transform("size")


TOKENS = Table("tokens", {
    "run_id": col("str", NONEMPTY, required=False, doc="the run's id (added when read back from several runs)"),
    "step": col("int", ge(1, "steps count from 1"), doc="RL step"),
    "version": col("int", ge(0, "weight versions count from 0"), doc="weight version the token was sampled with"),
    "sequence": col("int", ge(0, "a row index"), doc="row of the rollout batch"),
    "position": col("int", ge(0, "a completion position"), doc="position in the completion"),
    "token": col("int", ge(0, "a token id"), doc="sampled token id"),
    "sampler_logprob": col("float", *LOGPROB, doc="the sampler's log-prob of the token"),
    "learner_logprob": col("float", *LOGPROB, doc="the learner's log-prob of the same token, same version, over the "
                           "ids the sampler can emit (the vocabulary tail excluded, as the sampler excludes it)"),
}, (
    unique("step", "sequence", "position", optional=("run_id",), what="one row per sampled token"),
    rule("positions without gaps", "positions of a (step, sequence) must run 0, 1, …, n−1 (no sampled token "
         "dropped or repeated)", ("step", "sequence", "position"), _gapped_positions),
    constant_per(["step"], "version", "a rollout's tokens come from one weight version: W5", optional=("run_id",)),
), "one row per sampled token (loop.rollout_and_learn)")


def _over_budget(df: pd.DataFrame) -> pd.Series:
    return (num(df, "tokens") > num(df, "tokens_per_microbatch")) & (num(df, "rows") > 1)


def _index_beyond(df: pd.DataFrame) -> pd.Series:
    n = df.groupby(["run_id", "step"])["microbatch"].transform("size")
    return num(df, "microbatch") >= n


MICROBATCHES = Table("microbatches", {
    "run_id": col("str", NONEMPTY, doc="the run's id"),
    "precision": col("str", isin(PRECISIONS, "the learner's precision"), doc="learner precision"),
    "step": col("int", ge(1, "steps count from 1"), doc="RL step"),
    "microbatch": col("int", ge(0, "an index"), doc="index of the micro-batch in its step"),
    "tokens_per_microbatch": col("int", ge(1, "a token budget"), doc="the packing budget"),
    "rows": col("int", ge(1, "a micro-batch holds at least one sequence"), doc="sequences in the micro-batch"),
    "tokens": col("int", ge(1, "padded tokens processed"), doc="rows × longest sequence"),
    "real_tokens": col("int", ge(1, "tokens that are not padding"), doc="prompt + completion tokens, no padding"),
    "seconds": col("float", *SECONDS, doc="wall seconds of forward + backward"),
    "quantize_s": col("float", *SECONDS, doc="seconds quantizing (MXFP8)"),
    "gemm_s": col("float", *SECONDS, doc="seconds in GEMMs (MXFP8)"),
    "other_s": col("float", *SECONDS, required=False, doc="the remainder"),
}, (
    unique("step", "microbatch", optional=("run_id",), what="one row per micro-batch"),
    rule("microbatch index < count", "'microbatch' must be < the number of micro-batches of its (run_id, step) "
         "(indices run 0 … n−1)", ("run_id", "step", "microbatch"), _index_beyond),
    at_least("tokens", "real_tokens", "padding only adds tokens"),
    rule("tokens = rows × longest", "'tokens' must be a multiple of 'rows' (padded size = rows × longest sequence)",
         ("tokens", "rows"), lambda d: (num(d, "tokens") % num(d, "rows")) != 0),
    rule("within budget", "'tokens' must be ≤ 'tokens_per_microbatch' unless the micro-batch is one over-long "
         "sequence (the packing rule)", ("tokens", "tokens_per_microbatch", "rows"), _over_budget),
    rule("quantize + gemm ≤ seconds", "'quantize_s' + 'gemm_s' must be ≤ 'seconds' (disjoint parts of the "
         "micro-batch's wall time)", ("quantize_s", "gemm_s", "seconds"),
         lambda d: num(d, "quantize_s") + num(d, "gemm_s") > num(d, "seconds") + TIME_TOL),
    rule("bf16 quantizes nothing", "'quantize_s' must be 0 when 'precision' is 'bf16' (a BF16 learner quantizes "
         "nothing)", ("precision", "quantize_s"), lambda d: (d["precision"] == "bf16") & (num(d, "quantize_s") != 0)),
    constant_per(["run_id"], "precision", "one learner precision per run"),
    constant_per(["run_id"], "tokens_per_microbatch", "one packing budget per run"),
), "one row per learner micro-batch (grpo.MicroBatchTiming)")
