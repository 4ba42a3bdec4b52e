"""The claims' verdicts on one sweep: :func:`evaluate_claims` measures each claim of
:data:`~fp8rl_core.report.claims.CLAIMS` with confidence intervals, one evaluator per claim kind
(:data:`EVALUATORS`), and returns a :class:`ClaimRow` per (claim, model[, KL measure]);
:func:`absent_claims` lists the claims a sweep cannot test. The verdict rules, the two KL measures and
what each row holds are specified in docs/metrics.md ("Claims and verdicts"); every verdict from an interval is
:func:`~.claims.claim_verdict`'s (reproduced / contradicted / unresolved), and an unresolved KL row says the
sample a resolution would need (:func:`_with_power`, from :func:`fp8rl_core.metrics.power.sample_needed` on
the row's own units); the comparisons behind them are :mod:`.compare`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fp8rl_core.metrics import CostModel

from .claims import (CLAIMS, PROBE_MEASURE, VERDICTS, Claim, ClaimKind, Direction, Verdict, claim_verdict,
                     joint_verdict, measure_label, needed_text)
from .compare import PresetComparison, compare_presets, compare_times, cost_models, fmt_number, units_of
from .data import SweepData, Units, is_probe_metric, sweep_models
from .power import claim_power
from .syncs import sync_groups

__all__ = ["EVALUATORS", "AbsentClaim", "ClaimRow", "absent_claims", "direction_verdict", "evaluate_claims"]

_CPU_TIMING = ("MXFP8 is emulated on CPU (no FP8 tensor cores, quantization is extra work) and the CPU sampler "
               "runs BF16/FP32 arithmetic whatever the preset, so these times cannot show what FP8 hardware saves")


@dataclass(frozen=True)
class ClaimRow:
    """One claim's verdict on one model (and, for a KL claim with a probe table, one KL measure).

    ``claim``: "(id) text[ — model][ — measure label]"; ``measure``: ``"probe_kl"`` or the claim's
    sampled-token metric for a KL claim, else None; ``measured``: what the sweep measured, in words;
    ``ratio`` / ``lo`` / ``hi``: a ratio b/a and its interval (None for claims that are not a ratio);
    ``value``: the claim's number otherwise (a fraction, seconds, tokens; else None); ``paper_in_ci``:
    whether the paper's number (or range) lies inside the interval (None when not applicable);
    ``verdict``: one of :data:`~fp8rl_core.report.claims.VERDICTS`; ``why``: the reason in words."""

    id: str
    claim: str
    model: str | None
    measure: str | None
    paper: str
    measured: str
    ratio: float | None
    lo: float | None
    hi: float | None
    value: float | None
    paper_in_ci: bool | None
    verdict: Verdict
    why: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"claim {self.id!r}: unknown verdict {self.verdict!r}; valid: {', '.join(VERDICTS)}")


@dataclass(frozen=True)
class AbsentClaim:
    """A claim the sweep does not test: ``claim`` "(id) text" and what the sweep would ``need``."""

    id: str
    claim: str
    needs: str


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


def _row(claim: Claim, model: str | None, measured: str, verdict: Verdict, why: str, *, ratio=None, lo=None, hi=None,
         value=None, paper_in_ci=None, measure: str | None = None, suffix: bool = False) -> ClaimRow:
    label = f"({claim.id}) {claim.text}" + (f" — {model}" if model else "")
    if suffix and measure is not None:
        label += f" — {measure_label(measure)}"
    return ClaimRow(claim.id, label, model, measure, claim.paper, measured, _float(ratio), _float(lo), _float(hi),
                    _float(value), paper_in_ci, verdict, why)


def direction_verdict(lo: float, hi: float, direction: Direction, *, null: float = 1.0, level: float = 0.95,
                      paper: float | None = None, paper_range: tuple[float, float] | None = None,
                      unit: str = "") -> tuple[Verdict, str, bool | None]:
    """(verdict, why, paper_in_ci) for a claim that a measured quantity lies ``direction`` (``"lower"``/``"higher"``)
    of ``null`` (1 for a ratio, 0 for a difference), given its ``level`` interval [lo, hi].

    :func:`~.claims.claim_verdict`: reproduced when the interval lies entirely on the claimed side,
    contradicted when it lies on the other side ("the opposite direction"), unresolved when it includes
    ``null`` ("no difference resolved"). ``why`` also says whether the paper's
    value ``paper`` (or range ``paper_range``) lies inside the interval; ``paper_in_ci`` is that flag
    (None when no paper value is given). ``unit`` is appended to the interval's numbers (e.g. " ms")."""
    verdict = claim_verdict(lo, hi, direction, null)
    ci = f"the {level:.0%} CI [{fmt_number(lo)}{unit}, {fmt_number(hi)}{unit}]"
    side = "below" if direction == "lower" else "above"
    other = "above" if direction == "lower" else "below"
    if verdict == "reproduced":
        why = f"{ci} lies entirely {side} {null:g}"
    elif verdict == "contradicted":
        why = f"the opposite direction: {ci} lies entirely {other} {null:g}"
    else:
        why = f"no difference resolved: {ci} includes {null:g}"
    inside: bool | None = None
    if paper is not None:
        inside = bool(lo <= paper <= hi)
        where = "inside" if inside else ("below" if paper < lo else "above")
        why += f"; the paper's {fmt_number(paper)} lies {where} the CI" if where == "inside" else \
            f"; the paper's {fmt_number(paper)} lies {where} the CI (the size differs)"
    elif paper_range is not None:
        p_lo, p_hi = paper_range
        inside = bool(lo <= p_hi and p_lo <= hi)
        if inside:
            why += f"; the CI overlaps the paper's range {fmt_number(p_lo)}–{fmt_number(p_hi)}"
        else:
            where = "below" if hi < p_lo else "above"
            why += (f"; the CI lies entirely {where} the paper's range {fmt_number(p_lo)}–{fmt_number(p_hi)} "
                    "(the size differs)")
    return verdict, why, inside


