"""The claims' verdicts on one sweep: :func:`evaluate_claims` measures each claim of
:data:`~fp8rl_core.report.claims.CLAIMS` on a :class:`~fp8rl_core.report.data.SweepData` with
confidence intervals and returns one row per (claim, model[, measure]):

``{"id", "claim", "model", "measure", "paper", "measured", "ratio", "lo", "hi", "value", "paper_in_ci",
"verdict", "why"}`` — ``measure`` the KL measure of a KL claim's row (``"probe_kl"`` or ``"k3"``, see
below; None for the other claims), ``ratio``/``lo``/``hi`` for claims that are a ratio b/a (else
None), ``value`` the claim's number for the others (a fraction, seconds, tokens; else None),
``paper_in_ci`` whether the paper's number (or range) lies inside the interval (None when not
applicable), ``verdict`` one of :data:`~fp8rl_core.report.claims.VERDICTS`, ``why`` the reason in words.

The statistics behind them: :func:`compare_presets` (a metric of one preset relative to another, a
:class:`PresetComparison`), :func:`cost_models` (the micro-batch cost model per model),
:func:`direction_verdict` (the rule for a claimed direction).

A claim whose presets (or table) the sweep lacks is **omitted** from :func:`evaluate_claims`;
:func:`absent_claims` lists those with what they would need (the Markdown report prints them under
the table), so a reader sees which claims a sweep does not test rather than a row of blanks.

Verdict rules
-------------
Direction claims (a, b, d, e, f1, h): with the ``level`` (95%) interval of the measured ratio (or
difference),

- **reproduced** — the interval lies entirely on the claimed side of 1 (of 0 for Δfixed);
- **not reproduced** — it lies entirely on the other side ("the opposite direction"), or it includes 1
  ("no difference resolved": the sweep cannot tell the two apart — more seeds or steps may);

and ``why`` adds whether the paper's magnitude (0.89, 0.84, 2, 2.5–10, 0.893 …) lies inside the
interval: a direction can reproduce while the size differs (tiny CPU models are not Qwen3-8B).
Claim d needs both the whole-run and the step-1 interval above 1 ("from the first step"). Claim c is
reproduced when every W2 row passed (not reproduced on any failure, naming it). Claim f2 and the
timing claims h are **not measurable here** on CPU emulation (``SweepData.emulated``): emulated MXFP8
has no FP8 tensor cores to save per-token time, and the sampler runs BF16/FP32 arithmetic whatever
the preset, so their times say nothing about B200 — the numbers are still printed. Claim g is not
measurable without a GPU profiler trace pair (``trace_paths``); with one it is reproduced when the
host-bound idle time is more than half the added wall time. On FP8 hardware (``emulated=False``) f2
is reproduced when the cost model's status is ``break_even`` (``why`` says whether the paper's 4500
lies inside the break-even's CI) and not reproduced otherwise (``unresolved`` reads "no difference
resolved"). A KL ratio whose baseline is exactly 0 (sampler and learner agreed exactly) and a cost
model that cannot be fitted (e.g. one token budget) are also **not measurable here**, with the reason.

Step and generation times (claim h) come from the ``steps`` table, one unit per (seed, step), the step
time being ``total_s − checks_s`` (the paper's pipeline runs no W1–W7 checks); without a steps table,
from the runs' ``time/step_s`` / ``time/generate_s`` columns, one unit per run.

Two KL measures
---------------
The KL claims (a, b, d, e) are measured twice when the sweep has a ``probe`` table
(:attr:`SweepData.probe <fp8rl_core.report.data.SweepData>`), one row each, the measure named in the
row's ``measure`` and at the end of its ``claim`` text:

- ``"probe_kl"`` — "… — exact probe KL", listed first, the primary measure: the exact
  full-vocabulary KL(sampler‖learner) per position on a fixed held-out probe batch at the final
  weights (:func:`~fp8rl_core.report.data.probe_units`), paired by (seed, probe sequence) — the same
  tokens for every preset. It is the divergence itself on fixed data, not an estimate from sampled
  tokens, so it resolves differences the sampled estimator cannot;
- ``"k3"`` (the claim's ``metric``) — "… — sampled-token k3": the k3 estimator on the tokens the
  sampler drew, paired by prompt, as without a probe table. On tiny, very peaked policies it is
  dominated by rare tokens and its intervals can span orders of magnitude.

Both rows follow the same verdict rule; they are reported side by side, not combined. For claim d the
probe row is whole-run only (the probe is measured at the final weights, so it has no step 1) and its
verdict is the whole-run rule; "from the first step" is tested by the sampled-token row (whole run and
step 1, as below). Without a probe table (an empty ``SweepData.probe``) the KL claims have their
sampled-token rows only and the ``claim`` text carries no measure suffix — the rows are as before.

Comparisons are paired (:func:`fp8rl_core.metrics.compare_ratio` with ``paired=True``) over
sequence units keyed ``(seed, step, sequence)`` when both presets have the same keys (the same seeds,
steps and batch shape: same prompts, see :mod:`fp8rl_core.report.data`), seeds as the upper-level
cluster (probe units: keyed ``(seed, 0, probe sequence)``, paired when both presets have the same seeds
and probe batch size); otherwise unpaired, and ``why`` says so. Every bootstrap is seeded: the rows are
deterministic given the data.

Factors across models
---------------------
:func:`factors_across_models` asks whether a KL claim's factor (candidate/baseline exact probe KL) is the
same on every model of a sweep: for each model after the first (sweep order) the quotient of its factor
and the first model's, with the bootstrap interval of :func:`fp8rl_core.metrics.compare_factors` (each
factor paired by (seed, probe sequence) within its model, the two models resampled independently). On a
sweep whose models differ in how many 128×128 blocks each matrix has (``configs/moe-grids-small.yaml``:
the MoE mini, one block per expert matrix, and the MoE small, ≥ 4×4 blocks), claim d's row is the
block-size ablation: a quotient whose interval lies below 1 says the other-grid factor shrinks on the
model with more blocks per matrix.

Power
-----
:func:`power_rows` says, for each KL claim's exact probe comparison, what the sweep's own design (its seeds
× probe sequences per seed) can resolve and how many seeds the paper's ratio would need
(:func:`fp8rl_core.metrics.power.power_estimate`: variance components of the paired log-ratio between
and within seeds). Run on a pilot it sizes the experiment; in a report it says why a claim whose CI
includes 1 could not be settled at this scale: :func:`evaluate_claims` appends it to the ``why`` of every
exact-probe KL row whose interval includes 1 ("power: 3 seeds × 64 probe sequences resolve only ratios
≤ 0.79 or ≥ 1.26 (80% power); the paper's 0.89 would need 12 seeds × 64 sequences").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fp8rl_core.metrics import (Comparison, CostModel, compare_factors, compare_ratio, cost_model, describe_change,
                                paired_units)
from fp8rl_core.metrics.power import power_estimate

from .claims import CLAIMS, PROBE_MEASURE, VERDICTS, Claim, Verdict, measure_label
from .data import SweepData, Units, is_moe, is_probe_metric, probe_units, sequence_units, with_run_columns

__all__ = ["FactorAcrossModels", "PresetComparison", "absent_claims", "compare_presets", "cost_models",
           "direction_verdict", "evaluate_claims", "factors_across_models", "power_rows"]

_CPU_TIMING = ("MXFP8 is emulated on CPU (no FP8 tensor cores, quantization is extra work) and the CPU sampler "
               "runs BF16/FP32 arithmetic whatever the preset, so these times cannot show what FP8 hardware saves")


# ------------------------------------------------------------------------------------------- helpers

def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a" if x is None else str(x)
    return f"{x:.{digits}g}"


def _models(data: SweepData, which: str) -> list[str]:
    models = list(dict.fromkeys(data.runs["model"].astype(str))) if not data.runs.empty else []
    if which == "dense":
        return [m for m in models if not is_moe(m)]
    if which == "moe":
        return [m for m in models if is_moe(m)]
    return models


def _units_of(data: SweepData, metric: str) -> dict[tuple, Units]:
    """Units grouped by (model, preset): probe units for a probe measure, sequence units otherwise."""
    if is_probe_metric(metric):
        return probe_units(data, metric, ("model", "preset"))
    return sequence_units(data, metric, ("model", "preset"))


def _describe(cmp_ratio: float, lo: float, hi: float, level: float) -> str:
    """describe_change's words, or plain numbers when the interval does not hold the point estimate
    (a percentile interval can miss it on very skewed data) or a value is not a valid ratio."""
    try:
        return describe_change(cmp_ratio, lo, hi, level=level, digits=1 if abs(cmp_ratio - 1) < 0.1 else 0)
    except ValueError:
        return f"ratio {_fmt(cmp_ratio)} ({level:.0%} CI {_fmt(lo)}–{_fmt(hi)})"


@dataclass(frozen=True)
class PresetComparison:
    """A metric of ``candidate`` relative to ``baseline`` (:func:`compare_presets`): the ratio b/a with its
    bootstrap interval (``comparison``), whether the units were ``paired``, the ``sequences`` and
    ``seeds`` counted on each side (baseline, candidate), and ``text``: the comparison in words."""

    comparison: Comparison
    paired: bool
    sequences: tuple[int, int]
    seeds: tuple[int, int]
    text: str


def compare_presets(data: SweepData, baseline: str, candidate: str, *, metric: str = "k3", model: str | None = None,
                    step: int | None = None, n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                    _units: Mapping[tuple, Units] | None = None) -> PresetComparison | None:
    """``metric`` of ``candidate`` relative to ``baseline`` (a ratio b/a with its bootstrap interval).

    Units: :func:`~fp8rl_core.report.data.sequence_units` grouped by (model, preset) (``model`` None:
    the sweep's only model — several models raise); for a probe measure (``metric`` one of
    :data:`~fp8rl_core.report.data.PROBE_METRICS`, e.g. ``"probe_kl"``)
    :func:`~fp8rl_core.report.data.probe_units`, whose step column is 0. ``step``: one RL step only.
    Paired when both sides have the same ``(seed, step, sequence)`` keys (seeds as clusters), else
    unpaired.
    Returns None when either preset has no units (no tokens, or no probe rows), else a
    :class:`PresetComparison`. Raises ValueError from
    :func:`~fp8rl_core.metrics.compare_ratio` when the baseline's metric is 0."""
    units = _units if _units is not None else _units_of(data, metric)
    probe = is_probe_metric(metric)
    if model is None:
        models = sorted({k[0] for k in units})
        if len(models) > 1:
            raise ValueError(f"the sweep has several models {models}: pass model=")
        model = models[0] if models else None
    ua, ub = units.get((model, baseline)), units.get((model, candidate))
    if ua is None or ub is None:
        return None
    if step is not None:
        ua, ub = ua.at_step(step), ub.at_step(step)
        if ua.keys.shape[0] == 0 or ub.keys.shape[0] == 0:
            return None
    same_keys = np.array_equal(np.unique(ua.keys, axis=0), np.unique(ub.keys, axis=0))
    if same_keys:
        a, b, keys = paired_units(ua.keys, (ua.num, ua.den), ub.keys, (ub.num, ub.den))
        cmp = compare_ratio(a, b, paired=True, groups=keys[:, 0], n_boot=n_boot, level=level, seed=seed)
        by = "held-out probe sequence" if probe else "prompt"
        how = f"paired by {by} over {keys.shape[0]} sequences, {np.unique(keys[:, 0]).size} seeds"
    else:
        cmp = compare_ratio((ua.num, ua.den), (ub.num, ub.den), paired=False, groups=ua.seeds, b_groups=ub.seeds,
                            n_boot=n_boot, level=level, seed=seed)
        differ = "seeds or probe batch size" if probe else "seeds, steps or batch shape"
        how = (f"unpaired ({baseline} and {candidate} differ in {differ}): "
               f"{ua.keys.shape[0]} vs {ub.keys.shape[0]} sequences, {ua.n_seeds} vs {ub.n_seeds} seeds")
    name = f"{measure_label(metric)} (nats/position)" if probe else metric
    text = (f"{name} {candidate} {_fmt(cmp.b)} vs {baseline} {_fmt(cmp.a)}: "
            f"{_describe(cmp.ratio, cmp.lo, cmp.hi, level)}; {how}")
    return PresetComparison(cmp, bool(same_keys), (int(ua.keys.shape[0]), int(ub.keys.shape[0])),
                            (int(ua.n_seeds), int(ub.n_seeds)), text)


