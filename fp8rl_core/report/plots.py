"""The report's figures, one function each; every function writes a PNG to the path it is given and
returns that path.

===========================  ==============================================================================
figure                       what it shows
===========================  ==============================================================================
:func:`kl_by_preset`         the paper's matching figure: KL per sampler preset, 95% bootstrap CI bars — one
                             panel per measure given (e.g. exact probe KL | sampled-token k3)
:func:`kl_over_steps`        KL per RL step and preset (mean over seeds) with its CI band
:func:`reward_over_steps`    the RL reward curves: mean reward of each step's rollout per preset, every seed
                             a thin line, the mean over seeds a thick one (does RL move every run?)
:func:`microbatch_time`      seconds per micro-batch vs tokens, both precisions, fitted cost lines, break-even
:func:`step_breakdown`       where a step's seconds go (generate, learner, export, …) per preset
:func:`detection_matrix`     faults × checks: which check fired at each injected fault's first sync
:func:`run_figures`          one run's own: KL (k3) and reward per RL step; the |Δ log p| histogram of its
                             sampled tokens (logged as images of the run in MLflow)
===========================  ==============================================================================

Each figure also has a ``*_figure`` builder returning the matplotlib ``Figure`` unsaved, so a caller
(or a test) can inspect what is drawn: artists that carry a meaning have a ``gid`` (``"break-even"``,
``"break-even-ci"``, ``"verdict"``, ``"kl-<preset>"`` …).

Conventions: the ``Agg`` backend (no display needed), 110 dpi, axis labels with units, a title saying
what is shown and over how many seeds, a log axis where the values span a decade or more. Confidence
intervals come from :func:`~fp8rl_core.report.data.interval_table` (seeded: the same data draws the
same figure).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8rl_core.metrics import CostModel
from fp8rl_core.vocabulary import CONDITIONS, ENGINE_CHECKSUM, STEP_STAGES, seconds_column

from .data import CANONICAL_PRESETS, PROBE_METRICS, SweepData, interval_table, preset_order, with_run_columns

__all__ = [
    "METRIC_LABELS",
    "PANEL_TITLES",
    "STEP_PHASES",
    "detection_matrix",
    "detection_matrix_figure",
    "kl_by_preset",
    "kl_by_preset_figure",
    "kl_over_steps",
    "kl_over_steps_figure",
    "microbatch_time",
    "microbatch_time_figure",
    "reward_over_steps",
    "reward_over_steps_figure",
    "run_figures",
    "run_steps_figure",
    "logprob_diff_histogram_figure",
    "step_breakdown",
    "step_breakdown_figure",
]

#: axis label (with units) of each mismatch metric
METRIC_LABELS: dict[str, str] = {
    "k1": "KL(sampler‖learner), k1 estimator [nats/token]",
    "k2": "KL(sampler‖learner), k2 estimator [nats/token]",
    "k3": "KL(sampler‖learner), k3 estimator [nats/token]",
    "k1_rev": "KL(learner‖sampler), k1 estimator [nats/token]",
    "k3_rev": "KL(learner‖sampler), k3 estimator [nats/token]",
    "mean_abs_logprob_diff": "mean |Δ log p| [nats/token]",
    "mean_abs_prob_diff": "mean |Δp| [probability]",
    "token_mult_prob_error": "mean exp(|Δ log p|) [×, 1 = exact]",
    "chi2_token": "χ² per token [dimensionless]",
    "chi2_seq": "χ² per sequence [dimensionless]",
    "probe_kl": "exact KL(sampler‖learner), probe batch [nats/position]",
    "probe_kl_rev": "exact KL(learner‖sampler), probe batch [nats/position]",
    "probe_js": "exact Jensen–Shannon, probe batch [nats/position]",
}

#: the panel title of each measure in a several-panel :func:`kl_by_preset` figure
PANEL_TITLES: dict[str, str] = {
    "probe_kl": "exact KL on a fixed held-out probe batch (final weights)",
    "probe_kl_rev": "exact reverse KL on the probe batch (final weights)",
    "probe_js": "exact Jensen–Shannon on the probe batch (final weights)",
    "k3": "sampled-token k3 (on the tokens the sampler drew)",
}

#: steps-table time columns, in stacking order, with their legend names
STEP_PHASES: dict[str, str] = {seconds_column(s): s for s in (*STEP_STAGES, "checks")}
_PHASE_COLORS = ["#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#fd8d3c", "#9ecae1", "#d9d9d9"]
_PRECISION_COLORS = {"bf16": "#3182bd", "mxfp8": "#e6550d"}
_MODEL_MARKERS = ["o", "s", "D", "^", "v"]
_DPI = 110


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=_DPI)
    _pyplot().close(fig)
    return path


def _spans_decade(values: Sequence[float]) -> bool:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    return v.size > 0 and bool((v > 0).all()) and v.max() / v.min() >= 10.0


def _seeds_text(seeds: Sequence[int]) -> str:
    s = sorted({int(x) for x in seeds})
    if not s:
        return "n = ? seeds"
    return f"n = {s[0]} seed{'s' if s[0] != 1 else ''}" if len(s) == 1 else f"n = {s[0]}–{s[-1]} seeds"


def _interval_rows(source: Any, metric: str, *, per_step: bool, n_boot: int,
                   seed: int) -> tuple[pd.DataFrame, str, list[str]]:
    """(rows with model, preset, [step,] estimate, lo, hi, seeds; sweep name; preset order)."""
    if isinstance(source, SweepData):
        df = interval_table(source, [metric], by=("model", "preset"), per_step=per_step, n_boot=n_boot, seed=seed)
        return df, source.sweep, preset_order(source)
    df = pd.DataFrame(list(source) if not isinstance(source, pd.DataFrame) else source)
    if df.empty:
        return df, "", []
    if "metric" in df.columns:
        df = df[df["metric"] == metric]
    if "model" not in df.columns:
        df = df.assign(model="")
    if "seeds" not in df.columns:
        df = df.assign(seeds=0)
    present = list(dict.fromkeys(df["preset"].astype(str)))
    order = [p for p in CANONICAL_PRESETS if p in present] + [p for p in present if p not in CANONICAL_PRESETS]
    return df.reset_index(drop=True), str(df["sweep"].iloc[0]) if "sweep" in df.columns else "", order


# --------------------------------------------------------------------------------------- KL by preset

def _kl_points(ax, df: pd.DataFrame, order: list[str], models: list[str]) -> None:
    """One marker per (model, preset) with its CI bar and value; models keep their marker and offset
    (their index in ``models``) whichever panel they are drawn in. Axis scale: log when the CIs span a
    decade."""
    width = 0.6 / max(len(models), 1)
    for i, model in enumerate(models):
        sub = df[df["model"].astype(str) == model].set_index("preset")
        if sub.empty:
            continue
        xs, ys, lo, hi = [], [], [], []
        for j, p in enumerate(order):
            if p in sub.index:
                r = sub.loc[p]
                xs.append(j + (i - (len(models) - 1) / 2) * width)
                ys.append(float(r["estimate"]))
                lo.append(float(r["lo"]))
                hi.append(float(r["hi"]))
        ys_a, lo_a, hi_a = np.array(ys), np.array(lo), np.array(hi)
        yerr = np.vstack([np.clip(ys_a - lo_a, 0, None), np.clip(hi_a - ys_a, 0, None)])
        bars = ax.errorbar(xs, ys_a, yerr=yerr, fmt=_MODEL_MARKERS[i % len(_MODEL_MARKERS)], capsize=4, markersize=6,
                           label=model or None, color=f"C{i}")
        bars.lines[0].set_gid(f"kl-{model}")  # the points; the CI bars are bars.lines[2]
        for coll in bars.lines[2]:
            coll.set_gid(f"ci-{model}")
        for x, y, top in zip(xs, ys_a, hi_a):  # the value above its CI bar
            ax.annotate(f"{y:.3g}", (x, top), textcoords="offset points", xytext=(0, 4), fontsize=7, ha="center",
                        va="bottom")
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.6, len(order) - 0.4)
    ax.set_xlabel("sampler preset (pipeline)")
    if _spans_decade(list(df["lo"]) + list(df["hi"])):
        ax.set_yscale("log")
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)


def kl_by_preset_figure(source: Any, metric: str | Sequence[str] = "k3", *, n_boot: int = 2000, seed: int = 0):
    """The figure of :func:`kl_by_preset`, unsaved (points carry ``gid="kl-<model>"``; with several
    measures each panel's axes carry ``gid="panel-<metric>"``)."""
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise ValueError("kl_by_preset needs at least one metric")
    panels = []
    for m in metrics:
        df, sweep, order = _interval_rows(source, m, per_step=False, n_boot=n_boot, seed=seed)
        if not df.empty:
            panels.append((m, df, sweep, order))
    if not panels:
        what = "tokens table" if not any(m in PROBE_METRICS for m in metrics) else "tokens or probe table"
        raise ValueError(f"no {', '.join(metrics)} values to plot: the sweep has no {what} "
                         f"(or no rows for {', '.join(metrics)})")
    if len(metrics) == 1:
        return _kl_single(*panels[0])
    return _kl_panels(source, panels)


def _kl_single(metric: str, df: pd.DataFrame, sweep: str, order: list[str]):
    plt = _pyplot()
    models = list(dict.fromkeys(df["model"].astype(str)))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.3 * len(order) + 2.5), 4.2))
    _kl_points(ax, df, order, models)
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    if len(models) > 1 or models[0]:
        ax.legend(fontsize=8, title="model", title_fontsize=8)
    head = f"{sweep}: " if sweep else ""
    mean = "mean per position over probe sequences" if metric in PROBE_METRICS else "token mean over sequences"
    ax.set_title(f"{head}train–rollout {metric} per sampler preset ({_seeds_text(df['seeds'])})\n"
                 f"points: {mean}; bars: 95% CI, bootstrap over seeds then sequences", fontsize=9)
    fig.tight_layout()
    return fig


