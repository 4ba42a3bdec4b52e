"""The fixed-weights matching report's claims: the paper's matching claims measured as the paper measured them
(one checkpoint, the sampler's layers switched, KL on the same sequences), per checkpoint and across
checkpoints, with the tails, the power of the design and the ablation of what the ``all`` sampler still
computes differently. The engine axis: :mod:`.engines`; :func:`write_matching_report` writes the report file. Statistics:
:mod:`fp8rl_core.metrics.matching`; what each row means: docs/fixed-weights.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fp8rl_core.model_kind import is_moe
from fp8rl_core.metrics.matching import (MatchingPower, MatchingRatio, SeedInfluence, matching_power, matching_ratio,
                                         most_influential_seed)
from fp8rl_core.sampler.config import SAMPLER_ENGINES

from .claims import CLAIMS, KL_KINDS, Claim, claim_verdict, needed_text
from .data import SweepData, matching_frame
from .engines import engine_rows, engines_figure, engines_section
from .text import f3, ratio_text, table

__all__ = ["COMPARISONS", "ClaimAtFixedWeights", "Comparison", "SeedLeftOut", "claim_rows", "forest",
           "write_matching_report"]


@dataclass(frozen=True)
class Comparison:
    """One comparison the report makes: candidate ``b`` relative to baseline ``a``, what the paper says
    (``paper`` ratio, ``paper_text``), whether lower is the claimed side, and which models it is about."""

    claim: str
    a: str
    b: str
    paper: float | None
    paper_text: str
    expect: str  # "lower", "higher", or "" (a measured quantity, no claimed side)
    models: str = "any"  # "any", "dense", "moe"


    @classmethod
    def of(cls, claim: Claim) -> "Comparison":
        """The comparison of a KL claim of the paper (:data:`~fp8rl_core.report.claims.CLAIMS`): its presets, number
        (a range's lower end), claimed side and models."""
        paper = claim.paper_ratio if claim.paper_ratio is not None else claim.paper_range[0]
        return cls(f"({claim.id}) {claim.short}", claim.baseline, claim.candidate, paper, claim.paper_short,
                   claim.direction, claim.models)


#: the comparisons, in report order: the paper's KL claims (:data:`~fp8rl_core.report.claims.CLAIMS`,
#: docs/design.md, reference results), then what the experiment measures besides them
COMPARISONS: tuple[Comparison, ...] = (
    *(Comparison.of(c) for c in CLAIMS if c.kind in KL_KINDS),
    Comparison("requantized from BF16 vs the learner's bytes", "all", "requant", None, "—", ""),
    Comparison("the BF16 sampler on SGLang vs on vLLM", "bf16-sampler", "bf16-sampler@sglang", None, "—", ""),
    Comparison("BF16 end to end on SGLang vs on vLLM", "bf16-e2e", "bf16-e2e@sglang", None, "—", ""),
)


def _median(r: MatchingRatio) -> str:
    return f"{f3(r.median_ratio)} ({f3(r.median_lo)} … {f3(r.median_hi)})"


def _models(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["model"].astype(str)))


@dataclass(frozen=True)
class SeedLeftOut:
    """The pooled comparison without the seed that moves it most (:class:`SeedInfluence`): its ``pooled`` ratio
    with the interval and ``verdict`` (the claim's rule; a measured quantity: the interval's side)."""

    influence: SeedInfluence
    pooled: MatchingRatio
    verdict: str


@dataclass(frozen=True)
class ClaimAtFixedWeights:
    """One comparison on one model: across checkpoints (``pooled``), per checkpoint (``per_checkpoint``, in
    checkpoint order), per probe source (``by_source``), its power, the pooled comparison without its most
    influential seed (``left_out``; ``None`` under 3 seeds), and the verdict in words."""

    model: str
    comparison: Comparison
    pooled: MatchingRatio
    per_checkpoint: dict[str, MatchingRatio]
    by_source: dict[str, MatchingRatio]
    power: MatchingPower | None
    left_out: SeedLeftOut | None
    verdict: str

    def counts(self) -> dict[str, int]:
        out = {"lower": 0, "higher": 0, "unresolved": 0}
        for r in self.per_checkpoint.values():
            out[r.direction] += 1
        return out