def direction_verdict(lo: float, hi: float, direction: str, *, null: float = 1.0, level: float = 0.95,
                      paper: float | None = None, paper_range: tuple[float, float] | None = None,
                      unit: str = "") -> tuple[Verdict, str, bool | None]:
    """(verdict, why, paper_in_ci) for a claim that a measured quantity lies ``direction`` (``"lower"``/``"higher"``)
    of ``null`` (1 for a ratio, 0 for a difference), given its ``level`` interval [lo, hi].

    Reproduced when the interval lies entirely on the claimed side; not reproduced when it lies on the
    other side or includes ``null`` ("no difference resolved"). ``why`` also says whether the paper's
    value ``paper`` (or range ``paper_range``) lies inside the interval; ``paper_in_ci`` is that flag
    (None when no paper value is given). ``unit`` is appended to the interval's numbers (e.g. " ms")."""
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    ci = f"the {level:.0%} CI [{_fmt(lo)}{unit}, {_fmt(hi)}{unit}]"
    below, above = hi < null, lo > null
    claimed, opposite = (below, above) if direction == "lower" else (above, below)
    side = "below" if direction == "lower" else "above"
    other = "above" if direction == "lower" else "below"
    if claimed:
        verdict, why = "reproduced", f"{ci} lies entirely {side} {null:g}"
    elif opposite:
        verdict, why = "not reproduced", f"the opposite direction: {ci} lies entirely {other} {null:g}"
    else:
        verdict, why = "not reproduced", f"no difference resolved: {ci} includes {null:g}"
    inside: bool | None = None
    if paper is not None:
        inside = bool(lo <= paper <= hi)
        where = "inside" if inside else ("below" if paper < lo else "above")
        why += f"; the paper's {_fmt(paper)} lies {where} the CI" if where == "inside" else \
            f"; the paper's {_fmt(paper)} lies {where} the CI (the size differs)"
    elif paper_range is not None:
        p_lo, p_hi = paper_range
        inside = bool(lo <= p_hi and p_lo <= hi)
        if inside:
            why += f"; the CI overlaps the paper's range {_fmt(p_lo)}–{_fmt(p_hi)}"
        else:
            where = "below" if hi < p_lo else "above"
            why += f"; the CI lies entirely {where} the paper's range {_fmt(p_lo)}–{_fmt(p_hi)} (the size differs)"
    return verdict, why, inside


