"""The history gate's figures: one PNG per watched metric over a deployment's last nights, with tonight's band
(fp8rl_core/metrics/history.py). A run-and-step rule draws each run's mean over its steps, one line a run, and
tonight's band of each run as a bar at tonight; a night-pooled rule draws each night's median of value / tonight's
baseline median, with the band ``1 ± rel`` shaded. Untrusted nights are hollow markers."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from fp8rl_core.metrics.history import GATE_RULES, GateRule, NightRecord, rule_values

__all__ = ["LAST_NIGHTS", "night_figures"]

#: how many nights a figure shows
LAST_NIGHTS = 30


def _baseline(rule: GateRule, nights: Sequence[NightRecord]) -> dict[tuple[str, int], float]:
    trusted = [rule_values(rule, n.steps) for n in nights if n.trusted][-rule.window:]
    keys = {k for h in trusted for k in h}
    return {k: statistics.median(h[k] for h in trusted if k in h) for k in keys
            if sum(k in h for h in trusted) >= rule.min_nights}


def _figure(rule: GateRule, nights: Sequence[NightRecord], tonight: NightRecord, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [*nights[-(LAST_NIGHTS - 1):], tonight]
    values = [rule_values(rule, n.steps) for n in shown]
    if not values[-1]:
        return None
    base = _baseline(rule, nights)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    fig.subplots_adjust(left=0.1, right=0.98, top=0.92, bottom=0.2)
    x = list(range(len(shown)))
    if rule.pool == "night":
        y = [statistics.median([v / base[k] for k, v in vals.items() if base.get(k, 0) > 0] or [math.nan])
             for vals in values]
        ax.plot(x, y, color="C0", lw=1)
        for i, (n, v) in enumerate(zip(shown, y, strict=True)):
            ax.plot(i, v, "o", color="C0", mfc="C0" if n.trusted or n is tonight else "none")
        ax.axhspan(1 - rule.rel if rule.side == "two-sided" else 0, 1 + rule.rel, color="C2", alpha=0.15,
                   label=f"band ≤ {1 + rule.rel:g}" if rule.side == "upper" else f"band 1 ± {rule.rel:g}")
        ax.set_ylabel("night median of value / baseline", fontsize=8)
    else:
        runs = sorted({k[0] for k in values[-1]})
        for j, run in enumerate(runs):
            mean = [statistics.fmean(v for (r, _), v in vals.items() if r == run) if any(r == run for r, _ in vals)
                    else math.nan for vals in values]
            ax.plot(x, mean, lw=0.8, color=f"C{j % 10}", label=tonight.names.get(run, run) if len(runs) <= 12 else None)
            meds = [m for (r, _), m in base.items() if r == run]
            if meds:
                m = statistics.fmean(meds)
                w = max(rule.rel * abs(m - rule.origin), rule.floor)
                lo = m - w if rule.side == "two-sided" else m
                ax.errorbar(x[-1] + 0.3 + 0.02 * j, m, yerr=[[m - lo], [w]], color=f"C{j % 10}", capsize=2, lw=0.8)
        if all(v > 0 for vals in values for v in vals.values()):
            ax.set_yscale("log")
        ax.set_ylabel("mean over a run's steps", fontsize=8)
    ax.set_xticks(x, [("tonight" if n is tonight else str(i - len(shown) + 1)) for i, n in enumerate(shown)],
                  fontsize=6, rotation=90)
    ax.set_xlabel("night (hollow: untrusted; bars at tonight: its band per run)")
    ax.set_title(f"{rule.metric} over the last {len(shown)} nights", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, ncol=2, loc="upper left")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def night_figures(tonight: NightRecord, earlier: Sequence[NightRecord], folder: str | Path,
                  rules: Sequence[GateRule] = GATE_RULES) -> list[Path]:
    """One PNG per rule tonight's runs log, in ``folder`` (``gate-<metric>.png``); ``earlier``: the deployment's
    nights before tonight on its machine class, any order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    nights = sorted((n for n in earlier if n.machine == tonight.machine), key=lambda n: n.when)
    out = []
    for rule in rules:
        path = folder / f"gate-{re.sub(r'[^A-Za-z0-9_.-]+', '_', rule.metric)}.png"
        if _figure(rule, nights, tonight, path) is not None:
            out.append(path)
    return out
