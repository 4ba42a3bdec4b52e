"""Whether a KL claim's factor (candidate / baseline exact probe KL) is the same on every model of a
sweep: each later model's factor relative to the first model's, with the interval of
:func:`fp8rl_core.metrics.compare_factors`. On the MoE grid sweeps it is the block-size ablation.
Specified in docs/metrics.md ("Claims and verdicts", "Factors across models").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fp8rl_core.metrics import Comparison, ci_side, compare_factors

from .claims import CLAIMS, KL_KINDS, PROBE_MEASURE, Claim
from .compare import describe_ratio, fmt_number, match_presets
from .data import SweepData, probe_units, sweep_models

__all__ = ["FactorAcrossModels", "factors_across_models"]


@dataclass(frozen=True)
class FactorAcrossModels:
    """One KL claim's factor on ``model`` relative to the same factor on ``reference`` (the sweep's first
    model): ``comparison.a`` / ``comparison.b`` are the two factors, ``comparison.ratio`` their quotient
    (model's / reference's) with its interval; ``seeds`` and ``sequences`` counted on (reference, model);
    ``verdict`` in words."""

    claim: str
    candidate: str
    baseline: str
    reference: str
    model: str
    comparison: Comparison
    seeds: tuple[int, int]
    sequences: tuple[int, int]
    verdict: str


def _verdict(cmp: Comparison, model: str, ref: str, level: float) -> str:
    factors = f"{fmt_number(cmp.b)}× vs {fmt_number(cmp.a)}× on {ref}"
    side = ci_side(cmp.lo, cmp.hi)  # the verdicts' one rule; a quotient has no claimed side
    if side == "lower":
        return f"the factor is smaller on {model}: {factors} ({describe_ratio(cmp.ratio, cmp.lo, cmp.hi, level)})"
    if side == "higher":
        return f"the factor is larger on {model}: {factors} ({describe_ratio(cmp.ratio, cmp.lo, cmp.hi, level)})"
    return (f"no change resolved: {fmt_number(cmp.b)}× on {model} vs {fmt_number(cmp.a)}× on {ref} "
            f"(quotient {fmt_number(cmp.ratio)}, {level:.0%} CI {fmt_number(cmp.lo)}–{fmt_number(cmp.hi)})")


def factors_across_models(data: SweepData, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                          claims: Sequence[Claim] = CLAIMS) -> list[FactorAcrossModels]:
    """For each KL-ratio claim whose presets two or more models of the sweep ran with exact probe units
    (paired by seed and probe sequence): the factor on every later model relative to the first, in
    sweep order. No probe table or a single model → ``[]``."""
    if data.probe.empty:
        return []
    units = probe_units(data, PROBE_MEASURE, ("model", "preset"))
    out: list[FactorAcrossModels] = []
    for claim in claims:
        if claim.kind not in KL_KINDS:  # d included: its probe comparison is whole-run (final weights)
            continue
        sides = []
        for model in sweep_models(data, claim.models):
            m = match_presets(units, model, claim.baseline, claim.candidate)
            if m is not None and m.paired:
                sides.append((model, m))
        if len(sides) < 2:
            continue
        ref, first = sides[0]
        for model, m in sides[1:]:
            try:
                cmp = compare_factors((first.a, first.b, first.a_seeds), (m.a, m.b, m.a_seeds), n_boot=n_boot,
                                      level=level, seed=seed)
            except ValueError:
                continue  # a baseline KL of exactly 0 on one model: no factor to compare (its claim row says so)
            out.append(FactorAcrossModels(f"({claim.id}) {claim.text}", claim.candidate, claim.baseline, ref, model,
                                          cmp, (first.n_seeds, m.n_seeds), (first.n_units, m.n_units),
                                          _verdict(cmp, model, ref, level)))
    return out