def _row(claim: Claim, model: str | None, measured: str, verdict: Verdict, why: str, *, ratio=None, lo=None, hi=None,
         value=None, paper_in_ci=None, measure: str | None = None, suffix: bool = False) -> dict[str, Any]:
    label = f"({claim.id}) {claim.text}" + (f" — {model}" if model else "")
    if suffix and measure is not None:
        label += f" — {measure_label(measure)}"
    if verdict not in VERDICTS:
        raise AssertionError(f"unknown verdict {verdict!r}")
    return {"id": claim.id, "claim": label, "model": model, "measure": measure, "paper": claim.paper,
            "measured": measured,
            "ratio": None if ratio is None else float(ratio), "lo": None if lo is None else float(lo),
            "hi": None if hi is None else float(hi), "value": None if value is None else float(value),
            "paper_in_ci": paper_in_ci, "verdict": verdict, "why": why}


# ------------------------------------------------------------------------------------- the measures

class _Ctx:
    """Units cached per metric so that claims sharing a metric bootstrap from one table."""

    def __init__(self, data: SweepData, n_boot: int, level: float, seed: int) -> None:
        self.data, self.n_boot, self.level, self.seed = data, n_boot, level, seed
        self._units: dict[str, dict[tuple, Units]] = {}
        #: whether the sweep has a probe table: then KL claim rows name their measure
        self.has_probe = not data.probe.empty

    def units(self, metric: str) -> dict[tuple, Units]:
        if metric not in self._units:
            self._units[metric] = _units_of(self.data, metric)
        return self._units[metric]

    def measures(self, claim: Claim) -> list[str]:
        """A KL claim's measures, primary first: the exact probe KL (when there is a probe table), then
        the claim's sampled-token metric."""
        return ([PROBE_MEASURE] if self.has_probe else []) + [claim.metric]

    def compare(self, claim: Claim, model: str, step: int | None = None,
                metric: str | None = None) -> PresetComparison | None:
        metric = metric or claim.metric
        return compare_presets(self.data, claim.baseline, claim.candidate, metric=metric, model=model,
                               step=step, n_boot=self.n_boot, level=self.level, seed=self.seed,
                               _units=self.units(metric))

    def row(self, claim: Claim, model: str | None, measure: str, *args, **kwargs) -> dict[str, Any]:
        return _row(claim, model, *args, measure=measure, suffix=self.has_probe, **kwargs)


