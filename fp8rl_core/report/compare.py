"""The comparisons behind the claims: a metric of one preset relative to another on a sweep, as a ratio
b/a with its bootstrap interval — KL measures over sequence or probe units (:func:`compare_presets`),
step or generation times over (seed, step) units (:func:`compare_times`) — and the MXFP8 vs BF16
micro-batch cost model per model (:func:`cost_models`). A comparison pairs the two sides by key when they
cover the same keys and is unpaired otherwise (:func:`match_units`, the one place that rule lives).
Specified in docs/metrics.md ("Claims and verdicts").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fp8rl_core.metrics import Comparison, CostModel, compare_ratio, cost_model, describe_change, paired_units

from .claims import measure_label
from .data import SweepData, Units, is_probe_metric, probe_units, sequence_units, with_run_columns

__all__ = ["Matched", "PresetComparison", "compare_matched", "compare_presets", "compare_times", "cost_models",
           "describe_ratio", "fmt_number", "match_presets", "match_units", "units_of"]


def fmt_number(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits; ``"n/a"`` for None, ``"nan"``/``"inf"`` as Python writes them."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a" if x is None else str(x)
    return f"{x:.{digits}g}"


def describe_ratio(ratio: float, lo: float, hi: float, level: float) -> str:
    """:func:`~fp8rl_core.metrics.describe_change`'s words ("16% lower (95% CI 9%–22% lower)"), or plain
    numbers when the interval does not hold the point estimate (a percentile interval can miss it on very
    skewed data) or a value is not a valid ratio."""
    try:
        return describe_change(ratio, lo, hi, level=level, digits=1 if abs(ratio - 1) < 0.1 else 0)
    except ValueError:
        return f"ratio {fmt_number(ratio)} ({level:.0%} CI {fmt_number(lo)}–{fmt_number(hi)})"


@dataclass(frozen=True)
class Matched:
    """Two sides' units ready for :func:`~fp8rl_core.metrics.compare_ratio`: ``paired`` when both cover
    the same keys (then ``a`` and ``b`` are aligned by key, units sharing a key summed), else each side
    as it came. ``a_seeds`` / ``b_seeds``: each unit's seed (the upper-level cluster; one array for both
    sides when paired); ``counts`` / ``seed_counts``: the units and seeds each side came with."""

    paired: bool
    a: tuple[np.ndarray, np.ndarray] | np.ndarray
    b: tuple[np.ndarray, np.ndarray] | np.ndarray
    a_seeds: np.ndarray
    b_seeds: np.ndarray
    counts: tuple[int, int]
    seed_counts: tuple[int, int]

    @property
    def n_units(self) -> int:
        """Units compared: the common keys when paired, the baseline's units otherwise."""
        return int(self.a_seeds.shape[0])

    @property
    def n_seeds(self) -> int:
        """Seeds of the compared units (the baseline's when unpaired)."""
        return int(np.unique(self.a_seeds).size)


def match_units(a_keys: np.ndarray, a_units: Any, b_keys: np.ndarray, b_units: Any) -> Matched:
    """Pair two sides by key when their key sets are equal, else leave them unpaired. Keys are int rows
    whose first column is the seed; units are per-unit values or ``(num, den)`` arrays, one per key row."""
    counts = (int(a_keys.shape[0]), int(b_keys.shape[0]))
    seed_counts = (int(np.unique(a_keys[:, 0]).size), int(np.unique(b_keys[:, 0]).size))
    if np.array_equal(np.unique(a_keys, axis=0), np.unique(b_keys, axis=0)):
        a, b, keys = paired_units(a_keys, a_units, b_keys, b_units)
        return Matched(True, a, b, keys[:, 0], keys[:, 0], counts, seed_counts)
    return Matched(False, a_units, b_units, a_keys[:, 0], b_keys[:, 0], counts, seed_counts)