def _side(c: Comparison, r: MatchingRatio) -> str:
    """A pooled interval's verdict: the claim's rule (:func:`~.claims.claim_verdict`), or for a measured quantity
    (no claimed side) the interval's side."""
    return claim_verdict(r.lo, r.hi, c.expect) if c.expect else r.direction


def _one_seed(c: Comparison, pooled: MatchingRatio, left: SeedLeftOut | None) -> str:
    """The clause a verdict gets when leaving one seed out changes it (else nothing)."""
    if left is None or left.verdict == _side(c, pooled):
        return ""
    i = left.influence
    return (f"; one seed decides it: without seed {i.seed} (its checkpoints {i.share:.0%} of `{c.a}`'s KL) "
            f"{ratio_text(left.pooled)}, {left.verdict}")


def _verdict(c: Comparison, pooled: MatchingRatio, per: dict[str, MatchingRatio], power: MatchingPower | None,
             left: SeedLeftOut | None = None) -> str:
    """The comparison's verdict in words. A claim: :func:`~.claims.claim_verdict` on the pooled CI (reproduced /
    contradicted / unresolved), then what the checkpoints say, whether one seed left out changes it
    (``left``), the paper's size, and for an unresolved one the sample a resolution needs
    (:func:`~.claims.needed_text`, checkpoints as the groups). A measured quantity (no claimed side): the
    pooled CI's side."""
    n = len(per)
    dirs = [r.direction for r in per.values()]
    lower, higher = dirs.count("lower"), dirs.count("higher")
    if not c.expect:
        if pooled.direction == "unresolved":
            return (f"no difference resolved (pooled CI includes 1; {lower} of {n} checkpoints lower, {higher} higher)"
                    + _one_seed(c, pooled, left))
        return (f"{pooled.direction} at {dirs.count(pooled.direction)} of {n} checkpoints ({f3(pooled.ratio)} pooled)"
                + _one_seed(c, pooled, left))
    verdict = claim_verdict(pooled.lo, pooled.hi, c.expect)
    claimed = dirs.count(c.expect)
    other = lower if c.expect == "higher" else higher
    side = "below" if c.expect == "lower" else "above"
    if verdict == "reproduced":
        text = f"reproduced: the pooled CI lies {side} 1; {claimed} of {n} checkpoints on the claimed side"
        if other:
            text += f", {other} the other way"
    elif verdict == "contradicted":
        text = (f"contradicted: the pooled CI lies {'above' if c.expect == 'lower' else 'below'} 1; {other} of {n} "
                f"checkpoints the other way, {claimed} on the claimed side")
    else:
        text = (f"unresolved: the pooled CI includes 1; {claimed} of {n} checkpoints on the claimed side, {other} the "
                f"other way")
        if claimed and other:
            text += " — the effect depends on the checkpoint"
    text += _one_seed(c, pooled, left)
    if c.paper is not None:
        inside = pooled.lo <= c.paper <= pooled.hi
        if inside:
            text += f"; the paper's {c.paper_text} lies inside the pooled CI"
        elif verdict == "reproduced":
            larger = pooled.hi < c.paper if c.expect == "lower" else pooled.lo > c.paper
            text += f"; the effect is {'larger' if larger else 'smaller'} than the paper's {c.paper_text}"
        else:
            text += f"; the paper's {c.paper_text} lies outside the pooled CI"
    if verdict == "unresolved" and power is not None:
        text += "; " + needed_text(power.needed, f"the paper's {f3(power.target)}", "checkpoints")
    return text