def _kl_models(ctx: _Ctx, claim: Claim, metric: str | None = None) -> list[str]:
    units = ctx.units(metric or claim.metric)
    return [m for m in _models(ctx.data, claim.models)
            if (m, claim.baseline) in units and (m, claim.candidate) in units]


def _kl_cells(ctx: _Ctx, claim: Claim) -> list[tuple[str, str]]:
    """The (model, measure) pairs a KL claim has rows for: per model (in runs order), the measures both
    presets have, primary first."""
    have = {m: set(_kl_models(ctx, claim, m)) for m in ctx.measures(claim)}
    return [(model, m) for model in _models(ctx.data, claim.models) for m in ctx.measures(claim) if model in have[m]]


def _zero_baseline(ctx: _Ctx, claim: Claim, model: str, exc: ValueError, metric: str) -> dict[str, Any]:
    name = measure_label(metric) if is_probe_metric(metric) else metric
    return ctx.row(claim, model, metric, f"{name} of {claim.baseline} is 0", "not measurable here",
                   f"the ratio is undefined: {claim.baseline} has zero {name} on (almost) every sequence, "
                   "i.e. its "
                   f"sampler and learner agreed exactly ({exc})")


def _eval_kl_ratio(ctx: _Ctx, claim: Claim) -> list[dict[str, Any]]:
    rows = []
    for model, metric in _kl_cells(ctx, claim):
        try:
            res = ctx.compare(claim, model, metric=metric)
        except ValueError as exc:
            rows.append(_zero_baseline(ctx, claim, model, exc, metric))
            continue
        c: Comparison = res.comparison
        verdict, why, inside = direction_verdict(c.lo, c.hi, claim.direction, level=c.level, paper=claim.paper_ratio,
                                                 paper_range=claim.paper_range)
        if claim.note:
            why += f"; {claim.note}"
        precision = _learner_precisions(ctx.data, model, (claim.baseline, claim.candidate))
        if claim.id in ("a", "b") and precision != {"mxfp8"}:
            why += f"; note: the learner precision of these runs is {sorted(precision)}, the claim is about MXFP8"
        rows.append(ctx.row(claim, model, metric, res.text, verdict, why, ratio=c.ratio, lo=c.lo, hi=c.hi,
                            paper_in_ci=inside))
    return rows


def _learner_precisions(data: SweepData, model: str, presets: Sequence[str]) -> set[str]:
    r = data.runs
    if "learner_precision" not in r.columns:
        return {"mxfp8"}
    sel = (r["model"].astype(str) == model) & r["preset"].isin(presets)
    return set(r.loc[sel, "learner_precision"].astype(str))


