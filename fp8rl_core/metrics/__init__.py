"""Mismatch and timing metrics (pure functions over the loop's tables): train–rollout KL estimators and
the other mismatch measures (:mod:`.mismatch`), bootstrap confidence intervals and paired comparisons
(:mod:`.stats`), the per-micro-batch cost model and break-even (:mod:`.timing`), trace analysis
(:mod:`.trace`)."""

from .mismatch import (
    GEN_KL_TYPES,
    NEMO_STEP_METRICS,
    SEQ_LOG_RATIO_CLAMP,
    SEQUENCE_METRICS,
    TOKEN_METRICS,
    from_padded,
    full_vocab_divergence,
    gen_kl_error,
    kl_estimators,
    metric_units,
    nemo_step_numbers,
    sequence_table,
    summarize_steps,
    token_mismatch,
    token_mult_prob_error,
)
from .stats import CiSide, Comparison, Interval, ci_side, cluster_bootstrap, compare_factors, compare_ratio, describe_change, paired_units, sum_by_key
from .timing import CostModel, CostStatus, LinearFit, cost_model, fit_linear
from .trace import AddedTime, GpuIdle, IdleGap, added_time_idle_fraction, gpu_idle, load_trace, phase_times, wall_window

__all__ = [
    "GEN_KL_TYPES", "NEMO_STEP_METRICS", "SEQUENCE_METRICS", "SEQ_LOG_RATIO_CLAMP", "TOKEN_METRICS", "AddedTime", "CiSide", "Comparison", "CostModel", "CostStatus",
    "GpuIdle", "IdleGap", "Interval", "LinearFit", "added_time_idle_fraction", "ci_side",
    "cluster_bootstrap", "compare_factors", "compare_ratio", "cost_model", "describe_change", "fit_linear", "from_padded",
    "full_vocab_divergence", "gen_kl_error", "gpu_idle", "kl_estimators", "load_trace", "metric_units", "nemo_step_numbers", "paired_units", "phase_times",
    "sequence_table", "sum_by_key", "summarize_steps", "token_mismatch", "token_mult_prob_error", "wall_window",
]
