"""Pandera schemas for every metrics table fp8rl writes, and :func:`validate`, which checks one.

A run's numbers travel as tables of rows (``list[dict]``, logged as parquet/CSV): a wrong column there
reaches a plot or a verdict silently. Each schema below states what a table's rows must satisfy, and
each constraint names what it protects. :func:`validate` checks a table (a list of row dicts or a
DataFrame) against :data:`SCHEMAS` lazily — every problem at once — and raises :class:`TableError`
with one line per problem: the table, the column, the rule in words, the offending rows (index labels:
list positions for a list of dicts; the first few and a count) and their values, e.g.::

    table 'tokens': column 'sampler_logprob' must be ≤ 0 (a log-probability); rows 3, 7 (2 rows) hold 0.2, 1.5

Extra columns: every table is *strict* — a column the schema does not declare is refused (a renamed or
misspelt key would otherwise pass unchecked and the real column be reported missing only by a reader).
Columns that legitimately vary are declared as patterns: ``check/W1`` … ``check/W7`` (steps, clean
syncs) and the confidence bounds ``<metric>_lo`` / ``<metric>_hi`` (KL summary). Optional columns (only
some writers add them) are declared ``required=False``. Dtypes are strict, except lossless widenings
done before validation: integer → float in float columns, whole-number floats → int64 in count columns
(``metrics.mismatch`` returns counts as floats), integral numbers/None → nullable ``Int64``, booleans/None
→ nullable ``boolean`` (what a list of dicts or a parquet/CSV read-back yields); 1.5 in a count column,
text in a number column or 1 in a True/False column is refused, naming its rows.

The tables
----------
``steps`` — one row per RL step. Written by :func:`fp8rl_core.loop.rollout_and_learn` (step, version,
    new_version, sequences, tokens, cached_tokens, mean_reward, loss, grad_norm, clip_fraction,
    mean/max_abs_logprob_diff, generate_s, learner_s, microbatches) + :func:`fp8rl_core.loop.sync_weights`
    (export_s, transport_s, load_s, reset_s, sync_bytes, sync_buckets) + total_s (``run_rl`` or the
    ``experiment`` flow); the flow (``tasks.stages``) adds the optional train_stage_s, checks_s,
    checks_full and ``check/W*`` (1.0 passed, 0.0 failed, null: not run at that sync — W3/W7 run in the
    full tier only) and logs it as ``tables/steps.parquet``. Protects: one row per step (a retried
    ``record-step`` must not double a step); ``new_version = version + 1`` and each step's rollout on
    the version the previous step produced (W5: no rollout on stale or mixed weights); rewards in
    [0, 1] (the task's reward rule); ``tokens ≥ sequences`` (every completion has ≥ 1 sampled token);
    max |Δlogp| ≥ mean |Δlogp|; non-negative, finite timings, and ``total_s`` covering its disjoint
    parts (a mis-attributed or double-counted timing breaks the timing fits).
``tokens`` — one row per sampled token, from ``rollout_and_learn`` (``tables/tokens.parquet``): step,
    version, sequence, position, token, sampler_logprob, learner_logprob. Protects the KL estimators:
    both log-probs ≤ 0 (up to +1e-4 of float32 rounding, as metrics.mismatch allows) and finite (-inf/NaN
    would make every KL infinite or NaN);
    one row per (step, sequence, position); positions of a sequence run 0 … n−1 without gaps (no token
    dropped or repeated); one weight version per step (W5: the tokens of a rollout come from one version).
``microbatches`` — one row per learner micro-batch: the fields of
    :class:`fp8rl_core.learner.grpo.MicroBatchTiming` (rows, tokens, real_tokens, seconds, quantize_s,
    gemm_s; optional other_s) plus run_id, precision, step, microbatch (index in the step) and
    tokens_per_microbatch (the budget); :func:`microbatch_rows` builds them. Protects the break-even fit:
    padded tokens = rows × longest (a multiple of rows) and ≥ real tokens; a micro-batch stays within
    the budget unless it is one over-long sequence (the packing rule); quantize + GEMM time ≤ the
    micro-batch's wall time (they are disjoint parts of it); a BF16 micro-batch quantizes nothing;
    indices 0 … n−1 per step, one precision and one budget per run.
``kl_summary`` — one row per (run, step), or per run (step null), of train–rollout mismatch: Schulman's
    k1/k2/k3 of KL(sampler‖learner) and the reverse direction (``*_rev``), |Δlogp| and |Δp| means and
    maxima, token_mult_prob_error, χ² per token and per sequence, log-perplexity difference (the keys of
    ``metrics.mismatch.token_mismatch``, whose extra log_ppl_abs_diff and chi2_seq_clamped are optional
    columns), and optional confidence bounds ``<metric>_lo``/``<metric>_hi``. Protects: k2, k3 (and reverse) ≥ 0
    (they are non-negative estimators); |Δ| ≥ 0 and max ≥ mean; |Δp| ≤ 1 (a probability difference);
    token_mult_prob_error ≥ 1 (a multiplicative error: exp of a mean |log ratio|); finite values; one
    row per (run, step) and one whole-run row per run; preset, model and seed fixed per run; lo ≤ hi.
``probe`` — one row per sequence of the run's held-out probe batch: the *sums* over its positions of the
    exact full-vocabulary KL(sampler‖learner) (``kl``), KL(learner‖sampler) (``kl_rev``) and Jensen–Shannon
    (``js``), from :func:`fp8rl_core.loop.probe_divergence` at the final weights, with run_id, preset,
    model, seed (the batch is drawn from the seed, so (seed, sequence) pairs presets). Protects the
    exact-KL comparisons: divergences ≥ 0 (KL may be +inf when one side gives a token zero mass); JS ≤
    ln 2 per position; one row per probe sequence; one preset and seed per run.
``checks`` — one row per (sync, condition) of the weight-sync checks: the flattened
    :meth:`fp8rl_core.checks.CheckReport.as_dict` (version, sync, tier, why, report_seconds) × its
    :meth:`CheckResult.as_dict` (condition, passed, measured, bound, count, seconds, detail, offenders);
    :func:`check_rows` flattens reports (what ``tasks.stages`` keeps as ``checks.json``). Protects: one
    result per condition per sync, one version and tier per sync; tier ``cheap``/``full`` and condition
    W1…W7; a passed check has no offenders (count 0); W3 and W7 only in the full tier; counts, bounds,
    measurements and seconds ≥ 0 (measured may be NaN: a non-finite measurement, which the check fails).
``clean_syncs`` — one row per clean sync of the correctness stage:
    :func:`fp8rl_core.checks.matrix.clean_series` (sync, version, tier, false_alarm, alarms, checks_s,
    step_s, mean_reward, ``check/W*`` True/False/null), with ``model`` (dense|moe) added by the nightly
    flow; ``tasks.stages.record_matrix`` logs it as ``tables/clean_syncs.parquet``. Protects the
    false-alarm count: false_alarm is true exactly when a check failed, and then (only then) alarms
    says why; one row per (model, sync); W3/W7 only in the full tier.
``detection_matrix`` — one row per injected fault: :func:`fp8rl_core.checks.matrix.inject` (fault,
    condition, stage, model, what, tier, why, warmup_clean, caught_first, declared_offenders, W1…W7 as
    1 fired / 0 passed / null not run, optional repaired); ``record_matrix`` writes it as
    ``detection_matrix.csv``. Protects the verdicts: caught_first is true exactly when the declared
    condition's column is 1; a caught fault names its offenders; W3/W7 are null in the cheap tier;
    one row per fault; the condition, stage, model and tier from their fixed vocabularies.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors

__all__ = ["SCHEMAS", "Problem", "TableError", "check_rows", "microbatch_rows", "validate"]

CONDITIONS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7")
FULL_TIER_ONLY = ("W3", "W7")  # the checks the cheap tier never runs (fp8rl_core.checks.runner)
TIERS = ("cheap", "full")
PRECISIONS = ("bf16", "mxfp8")
STAGES = ("config", "export", "transport", "load", "post-load", "engine")  # fp8rl_core.checks.faults
MODELS = ("dense", "moe")  # the correctness stage's model kinds (fp8rl_core.config)
TIME_TOL = 1e-6  # seconds: sums of timings may differ from a measured total by float rounding
#: a log-prob above 0 by at most this is float32 log_softmax rounding, not an error (the same tolerance
#: as ``fp8rl_core.metrics.mismatch.LOGPROB_POSITIVE_TOL``, which refuses larger ones)
LOGPROB_TOL = 1e-4

# -- dtypes ------------------------------------------------------------------------------------------
# kind → (pandera dtype, words for a user)
_DTYPES = {
    "int": ("int64", "whole numbers (int64)"),
    "Int64": ("Int64", "whole numbers or null (Int64)"),
    "float": ("float64", "real numbers (float64)"),
    "bool": ("bool", "True/False (bool)"),
    "boolean": ("boolean", "True/False or null (boolean)"),
    "str": (str, "text (str)"),
}


@dataclass(frozen=True)
class _Col:
    kind: str
    checks: tuple = ()
    doc: str = ""
    required: bool = True
    nullable: bool = False
    regex: bool = False


def _col(kind: str, *checks, doc: str = "", required: bool = True, nullable: bool = False) -> _Col:
    return _Col(kind, checks, doc, required, nullable)


def _pattern(kind: str, *checks, doc: str = "", nullable: bool = True) -> _Col:
    return _Col(kind, checks, doc, required=False, nullable=nullable, regex=True)


# -- column checks (their ``error`` is the rule in words, used in messages) --------------------------
def _ge(v, why: str) -> pa.Check:
    return pa.Check.ge(v, error=f"must be ≥ {v} ({why})")


def _le(v, why: str) -> pa.Check:
    return pa.Check.le(v, error=f"must be ≤ {v} ({why})")


def _between(lo, hi, why: str) -> pa.Check:
    return pa.Check.in_range(lo, hi, error=f"must lie in [{lo}, {hi}] ({why})")


def _isin(values: Sequence, why: str = "") -> pa.Check:
    words = ", ".join(repr(v) for v in values)
    return pa.Check.isin(list(values), error=f"must be one of {words}" + (f" ({why})" if why else ""))


def _finite_fn(s: pd.Series) -> pd.Series:
    return pd.Series(np.isfinite(s.to_numpy(dtype="float64", na_value=np.nan)), index=s.index)


FINITE = pa.Check(_finite_fn, error="must be finite (not ±inf)")
NONEMPTY = pa.Check.str_length(min_value=1, error="must not be empty text")
SECONDS = (_ge(0, "a duration"), FINITE)
LOGPROB = (pa.Check.le(LOGPROB_TOL, error=f"must be ≤ 0 (a log-probability; float32 rounding up to +{LOGPROB_TOL:g} "
                       "is tolerated)"), FINITE)


# -- frame checks: a rule across columns; fn returns True on the *bad* rows --------------------------
def _num(df: pd.DataFrame, c: str) -> pd.Series:
    s = df[c]
    if isinstance(s.dtype, pd.BooleanDtype) or s.dtype == bool:
        s = s.astype("Float64")
    return pd.to_numeric(s, errors="coerce").astype("float64")


def _rule(name: str, error: str, columns: Sequence[str], bad: Callable[[pd.DataFrame], pd.Series],
          optional: Sequence[str] = ()) -> pa.Check:
    """A frame-level check over ``columns`` (all must be present, else it passes: a missing column is
    reported by its own entry) and ``optional`` ones (shown in messages when present)."""

    def check(df: pd.DataFrame) -> pd.Series:
        if any(c not in df.columns for c in columns) or df.empty:
            return pd.Series(True, index=df.index)
        b = pd.Series(bad(df), index=df.index)
        return ~b.fillna(False).astype(bool)

    c = pa.Check(check, name=name, error=error, ignore_na=False)
    c.fp8rl_columns = tuple(columns) + tuple(optional)
    c.fp8rl_required = tuple(columns)
    return c


def _unique(*columns: str, optional: Sequence[str] = (), what: str) -> pa.Check:
    def bad(df):
        key = [*(c for c in optional if c in df.columns), *columns]
        return df.duplicated(subset=key, keep=False)

    names = ", ".join(f"'{c}'" for c in (*optional, *columns))
    together = " together" if len(columns) + len(optional) > 1 else ""
    opt = f" ({', '.join(repr(c) for c in optional)} where present)" if optional else ""
    plural = "columns" if len(columns) + len(optional) > 1 else "column"
    return _rule(f"unique({names})", f"{plural} {names}{opt} must be unique{together} ({what})", columns, bad,
                 optional)


def _at_least(big: str, small: str, why: str, tol: float = 0.0) -> pa.Check:
    return _rule(f"{big}>={small}", f"'{big}' must be ≥ '{small}' ({why})", (big, small),
                 lambda d: _num(d, big) < _num(d, small) - tol)


def _constant_per(group: Sequence[str], column: str, why: str) -> pa.Check:
    def bad(df):  # the rows that differ from their group's most common value
        common = df.groupby(list(group), dropna=False)[column].transform(lambda s: s.mode(dropna=False).iloc[0])
        same = (df[column] == common).fillna(False).astype(bool) | (df[column].isna() & common.isna())
        return ~same

    return _rule(f"constant({column} per {', '.join(group)})",
                 f"'{column}' must be the same on every row of one {' × '.join(group)} ({why})",
                 (*group, column), bad)


def _cheap_skips(columns: Sequence[str], tier: str = "tier") -> pa.Check:
    """On cheap-tier rows the full-tier-only checks' columns are null (they did not run)."""

    def bad(df):
        present = [c for c in columns if c in df.columns]
        ran = df[present].notna().any(axis=1) if present else pd.Series(False, index=df.index)
        return (df[tier] == "cheap") & ran

    return _rule("cheap tier runs no W3/W7", f"{', '.join(repr(c) for c in columns)} must be null on cheap-tier rows "
                 "(W3 and W7 run in the full tier only; a value there contradicts the tier)", (tier,), bad, columns)