def _kl_panels(source: Any, panels: list[tuple[str, pd.DataFrame, str, list[str]]]):
    """One panel per measure, side by side, sharing the preset axis and the model markers; each panel
    has its own y axis (log where its CIs span a decade)."""
    plt = _pyplot()
    if isinstance(source, SweepData):
        order = preset_order(source)
    else:
        present = list(dict.fromkeys(p for _, _, _, o in panels for p in o))
        order = [p for p in CANONICAL_PRESETS if p in present] + [p for p in present if p not in CANONICAL_PRESETS]
    models = list(dict.fromkeys(m for _, df, _, _ in panels for m in df["model"].astype(str)))
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(n * max(4.6, 1.1 * len(order) + 1.8), 4.6), squeeze=False)
    for ax, (metric, df, _, _) in zip(axes[0], panels):
        _kl_points(ax, df, order, models)
        ax.set_gid(f"panel-{metric}")
        ax.set_ylabel(METRIC_LABELS.get(metric, metric), fontsize=8.5)
        ax.set_title(f"{PANEL_TITLES.get(metric, metric)}\n({_seeds_text(df['seeds'])})", fontsize=9)
    if len(models) > 1 or models[0]:
        axes[0][-1].legend(fontsize=8, title="model", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    sweep = next((sw for _, _, sw, _ in panels if sw), "")
    head = f"{sweep}: " if sweep else ""
    fig.suptitle(f"{head}train–rollout KL per sampler preset\npoints: mean per position (probe) or per sampled "
                 "token; bars: 95% CI, bootstrap over seeds then sequences", fontsize=9.5)
    fig.tight_layout()
    return fig


def kl_by_preset(source: Any, path: str | Path, metric: str | Sequence[str] = "k3", *, n_boot: int = 2000,
                 seed: int = 0) -> Path:
    """The paper's matching figure: train–rollout KL per sampler preset with 95% bootstrap CI bars.

    ``source``: a :class:`~fp8rl_core.report.data.SweepData` (intervals computed here: sequences
    resampled within seeds, seeds resampled, seeded) or precomputed rows (a DataFrame or dicts with
    ``preset``, ``estimate``, ``lo``, ``hi`` and optionally ``model``, ``seeds``, ``metric``, ``sweep`` —
    e.g. :func:`~fp8rl_core.report.data.interval_table` output). Presets follow the sweep's axis order
    (:func:`~fp8rl_core.report.data.preset_order`); one marker per model.

    ``metric``: one measure (one panel, e.g. ``"k3"``) or several (one panel each, side by side, same
    preset axis and model markers, each panel its own y axis — log where its CIs span a decade): the
    report draws ``["probe_kl", "k3"]`` when the sweep has a probe table, the exact probe KL (left)
    next to the sampled-token k3 (right). Measures without values are left out. Writes ``path``,
    returns it."""
    return _save(kl_by_preset_figure(source, metric, n_boot=n_boot, seed=seed), path)


# ------------------------------------------------------------------------------------- KL over steps

def alarm_events(data: SweepData) -> dict[tuple[str, str], dict[int, int]]:
    """(model, preset) → {RL step: how many of the alarm's suspicions the full tier dismissed there, over the
    seeds} from the steps table's ``check/alarm_events`` (empty where no run recorded any)."""
    steps = data.steps
    if steps.empty or "check/alarm_events" not in steps.columns:
        return {}
    df = with_run_columns(steps, data.runs, ["model", "preset"])
    df = df[pd.to_numeric(df["check/alarm_events"], errors="coerce").fillna(0) > 0]
    out: dict[tuple[str, str], dict[int, int]] = {}
    for (m, p, step), g in df.groupby(["model", "preset", "step"]):
        out.setdefault((str(m), str(p)), {})[int(step)] = int(g["check/alarm_events"].sum())
    return out


def kl_over_steps_figure(data: SweepData, metric: str = "k3", *, n_boot: int = 2000, seed: int = 0):
    """The figure of :func:`kl_over_steps`, unsaved (lines carry ``gid="kl-<preset>"``)."""
    plt = _pyplot()
    df = interval_table(data, [metric], by=("model", "preset"), per_step=True, n_boot=n_boot, seed=seed)
    if df.empty:
        raise ValueError(f"no {metric} values to plot: the sweep has no tokens table")
    models = list(dict.fromkeys(df["model"].astype(str)))
    order = preset_order(data)
    colors = {p: _PHASE_COLORS[i % len(_PHASE_COLORS)] for i, p in enumerate(order)}
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models) + 2.0, 4.0), squeeze=False, sharey=True)
    log = _spans_decade(list(df["lo"]) + list(df["hi"]))
    events = alarm_events(data)
    for ax, model in zip(axes[0], models):
        sub = df[df["model"].astype(str) == model]
        labelled = False
        for p in order:
            s = sub[sub["preset"] == p].sort_values("step")
            if s.empty:
                continue
            ax.plot(s["step"], s["estimate"], marker="o", markersize=4, color=colors[p], label=p, gid=f"kl-{p}")
            ax.fill_between(s["step"], s["lo"], s["hi"], color=colors[p], alpha=0.18, linewidth=0)
            hit = s[s["step"].isin(events.get((model, p), {}))]
            if not hit.empty:  # the alarm's events: suspect steps whose full tier passed (the policy's own mismatch)
                ax.scatter(hit["step"], hit["estimate"], marker="x", s=46, color="#c62828", zorder=5,
                           gid=f"events-{p}", label=None if labelled else "mismatch event (alarm; full tier passed)")
                labelled = True
        ax.set_xlabel("RL step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{model} ({_seeds_text(sub['seeds'])})", fontsize=9)
        ax.grid(color="#dddddd", linewidth=0.6)
        if log:
            ax.set_yscale("log")
    axes[0][0].set_ylabel(METRIC_LABELS.get(metric, metric))
    axes[0][-1].legend(fontsize=8, title="preset", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"{data.sweep}: train–rollout {metric} per RL step — mean over seeds, band: 95% bootstrap CI",
                 fontsize=10)
    fig.tight_layout()
    return fig