def _eval_first_step(ctx: _Ctx, claim: Claim) -> list[dict[str, Any]]:
    rows = []
    for model, metric in _kl_cells(ctx, claim):
        if is_probe_metric(metric):  # measured at the final weights only: a whole-run row
            try:
                res = ctx.compare(claim, model, metric=metric)
            except ValueError as exc:
                rows.append(_zero_baseline(ctx, claim, model, exc, metric))
                continue
            c = res.comparison
            verdict, why, inside = direction_verdict(c.lo, c.hi, claim.direction, level=c.level,
                                                     paper=claim.paper_ratio)
            why = (f"whole run: {why}; the probe is measured at the final weights only, so this row is whole-run — "
                   "'from the first step' is tested by the sampled-token row")
            rows.append(ctx.row(claim, model, metric, f"final weights: {res.text}", verdict, why, ratio=c.ratio,
                                lo=c.lo, hi=c.hi, paper_in_ci=inside))
            continue
        units = ctx.units(metric)
        first = int(min(units[(model, p)].keys[:, 1].min() for p in (claim.baseline, claim.candidate)))
        try:
            whole = ctx.compare(claim, model, metric=metric)
            step1 = ctx.compare(claim, model, step=first, metric=metric)
        except ValueError as exc:
            rows.append(_zero_baseline(ctx, claim, model, exc, metric))
            continue
        c = whole.comparison
        v_all, why_all, inside = direction_verdict(c.lo, c.hi, claim.direction, level=c.level, paper=claim.paper_ratio)
        measured = f"whole run: {whole.text}"
        if step1 is None:
            verdict, why = "not reproduced", f"whole run: {why_all}; step {first}: not measured on both presets"
        else:
            s = step1.comparison
            v_1, why_1, _ = direction_verdict(s.lo, s.hi, claim.direction, level=s.level, paper=claim.paper_ratio)
            measured += f"; step {first}: {step1.text}"
            verdict = "reproduced" if v_all == v_1 == "reproduced" else "not reproduced"
            why = f"whole run: {why_all}; step {first}: {why_1}"
        rows.append(ctx.row(claim, model, metric, measured, verdict, why, ratio=c.ratio, lo=c.lo, hi=c.hi,
                            paper_in_ci=inside))
    return rows


def _run_names(data: SweepData) -> dict[str, str]:
    if data.runs.empty:
        return {}
    names = data.runs["name"] if "name" in data.runs.columns else data.runs["run_id"]
    return dict(zip(data.runs["run_id"].astype(str), names.astype(str)))


def _eval_sync(ctx: _Ctx, claim: Claim) -> list[dict[str, Any]]:
    ch = ctx.data.checks
    if ch.empty or "condition" not in ch.columns:
        return []
    w2 = ch[ch["condition"] == "W2"]
    if w2.empty:
        return []
    passed = w2["passed"].astype(bool)
    run_col = w2["run_id"].astype(str) if "run_id" in w2.columns else pd.Series("run", index=w2.index)
    syncs = pd.DataFrame({"run": run_col, "sync": w2["sync"]}).drop_duplicates().shape[0]
    runs = run_col.nunique()
    all_pass = int(ch["passed"].astype(bool).sum())
    measured = (f"{int(passed.sum())}/{len(w2)} W2 checks passed ({syncs} syncs of {runs} runs); all conditions: "
                f"{all_pass}/{len(ch)} checks passed")
    if passed.all():
        why = (f"every W2 check passed: at each of the {syncs} syncs the sampler's FP8 data and scale bytes read back "
               "equal the learner's rowwise quantization of its master weights")
        return [_row(claim, None, measured, "reproduced", why, value=float(passed.mean()))]
    names = _run_names(ctx.data)
    bad = w2[~passed]
    examples = []
    for _, r in bad.head(3).iterrows():
        who = names.get(str(r.get("run_id", "")), str(r.get("run_id", "run")))
        off = str(r.get("offenders") or "").strip()
        examples.append(f"{who} sync {int(r['sync'])}" + (f" ({off})" if off else ""))
    why = f"{len(bad)} W2 check(s) failed, e.g. " + "; ".join(examples)
    return [_row(claim, None, measured, "not reproduced", why, value=float(passed.mean()))]


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


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g} ms"