# ====================================================================================================
# The tables
# ====================================================================================================
_STEP_TIMES = ("generate_s", "learner_s", "export_s", "transport_s", "load_s", "reset_s")


def _stale_rollout(df: pd.DataFrame) -> pd.Series:
    """A step's rollout version ≠ the previous step's new_version (consecutive step numbers only)."""
    order = df.sort_values("step")
    step, v, nv = _num(order, "step"), _num(order, "version"), _num(order, "new_version")
    follows = step.diff() == 1
    bad = follows & (v != nv.shift(1))
    return bad.reindex(df.index)


_STEPS: dict[str, _Col] = {
    "step": _col("int", _ge(1, "steps count from 1"), doc="RL step number"),
    "version": _col("int", _ge(0, "weight versions count from 0"), doc="weight version the rollout ran on"),
    "new_version": _col("int", _ge(1, "a version after an update"), doc="learner version after the update"),
    "sequences": _col("int", _ge(1, "a rollout samples at least one sequence"), doc="sampled sequences"),
    "tokens": _col("int", _ge(1, "sampled completion tokens, EOS included"), doc="sampled tokens"),
    "cached_tokens": _col("int", _ge(0, "a count"), doc="prompt tokens served from the prefix cache"),
    "mean_reward": _col("float", _between(0, 1, "the task's reward is 0, 0.5·fraction or 1"), doc="mean reward"),
    "loss": _col("float", FINITE, doc="GRPO loss"),
    "grad_norm": _col("float", _ge(0, "a norm"), FINITE, doc="gradient norm before clipping"),
    "clip_fraction": _col("float", _between(0, 1, "a fraction of tokens"), doc="fraction of clipped ratios"),
    "mean_abs_logprob_diff": _col("float", _ge(0, "an absolute value"), FINITE, doc="mean |Δlogp| sampler vs learner"),
    "max_abs_logprob_diff": _col("float", _ge(0, "an absolute value"), FINITE, doc="max |Δlogp| sampler vs learner"),
    **{t: _col("float", *SECONDS, doc="seconds") for t in _STEP_TIMES},
    "total_s": _col("float", *SECONDS, doc="seconds of the whole step"),
    "microbatches": _col("int", _ge(1, "a step runs at least one micro-batch"), doc="learner micro-batches"),
    "sync_bytes": _col("int", _ge(1, "a sync writes the weights"), doc="bytes written by the sync"),
    "sync_buckets": _col("int", _ge(1, "a sync writes at least one bucket"), doc="buckets written by the sync"),
    "train_stage_s": _col("float", *SECONDS, required=False, doc="seconds of the flow's train stage"),
    "checks_s": _col("float", *SECONDS, required=False, doc="seconds of the checks after the sync"),
    "checks_full": _col("float", _isin([0.0, 1.0], "1.0: the full tier ran"), required=False, doc="full tier ran"),
    r"^check/W[1-7]$": _pattern("float", _isin([0.0, 1.0], "1.0 passed, 0.0 failed, null: not run"),
                                doc="check verdict of condition W*"),
}
_STEPS_RULES = [
    _unique("step", what="one row per step: a retried record must not double a step"),
    _rule("new_version = version + 1", "'new_version' must equal 'version' + 1 (one learner update per rollout, "
          "and the rollout ran on the learner's weights: W5)", ("version", "new_version"),
          lambda d: _num(d, "new_version") != _num(d, "version") + 1),
    _rule("rollout on the previous step's weights", "'version' must equal the previous step's 'new_version' (each "
          "rollout runs on the weights the previous step synced: W5)", ("step", "version", "new_version"),
          _stale_rollout),
    _at_least("tokens", "sequences", "every completion has at least one sampled token"),
    _at_least("max_abs_logprob_diff", "mean_abs_logprob_diff", "a maximum is never below its mean", 1e-12),
    _rule("total_s covers its parts", f"'total_s' must be ≥ the sum of {', '.join(_STEP_TIMES)} (disjoint parts "
          "of the step)", ("total_s", *_STEP_TIMES),
          lambda d: _num(d, "total_s") < sum(_num(d, c) for c in _STEP_TIMES) - TIME_TOL),
    _rule("train_stage_s covers generate and learner", "'train_stage_s' must be ≥ 'generate_s' + 'learner_s' (both "
          "run inside the train stage)", ("train_stage_s", "generate_s", "learner_s"),
          lambda d: _num(d, "train_stage_s") < _num(d, "generate_s") + _num(d, "learner_s") - TIME_TOL),
    _at_least("total_s", "checks_s", "the checks run inside the step", TIME_TOL),
]