# ------------------------------------------------------------------------------------- the measures

class _Ctx:
    """One evaluation's data and bootstrap settings, with the units (per metric) and the cost models
    computed once, so that claims sharing them bootstrap from one table."""

    def __init__(self, data: SweepData, n_boot: int, level: float, seed: int, trace_paths: Any) -> None:
        self.data, self.n_boot, self.level, self.seed, self.trace_paths = data, n_boot, level, seed, trace_paths
        self._units: dict[str, dict[tuple, Units]] = {}
        self._cost_models: list[tuple[str | None, CostModel | str]] | None = None
        #: whether the sweep has a probe table: then KL claim rows name their measure
        self.has_probe = not data.probe.empty

    def units(self, metric: str) -> dict[tuple, Units]:
        if metric not in self._units:
            self._units[metric] = units_of(self.data, metric)
        return self._units[metric]

    def cost_models(self) -> list[tuple[str | None, CostModel | str]]:
        if self._cost_models is None:
            self._cost_models = cost_models(self.data, n_boot=self.n_boot, level=self.level, seed=self.seed)
        return self._cost_models

    def measures(self, claim: Claim) -> list[str]:
        """A KL claim's measures, primary first: the exact probe KL (when there is a probe table), then
        the claim's sampled-token metric."""
        return ([PROBE_MEASURE] if self.has_probe else []) + [claim.metric]

    def compare(self, claim: Claim, model: str, step: int | None = None,
                metric: str | None = None) -> PresetComparison | None:
        metric = metric or claim.metric
        return compare_presets(self.data, claim.baseline, claim.candidate, metric=metric, model=model,
                               step=step, n_boot=self.n_boot, level=self.level, seed=self.seed,
                               units=self.units(metric))

    def row(self, claim: Claim, model: str | None, measure: str, *args, **kwargs) -> ClaimRow:
        return _row(claim, model, *args, measure=measure, suffix=self.has_probe, **kwargs)


def _kl_cells(ctx: _Ctx, claim: Claim) -> list[tuple[str, str]]:
    """The (model, measure) pairs a KL claim has rows for: per model (in runs order), the measures both
    presets have, primary first."""
    def both(metric: str) -> set[str]:
        units = ctx.units(metric)
        return {m for m in sweep_models(ctx.data, claim.models)
                if (m, claim.baseline) in units and (m, claim.candidate) in units}

    have = {m: both(m) for m in ctx.measures(claim)}
    return [(model, m) for model in sweep_models(ctx.data, claim.models) for m in ctx.measures(claim)
            if model in have[m]]


def _zero_baseline(ctx: _Ctx, claim: Claim, model: str, exc: ValueError, metric: str) -> ClaimRow:
    name = measure_label(metric) if is_probe_metric(metric) else metric
    return ctx.row(claim, model, metric, f"{name} of {claim.baseline} is 0", "not measurable here",
                   f"the ratio is undefined: {claim.baseline} has zero {name} on (almost) every sequence, "
                   f"i.e. its sampler and learner agreed exactly ({exc})")