def _eval_cost(ctx: _Ctx, claim: Claim, models: list[tuple[str | None, CostModel | str]]) -> list[dict[str, Any]]:
    rows = []
    for model, cm in models:
        if isinstance(cm, str):
            rows.append(_row(claim, model, "no fit", "not measurable here", f"the cost model cannot be fitted: {cm}"))
            continue
        if claim.kind == "cost_fixed":
            ci = cm.delta_fixed_ci
            ci_txt = f", {cm.level:.0%} CI [{_ms(ci[0])}, {_ms(ci[1])}]" if ci else ""
            measured = f"Δfixed = {_ms(cm.delta_fixed)} per micro-batch{ci_txt}"
            if ci is None:
                rows.append(_row(claim, model, measured, "not measurable here", "no bootstrap interval (n_boot=0)",
                                 value=cm.delta_fixed))
                continue
            verdict, why, _ = direction_verdict(ci[0] * 1e3, ci[1] * 1e3, "higher", null=0.0, level=cm.level,
                                                unit=" ms")
            if ctx.data.emulated:
                why += ("; on CPU emulation the fixed part (weight quantization, extra kernels per micro-batch) is the "
                        "part of the cost model that transfers")
            rows.append(_row(claim, model, measured, verdict, why, value=cm.delta_fixed))
            continue
        # cost_break_even
        measured = f"status {cm.status}: {cm.verdict}"
        value = cm.break_even
        if ctx.data.emulated:
            rows.append(_row(claim, model, measured, "not measurable here",
                             "CPU emulation has no FP8 tensor cores, so MXFP8 cannot save per-token time here and a "
                             "break-even measured on it says nothing about FP8 hardware; the cost model's finding: "
                             f"{cm.headline}", value=value))
            continue
        if cm.status == "break_even":
            ci = cm.break_even_ci
            inside = None if ci is None else bool(ci[0] <= claim.paper_ratio <= ci[1])
            why = f"MXFP8 pays off above ≈{cm.break_even:.0f} tokens per micro-batch"
            if ci is not None:
                why += (f"; the paper's {claim.paper_ratio:.0f} lies {'inside' if inside else 'outside'} the "
                        f"{cm.level:.0%} CI [{ci[0]:.0f}, {ci[1]:.0f}]")
            rows.append(_row(claim, model, measured, "reproduced", why, value=value, paper_in_ci=inside))
        elif cm.status == "unresolved":
            rows.append(_row(claim, model, measured, "not reproduced",
                             f"no difference resolved: the per-token saving's CI includes 0; {cm.verdict}"))
        else:
            rows.append(_row(claim, model, measured, "not reproduced", cm.verdict, value=value))
    return rows


def _trace_pair(trace_paths: Any) -> tuple[Any, Any]:
    if isinstance(trace_paths, Mapping):
        missing = [k for k in ("mxfp8", "bf16") if k not in trace_paths]
        if missing:
            raise ValueError(f"trace_paths needs the keys 'mxfp8' and 'bf16'; missing {missing}")
        return trace_paths["mxfp8"], trace_paths["bf16"]
    pair = list(trace_paths)
    if len(pair) != 2:
        raise ValueError(f"trace_paths: give (mxfp8_trace, bf16_trace) or {{'mxfp8': …, 'bf16': …}}, "
                         f"got {len(pair)} items")
    return pair[0], pair[1]


def _eval_trace(ctx: _Ctx, claim: Claim, trace_paths: Any) -> list[dict[str, Any]]:
    if trace_paths is None:
        return [_row(claim, None, "no trace", "not measurable here",
                     "no GPU profiler trace was supplied (trace_paths={'mxfp8': …, 'bf16': …}); a CPU run has no "
                     "device timeline on which the GPU could wait")]
    from fp8rl_core.metrics import added_time_idle_fraction

    m, b = _trace_pair(trace_paths)
    res = added_time_idle_fraction(m, b)
    frac = res.host_bound_fraction_of_added
    if frac is None:
        return [_row(claim, None, "no added time to attribute", "not measurable here", str(res.message))]
    added_ms = res.added_wall_us / 1e3
    idle = res.idle_fraction_of_added
    measured = (f"host-bound idle = {frac:.0%} of the {added_ms:.3g} ms MXFP8 adds (all idle: {idle:.0%} of it)")
    if frac > 0.5:
        return [_row(claim, None, measured, "reproduced", "more than half of the added wall time the GPU sat idle "
                     "waiting for the host to launch work", value=frac)]
    return [_row(claim, None, measured, "not reproduced", f"only {frac:.0%} of the added time is the GPU waiting for "
                 "the host (the claim needs most of it, > 50%)", value=frac)]


_RUN_TIME_COLUMNS = {"step_s": "time/step_s", "generate_s": "time/generate_s", "learner_s": "time/learner_s"}