def claim_rows(data: SweepData, *, n_boot: int = 2000, seed: int = 0) -> list[ClaimAtFixedWeights]:
    """Every comparison of :data:`COMPARISONS` whose two variants were measured, per model."""
    m = matching_frame(data)
    out = []
    for model in _models(m):
        rows = m[m["model"].astype(str) == model].to_dict("records")
        have = {r["variant"] for r in rows}
        order = list(dict.fromkeys(r["checkpoint"] for r in rows))
        for c in COMPARISONS:
            if c.a not in have or c.b not in have or (c.models == "moe" and not is_moe(model)) \
                    or (c.models == "dense" and is_moe(model)):
                continue
            pooled = matching_ratio(rows, c.a, c.b, n_boot=n_boot, seed=seed)
            per = {ck: matching_ratio(rows, c.a, c.b, checkpoint=ck, n_boot=n_boot, seed=seed) for ck in order}
            srcs = {s: matching_ratio(rows, c.a, c.b, source=s, n_boot=n_boot, seed=seed)
                    for s in dict.fromkeys(r["source"] for r in rows)}
            target = c.paper if c.paper is not None and c.paper != 1 else 0.9
            power = matching_power(rows, c.a, c.b, target=target) if pooled.units > 2 else None
            left = None
            if (influence := most_influential_seed(rows, c.a, c.b)) is not None:
                rest = [r for r in rows if int(r["seed"]) != influence.seed]
                without = matching_ratio(rest, c.a, c.b, n_boot=n_boot, seed=seed)
                left = SeedLeftOut(influence, without, _side(c, without))
            out.append(ClaimAtFixedWeights(model, c, pooled, per, srcs, power, left,
                                           _verdict(c, pooled, per, power, left)))
    return out


def _design(data: SweepData) -> list[str]:
    m, ch = matching_frame(data), data.matching_checks
    per_model = {mo: g for mo, g in m.groupby("model", sort=False)}
    counts = "; ".join(f"{mo}: {g['checkpoint'].nunique()} checkpoints (seeds "
                       f"{', '.join(map(str, sorted({int(x) for x in g['seed']})))})" for mo, g in per_model.items())
    steps = sorted({int(s) for s in m["step"]})
    per = m.groupby(["model", "checkpoint", "variant", "source"]).size()
    sizes = per.groupby("source").max().to_dict()
    variants = list(dict.fromkeys(m["variant"]))
    named = sorted({str(c) for c in m["checkpoint"] if not re.fullmatch(r"seed\d+/step\d+", str(c))})
    where = (f"each seed's warm start and the learner after RL steps {', '.join(map(str, steps))} from it" if not named
             else f"the named checkpoints {', '.join(f'`{c}`' for c in named)} (matching.checkpoints: Hugging Face "
             "directories or a verl run's saved steps; the seed draws the probes)")
    lines = ["## Design", "",
             f"{counts}; {where}; {len(variants)} variants ({', '.join(f'`{v}`' for v in variants)}). Each variant "
             "gets each checkpoint's learner weights through the normal sync path (export → sync → W1–W7 at the full "
             "tier), then the exact full-vocabulary KL(sampler‖learner) is measured on "
             f"{sizes.get('held-out', 0)} held-out sequences (the same for every variant) and {sizes.get('sampled', 0)} "
             "of the variant's own rollouts (one completion per probe prompt, one sampling seed for every variant: paired "
             "by prompt; completion positions only). Ratios pair by (checkpoint, source, sequence); the pooled "
             "interval resamples checkpoints, then sequences.", ""]
    if not ch.empty:
        main = ch[~ch["ablation"].astype(bool)]
        abl = ch[ch["ablation"].astype(bool)]
        lines += [f"Checks: {int(main['passed'].sum())} of {len(main)} syncs of the presets passed all seven conditions"
                  + (" (a failed one stops the run: no KL is measured on weights the learner does not hold)." if
                     len(main) else ".")]
        if len(abl):
            failed = abl[~abl["passed"].astype(bool)]
            what = "; ".join(f"`{v}`: {', '.join(sorted(set(','.join(g['failed']).split(','))))} "
                             f"({len(g)} of {int((abl['variant'] == v).sum())})" for v, g in failed.groupby("variant"))
            lines += [f"Ablation syncs: {int(abl['passed'].sum())} of {len(abl)} passed every condition"
                      + (f"; failed — as the switch makes them (the sampler then computes differently from what "
                         f"the checks expect of a run): {what}." if what else ".")]
        lines += [""]
    return lines