def kl_over_steps(data: SweepData, path: str | Path, metric: str = "k3", *, n_boot: int = 2000, seed: int = 0) -> Path:
    """KL per RL step for each preset: the token mean over every seed's sequences of that step, with a
    95% bootstrap band (seeds, then sequences). One panel per model. Shows whether a gap between
    presets is there "from the first step" (claim d). Writes ``path``, returns it."""
    return _save(kl_over_steps_figure(data, metric, n_boot=n_boot, seed=seed), path)


def reward_over_steps_figure(data: SweepData):
    """The figure of :func:`reward_over_steps`, unsaved (mean lines carry ``gid="reward-<preset>"``)."""
    plt = _pyplot()
    st = data.steps
    if st.empty or "mean_reward" not in st.columns:
        raise ValueError("no rewards to plot: the sweep has no steps table with mean_reward")
    st = with_run_columns(st, data.runs, ("model", "preset", "seed")).dropna(subset=["model", "preset", "seed"])
    models = list(dict.fromkeys(st["model"].astype(str)))
    order = [p for p in preset_order(data) if p in set(st["preset"])]
    colors = {p: _PHASE_COLORS[i % len(_PHASE_COLORS)] for i, p in enumerate(order)}
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models) + 2.0, 4.0), squeeze=False, sharey=True)
    for ax, model in zip(axes[0], models):
        sub = st[st["model"].astype(str) == model]
        for p in order:
            sp = sub[sub["preset"] == p]
            for _, one in sp.groupby("seed"):
                one = one.sort_values("step")
                ax.plot(one["step"], one["mean_reward"], color=colors[p], alpha=0.35, linewidth=0.8)
            mean = sp.groupby("step")["mean_reward"].mean()
            if not mean.empty:
                ax.plot(mean.index, mean.values, color=colors[p], linewidth=2.2, marker="o", markersize=3,
                        label=p, gid=f"reward-{p}")
        ax.set_xlabel("RL step (each step's rollout, before its update)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{model} ({_seeds_text([sub['seed'].nunique()])})", fontsize=9)
        ax.grid(color="#dddddd", linewidth=0.6)
    axes[0][0].set_ylabel("mean reward of the rollout")
    axes[0][-1].legend(fontsize=8, title="preset", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"{data.sweep}: RL reward per step — thin: each seed, thick: mean over seeds", fontsize=10)
    fig.tight_layout()
    return fig