def _gapped_positions(df: pd.DataFrame) -> pd.Series:
    """n distinct non-negative positions (their own rules) run 0 … n−1 iff none is ≥ n: flag those."""
    return _num(df, "position") >= df.groupby(["step", "sequence"])["position"].transform("size")


_TOKENS: dict[str, _Col] = {
    "step": _col("int", _ge(1, "steps count from 1"), doc="RL step"),
    "version": _col("int", _ge(0, "weight versions count from 0"), doc="weight version the token was sampled with"),
    "sequence": _col("int", _ge(0, "a row index"), doc="row of the rollout batch"),
    "position": _col("int", _ge(0, "a completion position"), doc="position in the completion"),
    "token": _col("int", _ge(0, "a token id"), doc="sampled token id"),
    "sampler_logprob": _col("float", *LOGPROB, doc="the sampler's log-prob of the token"),
    "learner_logprob": _col("float", *LOGPROB, doc="the learner's log-prob of the same token, same version"),
}
_TOKENS_RULES = [
    _unique("step", "sequence", "position", what="one row per sampled token"),
    _rule("positions without gaps", "positions of a (step, sequence) must run 0, 1, …, n−1 (no sampled token "
          "dropped or repeated)", ("step", "sequence", "position"), _gapped_positions),
    _constant_per(["step"], "version", "a rollout's tokens come from one weight version: W5"),
]