def _claims(rows: list[ClaimAtFixedWeights]) -> list[str]:
    lines = ["## The matching claims at fixed weights", "",
             "Ratio of mean KL per position (b / a) over every checkpoint and both probe sources, 95% CI (two-stage "
             "bootstrap); *median ratio*: the robust companion, exp of the median over sequences of the paired "
             "per-position log ratio; *checkpoints*: how many of the per-checkpoint CIs lie below 1 / above 1 / "
             "include 1. These answer \"does matching the learner's grid lower the KL at these weights\"; the RL "
             "sweeps' rows answer \"does it still pay after RL has moved each run's weights\".", ""]
    body = []
    for r in rows:
        cnt = r.counts()
        rng = [x.ratio for x in r.per_checkpoint.values()]
        body.append([r.model, r.comparison.claim, r.comparison.paper_text, ratio_text(r.pooled), _median(r.pooled),
                     f"{cnt['lower']} / {cnt['higher']} / {cnt['unresolved']}", f"{f3(min(rng))} … {f3(max(rng))}",
                     f"**{r.verdict}**"])
    lines += table(["model", "comparison (b vs a)", "paper", "ratio b/a (CI)", "median ratio (CI)",
                     "checkpoints lower / higher / unresolved", "per-checkpoint range", "verdict"], body)
    return lines + [""]


def _per_checkpoint(rows: list[ClaimAtFixedWeights]) -> list[str]:
    lines = ["## Per checkpoint", "",
             "Each checkpoint's ratio with its 95% CI (sequences resampled), its median ratio, both means (µnats per "
             "position) and the share of b's mean KL its heaviest 1% of sequences carry.", ""]
    for r in rows:
        lines += [f"**{r.model}: {r.comparison.claim}** (`{r.comparison.b}` / `{r.comparison.a}`)", ""]
        lines += table(["checkpoint", "ratio (CI)", "median ratio (CI)", f"{r.comparison.a} µnats", f"{r.comparison.b} µnats",
                         f"top 1% share of {r.comparison.b}", "direction"],
                        [[ck, ratio_text(x), _median(x), f"{1e6 * x.a_mean:.4g}", f"{1e6 * x.b_mean:.4g}",
                          f"{x.b_tail.top1pct:.0%}", x.direction] for ck, x in r.per_checkpoint.items()])
        lines += [""]
    return lines


def _sources(rows: list[ClaimAtFixedWeights]) -> list[str]:
    srcs = list(dict.fromkeys(s for r in rows for s in r.by_source))
    lines = ["## By probe source", "",
             "The pooled ratio on the held-out sequences alone and on the variants' own rollouts alone.", ""]
    lines += table(["model", "comparison", *srcs],
                    [[r.model, r.comparison.claim, *(ratio_text(r.by_source[s]) if s in r.by_source else "—" for s in srcs)]
                     for r in rows])
    return lines + [""]


def _seed_left_out(rows: list[ClaimAtFixedWeights]) -> list[str]:
    body = [[r.model, r.comparison.claim, str(r.left_out.influence.seed), f"{r.left_out.influence.share:.0%}",
             ratio_text(r.pooled), ratio_text(r.left_out.pooled), _median(r.left_out.pooled), r.left_out.verdict,
             "yes" if r.left_out.verdict != _side(r.comparison, r.pooled) else "no"]
            for r in rows if r.left_out is not None]
    if not body:
        return []
    lines = ["## One seed left out", "",
             "The ratio of means weighs each checkpoint by its KL, so a seed whose checkpoints' KL is far above the "
             "others' can carry a pooled verdict. Per comparison (3 seeds or more), the seed whose absence moves the "
             "pooled ratio most (`fp8rl_core.metrics.matching.most_influential_seed`), its checkpoints' share of the "
             "baseline's summed KL, and the pooled comparison without it (the same two-stage bootstrap).", ""]
    lines += table(["model", "comparison", "seed left out", "its share of a's KL", "ratio b/a (CI)",
                     "without it (CI)", "median ratio without it (CI)", "verdict without it", "verdict changes"], body)
    return lines + [""]