def reward_over_steps(data: SweepData, path: str | Path) -> Path:
    """The reward curves of the sweep's runs: per model, the mean reward of each RL step's rollout (the
    task's reward: 1 exact, 0.5·fraction of right digits otherwise) for every seed and the mean over seeds,
    per preset. Shows where RL starts after the warm start and whether it moves. Writes ``path``."""
    return _save(reward_over_steps_figure(data), path)


# ------------------------------------------------------------------------------- micro-batch time

def microbatch_time_figure(microbatches: pd.DataFrame, cost_model_result: CostModel | None = None, *,
                           title: str = "", emulated: bool | None = None):
    """The figure of :func:`microbatch_time`, unsaved. With ``status == "break_even"`` it has a vertical
    line ``gid="break-even"`` at the break-even (and a band ``gid="break-even-ci"`` for its CI), else a
    text box ``gid="verdict"`` holding the cost model's verdict."""
    plt = _pyplot()
    mb = pd.DataFrame(microbatches)
    if cost_model_result is None:
        from fp8rl_core.metrics import cost_model

        cost_model_result = cost_model(mb, emulated=emulated)
    cm = cost_model_result
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    tokens = mb["tokens"].to_numpy(np.float64)
    x_hi = float(tokens.max())
    be = cm.break_even if cm.status == "break_even" else None
    if be is not None:
        x_hi = max(x_hi, 1.15 * be)
    log_x = _spans_decade([float(tokens.min()), x_hi])
    x = np.geomspace(max(tokens.min(), 1.0), x_hi, 200) if log_x else np.linspace(0.0, x_hi, 200)
    for prec in ("bf16", "mxfp8"):
        sel = mb["precision"].astype(str) == prec
        if not sel.any():
            continue
        color = _PRECISION_COLORS[prec]
        ax.scatter(mb.loc[sel, "tokens"], mb.loc[sel, "seconds"], s=12, alpha=0.45, color=color,
                   label=f"{prec} micro-batches (n = {int(sel.sum())})", gid=f"points-{prec}")
        fit = cm.fits.get(prec)
        if fit is not None:
            ax.plot(x, fit.fixed + fit.per_token * x, color=color, linewidth=1.6, gid=f"fit-{prec}",
                    label=f"{prec} fit: {fit.fixed * 1e3:.3g} ms + {fit.per_token * 1e6:.3g} µs/token")
    if be is not None:
        ax.axvline(be, color="black", linestyle="--", linewidth=1.2, gid="break-even")
        ci = cm.break_even_ci
        if ci is not None and np.isfinite(ci[1]):
            ax.axvspan(ci[0], ci[1], color="black", alpha=0.08, gid="break-even-ci")
        ax.annotate(f"break-even ≈ {be:.0f} tokens", (be, 0.97), xycoords=("data", "axes fraction"),
                    xytext=(5, 0), textcoords="offset points", va="top", fontsize=8)
    else:
        ax.text(0.02, 0.97, textwrap.fill(cm.verdict, 70), transform=ax.transAxes, va="top",
                ha="left", fontsize=7.5, gid="verdict",
                bbox={"boxstyle": "round", "facecolor": "#fff7e6", "edgecolor": "#cc8800"})
    if log_x:
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_xscale("log")
        budgets = np.unique(tokens)
        if budgets.size <= 8:  # label the measured budgets themselves, in plain numbers
            ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:  # many budgets (padded sizes vary): plain numbers on the decades, no minor labels
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
    if _spans_decade(list(mb["seconds"])):
        ax.set_yscale("log")
    ax.set_xlabel("tokens per micro-batch (padded: rows × longest sequence)")
    ax.set_ylabel("seconds per micro-batch [s] (forward + backward)")
    ax.grid(color="#dddddd", linewidth=0.6)
    ax.legend(fontsize=7.5, loc="lower right")
    runs = mb["run_id"].nunique() if "run_id" in mb.columns else None
    head = f"{title}: " if title else ""
    ax.set_title(f"{head}learner time per micro-batch, BF16 vs MXFP8 ({len(mb)} micro-batches"
                 + (f", {runs} runs" if runs else "") + f")\nstatus: {cm.status}", fontsize=9)
    fig.tight_layout()
    return fig


