"""The requantization comparison: a sampler that requantizes the BF16 view itself (preset ``requant``,
vLLM's online MXFP8 rule) against one fed the learner's bytes (``all``), per model and KL measure — the KL
ratio requant/all with its bootstrap interval, a verdict sentence a user can act on, and the byte-difference
fractions W2 measured (``requant/*``, per layer kind) — or "not run" when the sweep lacks either preset.
Specified in docs/metrics.md ("The requantization comparison").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fp8rl_core.metrics.stats import ci_side
from fp8rl_core.schemas.dsl import REQUANT_COLUMNS

from .claims import PROBE_MEASURE, measure_label
from .compare import compare_presets, fmt_number
from .data import SweepData, sweep_models

__all__ = ["BASELINE", "CANDIDATE", "RequantRow", "requant_bytes", "requant_rows", "requant_verdict"]

#: the comparison: the sampler that requantizes vs the one fed the learner's bytes
CANDIDATE, BASELINE = "requant", "all"


@dataclass(frozen=True)
class RequantRow:
    """requant/all on one model and KL measure: ``ratio`` [``lo``, ``hi``] (None when not measurable),
    ``measured`` (the comparison in words), ``verdict`` (the sentence) and ``bytes_differ`` (metric →
    mean over the requant runs' syncs of W2's byte-difference fraction; empty without a steps table)."""

    model: str
    measure: str
    ratio: float | None
    lo: float | None
    hi: float | None
    measured: str
    verdict: str
    bytes_differ: dict[str, float]


def requant_verdict(ratio: float, lo: float, hi: float, level: float, model: str, measure: str) -> str:
    """The sentence for requant/all = ``ratio`` with its ``level`` interval [lo, hi] on ``model``."""
    ci = f"{level:.0%} CI {fmt_number(lo)}–{fmt_number(hi)}"
    what = measure_label(measure)
    side = ci_side(lo, hi)  # the verdicts' one rule (:func:`fp8rl_core.metrics.stats.ci_side`); no claimed side here
    if side == "higher":
        return (f"shipping the learner's bytes instead of requantizing buys {1 - 1 / ratio:.0%} lower {what} on "
                f"{model} (requant/all {fmt_number(ratio)}, {ci})")
    if side == "lower":
        return (f"requantizing from BF16 gave {1 - ratio:.0%} lower {what} than the learner's bytes on {model} "
                f"(requant/all {fmt_number(ratio)}, {ci})")
    return f"no difference resolved at this power on {model} ({what}: requant/all {fmt_number(ratio)}, {ci} includes 1)"


def requant_bytes(data: SweepData, model: str) -> dict[str, float]:
    """Mean over the ``requant`` runs' syncs on ``model`` of every ``requant/*`` steps-table column."""
    st, runs = data.steps, data.runs
    if st.empty or runs.empty or "run_id" not in st.columns:
        return {}
    ids = runs.loc[(runs["model"].astype(str) == model) & (runs["preset"] == CANDIDATE), "run_id"]
    sel = st[st["run_id"].isin(ids)]
    cols = [c for c in st.columns if re.fullmatch(REQUANT_COLUMNS, str(c))]
    return {c: float(sel[c].mean()) for c in cols if sel[c].notna().any()}


def requant_rows(data: SweepData, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> list[RequantRow]:
    """One row per model with both presets and per KL measure they share (exact probe KL first, then
    sampled-token k3); empty when the sweep lacks ``requant`` or ``all`` runs."""
    rows = []
    measures = ([PROBE_MEASURE] if not data.probe.empty else []) + ["k3"]
    for model in sweep_models(data):
        for measure in measures:
            try:
                res = compare_presets(data, BASELINE, CANDIDATE, metric=measure, model=model, n_boot=n_boot,
                                      level=level, seed=seed)
            except ValueError as exc:  # all's KL is 0: the ratio is undefined
                rows.append(RequantRow(model, measure, None, None, None, f"{measure_label(measure)} of all is 0",
                                       f"not measurable here ({exc})", requant_bytes(data, model)))
                continue
            if res is None:
                continue
            c = res.comparison
            rows.append(RequantRow(model, measure, c.ratio, c.lo, c.hi, res.text,
                                   requant_verdict(c.ratio, c.lo, c.hi, c.level, model, measure),
                                   requant_bytes(data, model)))
    return rows