def _tails(data: SweepData) -> list[str]:
    from fp8rl_core.metrics.matching import tail_share

    m = matching_frame(data)
    body = []
    for (model, variant), g in m.groupby(["model", "variant"], sort=False):
        shares = [tail_share(part["kl"].to_numpy()) for _, part in g.groupby("checkpoint", sort=False)]
        pooled = tail_share(g["kl"].to_numpy())
        body.append([model, variant, f"{pooled.top1pct:.0%}", f"{min(s.top1pct for s in shares):.0%} … "
                     f"{max(s.top1pct for s in shares):.0%}", f"{max(s.top5 for s in shares):.0%}",
                     f"{1e6 * g['kl'].sum() / g['positions'].sum():.4g}",
                     f"{1e6 * float(np.median(g['kl'] / g['positions'])):.4g}"])
    lines = ["## Heavy tails", "",
             "How much of each variant's mean KL its heaviest sequences carry: the top 1% of sequences pooled over "
             "checkpoints, per checkpoint (range), the five heaviest at the worst checkpoint; and the mean beside the "
             "median per-position KL (µnats). A mean carried by a few sequences has a wide CI, which the bootstrap "
             "shows; the median ratio above is the comparison they cannot move.", ""]
    lines += table(["model", "variant", "top 1% share (pooled)", "top 1% per checkpoint", "top 5 at worst checkpoint",
                     "mean µnats/pos", "median µnats/pos"], body)
    return lines + [""]


def _power(rows: list[ClaimAtFixedWeights]) -> list[str]:
    lines = ["## Power", "",
             "From this experiment's own units (`fp8rl_core.metrics.matching.matching_power`): σ² of the "
             "log-ratio influence within checkpoints (sequence to sequence; per checkpoint as a range) and between "
             "checkpoints (how far their own ratios differ beyond sequence noise). At one checkpoint the weights are "
             "fixed, so sequences alone set the CI: *resolvable* f means a ratio ≤ 1/f or ≥ f is resolved with 80% "
             "power at 95%. *Sequences needed* resolve the paper's ratio (0.9 where the paper has none) at one "
             "checkpoint; *checkpoints needed* resolve it pooled, at this many sequences each.", ""]
    body = []
    for r in rows:
        p = r.power
        if p is None:
            continue
        w = list(p.within_by_checkpoint.values())
        body.append([r.model, r.comparison.claim, f"{p.checkpoints} × {p.sequences}", f"{p.components.within:.3g} "
                     f"({min(w):.3g} … {max(w):.3g})", f"{p.components.between:.3g}", f"{p.resolvable:.3f}",
                     f"{f3(p.target)}: {p.sequences_for_target}", f"{p.pooled_resolvable:.3f}",
                     "—" if p.checkpoints_for_target is None else str(p.checkpoints_for_target)])
    lines += table(["model", "comparison", "checkpoints × sequences", "σ² within (per checkpoint)", "σ² between",
                     "resolvable f per checkpoint", "sequences needed per checkpoint", "resolvable f pooled",
                     "checkpoints needed"], body)
    return lines + [""]


#: what each ablation switch removes, in the report's words
SWITCHES = {
    "engine": "the engine computes in float32 (activations, attention, norms, residual adds, KV cache and logits no "
              "longer rounded to BF16 in the sampler)",
    "learner": "the learner side is its fp32 function of exactly the synced weights (no BF16 autocast rounding in "
               "the learner's attention, norms, residual stream and logits)",
    "activations": "the sampler's on-grid layers quantize activations with another E8M0 rule than the learner "
                   "(an online activation quantizer of its own, as a GPU sampler's kernels have)",
}