def _over_budget(df: pd.DataFrame) -> pd.Series:
    return (_num(df, "tokens") > _num(df, "tokens_per_microbatch")) & (_num(df, "rows") > 1)


def _index_beyond(df: pd.DataFrame) -> pd.Series:
    n = df.groupby(["run_id", "step"])["microbatch"].transform("size")
    return _num(df, "microbatch") >= n


_MICROBATCHES: dict[str, _Col] = {
    "run_id": _col("str", NONEMPTY, doc="the run's id"),
    "precision": _col("str", _isin(PRECISIONS, "the learner's precision"), doc="learner precision"),
    "step": _col("int", _ge(1, "steps count from 1"), doc="RL step"),
    "microbatch": _col("int", _ge(0, "an index"), doc="index of the micro-batch in its step"),
    "tokens_per_microbatch": _col("int", _ge(1, "a token budget"), doc="the packing budget"),
    "rows": _col("int", _ge(1, "a micro-batch holds at least one sequence"), doc="sequences in the micro-batch"),
    "tokens": _col("int", _ge(1, "padded tokens processed"), doc="rows × longest sequence"),
    "real_tokens": _col("int", _ge(1, "tokens that are not padding"), doc="prompt + completion tokens, no padding"),
    "seconds": _col("float", *SECONDS, doc="wall seconds of forward + backward"),
    "quantize_s": _col("float", *SECONDS, doc="seconds quantizing (MXFP8)"),
    "gemm_s": _col("float", *SECONDS, doc="seconds in GEMMs (MXFP8)"),
    "other_s": _col("float", *SECONDS, required=False, doc="the remainder"),
}
_MICROBATCHES_RULES = [
    _unique("step", "microbatch", optional=("run_id",), what="one row per micro-batch"),
    _rule("microbatch index < count", "'microbatch' must be < the number of micro-batches of its (run_id, step) "
          "(indices run 0 … n−1)", ("run_id", "step", "microbatch"), _index_beyond),
    _at_least("tokens", "real_tokens", "padding only adds tokens"),
    _rule("tokens = rows × longest", "'tokens' must be a multiple of 'rows' (padded size = rows × longest sequence)",
          ("tokens", "rows"), lambda d: (_num(d, "tokens") % _num(d, "rows")) != 0),
    _rule("within budget", "'tokens' must be ≤ 'tokens_per_microbatch' unless the micro-batch is one over-long "
          "sequence (the packing rule)", ("tokens", "tokens_per_microbatch", "rows"), _over_budget),
    _rule("quantize + gemm ≤ seconds", "'quantize_s' + 'gemm_s' must be ≤ 'seconds' (disjoint parts of the "
          "micro-batch's wall time)", ("quantize_s", "gemm_s", "seconds"),
          lambda d: _num(d, "quantize_s") + _num(d, "gemm_s") > _num(d, "seconds") + TIME_TOL),
    _rule("bf16 quantizes nothing", "'quantize_s' must be 0 when 'precision' is 'bf16' (a BF16 learner quantizes "
          "nothing)", ("precision", "quantize_s"), lambda d: (d["precision"] == "bf16") & (_num(d, "quantize_s") != 0)),
    _constant_per(["run_id"], "precision", "one learner precision per run"),
    _constant_per(["run_id"], "tokens_per_microbatch", "one packing budget per run"),
]

#: the columns that say which run a per-run table row belongs to (KL summary, probe)
_RUN_IDENTITY: dict[str, _Col] = {
    "run_id": _col("str", NONEMPTY, doc="the run's id"),
    "preset": _col("str", NONEMPTY, doc="the run's preset"),
    "model": _col("str", NONEMPTY, doc="the run's model"),
    "seed": _col("int", _ge(0, "a seed"), doc="the run's seed (it draws the prompts and the probe batch)"),
}

KL_METRICS = ("k1", "k2", "k3", "k1_rev", "k2_rev", "k3_rev", "mean_abs_logprob_diff", "max_abs_logprob_diff",
              "mean_abs_prob_diff", "max_abs_prob_diff", "token_mult_prob_error", "chi2_token", "chi2_seq",
              "log_ppl_diff", "log_ppl_abs_diff")
