"""Names used across layers, declared once: the weight-sync conditions, the check tiers, the stages of an RL
step, the train–rollout mismatch metrics and the tolerances the tables share.

This module imports nothing from fp8rl (rank 0 in the layer order): the checks, the metrics, the table
schemas, the report and the tasks all take their names from here, so that a renamed condition or metric
changes in one place and every user follows.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "CONDITIONS", "CONDITION_MEANINGS", "ENGINE_CHECKSUM", "FAULT_STAGES", "FULL_TIER_ONLY", "KL_METRICS", "KL_OPTIONAL_METRICS",
    "KL_RUN_METRICS", "LOGPROB_TOL", "MODEL_KINDS", "PRECISIONS", "REQUANT_QUANTITIES", "STEP_STAGES", "STEP_TIMES",
    "TIERS", "TIME_TOL", "TIMING_COLUMNS", "VERL_K3_ABS_TOL", "VERL_K3_REL_TOL", "ModelKind", "Precision", "Tier",
    "check_column", "requant_column", "seconds_column",
]

# -- the weight-sync conditions (docs/design.md, "The seven conditions every weight sync must preserve") --------
#: each condition's name and what it asks of a sync, in one line
CONDITION_MEANINGS: dict[str, str] = {
    "W1": "Coverage: every tensor the sampler computes with was written by this sync; none missing or extra",
    "W2": "Grid identity: on-grid layers hold the learner's FP8 forward operands (data and scale bytes)",
    "W3": "Layout: each tensor lands in the order, orientation and shape the sampler's kernel reads",
    "W4": "Precision: off-grid tensors arrive as the learner's BF16 view; the on-grid layer set is the configured one",
    "W5": "Atomic version: every tensor on every rank and replica carries one version; rollouts are tagged with it",
    "W6": "Derived state: caches and processed copies of old weights are rebuilt or dropped; post-load runs once",
    "W7": "Behaviour: on a fixed probe batch the sampler's log-probs match the learner's within the declared bound",
}
CONDITIONS: tuple[str, ...] = tuple(CONDITION_MEANINGS)

#: the second opinion on W2/W4's held bytes: vLLM's own weight checksums against the learner's bytes (its result's
#: name, and its verdict column ``check/vllm_checksum`` of the clean-sync table and column of the detection
#: matrix; fp8rl_core.checks.checksum). Not a condition: it judges the same bytes as W2 and W4 with vLLM's code.
ENGINE_CHECKSUM = "vllm_checksum"

#: the check tiers: ``cheap`` after every sync, ``full`` on a schedule and on suspicion (fp8rl_core.checks.runner)
Tier = Literal["cheap", "full"]
TIERS: tuple[str, ...] = get_args(Tier)
#: the conditions only the full tier checks (W7's cheap tier is the behavioural alarm, fp8rl_core.checks.alarm,
#: where the step's mismatch numbers are given; its probe runs in the full tier)
FULL_TIER_ONLY: tuple[str, ...] = ("W3",)


def check_column(condition: str) -> str:
    """The per-condition verdict column of the steps and clean-sync tables (``check/W1`` …)."""
    return f"check/{condition}"


#: what W2 measures on a sampler that requantizes the BF16 view itself (preset ``requant``): the fraction of
#: its E4M3 data bytes and E8M0 scale bytes that differ from the learner's own forward operand
REQUANT_QUANTITIES: tuple[str, ...] = ("data_bytes_differ", "scale_bytes_differ")


def requant_column(quantity: str, kind: str = "") -> str:
    """The metric (and steps-table column) of a requant quantity, overall or for one layer kind
    (``requant/data_bytes_differ``, ``requant/scale_bytes_differ/attention`` …)."""
    return f"requant/{quantity}" + (f"/{kind}" if kind else "")


# -- runs -----------------------------------------------------------------------------------------------
#: the learner's precisions
Precision = Literal["bf16", "mxfp8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: the model kinds (the correctness stage runs one series per kind)
ModelKind = Literal["dense", "moe"]
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)

# -- the stages of one RL step and their timing columns -------------------------------------------------
#: disjoint parts of a step, in order: rollout, learner update, then the sync (export → transport → load →
#: cache reset)
STEP_STAGES: tuple[str, ...] = ("generate", "learner", "export", "transport", "load", "reset")


def seconds_column(stage: str) -> str:
    """A stage's seconds column of the steps table (``generate`` → ``generate_s``)."""
    return f"{stage}_s"


#: the steps table's seconds per stage (``total_s`` covers their sum)
STEP_TIMES: tuple[str, ...] = tuple(seconds_column(s) for s in STEP_STAGES)
#: every timing column of the steps table: the stages, the checks after the sync, the whole step
TIMING_COLUMNS: tuple[str, ...] = (*STEP_TIMES, seconds_column("checks"), "total_s")
#: where in the sync path a fault of the catalogue acts (fp8rl_core.checks.faults)
FAULT_STAGES: tuple[str, ...] = ("config", "export", "transport", "load", "post-load", "engine")

# -- train–rollout mismatch metrics (fp8rl_core.metrics.mismatch.token_mismatch) -------------------------
#: every ``kl_summary`` row's metrics: Schulman's k1/k2/k3 of KL(sampler‖learner) and the reverse, |Δlogp| and
#: |Δp| means and maxima, the multiplicative token error, χ² per token and sequence, log-perplexity difference
KL_METRICS: tuple[str, ...] = (
    "k1", "k2", "k3", "k1_rev", "k2_rev", "k3_rev", "mean_abs_logprob_diff", "max_abs_logprob_diff",
    "mean_abs_prob_diff", "max_abs_prob_diff", "token_mult_prob_error", "chi2_token", "chi2_seq", "log_ppl_diff",
)
#: metrics some ``kl_summary`` rows add
KL_OPTIONAL_METRICS: tuple[str, ...] = ("log_ppl_abs_diff",)
#: the whole-run ``kl_summary`` columns a run logs as metrics ``kl/<name>`` (with ``kl/<name>_lo``/``_hi`` where an
#: interval exists)
KL_RUN_METRICS: tuple[str, ...] = (*KL_METRICS, "tokens", "sequences")

# -- tolerances ---------------------------------------------------------------------------------------
#: a log-prob above 0 by at most this is float32 log_softmax rounding, not an error; larger ones are refused
LOGPROB_TOL = 1e-4
#: seconds: a sum of timings may exceed a measured total by float rounding
TIME_TOL = 1e-6
#: a verl run's per-step k3 from its tokens table (float64) against verl's ``rollout_corr/k3_kl`` of the same tokens
#: (float32: exp(lr) − lr − 1 cancels to a few ulp(1) per token): they agree within ABS + REL × the run's largest
#: per-step k3 (docs/metrics.md, verl runs; measured by tests/verl/test_capture.py); ABS is two float32 epsilons
VERL_K3_ABS_TOL = 2 * 2.0**-23
VERL_K3_REL_TOL = 1e-3
