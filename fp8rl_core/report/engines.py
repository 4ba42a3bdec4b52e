"""The fixed-weights report's engine axis: a variant served by SGLang beside its vLLM twin at the same
weights — each engine's exact KL to the learner, their ratio paired by sequence, and the two engines' KL to
each other on the same sequences (the ``matching_engines`` table, :func:`fp8rl_core.matching.measure`).
Statistics: :mod:`fp8rl_core.metrics.matching`; the protocol: docs/fixed-weights.md, "The engine axis".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fp8rl_core.metrics.matching import MatchingRatio, matching_ratio
from fp8rl_core.metrics.stats import Interval, cluster_bootstrap

from .data import SweepData, matching_frame
from .text import ratio_text, table

__all__ = ["EngineComparison", "engine_rows", "engines_figure", "engines_section"]


@dataclass(frozen=True)
class EngineComparison:
    """One variant on another engine against its vLLM twin on one model: each one's mean KL to the learner
    (nats per position, over every checkpoint and probe source, with its interval), b/a of the two
    (``ratio``, paired by sequence), and the two engines' divergence from each other on the same sequences
    (``between``: KL(variant's engine‖vLLM); ``between_by_source``: on the held-out sequences alone and on the
    rollouts of the one measured first alone)."""

    model: str
    variant: str
    reference: str
    engine: str
    reference_kl: Interval
    variant_kl: Interval
    ratio: MatchingRatio
    between: Interval
    between_by_source: dict[str, Interval]
    rollouts: str


def _mean(rows: pd.DataFrame, n_boot: int, seed: int) -> Interval:
    groups = rows["checkpoint"].astype(str).to_numpy() if rows["checkpoint"].nunique() > 1 else None
    return cluster_bootstrap(rows["kl"].to_numpy(float), rows["positions"].to_numpy(float), groups=groups,
                             n_boot=n_boot, seed=seed)


def engine_rows(data: SweepData, *, n_boot: int = 2000, seed: int = 0) -> list[EngineComparison]:
    """Every variant of ``data.matching_engines`` against its vLLM twin, per model (none without that table)."""
    e = matching_frame(data, "matching_engines")
    if e.empty:
        return []
    m = matching_frame(data)
    out = []
    for (model, variant), g in e.groupby(["model", "variant"], sort=False):
        ref = str(g["reference"].iloc[0])
        mm = m[m["model"].astype(str) == str(model)]
        pick = lambda v: mm[mm["variant"] == v]  # noqa: E731
        by_source = {str(src): _mean(part, n_boot, seed) for src, part in g.groupby("source", sort=False)}
        out.append(EngineComparison(str(model), str(variant), ref, str(g["engine"].iloc[0]),
                                    _mean(pick(ref), n_boot, seed), _mean(pick(variant), n_boot, seed),
                                    matching_ratio(mm.to_dict("records"), ref, str(variant), n_boot=n_boot, seed=seed),
                                    _mean(g, n_boot, seed), by_source, str(g["rollouts"].iloc[0])))
    return out


def _micro(x: Interval) -> str:
    return f"{1e6 * x.estimate:.4g} ({1e6 * x.lo:.4g} … {1e6 * x.hi:.4g})"


def engines_section(rows: list[EngineComparison]) -> list[str]:
    """The report's *Engines* section (nothing without a variant on another engine)."""
    if not rows:
        return []
    lines = ["## Engines: the same variant on SGLang and on vLLM", "",
             "One variant served by two engines at the same weights (each synced through the normal path and checked): "
             "each engine's exact KL(engine‖learner) in µnats per position over every checkpoint and probe source "
             "(95% CI; checkpoints, then sequences resampled), their ratio paired by sequence, and the two engines' "
             "KL(other engine‖vLLM) on the same sequences — the held-out ones, and the rollouts of the one measured "
             "first, which the other engine scores too. The engines' difference to each other, set beside each one's "
             "difference to the learner, says how much of the train–rollout mismatch is the serving engine's own "
             "(kernels, attention backend, BF16 rounding order) rather than the sampler's precision.", ""]
    body = [[r.model, f"`{r.variant}` vs `{r.reference}`", _micro(r.reference_kl), _micro(r.variant_kl), ratio_text(r.ratio),
             _micro(r.between), *(_micro(r.between_by_source[s]) if s in r.between_by_source else "—"
                                  for s in ("held-out", "sampled")), f"`{r.rollouts}`"] for r in rows]
    lines += table(["model", "variant vs vLLM twin", "vLLM ‖ learner µnats", "other engine ‖ learner µnats",
                     "ratio other / vLLM (CI)", "other engine ‖ vLLM µnats", "on held-out", "on rollouts",
                     "rollouts of"], body)
    lines += ["", "![Each engine's KL to the learner and the two engines' KL to each other](engines.png)", ""]
    return lines


def engines_figure(rows: list[EngineComparison], path: str | Path) -> Path:
    """Per model and variant: vLLM ‖ learner, the other engine ‖ learner and the other engine ‖ vLLM, µnats
    per position with their CIs (horizontal bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.9 * len(rows)))
    ticks, labels, y = [], [], 0
    for r in rows:
        for label, x, col in ((f"vLLM ‖ learner ({r.reference})", r.reference_kl, "C0"),
                              (f"{r.engine} ‖ learner ({r.variant})", r.variant_kl, "C1"),
                              (f"{r.engine} ‖ vLLM", r.between, "C2")):
            ax.barh(y, 1e6 * x.estimate, color=col, gid=f"engines-{r.model}-{r.variant}-{label.split(' ')[0]}")
            ax.errorbar([1e6 * x.estimate], [y], xerr=[[1e6 * (x.estimate - x.lo)], [1e6 * (x.hi - x.estimate)]],
                        fmt="none", color="k", capsize=2)
            ticks.append(y)
            labels.append(f"{r.model}: {label}")
            y += 1
        y += 0.5
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("exact KL, µnats per position (95% CI)")
    ax.set_title("the same weights in two engines", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