def _learner_precisions(data: SweepData, model: str, presets: Sequence[str]) -> set[str]:
    r = data.runs
    if "learner_precision" not in r.columns:
        return {"mxfp8"}
    sel = (r["model"].astype(str) == model) & r["preset"].isin(presets)
    return set(r.loc[sel, "learner_precision"].astype(str))


def _whole_run(ctx: _Ctx, claim: Claim, model: str, metric: str, paper_range: tuple[float, float] | None = None
               ) -> tuple[PresetComparison, tuple[Verdict, str, bool | None]] | ClaimRow:
    """A KL claim's whole-run comparison on ``model`` by ``metric`` and its direction verdict, or the
    "not measurable here" row when the baseline's KL is 0."""
    try:
        res = ctx.compare(claim, model, metric=metric)
    except ValueError as exc:
        return _zero_baseline(ctx, claim, model, exc, metric)
    c = res.comparison
    return res, direction_verdict(c.lo, c.hi, claim.direction, level=c.level, paper=claim.paper_ratio,
                                  paper_range=paper_range)


def _eval_kl_ratio(ctx: _Ctx, claim: Claim) -> list[ClaimRow]:
    rows = []
    for model, metric in _kl_cells(ctx, claim):
        judged = _whole_run(ctx, claim, model, metric, claim.paper_range)
        if isinstance(judged, ClaimRow):
            rows.append(judged)
            continue
        res, (verdict, why, inside) = judged
        c = res.comparison
        if claim.note:
            why += f"; {claim.note}"
        precision = _learner_precisions(ctx.data, model, (claim.baseline, claim.candidate))
        if claim.id in ("a", "b") and precision != {"mxfp8"}:
            why += f"; note: the learner precision of these runs is {sorted(precision)}, the claim is about MXFP8"
        rows.append(ctx.row(claim, model, metric, res.text, verdict, why, ratio=c.ratio, lo=c.lo, hi=c.hi,
                            paper_in_ci=inside))
    return rows


def _eval_first_step(ctx: _Ctx, claim: Claim) -> list[ClaimRow]:
    rows = []
    for model, metric in _kl_cells(ctx, claim):
        if is_probe_metric(metric):  # measured at the final weights only: a whole-run row
            judged = _whole_run(ctx, claim, model, metric)
            if isinstance(judged, ClaimRow):
                rows.append(judged)
                continue
            res, (verdict, why, inside) = judged
            c = res.comparison
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
            verdict = joint_verdict([v_all, "unresolved"])
            why = f"whole run: {why_all}; step {first}: not measured on both presets"
        else:
            s = step1.comparison
            v_1, why_1, _ = direction_verdict(s.lo, s.hi, claim.direction, level=s.level, paper=claim.paper_ratio)
            measured += f"; step {first}: {step1.text}"
            verdict = joint_verdict([v_all, v_1])
            why = f"whole run: {why_all}; step {first}: {why_1}"
        rows.append(ctx.row(claim, model, metric, measured, verdict, why, ratio=c.ratio, lo=c.lo, hi=c.hi,
                            paper_in_ci=inside))
    return rows


def _eval_sync(ctx: _Ctx, claim: Claim) -> list[ClaimRow]:
    """Claim (c) over the syncs whose sampler holds layers on the learner's grid (:mod:`.syncs`), judged by
    their W2 checks; the other syncs' checks are stated beside it, not counted. No such sync: no row."""
    groups = sync_groups(ctx.data)
    on = next((g for g in groups if g.on_learner_grid), None)
    w2 = None if on is None else on.tally("W2")
    if w2 is None:
        return []
    presets = ", ".join(on.presets)
    measured = (f"{w2} W2 checks passed at the {on.syncs} syncs of {on.runs} run{'s' * (on.runs != 1)} on the "
                f"learner's grid ({presets}); "
                f"all conditions there: {on.checks} checks passed")
    if w2.failed == 0:
        verdict: Verdict = "reproduced"
        why = (f"every W2 check on the learner's grid passed: at each of the {on.syncs} syncs of {presets} "
               f"{on.shows}")
    else:
        verdict = "contradicted"
        why = f"{w2.failed} W2 check(s) on the learner's grid failed, e.g. " + "; ".join(on.failed(("W2",)))
    others = [g.summary() for g in groups if g is not on]
    if others:
        why += "; not on the learner's grid, so not counted in (c): " + "; ".join(others)
    return [_row(claim, None, measured, verdict, why, value=w2.passed / w2.total)]


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g} ms"