def _on_other_engine(variant: str) -> bool:
    """Whether ``variant`` (a :attr:`fp8rl_core.matching.Variant.name`) runs on another engine than vLLM."""
    return "@" in variant and variant.split("@", 1)[1].split(",")[0] in SAMPLER_ENGINES[1:]


def _ablation(data: SweepData, n_boot: int, seed: int) -> list[str]:
    m = matching_frame(data)
    abl = m[m["ablation"].astype(bool) & ~m["variant"].astype(str).map(_on_other_engine)]
    if abl.empty:
        return []
    lines = ["## Ablation: what the `all` sampler still computes differently", "",
             "At the same checkpoints and probe sequences, each variant switches one difference between the sampler "
             "and the learner off (or, for the activation rule, on). *vs preset*: the variant's KL relative to its "
             "preset as runs configure it; *(b) under the switch*: `all` relative to `bf16-sampler` when both have "
             "the same switches. Switches: " + "; ".join(f"`{k}=…` — {v}" for k, v in SWITCHES.items()) + ".", ""]
    body = []
    for model in _models(m):
        rows = m[m["model"].astype(str) == model].to_dict("records")
        variants = list(dict.fromkeys(r["variant"] for r in rows))
        for v in variants:
            if "@" not in v or _on_other_engine(v):  # the engines have their own section
                continue
            preset, switches = v.split("@", 1)
            if preset not in variants:
                continue
            vs = matching_ratio(rows, preset, v, n_boot=n_boot, seed=seed)
            twin = {"all": "bf16-sampler", "bf16-sampler": "all"}.get(preset)
            other = f"{twin}@{switches}" if twin else None
            b = None
            if other in variants:
                a_, b_ = (other, v) if preset == "all" else (v, other)
                b = matching_ratio(rows, a_, b_, n_boot=n_boot, seed=seed)
            body.append([model, f"`{v}`", f"{1e6 * vs.b_mean:.4g}", ratio_text(vs), "—" if b is None else ratio_text(b)])
        for base in ("all", "bf16-sampler"):
            if base in variants:
                g = [r for r in rows if r["variant"] == base]
                mean = sum(r["kl"] for r in g) / sum(r["positions"] for r in g)
                body.append([model, f"`{base}` (as runs configure it)", f"{1e6 * mean:.4g}", "1", "—"])
    lines += table(["model", "variant", "KL µnats/pos", "vs preset (CI)", "(b) under the switch (CI)"], body)
    return lines + [""]


def _requant(data: SweepData, rows: list[ClaimAtFixedWeights]) -> list[str]:
    """requant vs all at fixed weights: the ratio with its verdict sentence, and the byte fractions W2
    measured at the requant syncs (mean over them, per layer kind)."""
    import re

    from fp8rl_core.schemas.dsl import REQUANT_COLUMNS
    from fp8rl_core.vocabulary import requant_column

    from .requant import requant_verdict

    found = [r for r in rows if (r.comparison.a, r.comparison.b) == ("all", "requant")]
    if not found:
        return []
    ch = matching_frame(data, "matching_checks")
    cols = [c for c in ch.columns if re.fullmatch(REQUANT_COLUMNS, str(c))]
    body = []
    for r in found:
        sel = ch[(ch["model"].astype(str) == r.model) & (ch["variant"] == "requant")] if cols else ch.iloc[0:0]
        frac = {c: float(sel[c].mean()) for c in cols if not sel.empty and sel[c].notna().any()}
        pct = lambda k: "–" if frac.get(k) is None else f"{frac[k]:.2%}"  # noqa: E731
        kinds = sorted({c.rsplit("/", 1)[-1] for c in frac if c.count("/") == 2})
        per = "; ".join(f"{k} {pct(requant_column('data_bytes_differ', k))} / {pct(requant_column('scale_bytes_differ', k))}"
                        for k in kinds)
        p = r.pooled
        body.append([r.model, ratio_text(p), _median(p), f"{r.counts()['higher']} / {r.counts()['lower']} / "
                     f"{r.counts()['unresolved']}", f"{pct(requant_column('data_bytes_differ'))} / "
                     f"{pct(requant_column('scale_bytes_differ'))}" + (f" ({per})" if per else ""),
                     requant_verdict(p.ratio, p.lo, p.hi, p.level, r.model, "probe_kl")])
    lines = ["## Requantization: requant vs all at fixed weights", "",
             "The sampler that quantizes the BF16 view itself with vLLM's online MXFP8 rule (`requant`) against the "
             "one fed the learner's bytes (`all`), at the same weights: KL ratio (95% CI, pooled), its median ratio, "
             "checkpoints higher / lower / unresolved, and the fraction of E4M3 data / E8M0 scale bytes W2 measured "
             "differing from the learner's at the requant syncs (mean over them; per layer kind).", ""]
    lines += table(["model", "requant / all (CI)", "median ratio (CI)", "checkpoints higher / lower / unresolved",
                     "bytes differing: data / scale", "verdict"], body)
    return lines + [""]


