"""The weight-sync check tables, each rule of a table naming what it protects (docs/metrics.md, tables).

``checks``: one row per (sync, condition) — check reports flattened by
:func:`fp8rl_core.checks.check_rows`. ``clean_syncs``: one row per clean sync of the correctness stage
(:func:`fp8rl_core.correctness.clean_series`, ``model`` added by the nightly flow).
``detection_matrix``: one row per injected fault (:func:`fp8rl_core.correctness.inject`). Conditions,
tiers, fault stages and model kinds are those of :mod:`fp8rl_core.vocabulary`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fp8rl_core.vocabulary import (CONDITIONS, ENGINE_CHECKSUM, FAULT_STAGES, FULL_TIER_ONLY, MODEL_KINDS, TIERS,
                                   check_column)

from .dsl import (CHECK_COLUMNS, FINITE, NONEMPTY, SECONDS, Table, between, cheap_skips, col, constant_per, ge, isin,
                  num, pattern, rule, unique)

__all__ = ["CHECKS", "CLEAN_SYNCS", "DETECTION_MATRIX"]


CHECKS = Table("checks", {
    "run_id": col("str", NONEMPTY, required=False, doc="the run's id (added when read back from several runs)"),
    "version": col("int", ge(0, "a weight version"), doc="learner version the sync carried"),
    "sync": col("int", ge(1, "syncs count from 1"), doc="the runner's sync counter"),
    "tier": col("str", isin(TIERS), doc="which tier ran"),
    "why": col("str", required=False, doc="why this tier"),
    "report_seconds": col("float", *SECONDS, required=False, doc="seconds of the whole report"),
    "condition": col("str", isin(CONDITIONS, "the seven conditions of DESIGN"), doc="the condition checked"),
    "passed": col("bool", doc="whether the condition held"),
    "measured": col("float", ge(0, "counts, byte counts or |Δlogp|"), nullable=True, doc="what was measured"),
    "bound": col("float", ge(0, "a tolerance"), FINITE, doc="the bound it was held to"),
    "count": col("int", ge(0, "a count of offenders"), doc="number of offenders"),
    "seconds": col("float", *SECONDS, doc="seconds the check took"),
    "detail": col("str", doc="what was checked"),
    "offenders": col("str", required=False, nullable=True, doc="first offenders, '; '-joined"),
}, (
    unique("sync", "condition", optional=("run_id",), what="one result per condition per sync"),
    rule("passed ⇒ no offenders", "'count' must be 0 when 'passed' is True (a passed check has no offenders)",
         ("passed", "count"), lambda d: d["passed"].astype(bool) & (num(d, "count") != 0)),
    constant_per(["sync"], "version", "one report per sync", optional=("run_id",)),
    constant_per(["sync"], "tier", "one report per sync", optional=("run_id",)),
    rule(f"cheap tier runs no {'/'.join(FULL_TIER_ONLY)}",
         f"'condition' must not be {' or '.join(FULL_TIER_ONLY)} on a cheap-tier row (they run in the full tier only)",
         ("tier", "condition"), lambda d: (d["tier"] == "cheap") & d["condition"].isin(FULL_TIER_ONLY)),
), "one row per (sync, condition) of the weight-sync checks")


def _alarm_mismatch(df: pd.DataFrame) -> pd.Series:
    cols = [c for c in df.columns if re.fullmatch(CHECK_COLUMNS, str(c)) or c == check_column(ENGINE_CHECKSUM)]
    failed = (df[cols] == False).any(axis=1) if cols else pd.Series(False, index=df.index)  # noqa: E712
    return df["false_alarm"].astype(bool) != failed.astype(bool)


def _alarms_text(df: pd.DataFrame) -> pd.Series:
    said = df["alarms"].fillna("").astype(str).str.len() > 0
    return said != df["false_alarm"].astype(bool)


CLEAN_SYNCS = Table("clean_syncs", {
    "model": col("str", isin(MODEL_KINDS), required=False, doc="the model kind (added by the nightly flow)"),
    "sync": col("int", ge(1, "syncs count from 1"), doc="the runner's sync counter"),
    "version": col("int", ge(1, "a version after an update"), doc="learner version the sync carried"),
    "tier": col("str", isin(TIERS), doc="which tier ran"),
    "false_alarm": col("bool", doc="a check failed on a clean sync"),
    "alarms": col("str", doc="the failed checks' message ('' when none)"),
    "checks_s": col("float", *SECONDS, doc="seconds of the checks"),
    "step_s": col("float", *SECONDS, doc="the step's total_s (loop.RLStep): rollout, learner step, sync, checks"),
    "mean_reward": col("float", between(0, 1, "the task's reward is 0, 0.5·fraction or 1"), doc="mean reward"),
    CHECK_COLUMNS: pattern("boolean", doc="True passed, False failed, null: not run"),
    check_column(ENGINE_CHECKSUM): col("boolean", required=False, nullable=True,
                                       doc="vLLM's own weight checksums agreed with the learner's bytes; null: not run"),
    f"{ENGINE_CHECKSUM}_s": col("float", *SECONDS, required=False, nullable=True,
                                doc="seconds of vLLM's checksums and the learner's digests; null: not run"),
}, (
    unique("sync", optional=("model",), what="one row per sync of each model's series"),
    rule("false_alarm ⇔ a check failed", "'false_alarm' must be True exactly when a 'check/W*' column is False "
         f"(or '{check_column(ENGINE_CHECKSUM)}')",
         ("false_alarm",), _alarm_mismatch, tuple(map(check_column, (*CONDITIONS, ENGINE_CHECKSUM)))),
    rule("alarms ⇔ false_alarm", "'alarms' must be non-empty exactly when 'false_alarm' is True",
         ("alarms", "false_alarm"), _alarms_text),
    cheap_skips([check_column(c) for c in FULL_TIER_ONLY]),
), "one row per clean sync (correctness.clean_series)")


def _declared_fired(df: pd.DataFrame) -> pd.Series:
    vals = pd.Series(np.nan, index=df.index, dtype="float64")
    for c in CONDITIONS:
        if c in df.columns:
            on = df["condition"] == c
            vals[on] = num(df, c)[on]
    return vals == 1


DETECTION_MATRIX = Table("detection_matrix", {
    "fault": col("str", NONEMPTY, doc="the fault's name (fp8rl_core.checks.faults)"),
    "condition": col("str", isin(CONDITIONS), doc="the condition the fault breaks"),
    "stage": col("str", isin(FAULT_STAGES), doc="where in the sync path it acts"),
    "model": col("str", isin(MODEL_KINDS), doc="the model it is injected on"),
    "what": col("str", NONEMPTY, doc="what goes wrong"),
    "tier": col("str", isin(TIERS), doc="the tier that ran at the fault's sync"),
    "why": col("str", doc="why that tier"),
    "warmup_clean": col("boolean", nullable=True, doc="the warm-up sync passed; null: no warm-up"),
    "caught_first": col("bool", doc="the declared condition's check fired at the first sync"),
    "declared_offenders": col("str", nullable=True, doc="first offenders of the declared check"),
    **{c: col("Int64", isin([0, 1], "1 fired, 0 passed, null: not run"), nullable=True, doc=f"check {c} fired")
       for c in CONDITIONS},
    ENGINE_CHECKSUM: col("Int64", isin([0, 1], "1 disagreed, 0 agreed, null: not run"), required=False, nullable=True,
                         doc="vLLM's own weight checksums disagreed with the learner's bytes at the fault's sync"),
    f"{ENGINE_CHECKSUM}_offenders": col("str", required=False, nullable=True,
                                        doc="the first parameters vLLM's checksums disagreed on ('' when none)"),
    "repaired": col("boolean", required=False, nullable=True, doc="a clean sync after the fault passed again"),
}, (
    unique("fault", what="one row per fault"),
    rule("caught_first ⇔ declared column is 1", "'caught_first' must be True exactly when the column named by "
         "'condition' is 1", ("caught_first", "condition"),
         lambda d: d["caught_first"].astype(bool) != _declared_fired(d), CONDITIONS),
    rule("a caught fault names offenders", "'declared_offenders' must be non-empty when 'caught_first' is True "
         "(a failed check names what failed)", ("caught_first", "declared_offenders"),
         lambda d: d["caught_first"].astype(bool) & (d["declared_offenders"].fillna("").astype(str).str.len() == 0)),
    cheap_skips(FULL_TIER_ONLY),
), "one row per injected fault (correctness.inject)")