def _per_cost_model(one: Callable[[_Ctx, Claim, str | None, CostModel], ClaimRow]
                    ) -> Callable[[_Ctx, Claim], list[ClaimRow]]:
    """An evaluator with one row per model of the sweep's cost models: ``one``'s row where the model was
    fitted, a "no fit" row (not measurable here) where the fit is impossible."""
    def evaluate(ctx: _Ctx, claim: Claim) -> list[ClaimRow]:
        return [_row(claim, model, "no fit", "not measurable here", f"the cost model cannot be fitted: {cm}")
                if isinstance(cm, str) else one(ctx, claim, model, cm) for model, cm in ctx.cost_models()]

    return evaluate


@_per_cost_model
def _eval_cost_fixed(ctx: _Ctx, claim: Claim, model: str | None, cm: CostModel) -> ClaimRow:
    ci = cm.delta_fixed_ci
    ci_txt = f", {cm.level:.0%} CI [{_ms(ci[0])}, {_ms(ci[1])}]" if ci else ""
    measured = f"Δfixed = {_ms(cm.delta_fixed)} per micro-batch{ci_txt}"
    if ci is None:
        return _row(claim, model, measured, "not measurable here", "no bootstrap interval (n_boot=0)",
                    value=cm.delta_fixed)
    verdict, why, _ = direction_verdict(ci[0] * 1e3, ci[1] * 1e3, "higher", null=0.0, level=cm.level, unit=" ms")
    if ctx.data.emulated:
        why += ("; on CPU emulation the fixed part (weight quantization, extra kernels per micro-batch) is the "
                "part of the cost model that transfers")
    return _row(claim, model, measured, verdict, why, value=cm.delta_fixed)


@_per_cost_model
def _eval_cost_break_even(ctx: _Ctx, claim: Claim, model: str | None, cm: CostModel) -> ClaimRow:
    measured = f"status {cm.status}: {cm.verdict}"
    value = cm.break_even
    if ctx.data.emulated:
        return _row(claim, model, measured, "not measurable here",
                    "CPU emulation has no FP8 tensor cores, so MXFP8 cannot save per-token time here and a "
                    "break-even measured on it says nothing about FP8 hardware; the cost model's finding: "
                    f"{cm.headline}", value=value)
    if cm.status == "break_even":
        ci = cm.break_even_ci
        inside = None if ci is None else bool(ci[0] <= claim.paper_ratio <= ci[1])
        why = f"MXFP8 pays off above ≈{cm.break_even:.0f} tokens per micro-batch"
        if ci is not None:
            why += (f"; the paper's {claim.paper_ratio:.0f} lies {'inside' if inside else 'outside'} the "
                    f"{cm.level:.0%} CI [{ci[0]:.0f}, {ci[1]:.0f}]")
        return _row(claim, model, measured, "reproduced", why, value=value, paper_in_ci=inside)
    if cm.status == "unresolved":
        return _row(claim, model, measured, "unresolved",
                    f"no difference resolved: the per-token saving's CI includes 0; {cm.verdict}")
    return _row(claim, model, measured, _BREAK_EVEN_VERDICT[cm.status], cm.verdict, value=value)


#: claim f2's verdict by the cost model's status where it is neither a break-even nor unresolved: no crossing
#: (MXFP8 never pays, or always does) contradicts "break-even ≈ 4.5k"; a crossing far outside the measured
#: token range is an extrapolation, so unresolved
_BREAK_EVEN_VERDICT: dict[str, Verdict] = {"no_break_even": "contradicted", "always_faster": "contradicted",
                                           "out_of_range": "unresolved"}


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


def _eval_trace(ctx: _Ctx, claim: Claim) -> list[ClaimRow]:
    if ctx.trace_paths is None:
        return [_row(claim, None, "no trace", "not measurable here",
                     "no GPU profiler trace was supplied (trace_paths={'mxfp8': …, 'bf16': …}); a CPU run has no "
                     "device timeline on which the GPU could wait")]
    from fp8rl_core.metrics import added_time_idle_fraction

    m, b = _trace_pair(ctx.trace_paths)
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
    return [_row(claim, None, measured, "contradicted", f"only {frac:.0%} of the added time is the GPU waiting for "
                 "the host (the claim needs most of it, > 50%)", value=frac)]