def forest(rows: list[ClaimAtFixedWeights], path: str | Path) -> Path:
    """Per-checkpoint ratios with their CIs, one panel per model, one colour per comparison, the paper's ratio
    marked; log x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 0.5 + 0.32 * max(
        sum(len(r.per_checkpoint) + 1 for r in rows if r.model == mo) for mo in models)), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, model in zip(axes[0], models):
        y = 0
        ticks, labels = [], []
        for i, r in enumerate(x for x in rows if x.model == model):
            col = colours[i % len(colours)]
            for ck, x in r.per_checkpoint.items():
                ax.errorbar([x.ratio], [y], xerr=[[x.ratio - x.lo], [x.hi - x.ratio]], fmt="o", color=col, ms=4,
                            capsize=2, gid=f"ratio-{r.comparison.b}-{ck}")
                ticks.append(y)
                labels.append(f"{r.comparison.b}/{r.comparison.a} {ck}")
                y += 1
            p = r.pooled
            ax.errorbar([p.ratio], [y], xerr=[[p.ratio - p.lo], [p.hi - p.ratio]], fmt="D", color=col, ms=6, capsize=3)
            ticks.append(y)
            labels.append(f"{r.comparison.b}/{r.comparison.a} pooled")
            if r.comparison.paper is not None:
                ax.plot([r.comparison.paper], [y], marker="|", color="k", ms=14, gid=f"paper-{r.comparison.b}")
            y += 1.5
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("KL ratio b / a (95% CI); | the paper's")
        ax.set_title(f"{model}: fixed-weights matching", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_matching_report(data: SweepData, out_dir: str | Path, *, n_boot: int = 2000, seed: int = 0,
                          generated: str | None = None, figures: bool = True) -> Path:
    """Write ``summary.md``, ``matching_ratios.png`` and (with a variant on SGLang beside vLLM) ``engines.png``
    of a fixed-weights sweep into ``out_dir`` (``figures`` off: the summary alone, its figure links kept)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = claim_rows(data, n_boot=n_boot, seed=seed)
    lines = [f"# fp8rl report: {data.sweep} (fixed weights)", ""]
    if generated:
        lines += [f"Generated {generated}.", ""]
    lines += _design(data) + _claims(rows)
    if rows:
        if figures:
            forest(rows, out / "matching_ratios.png")
        lines += ["![Per-checkpoint KL ratios with 95% CIs, and pooled](matching_ratios.png)", ""]
    engines = engine_rows(data, n_boot=n_boot, seed=seed)
    if engines and figures:
        engines_figure(engines, out / "engines.png")
    lines += _requant(data, rows) + _ablation(data, n_boot, seed) + engines_section(engines)
    lines += _per_checkpoint(rows) + _sources(rows) + _seed_left_out(rows) + _tails(data) + _power(rows)
    path = out / "summary.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