def _time_units(data: SweepData, model: str, preset: str, metric: str) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(keys [n, 2] (seed, step), seconds [n], source) of one preset's steps, or per run from the run
    metrics when there is no steps table (keys (seed, 0))."""
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


def _eval_time(ctx: _Ctx, claim: Claim) -> list[dict[str, Any]]:
    rows = []
    data = ctx.data
    for model in _models(data, claim.models):
        a = _time_units(data, model, claim.baseline, claim.metric)
        b = _time_units(data, model, claim.candidate, claim.metric)
        if a is None or b is None:
            continue
        (ka, va, src), (kb, vb, _) = a, b
        same = np.array_equal(np.unique(ka, axis=0), np.unique(kb, axis=0))
        try:
            if same:
                (an, ad), (bn, bd), keys = paired_units(ka, va, kb, vb)
                c = compare_ratio((an, ad), (bn, bd), paired=True, groups=keys[:, 0], n_boot=ctx.n_boot,
                                  level=ctx.level, seed=ctx.seed)
                how = f"paired by (seed, step) over {keys.shape[0]} units"
            else:
                c = compare_ratio(va, vb, paired=False, groups=ka[:, 0], b_groups=kb[:, 0], n_boot=ctx.n_boot,
                                  level=ctx.level, seed=ctx.seed)
                how = f"unpaired, {len(va)} vs {len(vb)} units"
        except ValueError as exc:
            rows.append(_row(claim, model, "no usable times", "not measurable here", str(exc)))
            continue
        measured = (f"{claim.metric} {c.b:.3g} s vs {c.a:.3g} s: {_describe(c.ratio, c.lo, c.hi, c.level)}; "
                    f"{how} ({src})")
        verdict, why, inside = direction_verdict(c.lo, c.hi, claim.direction, level=c.level, paper=claim.paper_ratio)
        if data.emulated:
            why = f"{_CPU_TIMING} (measured: {why})"
            verdict = "not measurable here"
        rows.append(_row(claim, model, measured, verdict, why, ratio=c.ratio, lo=c.lo, hi=c.hi, paper_in_ci=inside))
    return rows


# --------------------------------------------------------------------------------------------- public

def evaluate_claims(data: SweepData, *, trace_paths: Any = None, n_boot: int = 2000, level: float = 0.95,
                    seed: int = 0, claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    """One row per (claim, model) the sweep can test — per (claim, model, measure) for the KL claims when
    the sweep has a probe table, the exact probe KL row first — in :data:`CLAIMS` order (see the module
    docstring for the rows, the two measures, the rules and what is omitted).

    ``trace_paths``: optional GPU profiler traces for claim g, ``{"mxfp8": path, "bf16": path}`` or a
    pair (mxfp8, bf16) of anything :func:`fp8rl_core.metrics.load_trace` reads. ``n_boot``, ``level``,
    ``seed``: every bootstrap's settings (seeded: deterministic)."""
    ctx = _Ctx(data, n_boot, level, seed)
    rows: list[dict[str, Any]] = []
    cms: list | None = None
    for claim in claims:
        if claim.kind == "kl_ratio":
            rows += _eval_kl_ratio(ctx, claim)
        elif claim.kind == "kl_ratio_first_step":
            rows += _eval_first_step(ctx, claim)
        elif claim.kind == "sync":
            rows += _eval_sync(ctx, claim)
        elif claim.kind in ("cost_fixed", "cost_break_even"):
            if cms is None:
                cms = cost_models(data, n_boot=n_boot, level=level, seed=seed)
            rows += _eval_cost(ctx, claim, cms)
        elif claim.kind == "trace":
            rows += _eval_trace(ctx, claim, trace_paths)
        elif claim.kind == "time_ratio":
            rows += _eval_time(ctx, claim)
        else:
            raise ValueError(f"claim {claim.id}: unknown kind {claim.kind!r}")
    return _with_power(rows, data, level, claims)


def _with_power(rows: list[dict[str, Any]], data: SweepData, level: float, claims: Sequence[Claim]) -> list[dict[str, Any]]:
    """Append the power calculation to the ``why`` of each exact-probe KL row whose CI includes 1: what this
    design could resolve and the seeds the paper's ratio would need (:func:`power_rows`)."""
    unresolved = [r for r in rows if r["measure"] == PROBE_MEASURE and r["lo"] is not None and r["lo"] <= 1 <= r["hi"]]
    if not unresolved:
        return rows
    power = {(p["id"], p["model"]): p for p in power_rows(data, level=level, claims=claims)}
    for r in unresolved:
        p = power.get((r["id"], r["model"]))
        if p is None:
            continue
        need = "" if p["seeds_for_target"] is None else (
            f"; the paper's {p['target']:g} would need {p['seeds_for_target']} seeds × {p['sequences']} sequences")
        r["why"] += (f"; power: {p['seeds']} seeds × {p['sequences']} probe sequences resolve only ratios "
                     f"≤ {1 / p['resolvable']:.2f} or ≥ {p['resolvable']:.2f} (80% power){need}")
    return rows


def absent_claims(data: SweepData, rows: Sequence[Mapping[str, Any]] | None = None,
                  claims: Sequence[Claim] = CLAIMS) -> list[dict[str, str]]:
    """The claims this sweep does not test: ``{"id", "claim", "needs"}`` for each claim with no row in
    ``rows`` (the output of :func:`evaluate_claims`; computed when not given)."""
    if rows is None:
        rows = evaluate_claims(data, n_boot=200, claims=claims)
    have = {r["id"] for r in rows}
    return [{"id": c.id, "claim": f"({c.id}) {c.text}", "needs": c.needs} for c in claims if c.id not in have]