_NONNEG_EST = _ge(0, "a non-negative KL estimator")
_KL_SUMMARY: dict[str, _Col] = {
    **_RUN_IDENTITY,
    "step": _col("Int64", _ge(1, "steps count from 1"), nullable=True, doc="RL step; null: the whole run"),
    "tokens": _col("int", _ge(1, "a summary covers at least one token"), doc="tokens summarised"),
    "sequences": _col("int", _ge(1, "a summary covers at least one sequence"), doc="sequences summarised"),
    "k1": _col("float", FINITE, doc="mean k1 of KL(sampler‖learner); any sign"),
    "k2": _col("float", _NONNEG_EST, FINITE, doc="mean k2 of KL(sampler‖learner)"),
    "k3": _col("float", _NONNEG_EST, FINITE, doc="mean k3 of KL(sampler‖learner)"),
    "k1_rev": _col("float", FINITE, doc="mean k1 of the reverse KL; any sign"),
    "k2_rev": _col("float", _NONNEG_EST, FINITE, doc="mean k2 of the reverse KL"),
    "k3_rev": _col("float", _NONNEG_EST, FINITE, doc="mean k3 of the reverse KL"),
    "mean_abs_logprob_diff": _col("float", _ge(0, "an absolute value"), FINITE, doc="mean |Δlogp|"),
    "max_abs_logprob_diff": _col("float", _ge(0, "an absolute value"), FINITE, doc="max |Δlogp|"),
    "mean_abs_prob_diff": _col("float", _between(0, 1, "an absolute difference of probabilities"), doc="mean |Δp|"),
    "max_abs_prob_diff": _col("float", _between(0, 1, "an absolute difference of probabilities"), doc="max |Δp|"),
    "token_mult_prob_error": _col("float", _ge(1, "a multiplicative error, exp(mean |log ratio|)"), FINITE,
                                  doc="multiplicative token probability error"),
    "chi2_token": _col("float", _ge(0, "a χ² divergence"), FINITE, doc="χ² per token"),
    "chi2_seq": _col("float", _ge(0, "a χ² divergence"), FINITE, doc="χ² per sequence"),
    "log_ppl_diff": _col("float", FINITE, doc="log-perplexity difference; any sign"),
    "log_ppl_abs_diff": _col("float", _ge(0, "an absolute value"), FINITE, required=False,
                             doc="sequence mean of |log-perplexity difference|"),
    "chi2_seq_clamped": _col("int", _ge(0, "a count of sequences"), required=False,
                             doc="sequences whose |Σ log r| hit the clamp of chi2_seq"),
    rf"^(?:{'|'.join(KL_METRICS)})_(?:lo|hi)$": _pattern("float", FINITE, doc="confidence bound of a metric"),
}


def _ci_bad(df: pd.DataFrame) -> pd.Series:
    bad = pd.Series(False, index=df.index)
    for m in KL_METRICS:
        lo, hi = f"{m}_lo", f"{m}_hi"
        if lo in df.columns and hi in df.columns:
            bad |= _num(df, lo) > _num(df, hi)
    return bad


def _ci_unpaired(df: pd.DataFrame) -> pd.Series:
    cols = set(df.columns)
    odd = [m for m in KL_METRICS if (f"{m}_lo" in cols) != (f"{m}_hi" in cols)]
    return pd.Series(bool(odd), index=df.index)


_KL_SUMMARY_RULES = [
    _unique("step", optional=("run_id",), what="one row per step and one whole-run row (null step) per run"),
    _at_least("tokens", "sequences", "every sequence has at least one sampled token"),
    _at_least("sequences", "chi2_seq_clamped", "clamped sequences are some of the sequences"),
    _at_least("log_ppl_abs_diff", "log_ppl_diff", "a mean of absolute values bounds the mean", 1e-12),
    _at_least("max_abs_logprob_diff", "mean_abs_logprob_diff", "a maximum is never below its mean", 1e-12),
    _at_least("max_abs_prob_diff", "mean_abs_prob_diff", "a maximum is never below its mean", 1e-12),
    _constant_per(["run_id"], "preset", "a run has one preset"),
    _constant_per(["run_id"], "model", "a run has one model"),
    _constant_per(["run_id"], "seed", "a run has one seed"),
    _rule("ci lo ≤ hi", "every '<metric>_lo' must be ≤ its '<metric>_hi' (a confidence interval)", (), _ci_bad,
          tuple(f"{m}_{s}" for m in KL_METRICS for s in ("lo", "hi"))),
    _rule("ci bounds in pairs", "confidence bounds come in pairs: a '<metric>_lo' column needs its '<metric>_hi' "
          "and the reverse", (), _ci_unpaired, tuple(f"{m}_{s}" for m in KL_METRICS for s in ("lo", "hi"))),
]

_PROBE: dict[str, _Col] = {
    **_RUN_IDENTITY,
    "sequence": _col("int", _ge(0, "a row index"), doc="row of the probe batch"),
    "positions": _col("int", _ge(1, "a probe sequence scores at least one next token"), doc="scored positions"),
    "kl": _col("float", _ge(0, "an exact KL divergence (a sum of them)"), doc="Σ over positions of KL(sampler‖learner)"),
    "kl_rev": _col("float", _ge(0, "an exact KL divergence (a sum of them)"), doc="Σ of KL(learner‖sampler)"),
    "js": _col("float", _ge(0, "a Jensen–Shannon divergence (a sum of them)"), FINITE, doc="Σ of JS"),
}
_PROBE_RULES = [
    _unique("sequence", optional=("run_id",), what="one row per probe sequence"),
    _rule("js ≤ ln 2 per position", "'js' must be ≤ ln 2 × 'positions' (JS is bounded by ln 2 nats per position)",
          ("js", "positions"), lambda d: _num(d, "js") > math.log(2) * _num(d, "positions") + 1e-9),
    _constant_per(["run_id"], "preset", "a run has one preset"),
    _constant_per(["run_id"], "seed", "a run has one seed"),
]

_CHECKS: dict[str, _Col] = {
    "version": _col("int", _ge(0, "a weight version"), doc="learner version the sync carried"),
    "sync": _col("int", _ge(1, "syncs count from 1"), doc="the runner's sync counter"),
    "tier": _col("str", _isin(TIERS), doc="which tier ran"),
    "why": _col("str", required=False, doc="why this tier"),
    "report_seconds": _col("float", *SECONDS, required=False, doc="seconds of the whole report"),
    "condition": _col("str", _isin(CONDITIONS, "the seven conditions of DESIGN"), doc="the condition checked"),
    "passed": _col("bool", doc="whether the condition held"),
    "measured": _col("float", _ge(0, "counts, byte counts or |Δlogp|"), nullable=True, doc="what was measured"),
    "bound": _col("float", _ge(0, "a tolerance"), FINITE, doc="the bound it was held to"),
    "count": _col("int", _ge(0, "a count of offenders"), doc="number of offenders"),
    "seconds": _col("float", *SECONDS, doc="seconds the check took"),
    "detail": _col("str", doc="what was checked"),
    "offenders": _col("str", required=False, nullable=True, doc="first offenders, '; '-joined"),
}
_CHECKS_RULES = [
    _unique("sync", "condition", what="one result per condition per sync"),
    _rule("passed ⇒ no offenders", "'count' must be 0 when 'passed' is True (a passed check has no offenders)",
          ("passed", "count"), lambda d: d["passed"].astype(bool) & (_num(d, "count") != 0)),
    _constant_per(["sync"], "version", "one report per sync"),
    _constant_per(["sync"], "tier", "one report per sync"),
    _rule("cheap tier runs no W3/W7", "'condition' must not be W3 or W7 on a cheap-tier row (they run in the full "
          "tier only)", ("tier", "condition"), lambda d: (d["tier"] == "cheap") & d["condition"].isin(FULL_TIER_ONLY)),
]


