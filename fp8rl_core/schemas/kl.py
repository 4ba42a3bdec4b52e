"""The train–rollout mismatch tables, each rule of a table naming what it protects (docs/metrics.md).

``kl_summary``: one row per (run, step), or per run (step null), of the mismatch metrics
(:func:`fp8rl_core.metrics.summary.run_kl_summary`; the keys of
:func:`fp8rl_core.metrics.mismatch.token_mismatch`, names from
:data:`fp8rl_core.vocabulary.KL_METRICS`, optional ``<metric>_lo``/``_hi`` bounds). ``probe``: one row
per held-out probe sequence, the sums over its positions of the exact KL both ways and JS
(:func:`fp8rl_core.metrics.probe.probe_divergence`).
"""

from __future__ import annotations

import math

import pandas as pd

from fp8rl_core.vocabulary import KL_METRICS, KL_OPTIONAL_METRICS

from .dsl import FINITE, NONEMPTY, Col, Table, at_least, between, col, constant_per, ge, num, pattern, rule, unique

__all__ = ["KL_SUMMARY", "PROBE"]


#: the columns that say which run a per-run table row belongs to (KL summary, probe)
_RUN_IDENTITY: dict[str, Col] = {
    "run_id": col("str", NONEMPTY, doc="the run's id"),
    "preset": col("str", NONEMPTY, doc="the run's preset"),
    "model": col("str", NONEMPTY, doc="the run's model"),
    "seed": col("int", ge(0, "a seed"), doc="the run's seed (it draws the prompts and the probe batch)"),
}

#: every metric of a kl_summary row, required or optional: each may carry confidence bounds
_METRICS = (*KL_METRICS, *KL_OPTIONAL_METRICS)
_NONNEG_EST = ge(0, "a non-negative KL estimator")


def _ci_bad(df: pd.DataFrame) -> pd.Series:
    bad = pd.Series(False, index=df.index)
    for m in _METRICS:
        lo, hi = f"{m}_lo", f"{m}_hi"
        if lo in df.columns and hi in df.columns:
            bad |= num(df, lo) > num(df, hi)
    return bad


def _ci_unpaired(df: pd.DataFrame) -> pd.Series:
    cols = set(df.columns)
    odd = [m for m in _METRICS if (f"{m}_lo" in cols) != (f"{m}_hi" in cols)]
    return pd.Series(bool(odd), index=df.index)


KL_SUMMARY = Table("kl_summary", {
    **_RUN_IDENTITY,
    "step": col("Int64", ge(1, "steps count from 1"), nullable=True, doc="RL step; null: the whole run"),
    "tokens": col("int", ge(1, "a summary covers at least one token"), doc="tokens summarised"),
    "sequences": col("int", ge(1, "a summary covers at least one sequence"), doc="sequences summarised"),
    "k1": col("float", FINITE, doc="mean k1 of KL(sampler‖learner); any sign"),
    "k2": col("float", _NONNEG_EST, FINITE, doc="mean k2 of KL(sampler‖learner)"),
    "k3": col("float", _NONNEG_EST, FINITE, doc="mean k3 of KL(sampler‖learner)"),
    "k1_rev": col("float", FINITE, doc="mean k1 of the reverse KL; any sign"),
    "k2_rev": col("float", _NONNEG_EST, FINITE, doc="mean k2 of the reverse KL"),
    "k3_rev": col("float", _NONNEG_EST, FINITE, doc="mean k3 of the reverse KL"),
    "mean_abs_logprob_diff": col("float", ge(0, "an absolute value"), FINITE, doc="mean |Δlogp|"),
    "max_abs_logprob_diff": col("float", ge(0, "an absolute value"), FINITE, doc="max |Δlogp|"),
    "mean_abs_prob_diff": col("float", between(0, 1, "an absolute difference of probabilities"), doc="mean |Δp|"),
    "max_abs_prob_diff": col("float", between(0, 1, "an absolute difference of probabilities"), doc="max |Δp|"),
    "token_mult_prob_error": col("float", ge(1, "a multiplicative error, the mean of exp(|log ratio|)"), FINITE,
                                 doc="multiplicative token probability error"),
    "chi2_token": col("float", ge(0, "a χ² divergence"), FINITE, doc="χ² per token"),
    "chi2_seq": col("float", ge(0, "a χ² divergence"), FINITE, doc="χ² per sequence"),
    "log_ppl_diff": col("float", FINITE, doc="log-perplexity difference; any sign"),
    "log_ppl_abs_diff": col("float", ge(0, "an absolute value"), FINITE, required=False,
                            doc="sequence mean of |log-perplexity difference|"),
    "chi2_seq_clamped": col("int", ge(0, "a count of sequences"), required=False,
                            doc="sequences whose |Σ log r| hit the clamp of chi2_seq"),
    rf"^(?:{'|'.join(_METRICS)})_(?:lo|hi)$": pattern("float", FINITE, doc="confidence bound of a metric"),
}, (
    unique("step", optional=("run_id",), what="one row per step and one whole-run row (null step) per run"),
    at_least("tokens", "sequences", "every sequence has at least one sampled token"),
    at_least("sequences", "chi2_seq_clamped", "clamped sequences are some of the sequences"),
    at_least("log_ppl_abs_diff", "log_ppl_diff", "a mean of absolute values bounds the mean", 1e-12),
    at_least("max_abs_logprob_diff", "mean_abs_logprob_diff", "a maximum is never below its mean", 1e-12),
    at_least("max_abs_prob_diff", "mean_abs_prob_diff", "a maximum is never below its mean", 1e-12),
    constant_per(["run_id"], "preset", "a run has one preset"),
    constant_per(["run_id"], "model", "a run has one model"),
    constant_per(["run_id"], "seed", "a run has one seed"),
    rule("ci lo ≤ hi", "every '<metric>_lo' must be ≤ its '<metric>_hi' (a confidence interval)", (), _ci_bad,
         tuple(f"{m}_{s}" for m in _METRICS for s in ("lo", "hi"))),
    rule("ci bounds in pairs", "confidence bounds come in pairs: a '<metric>_lo' column needs its '<metric>_hi' "
         "and the reverse", (), _ci_unpaired, tuple(f"{m}_{s}" for m in _METRICS for s in ("lo", "hi"))),
), "train–rollout mismatch per (run, step) or per run")

PROBE = Table("probe", {
    **_RUN_IDENTITY,
    "sequence": col("int", ge(0, "a row index"), doc="row of the probe batch"),
    "positions": col("int", ge(1, "a probe sequence scores at least one next token"), doc="scored positions"),
    "kl": col("float", ge(0, "an exact KL divergence (a sum of them)"), doc="Σ over positions of KL(sampler‖learner)"),
    "kl_rev": col("float", ge(0, "an exact KL divergence (a sum of them)"), doc="Σ of KL(learner‖sampler)"),
    "js": col("float", ge(0, "a Jensen–Shannon divergence (a sum of them)"), FINITE, doc="Σ of JS"),
}, (
    unique("sequence", optional=("run_id",), what="one row per probe sequence"),
    rule("js ≤ ln 2 per position", "'js' must be ≤ ln 2 × 'positions' (JS is bounded by ln 2 nats per position)",
         ("js", "positions"), lambda d: num(d, "js") > math.log(2) * num(d, "positions") + 1e-9),
    constant_per(["run_id"], "preset", "a run has one preset"),
    constant_per(["run_id"], "seed", "a run has one seed"),
), "exact full-vocabulary divergences per probe sequence (metrics.probe.probe_divergence)")