def compare_matched(m: Matched, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> Comparison:
    """b relative to a: :func:`~fp8rl_core.metrics.compare_ratio`, paired with the seeds as clusters
    when ``m`` is paired, else each side resampled by its own seeds. Raises ValueError when a's estimate
    is 0."""
    if m.paired:
        return compare_ratio(m.a, m.b, paired=True, groups=m.a_seeds, n_boot=n_boot, level=level, seed=seed)
    return compare_ratio(m.a, m.b, paired=False, groups=m.a_seeds, b_groups=m.b_seeds, n_boot=n_boot, level=level,
                         seed=seed)


def units_of(data: SweepData, metric: str) -> dict[tuple, Units]:
    """Units grouped by (model, preset): probe units for a probe measure, sequence units otherwise."""
    if is_probe_metric(metric):
        return probe_units(data, metric, ("model", "preset"))
    return sequence_units(data, metric, ("model", "preset"))


def match_presets(units: Mapping[tuple, Units], model: str | None, baseline: str, candidate: str, *,
                  step: int | None = None) -> Matched | None:
    """``candidate``'s and ``baseline``'s units on ``model`` (of ``step`` only, if given) matched by
    :func:`match_units`; None when either has no units."""
    ua, ub = units.get((model, baseline)), units.get((model, candidate))
    if ua is None or ub is None:
        return None
    if step is not None:
        ua, ub = ua.at_step(step), ub.at_step(step)
        if ua.keys.shape[0] == 0 or ub.keys.shape[0] == 0:
            return None
    return match_units(ua.keys, (ua.num, ua.den), ub.keys, (ub.num, ub.den))


@dataclass(frozen=True)
class PresetComparison:
    """A metric of a candidate preset relative to a baseline: the ratio b/a with its bootstrap interval
    (``comparison``), whether the units were ``paired``, the units (``sequences``: sequences, probe
    sequences or timed steps) and ``seeds`` counted on each side (baseline, candidate), and ``text``: the
    comparison in words."""

    comparison: Comparison
    paired: bool
    sequences: tuple[int, int]
    seeds: tuple[int, int]
    text: str


def compare_presets(data: SweepData, baseline: str, candidate: str, *, metric: str = "k3", model: str | None = None,
                    step: int | None = None, n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                    units: Mapping[tuple, Units] | None = None) -> PresetComparison | None:
    """``metric`` of ``candidate`` relative to ``baseline`` (a ratio b/a with its bootstrap interval).

    Units: :func:`~fp8rl_core.report.data.sequence_units` grouped by (model, preset) (``model`` None:
    the sweep's only model — several models raise); for a probe measure (``metric`` one of
    :data:`~fp8rl_core.report.data.PROBE_METRICS`, e.g. ``"probe_kl"``)
    :func:`~fp8rl_core.report.data.probe_units`, whose step column is 0; ``units``: those units already
    built (:func:`units_of`). ``step``: one RL step only. Paired when both sides have the same
    ``(seed, step, sequence)`` keys (seeds as clusters), else unpaired.
    Returns None when either preset has no units (no tokens, or no probe rows), else a
    :class:`PresetComparison`. Raises ValueError from
    :func:`~fp8rl_core.metrics.compare_ratio` when the baseline's metric is 0."""
    units = units if units is not None else units_of(data, metric)
    probe = is_probe_metric(metric)
    if model is None:
        models = sorted({k[0] for k in units})
        if len(models) > 1:
            raise ValueError(f"the sweep has several models {models}: pass model=")
        model = models[0] if models else None
    m = match_presets(units, model, baseline, candidate, step=step)
    if m is None:
        return None
    cmp = compare_matched(m, n_boot=n_boot, level=level, seed=seed)
    if m.paired:
        by = "held-out probe sequence" if probe else "prompt"
        how = f"paired by {by} over {m.n_units} sequences, {m.n_seeds} seed{'s' * (m.n_seeds != 1)}"
    else:
        differ = "seeds or probe batch size" if probe else "seeds, steps or batch shape"
        how = (f"unpaired ({baseline} and {candidate} differ in {differ}): "
               f"{m.counts[0]} vs {m.counts[1]} sequences, {m.seed_counts[0]} vs {m.seed_counts[1]} seeds")
    name = f"{measure_label(metric)} (nats/position)" if probe else metric
    text = (f"{name} {candidate} {fmt_number(cmp.b)} vs {baseline} {fmt_number(cmp.a)}: "
            f"{describe_ratio(cmp.ratio, cmp.lo, cmp.hi, level)}; {how}")
    return PresetComparison(cmp, m.paired, m.counts, m.seed_counts, text)


#: a time metric's run-level column, used when the sweep has no steps table
_RUN_TIME_COLUMNS = {"step_s": "time/step_s", "generate_s": "time/generate_s", "learner_s": "time/learner_s"}


def _time_units(data: SweepData, model: str, preset: str, metric: str) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(keys [n, 2] (seed, step), seconds [n], source) of one preset's steps, or per run from the run
    metrics when there is no steps table (keys (seed, 0)). ``step_s`` is ``total_s − checks_s``."""
    runs = data.runs[(data.runs["model"].astype(str) == model) & (data.runs["preset"] == preset)]
    if runs.empty:
        return None
    st = data.steps
    col = "total_s" if metric == "step_s" else metric
    if not st.empty and "run_id" in st.columns and col in st.columns:
        st = st[st["run_id"].isin(runs["run_id"])]
        if not st.empty:
            st = with_run_columns(st, runs, ["seed"])
            secs = st[col].to_numpy(np.float64)
            src = "steps table"
            if metric == "step_s" and "checks_s" in st.columns:  # the paper's pipeline runs no W1–W7 checks
                secs = secs - st["checks_s"].fillna(0.0).to_numpy(np.float64)
                src = "steps table, total_s − checks_s"
            keys = np.column_stack([st["seed"].to_numpy(np.int64), st["step"].to_numpy(np.int64)])
            return keys, secs, src
    run_col = _RUN_TIME_COLUMNS.get(metric)
    if run_col and run_col in runs.columns and runs[run_col].notna().all():
        keys = np.column_stack([runs["seed"].to_numpy(np.int64), np.zeros(len(runs), np.int64)])
        return keys, runs[run_col].to_numpy(np.float64), f"run metric {run_col}"
    return None


def compare_times(data: SweepData, model: str, baseline: str, candidate: str, metric: str, *, n_boot: int = 2000,
                  level: float = 0.95, seed: int = 0) -> PresetComparison | None:
    """Seconds of ``metric`` (``"step_s"``, ``"generate_s"``, ``"learner_s"``) of ``candidate``
    relative to ``baseline`` on ``model``: units are (seed, step) from the ``steps`` table (step time
    ``total_s − checks_s``), or one per run from the run metrics without one; paired by (seed, step)
    when both cover the same units. None when either preset has no times; ValueError when the
    baseline's time is 0."""
    a = _time_units(data, model, baseline, metric)
    b = _time_units(data, model, candidate, metric)
    if a is None or b is None:
        return None
    (ka, va, src), (kb, vb, _) = a, b
    m = match_units(ka, va, kb, vb)
    c = compare_matched(m, n_boot=n_boot, level=level, seed=seed)
    how = f"paired by (seed, step) over {m.n_units} units" if m.paired else f"unpaired, {len(va)} vs {len(vb)} units"
    text = f"{metric} {c.b:.3g} s vs {c.a:.3g} s: {describe_ratio(c.ratio, c.lo, c.hi, c.level)}; {how} ({src})"
    return PresetComparison(c, m.paired, m.counts, m.seed_counts, text)


def _microbatch_groups(data: SweepData) -> list[tuple[str | None, pd.DataFrame]]:
    mb = data.microbatches
    if mb.empty or not {"precision", "tokens", "seconds"} <= set(mb.columns):
        return []
    if "run_id" in mb.columns and not data.runs.empty and "model" in data.runs.columns:
        mb = with_run_columns(mb, data.runs, ["model"])
        if mb["model"].notna().any():
            groups = [(str(m), g) for m, g in mb.groupby(mb["model"].astype(str), sort=False)]
        else:
            groups = [(None, mb)]
    else:
        groups = [(None, mb)]
    return [(m, g) for m, g in groups if {"bf16", "mxfp8"} <= set(g["precision"].astype(str))]


def cost_models(data: SweepData, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
                ) -> list[tuple[str | None, CostModel | str]]:
    """The micro-batch cost model per model of the sweep: (model, :func:`fp8rl_core.metrics.cost_model`
    result) — or (model, the reason as text) when the fit is impossible (e.g. one token budget)."""
    out = []
    for model, g in _microbatch_groups(data):
        try:
            out.append((model, cost_model(g, emulated=data.emulated, n_boot=n_boot, level=level, seed=seed)))
        except ValueError as exc:
            out.append((model, str(exc)))
    return out