def _alarm_mismatch(df: pd.DataFrame) -> pd.Series:
    cols = [c for c in df.columns if re.fullmatch(r"check/W[1-7]", str(c))]
    failed = (df[cols] == False).any(axis=1) if cols else pd.Series(False, index=df.index)  # noqa: E712
    return df["false_alarm"].astype(bool) != failed.astype(bool)


def _alarms_text(df: pd.DataFrame) -> pd.Series:
    said = df["alarms"].fillna("").astype(str).str.len() > 0
    return said != df["false_alarm"].astype(bool)


_CLEAN_SYNCS: dict[str, _Col] = {
    "model": _col("str", _isin(MODELS), required=False, doc="the model kind (added by the nightly flow)"),
    "sync": _col("int", _ge(1, "syncs count from 1"), doc="the runner's sync counter"),
    "version": _col("int", _ge(1, "a version after an update"), doc="learner version the sync carried"),
    "tier": _col("str", _isin(TIERS), doc="which tier ran"),
    "false_alarm": _col("bool", doc="a check failed on a clean sync"),
    "alarms": _col("str", doc="the failed checks' message ('' when none)"),
    "checks_s": _col("float", *SECONDS, doc="seconds of the checks"),
    "step_s": _col("float", *SECONDS, doc="seconds of the step without the checks"),
    "mean_reward": _col("float", _between(0, 1, "the task's reward is 0, 0.5·fraction or 1"), doc="mean reward"),
    r"^check/W[1-7]$": _pattern("boolean", doc="True passed, False failed, null: not run"),
}
_CLEAN_SYNCS_RULES = [
    _unique("sync", optional=("model",), what="one row per sync of each model's series"),
    _rule("false_alarm ⇔ a check failed", "'false_alarm' must be True exactly when a 'check/W*' column is False",
          ("false_alarm",), _alarm_mismatch, tuple(f"check/{c}" for c in CONDITIONS)),
    _rule("alarms ⇔ false_alarm", "'alarms' must be non-empty exactly when 'false_alarm' is True",
          ("alarms", "false_alarm"), _alarms_text),
    _cheap_skips([f"check/{c}" for c in FULL_TIER_ONLY]),
]


def _declared_fired(df: pd.DataFrame) -> pd.Series:
    vals = pd.Series(np.nan, index=df.index, dtype="float64")
    for c in CONDITIONS:
        if c in df.columns:
            on = df["condition"] == c
            vals[on] = _num(df, c)[on]
    return vals == 1


_DETECTION_MATRIX: dict[str, _Col] = {
    "fault": _col("str", NONEMPTY, doc="the fault's name (fp8rl_core.checks.faults)"),
    "condition": _col("str", _isin(CONDITIONS), doc="the condition the fault breaks"),
    "stage": _col("str", _isin(STAGES), doc="where in the sync path it acts"),
    "model": _col("str", _isin(MODELS), doc="the model it is injected on"),
    "what": _col("str", NONEMPTY, doc="what goes wrong"),
    "tier": _col("str", _isin(TIERS), doc="the tier that ran at the fault's sync"),
    "why": _col("str", doc="why that tier"),
    "warmup_clean": _col("boolean", nullable=True, doc="the warm-up sync passed; null: no warm-up"),
    "caught_first": _col("bool", doc="the declared condition's check fired at the first sync"),
    "declared_offenders": _col("str", nullable=True, doc="first offenders of the declared check"),
    **{c: _col("Int64", _isin([0, 1], "1 fired, 0 passed, null: not run"), nullable=True, doc=f"check {c} fired")
       for c in CONDITIONS},
    "repaired": _col("boolean", required=False, nullable=True, doc="a clean sync after the fault passed again"),
}
_DETECTION_MATRIX_RULES = [
    _unique("fault", what="one row per fault"),
    _rule("caught_first ⇔ declared column is 1", "'caught_first' must be True exactly when the column named by "
          "'condition' is 1", ("caught_first", "condition"), lambda d: d["caught_first"].astype(bool) != _declared_fired(d),
          CONDITIONS),
    _rule("a caught fault names offenders", "'declared_offenders' must be non-empty when 'caught_first' is True "
          "(a failed check names what failed)", ("caught_first", "declared_offenders"),
          lambda d: d["caught_first"].astype(bool) & (d["declared_offenders"].fillna("").astype(str).str.len() == 0)),
    _cheap_skips(FULL_TIER_ONLY),
]

_TABLES: dict[str, tuple[dict[str, _Col], list[pa.Check], str]] = {
    "steps": (_STEPS, _STEPS_RULES, "one row per RL step (loop.rollout_and_learn + sync_weights + the flow)"),
    "tokens": (_TOKENS, _TOKENS_RULES, "one row per sampled token (loop.rollout_and_learn)"),
    "microbatches": (_MICROBATCHES, _MICROBATCHES_RULES, "one row per learner micro-batch (grpo.MicroBatchTiming)"),
    "kl_summary": (_KL_SUMMARY, _KL_SUMMARY_RULES, "train–rollout mismatch per (run, step) or per run"),
    "probe": (_PROBE, _PROBE_RULES, "exact full-vocabulary divergences per probe sequence (loop.probe_divergence)"),
    "checks": (_CHECKS, _CHECKS_RULES, "one row per (sync, condition) of the weight-sync checks"),
    "clean_syncs": (_CLEAN_SYNCS, _CLEAN_SYNCS_RULES, "one row per clean sync (checks.matrix.clean_series)"),
    "detection_matrix": (_DETECTION_MATRIX, _DETECTION_MATRIX_RULES, "one row per injected fault (checks.matrix.inject)"),
}