def _paired_probe(units: Mapping[tuple, Units], model: str, claim: Claim
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A claim's baseline and candidate probe units on ``model`` aligned by (seed, 0, sequence):
    ``(a, b, keys)`` as :func:`~fp8rl_core.metrics.paired_units` gives them, or None when either preset is
    missing or the two do not cover the same keys."""
    ua, ub = units.get((model, claim.baseline)), units.get((model, claim.candidate))
    if ua is None or ub is None or not np.array_equal(np.unique(ua.keys, axis=0), np.unique(ub.keys, axis=0)):
        return None
    return paired_units(ua.keys, (ua.num, ua.den), ub.keys, (ub.num, ub.den))


def power_rows(data: SweepData, *, level: float = 0.95, power: float = 0.8, seeds: int | None = None,
               sequences: int | None = None, claims: Sequence[Claim] = CLAIMS) -> list[dict[str, Any]]:
    """One row per (KL claim, model) with paired exact probe units on ≥ 2 seeds: the power of the
    comparison (module docstring, "Power") for ``seeds`` × ``sequences`` per seed (default: the sweep's
    own design). Row: ``{"id", "claim", "model", "seeds", "sequences", "between", "within", "se",
    "resolvable", "target", "seeds_for_target", "estimate"}`` — ``resolvable`` the factor f: ratios ≤ 1/f or
    ≥ f are resolved with probability ``power``; ``target`` the paper's ratio (the low end of a range);
    ``seeds_for_target`` the seeds it needs at ``sequences``; ``estimate`` the
    :class:`~fp8rl_core.metrics.power.PowerEstimate`. No probe table → ``[]``."""
    if data.probe.empty:
        return []
    units = probe_units(data, PROBE_MEASURE, ("model", "preset"))
    rows = []
    for claim in claims:
        if claim.kind not in ("kl_ratio", "kl_ratio_first_step"):
            continue
        for model in _models(data, claim.models):
            paired = _paired_probe(units, model, claim)
            if paired is None:
                continue
            a, b, keys = paired
            if np.unique(keys[:, 0]).size < 2:
                continue
            target = claim.paper_ratio if claim.paper_ratio is not None else (
                claim.paper_range[0] if claim.paper_range else None)
            est = power_estimate(a, b, keys[:, 0], seeds=seeds, sequences=sequences, target=target, level=level,
                                 power=power)
            rows.append({"id": claim.id, "claim": f"{claim.candidate} vs {claim.baseline} ({claim.id})",
                         "model": model, "seeds": est.seeds, "sequences": est.sequences,
                         "between": est.components.between, "within": est.components.within, "se": est.se,
                         "resolvable": est.resolvable, "target": target, "seeds_for_target": est.seeds_for_target,
                         "estimate": est})
    return rows


@dataclass(frozen=True)
class FactorAcrossModels:
    """One KL claim's factor on ``model`` relative to the same factor on ``reference`` (see the module
    docstring, "Factors across models"): ``comparison.a`` / ``comparison.b`` are the two factors,
    ``comparison.ratio`` their quotient (model's / reference's) with its interval; ``verdict`` in words."""

    claim: str
    candidate: str
    baseline: str
    reference: str
    model: str
    comparison: Comparison
    seeds: tuple[int, int]
    sequences: tuple[int, int]
    verdict: str


def factors_across_models(data: SweepData, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                          claims: Sequence[Claim] = CLAIMS) -> list[FactorAcrossModels]:
    """For each KL-ratio claim whose presets two or more models of the sweep ran with exact probe units
    (paired by seed and probe sequence): the factor on every later model relative to the first
    (module docstring, "Factors across models"). No probe table or a single model → ``[]``."""
    if data.probe.empty:
        return []
    units = probe_units(data, PROBE_MEASURE, ("model", "preset"))
    out: list[FactorAcrossModels] = []
    for claim in claims:
        if claim.kind not in ("kl_ratio", "kl_ratio_first_step"):  # d: the probe is whole-run (final weights)
            continue
        sides = []
        for model in _models(data, claim.models):
            paired = _paired_probe(units, model, claim)
            if paired is None:
                continue
            a, b, keys = paired
            sides.append((model, (a, b, keys[:, 0]), int(np.unique(keys[:, 0]).size), int(keys.shape[0])))
        if len(sides) < 2:
            continue
        ref, ref_units, ref_seeds, ref_seqs = sides[0]
        for model, model_units, n_seeds, n_seqs in sides[1:]:
            try:
                cmp = compare_factors(ref_units, model_units, n_boot=n_boot, level=level, seed=seed)
            except ValueError:
                continue  # a baseline KL of exactly 0 on one model: no factor to compare (its claim row says so)
            if cmp.hi < 1.0:
                verdict = (f"the factor is smaller on {model}: {_fmt(cmp.b)}× vs {_fmt(cmp.a)}× on {ref} "
                           f"({_describe(cmp.ratio, cmp.lo, cmp.hi, level)})")
            elif cmp.lo > 1.0:
                verdict = (f"the factor is larger on {model}: {_fmt(cmp.b)}× vs {_fmt(cmp.a)}× on {ref} "
                           f"({_describe(cmp.ratio, cmp.lo, cmp.hi, level)})")
            else:
                verdict = (f"no change resolved: {_fmt(cmp.b)}× on {model} vs {_fmt(cmp.a)}× on {ref} "
                           f"(quotient {_fmt(cmp.ratio)}, {level:.0%} CI {_fmt(cmp.lo)}–{_fmt(cmp.hi)})")
            out.append(FactorAcrossModels(f"({claim.id}) {claim.text}", claim.candidate, claim.baseline, ref, model,
                                          cmp, (ref_seeds, n_seeds), (ref_seqs, n_seqs), verdict))
    return out