def _eval_time(ctx: _Ctx, claim: Claim) -> list[ClaimRow]:
    rows = []
    for model in sweep_models(ctx.data, claim.models):
        try:
            res = compare_times(ctx.data, model, claim.baseline, claim.candidate, claim.metric, n_boot=ctx.n_boot,
                                level=ctx.level, seed=ctx.seed)
        except ValueError as exc:
            rows.append(_row(claim, model, "no usable times", "not measurable here", str(exc)))
            continue
        if res is None:
            continue
        c = res.comparison
        verdict, why, inside = direction_verdict(c.lo, c.hi, claim.direction, level=c.level, paper=claim.paper_ratio)
        if ctx.data.emulated:
            why = f"{_CPU_TIMING} (measured: {why})"
            verdict = "not measurable here"
        rows.append(_row(claim, model, res.text, verdict, why, ratio=c.ratio, lo=c.lo, hi=c.hi, paper_in_ci=inside))
    return rows


#: the evaluator of each claim kind: (evaluation context, claim) → the claim's rows
EVALUATORS: dict[ClaimKind, Callable[[_Ctx, Claim], list[ClaimRow]]] = {
    "kl_ratio": _eval_kl_ratio,
    "kl_ratio_first_step": _eval_first_step,
    "sync": _eval_sync,
    "cost_fixed": _eval_cost_fixed,
    "cost_break_even": _eval_cost_break_even,
    "trace": _eval_trace,
    "time_ratio": _eval_time,
}


# --------------------------------------------------------------------------------------------- public

def evaluate_claims(data: SweepData, *, trace_paths: Any = None, n_boot: int = 2000, level: float = 0.95,
                    seed: int = 0, claims: Sequence[Claim] = CLAIMS) -> list[ClaimRow]:
    """One :class:`ClaimRow` per (claim, model) the sweep can test — per (claim, model, measure) for the KL
    claims when the sweep has a probe table, the exact probe KL row first — in ``claims`` order. A claim
    the sweep cannot test has no row (:func:`absent_claims`). The rules: docs/metrics.md.

    ``trace_paths``: optional GPU profiler traces for claim g, ``{"mxfp8": path, "bf16": path}`` or a
    pair (mxfp8, bf16) of anything :func:`fp8rl_core.metrics.load_trace` reads. ``n_boot``, ``level``,
    ``seed``: every bootstrap's settings (seeded: deterministic)."""
    ctx = _Ctx(data, n_boot, level, seed, trace_paths)
    rows: list[ClaimRow] = []
    for claim in claims:
        rows += EVALUATORS[claim.kind](ctx, claim)
    return _with_power(rows, ctx, level, {c.id: c for c in claims})


def _with_power(rows: list[ClaimRow], ctx: _Ctx, level: float, claims: Mapping[str, Claim]) -> list[ClaimRow]:
    """Each unresolved KL row (exact probe or sampled-token) with the power calculation on its own units
    appended to its ``why`` (:func:`~.power.claim_power`): what this design could resolve (with ≥ 2 seeds)
    and the sample a resolution of the paper's ratio would need (:func:`~.claims.needed_text`)."""
    out = []
    for r in rows:
        claim = claims.get(r.id)
        p = None
        step = None
        if r.verdict == "unresolved" and r.measure is not None and r.ratio is not None and claim is not None:
            units = ctx.units(r.measure)
            if claim.kind == "kl_ratio_first_step" and not is_probe_metric(r.measure):
                # "from the first step": step 1 has the fewest sequences, so its interval is the one to resolve
                step = int(min(units[(r.model, p_)].keys[:, 1].min() for p_ in (claim.baseline, claim.candidate)))
            p = claim_power(units, claim, r.model, level=level, step=step)
        if p is not None:
            units = "probe sequences" if r.measure == PROBE_MEASURE else "sequences"
            design = "" if p.estimate.components.seeds < 2 else (
                f"; power{'' if step is None else f' at step {step}'}: {p.seeds} seeds × {p.sequences} {units} resolve only ratios ≤ {1 / p.resolvable:.2f} or "
                f"≥ {p.resolvable:.2f} (80% power)")
            need = "" if p.estimate.needed is None else "; " + ("" if step is None else f"at step {step}: ") + \
                needed_text(p.estimate.needed, f"the paper's {p.target:g}")
            r = replace(r, why=r.why + design + need)
        out.append(r)
    return out


def absent_claims(data: SweepData, rows: Sequence[ClaimRow] | None = None,
                  claims: Sequence[Claim] = CLAIMS) -> list[AbsentClaim]:
    """The claims this sweep does not test: an :class:`AbsentClaim` for each claim with no row in ``rows``
    (the output of :func:`evaluate_claims`; computed when not given)."""
    if rows is None:
        rows = evaluate_claims(data, n_boot=200, claims=claims)
    have = {r.id for r in rows}
    return [AbsentClaim(c.id, f"({c.id}) {c.text}", c.needs) for c in claims if c.id not in have]