def _schema(name: str) -> pa.DataFrameSchema:
    cols, rules, doc = _TABLES[name]
    return pa.DataFrameSchema(
        {c: pa.Column(_DTYPES[s.kind][0], checks=list(s.checks), nullable=s.nullable, required=s.required,
                      regex=s.regex, description=s.doc) for c, s in cols.items()},
        checks=rules, strict=True, coerce=False, name=name, description=doc,
    )


#: the schema of every metrics table, by table name
SCHEMAS: dict[str, pa.DataFrameSchema] = {name: _schema(name) for name in _TABLES}


# ====================================================================================================
# Row builders for the tables nobody else flattens
# ====================================================================================================
def check_rows(reports: Iterable) -> list[dict]:
    """The ``checks`` table from check reports: :class:`~fp8rl_core.checks.CheckReport` objects or their
    :meth:`as_dict` dicts (``checks.json``); one row per (report, result)."""
    rows = []
    for rep in reports:
        d = rep.as_dict() if hasattr(rep, "as_dict") else rep
        head = {"version": d["version"], "sync": d["sync"], "tier": d["tier"], "why": d.get("why", ""),
                "report_seconds": d["seconds"]}
        for r in d["results"]:
            rows.append(head | {"condition": r["condition"], "passed": r["passed"], "measured": r["measured"],
                                "bound": r["bound"], "count": r["count"], "seconds": r["seconds"],
                                "detail": r["detail"], "offenders": "; ".join(map(str, r.get("offenders", [])))})
    return rows


def microbatch_rows(run_id: str, precision: str, step: int, tokens_per_microbatch: int, timings: Iterable) -> list[dict]:
    """The ``microbatches`` rows of one step from its :class:`~fp8rl_core.learner.grpo.MicroBatchTiming` list
    (``StepResult.microbatches``), in order."""
    return [{"run_id": run_id, "precision": precision, "step": step, "microbatch": i,
             "tokens_per_microbatch": tokens_per_microbatch, "rows": t.rows, "tokens": t.tokens,
             "real_tokens": t.real_tokens, "seconds": t.seconds, "quantize_s": t.quantize_s, "gemm_s": t.gemm_s,
             "other_s": t.other_s} for i, t in enumerate(timings)]


# ====================================================================================================
# Validation and the error a user reads
# ====================================================================================================
@dataclass
class Problem:
    """One failed rule: ``column`` (None for a rule across columns), the rule in words, the offending rows
    (index labels) and their values (the first few)."""

    column: str | None
    rule: str
    rows: list = field(default_factory=list)
    values: list = field(default_factory=list)
    reason: str = ""
    columns: tuple[str, ...] = ()  # the columns a rule across columns reads (those present)
    required: tuple[str, ...] = ()  # the columns it cannot be judged without

    def describe(self) -> str:
        subject = f"column '{self.column}' " if self.column is not None else ""
        text = subject + self.rule
        if self.rows:
            text += f"; {_rows_words(self.rows)}"
            if self.values:
                more = ", …" if len(self.rows) > _SHOW else ""
                text += (" holds " if len(self.rows) == 1 else " hold ") + ", ".join(self.values[:_SHOW]) + more
        return text


class TableError(ValueError):
    """A table failed its schema. ``problems`` lists every failed rule; ``failure_cases`` is pandera's
    long-form table of them (also reachable as ``__cause__``)."""

    def __init__(self, table: str, problems: list[Problem], failure_cases: pd.DataFrame | None = None) -> None:
        self.table = table
        self.problems = problems
        self.failure_cases = failure_cases
        lines = [p.describe() for p in problems]
        if len(lines) == 1:
            msg = f"table '{table}': {lines[0]}"
        else:
            msg = f"table '{table}': {len(lines)} problems:\n" + "\n".join(f"  - {ln}" for ln in lines)
        super().__init__(msg)

    @property
    def columns(self) -> list[str]:
        """Every column named by a problem (for rules across columns: the columns they read)."""
        out = []
        for p in self.problems:
            for c in ([p.column] if p.column is not None else list(p.columns)):
                if c not in out:
                    out.append(c)
        return out


_SHOW = 5


def _rows_words(rows: list) -> str:
    shown = ", ".join(str(r) for r in rows[:_SHOW]) + (", …" if len(rows) > _SHOW else "")
    return f"{'row' if len(rows) == 1 else 'rows'} {shown} ({len(rows)} {'row' if len(rows) == 1 else 'rows'})"