def microbatch_time(microbatches: pd.DataFrame, cost_model_result: CostModel | None, path: str | Path, *,
                    title: str = "", emulated: bool | None = None) -> Path:
    """Seconds per micro-batch against tokens per micro-batch: each precision's micro-batches as points
    and its fitted cost line ``fixed + per_token · tokens``; a dashed vertical line at the break-even
    (with its CI band) when ``cost_model_result.status == "break_even"``, otherwise the cost model's
    verdict in a box (e.g. "no break-even: …" on CPU emulation).

    ``microbatches``: the ``microbatches`` table (columns precision, tokens, seconds; run_id counted
    when present). ``cost_model_result``: :func:`fp8rl_core.metrics.cost_model` of the same rows
    (None: computed here with ``emulated``). Writes ``path``, returns it."""
    return _save(microbatch_time_figure(microbatches, cost_model_result, title=title, emulated=emulated), path)


# ------------------------------------------------------------------------------------ step breakdown

def _phase_means(steps: pd.DataFrame, groups: list[str]) -> tuple[pd.DataFrame, list[str]]:
    phases = [c for c in STEP_PHASES if c in steps.columns]
    if not phases:
        raise ValueError(f"the steps table has none of the time columns {list(STEP_PHASES)}")
    st = steps.copy()
    cols = phases[:]
    if "total_s" in st.columns:
        st["other_s"] = (st["total_s"] - st[phases].fillna(0.0).sum(axis=1)).clip(lower=0.0)
        cols.append("other_s")
    means = st.groupby(groups, sort=False)[cols].mean().fillna(0.0)
    return means, cols


def step_breakdown_figure(steps: pd.DataFrame, *, presets: Sequence[str] | None = None, title: str = ""):
    """The figure of :func:`step_breakdown`, unsaved (bar segments carry ``gid="phase-<column>"``)."""
    plt = _pyplot()
    st = pd.DataFrame(steps)
    if "preset" not in st.columns:
        raise ValueError("step_breakdown needs a 'preset' column (join it with "
                         "with_run_columns(steps, runs, ['preset']))")
    multi = "model" in st.columns and st["model"].nunique() > 1
    groups = ["model", "preset"] if multi else ["preset"]
    means, cols = _phase_means(st, groups)
    axis = list(presets) if presets is not None else list(CANONICAL_PRESETS)
    rank = {p: i for i, p in enumerate(axis)}
    def sort_key(k):
        return (k[0], rank.get(k[1], len(rank))) if multi else (rank.get(k, len(rank)),)

    keys = sorted(means.index, key=sort_key)
    means = means.loc[keys]
    labels = [f"{k[1]}\n{k[0]}" if multi else str(k) for k in means.index]
    fig, ax = plt.subplots(figsize=(max(5.5, 1.1 * len(labels) + 3.0), 4.4))
    bottom = np.zeros(len(means))
    for i, c in enumerate(cols):
        name = STEP_PHASES.get(c, "other (untimed)")
        vals = means[c].to_numpy(np.float64)
        ax.bar(range(len(means)), vals, bottom=bottom, color=_PHASE_COLORS[i % len(_PHASE_COLORS)], label=name,
               width=0.65, gid=f"phase-{c}")
        bottom += vals
    for j, total in enumerate(bottom):
        ax.annotate(f"{total:.3g} s", (j, total), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("sampler preset" + (" and model" if multi else ""))
    ax.set_ylabel("seconds per RL step [s] (mean over steps and seeds)")
    ax.set_ylim(0, bottom.max() * 1.12 if bottom.max() > 0 else 1.0)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase", title_fontsize=8)
    seeds = st.groupby(groups, sort=False)["seed"].nunique().tolist() if "seed" in st.columns else []
    head = f"{title}: " if title else ""
    n_text = _seeds_text(seeds) if seeds else f"{len(st)} steps"
    ax.set_title(f"{head}where an RL step's time goes, per preset ({n_text})", fontsize=9)
    fig.tight_layout()
    return fig


def step_breakdown(steps: pd.DataFrame, path: str | Path, *, presets: Sequence[str] | None = None,
                   title: str = "") -> Path:
    """Stacked bars of the mean seconds per RL step per preset, one segment per phase: generate,
    learner, export, transport, load, reset, checks (the ``steps`` columns ``generate_s`` … ``checks_s``
    that are present) and, when ``total_s`` is there, the untimed rest (``total_s`` minus the parts).

    ``steps``: the steps table joined with ``preset`` (and optionally ``model``, ``seed``) —
    ``with_run_columns(data.steps, data.runs, ["preset", "model", "seed"])``. ``presets``: bar order
    (default: the canonical preset order). Writes ``path``, returns it."""
    return _save(step_breakdown_figure(steps, presets=presets, title=title), path)


# ---------------------------------------------------------------------------------- detection matrix

def detection_matrix_figure(rows: list[dict], title: str = "fp8rl detection matrix"):
    """Heat map: faults (rows) × checks (columns). Dark green = the declared check fired; light = another
    check fired; red = the declared check did not fire; grey = the check did not run (a dash).

    ``rows``: the detection matrix, one row per fault as :func:`fp8rl_core.correctness.inject` writes it
    (``fault``, ``condition``, ``caught_first`` and one column per condition W1–W7: 1 fired, 0 passed,
    None not run; and, where the rows have it, vLLM's own checksums, ``vllm_checksum``, the last column).
    Returns the figure unsaved."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    cols = [*CONDITIONS, *([ENGINE_CHECKSUM] if any(ENGINE_CHECKSUM in r for r in rows) else [])]
    labels = [c if c != ENGINE_CHECKSUM else "vLLM\nSHA-256" for c in cols]
    codes = []
    for r in rows:
        row = []
        for c in cols:
            v = r.get(c)
            if v is None:
                row.append(0)
            elif c == r["condition"]:
                row.append(3 if v else 4)
            else:
                row.append(2 if v else 1)
        codes.append(row)
    cmap = ListedColormap(["#d9d9d9", "#ffffff", "#a1d99b", "#238b45", "#de2d26"])
    fig, ax = plt.subplots(figsize=(7.5 + 0.8 * (len(cols) - len(CONDITIONS)), 0.42 * len(rows) + 1.6))
    ax.imshow(codes, cmap=cmap, vmin=0, vmax=4, aspect="auto")
    ax.set_xticks(range(len(cols)), labels)
    ax.set_yticks(range(len(rows)), [f"{r['fault']} ({r['condition']})" for r in rows])
    ax.set_xlabel("check that fired at the fault's first sync")
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            v = r.get(c)
            ax.text(j, i, "–" if v is None else ("✓" if v else ""), ha="center", va="center", fontsize=9,
                    color="white" if codes[i][j] in (3, 4) else "black")
    ax.set_xticks([x - 0.5 for x in range(1, len(cols))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(rows))], minor=True)
    ax.grid(which="minor", color="#bbbbbb", linewidth=0.5)
    caught = sum(bool(r["caught_first"]) for r in rows)
    ax.set_title(f"{title}: {caught}/{len(rows)} caught at the first sync by the declared check\n"
                 "dark green: declared check fired · light green: another check fired · red: declared missed",
                 fontsize=9)
    fig.tight_layout()
    return fig


def detection_matrix(rows: list[dict], path: str | Path, title: str = "fp8rl detection matrix") -> Path:
    """The nightly detection matrix (faults × checks) as a heat map (:func:`detection_matrix_figure`).
    Writes ``path``, returns it."""
    return _save(detection_matrix_figure(rows, title=title), path)


# ------------------------------------------------------------------------------- one run's figures

def run_steps_figure(steps: Sequence[dict], kl_summary: Sequence[dict], title: str = ""):
    """One run per RL step: the sampled-token KL k3 with its 95% bootstrap interval over the step's
    sequences (``kl_summary`` rows with a step), in millionths of a nat, the alarm's mismatch events marked
    (steps whose ``check/alarm_events`` > 0, ``gid="events"``); the mean reward of the step's rollouts
    (``steps`` rows). Lines carry ``gid="kl"`` and ``gid="reward"``."""
    plt = _pyplot()
    kl = sorted((r for r in kl_summary if r.get("step") is not None), key=lambda r: int(r["step"]))
    st = sorted(steps, key=lambda r: int(r["step"]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    x = [int(r["step"]) for r in kl]
    y = np.array([float(r["k3"]) for r in kl]) * 1e6
    a.plot(x, y, marker="o", color=_PHASE_COLORS[0], gid="kl")
    if kl and "k3_lo" in kl[0]:
        a.fill_between(x, [float(r["k3_lo"]) * 1e6 for r in kl], [float(r["k3_hi"]) * 1e6 for r in kl],
                       color=_PHASE_COLORS[0], alpha=0.2, linewidth=0)
    flagged = {int(r["step"]) for r in st if (r.get("check/alarm_events") or 0) > 0}
    hits = [(xi, yi) for xi, yi in zip(x, y) if xi in flagged]
    if hits:
        a.scatter(*zip(*hits), marker="x", s=46, color="#c62828", zorder=5, gid="events",
                  label="mismatch event (alarm; full tier passed)")
        a.legend(fontsize=7)
    a.set_ylabel("KL k3 [µnats/token]")
    a.set_title("train–rollout KL per step (band: 95% CI)", fontsize=9)
    b.plot([int(r["step"]) for r in st], [float(r["mean_reward"]) for r in st], marker="o", color=_PHASE_COLORS[1],
           gid="reward")
    b.set_ylabel("mean reward")
    b.set_title("reward per step", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel("RL step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(color="#dddddd", linewidth=0.6)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def logprob_diff_histogram_figure(tokens: Sequence[dict], title: str = ""):
    """The distribution of |log p_sampler − log p_learner| over a run's sampled tokens (same token, same
    weight version): log-spaced bins from the smallest non-zero difference, exact agreements counted
    apart (bar ``gid="exact"``), count axis logarithmic."""
    plt = _pyplot()
    d = np.abs(np.array([float(t["sampler_logprob"]) - float(t["learner_logprob"]) for t in tokens]))
    exact = int((d == 0).sum())
    nz = d[d > 0]
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    if nz.size:
        lo, hi = float(nz.min()), float(nz.max())
        bins = np.logspace(np.log10(lo), np.log10(hi) + 1e-9, 30) if hi > lo else np.array([lo * 0.9, hi * 1.1])
        ax.hist(nz, bins=bins, color=_PHASE_COLORS[0])
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|Δ log p| per sampled token [nats]")
    ax.set_ylabel("tokens")
    ax.text(0.98, 0.95, f"{len(d)} tokens, {exact} identical, mean {d.mean() if d.size else 0:.3g}",
            transform=ax.transAxes, ha="right", va="top", fontsize=8, gid="exact")
    ax.set_title(title or "train–rollout log-prob differences", fontsize=9)
    ax.grid(color="#dddddd", linewidth=0.6)
    fig.tight_layout()
    return fig


def run_figures(steps: Sequence[dict], kl_summary: Sequence[dict], tokens: Sequence[dict], out_dir: str | Path,
                title: str = "") -> list[Path]:
    """Write one run's figures into ``out_dir``: ``kl_reward_per_step.png`` (:func:`run_steps_figure`) and
    ``abs_dlogp_hist.png`` (:func:`logprob_diff_histogram_figure`). Returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [_save(run_steps_figure(steps, kl_summary, title), out / "kl_reward_per_step.png"),
            _save(logprob_diff_histogram_figure(tokens, title), out / "abs_dlogp_hist.png")]