def _fmt(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "null"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return f"{float(v):.6g}"
    if isinstance(v, str):
        return repr(v if len(v) <= 60 else v[:57] + "...")
    return repr(v)


def _frame(name: str, rows) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return rows.copy()
    if isinstance(rows, Mapping) or isinstance(rows, (str, bytes)):
        raise TypeError(f"table '{name}': expected a list of row dicts or a DataFrame, got {type(rows).__name__}")
    rows = list(rows)
    if name == "checks" and rows and (hasattr(rows[0], "as_dict") or "results" in rows[0]):
        rows = check_rows(rows)
    if not rows:  # an empty table: its declared columns, no rows
        cols, _, _ = _TABLES[name]
        return pd.DataFrame({c: pd.Series(dtype=_DTYPES[s.kind][0]) for c, s in cols.items()
                             if s.required and not s.regex})
    if not all(isinstance(r, Mapping) for r in rows):
        bad = next(type(r).__name__ for r in rows if not isinstance(r, Mapping))
        raise TypeError(f"table '{name}': every row must be a dict, got a {bad}")
    return pd.DataFrame.from_records(rows)


def _spec_for(name: str, column: str) -> _Col | None:
    cols, _, _ = _TABLES[name]
    if column in cols and not cols[column].regex:
        return cols[column]
    for pat, s in cols.items():
        if s.regex and re.match(pat, str(column)):
            return s
    return None


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _is_null(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _fits(kind: str, v) -> bool:
    """Whether one value belongs in a column of ``kind`` (nulls are judged by the nullable rule)."""
    if _is_null(v):
        return kind != "int" and kind != "bool"
    if kind in ("int", "Int64"):
        return _is_int(v) or (_is_real(v) and float(v).is_integer())
    if kind == "float":
        return _is_real(v)
    if kind in ("bool", "boolean"):
        return isinstance(v, (bool, np.bool_))
    return isinstance(v, str)


def _normalize(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """Lossless widenings only (see the module docstring); anything else is left for the schema to refuse."""
    for c in df.columns:
        spec = _spec_for(name, c)
        if spec is None:
            continue
        s = df[c]
        want = {"int": "int64", "float": "float64", "Int64": "Int64", "boolean": "boolean"}
        if str(s.dtype) == want.get(spec.kind, str(s.dtype)):
            continue  # already right, or a kind that is never widened
        values = [v for v in s.tolist() if not _is_null(v)]
        try:
            if spec.kind == "int" and s.dtype.kind == "f" and len(values) == len(s) and all(
                    float(v).is_integer() for v in values):
                df[c] = s.astype("int64")  # a count returned as a float (e.g. metrics.mismatch's tokens)
            elif spec.kind == "float" and s.dtype != "float64" and all(_is_real(v) for v in values):
                df[c] = s.astype("float64") if values else pd.Series(np.nan, index=s.index, dtype="float64")
            elif spec.kind == "Int64" and s.dtype != "Int64" and all(_fits("Int64", v) for v in values):
                df[c] = pd.array([pd.NA if _is_null(v) else int(v) for v in s.tolist()], dtype="Int64")
            elif spec.kind == "boolean" and s.dtype != "boolean" and all(isinstance(v, (bool, np.bool_)) for v in values):
                df[c] = pd.array([pd.NA if _is_null(v) else bool(v) for v in s.tolist()], dtype="boolean")
        except (TypeError, ValueError, OverflowError):
            pass
    return df


def _index_list(fc) -> list:
    if isinstance(fc, pd.DataFrame) and "index" in fc.columns:
        return list(dict.fromkeys(i for i in fc["index"].tolist() if i is not None))
    return []


def _problems(name: str, df: pd.DataFrame, err: SchemaErrors) -> list[Problem]:
    dtype_cols: set[str] = set()
    out: list[Problem] = []
    for se in err.schema_errors:
        reason = getattr(se.reason_code, "name", str(se.reason_code))
        col = se.column_name
        fc = se.failure_cases
        check = se.check
        if reason == "COLUMN_NOT_IN_DATAFRAME":
            c = str(fc)
            spec = _spec_for(name, c)
            out.append(Problem(c, "is missing" + (f" (required: {spec.doc})" if spec and spec.doc else ""), reason=reason))
        elif reason == "COLUMN_NOT_IN_SCHEMA":
            pats = [p for p, s in _TABLES[name][0].items() if s.regex]
            allowed = f"; allowed patterns: {', '.join(pats)}" if pats else ""
            out.append(Problem(str(fc), f"is not a column of this table (unknown columns are refused: a renamed or "
                                        f"misspelt key would pass unchecked{allowed})", reason=reason))
        elif reason in ("WRONG_DATATYPE", "DATATYPE_COERCION"):
            spec = _spec_for(name, col)
            kind = spec.kind if spec else "str"
            dtype_cols.add(col)
            s = df[col]
            bad = [(i, v) for i, v in s.items() if not _fits(kind, v)]
            words = _DTYPES[kind][1]
            out.append(Problem(col, f"must hold {words}, holds {s.dtype}", [i for i, _ in bad],
                               [_fmt(v) for _, v in bad[:_SHOW]], reason))
        elif reason == "SERIES_CONTAINS_NULLS":
            rows = _index_list(fc)
            out.append(Problem(col, "must not be null (None/NaN)", rows, ["null"] * min(len(rows), _SHOW), reason))
        elif reason == "CHECK_ERROR":
            what = getattr(check, "error", None) or str(check)
            out.append(Problem(col, f"could not be checked against the rule '{what}' ({fc})", reason=reason,
                               required=tuple(getattr(check, "fp8rl_required", ()))))
        elif hasattr(check, "fp8rl_columns") or (col is None and reason == "DATAFRAME_CHECK"):
            cols = tuple(c for c in getattr(check, "fp8rl_columns", ()) if c in df.columns)
            rows = _index_list(fc)
            vals = [", ".join(f"{c}={_fmt(df.at[i, c])}" for c in cols) for i in rows[:_SHOW]] if cols else []
            vals = [f"({v})" for v in vals] if len(cols) > 1 else vals
            out.append(Problem(None, getattr(check, "error", None) or str(check), rows, vals, reason, cols,
                               tuple(getattr(check, "fp8rl_required", ()))))
        else:  # a column's own check
            rows = _index_list(fc)
            vals = fc["failure_case"].tolist() if isinstance(fc, pd.DataFrame) and "failure_case" in fc else []
            rule = getattr(check, "error", None) or str(check)
            out.append(Problem(col, rule, rows, [_fmt(v) for v in vals[:_SHOW]], reason))
    # a column of the wrong dtype: its own checks and the rules that read it only repeat that (or could
    # not run); keep the dtype line
    def echoes(p: Problem) -> bool:
        if p.reason in ("WRONG_DATATYPE", "DATATYPE_COERCION"):
            return False
        return p.column in dtype_cols or bool(dtype_cols.intersection(p.required))

    return [p for p in out if not echoes(p)]


def validate(name: str, rows) -> pd.DataFrame:
    """Check table ``name`` (a list of row dicts or a DataFrame) against ``SCHEMAS[name]``; every problem
    is found at once. Returns the validated DataFrame (integer columns of float tables widened to float,
    nullable integer/boolean columns as ``Int64``/``boolean``). For ``checks``, check reports (objects or
    ``as_dict()`` dicts) are flattened with :func:`check_rows` first. Raises :class:`TableError`."""
    if name not in SCHEMAS:
        raise ValueError(f"unknown table {name!r}; the tables are: {', '.join(SCHEMAS)}")
    df = _normalize(name, _frame(name, rows))
    try:
        return SCHEMAS[name].validate(df, lazy=True)
    except SchemaErrors as err:
        problems = _problems(name, df, err)
        raise TableError(name, problems, err.failure_cases) from err
