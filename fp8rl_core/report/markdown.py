"""A sweep's report as one Markdown file with its figures beside it.

:func:`write_report` writes ``summary.md`` and the PNGs into the directory it is given:

1. title, sweep, what ran (runs, models, presets, seeds);
2. the claims table — claim | paper | measured (CI) | verdict | why — from
   :func:`~fp8rl_core.report.verdicts.evaluate_claims`, and the claims this sweep does not test;
3. the runs (name, preset, model, seed, status and the run metrics present);
4. per model, the mismatch metrics per preset with 95% bootstrap intervals — the exact probe-batch
   divergences first when the sweep has a ``probe`` table (:data:`~fp8rl_core.report.data.PROBE_METRICS`:
   rows "exact probe KL (nats/position)", its reverse KL and JS), then the sampled-token estimators
   (:data:`~fp8rl_core.report.data.REPORT_METRICS`);
5. when several models ran a KL claim's presets, each claim's factor across the models
   (:func:`~fp8rl_core.report.factors.factors_across_models`: on the MoE sweeps the block-size
   ablation), then the power of each KL comparison; before them the requantization comparison — requant/all
   KL ratio per model and measure with its CI, W2's byte-difference fractions and a verdict sentence, or
   "not run" (:mod:`.requant`);
6. the micro-batch cost model's verdict, when the sweep timed micro-batches;
7. the weight-sync check pass counts per condition, then per group of syncs by what the sampler holds
   (:mod:`.syncs`: on the learner's grid — claim (c)'s syncs —, BF16, its own quantization);
8. the figures, linked relatively (``![…](kl_by_preset.png)``), so the directory can be moved or
   uploaded as one artifact.

The output is deterministic given the data: every bootstrap is seeded and nothing reads the clock —
pass ``generated`` to stamp a date yourself. Where the figures come from: :mod:`.plots`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fp8rl_core.vocabulary import CONDITIONS, VERL_K3_ABS_TOL, VERL_K3_REL_TOL, requant_column

from . import plots
from .agreement import verl_agreement
from .compare import cost_models
from .data import (PROBE_LABELS, PROBE_METRICS, REPORT_METRICS, SweepData, interval_table, is_probe_metric,
                   preset_order, sweep_models, with_run_columns)
from .factors import FactorAcrossModels, factors_across_models
from .inputs import TableCheck, compare_tables, load_inputs, save_inputs
from .claims import measure_label
from .power import PowerRow, power_rows
from .requant import BASELINE as REQUANT_BASELINE
from .requant import CANDIDATE as REQUANT_CANDIDATE
from .requant import requant_rows
from .matching import write_matching_report
from .syncs import sync_groups
from .verdicts import absent_claims, evaluate_claims

__all__ = ["RUN_METRICS", "check_tables", "write_report"]

#: run-level metric columns shown in the runs table when present: column → header
RUN_METRICS: dict[str, str] = {
    "kl/k3": "KL k3", "kl/full_kl": "probe KL", "kl/tail_mass": "tail mass", "kl/mean_abs_logprob_diff": "mean |Δlogp|",
    "reward/final": "final reward",
    "time/step_s": "step s", "time/generate_s": "generate s", "time/learner_s": "learner s",
    "time/total_s": "run s",
}



#: which KL holds the vocabulary tail (docs/metrics.md, "The vocabulary tail"): one rule for every preset
TAIL_NOTE = ("The vocabulary tail (ids at and beyond the checkpoint's tokenizer, which the sampler never emits): the "
             "exact probe KL excludes it (the learner restricted to the ids the sampler can emit), and so do a native "
             "run's sampled-token estimators; a verl run's include it (verl's `old_log_probs`, as its "
             "`rollout_corr/*`); its mass is the runs table's *tail mass* (0: none).")

#: what a report says of the runs verl's trainer ran without a captured ``tokens`` table (``backend: verl`` in
#: bypass mode, where verl does not recompute the learner's log-probs; docs/metrics.md, verl runs)
VERL_NOTE = ("Runs of `backend: verl` without a tokens table ({runs}): verl logged their train–rollout mismatch as "
             "per-step means only (`rollout_corr/*`, here `kl/k3`, `kl/k1` averaged over the steps), so they answer "
             "the sync claim (c) from their checks and no KL claim; their KL is listed per run below.")

def verl_runs_without_tokens(data: SweepData) -> list[str]:
    """The names of the sweep's ``backend: verl`` runs that have no tokens table (verl runs that have one
    answer the KL claims from it like native runs)."""
    r = data.runs
    if r.empty or "backend" not in r.columns:
        return []
    have = set(data.tokens["run_id"]) if not data.tokens.empty and "run_id" in data.tokens.columns else set()
    return [str(x.name) for x in r.itertuples() if x.backend == "verl" and x.run_id not in have]


def _cell(v: Any) -> str:
    """A Markdown table cell: numbers to 4 significant digits, pipes and newlines escaped."""
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(v) for v in r) + " |" for r in rows]
    return out


def _ci(est: float, lo: float, hi: float) -> str:
    return f"{est:.4g} [{lo:.4g}, {hi:.4g}]"


def _runs_section(data: SweepData) -> list[str]:
    r = data.runs
    ks = data.kl_summary
    if "kl/k3" not in r.columns and not ks.empty and {"run_id", "step", "k3"} <= set(ks.columns):
        whole = ks[ks["step"].isna()].drop_duplicates("run_id").set_index("run_id")["k3"]
        if not whole.empty:  # the whole-run rows of the KL summary stand in for the run metric
            r = r.assign(**{"kl/k3": r["run_id"].map(whole)})
    pr = data.probe
    if "kl/full_kl" not in r.columns and not pr.empty:  # the run's exact probe KL per position from its rows
        sums = pr.groupby("run_id", sort=False)[["kl", "positions"]].sum()
        r = r.assign(**{"kl/full_kl": r["run_id"].map(sums["kl"] / sums["positions"])})
    metrics = [c for c in RUN_METRICS if c in r.columns]
    # a sweep over the micro-batch budget has several runs per (model, preset, seed): show the budget
    budget = "tokens_per_microbatch" in r.columns and r["tokens_per_microbatch"].nunique() > 1
    header = ["name", "preset", "model", "seed", *(["tokens/micro-batch"] if budget else []), "status",
              *(RUN_METRICS[c] for c in metrics)]
    rank = {p: i for i, p in enumerate(preset_order(data))}
    order = r.assign(_m=r["model"].astype(str), _p=r["preset"].map(rank))
    order = order.sort_values(["_m", "_p", "seed", *(["tokens_per_microbatch"] if budget else [])], kind="stable")
    rows = []
    for _, x in order.iterrows():
        name = x["name"] if "name" in r.columns else x["run_id"]
        status = x["status"] if "status" in r.columns else "FINISHED"
        rows.append([name, x["preset"], x["model"], int(x["seed"]),
                     *([int(x["tokens_per_microbatch"])] if budget else []), status, *(x[c] for c in metrics)])
    return ["## Runs", "", *_table(header, rows), ""]


def _kl_section(table: pd.DataFrame, order: list[str]) -> list[str]:
    if table.empty:
        return []
    probe = table["metric"].map(is_probe_metric).astype(bool)
    if not probe.any():
        intro = ("Token means over every sampled token of the preset's runs; in brackets the 95% bootstrap interval "
                 "(seeds resampled, then sequences within them). k1, k3: KL(sampler‖learner); "
                 "k3_rev: KL(learner‖sampler); nats per token.")
    else:
        intro = ("Exact probe rows: the exact full-vocabulary divergence per scored position on a fixed held-out "
                 "probe batch at the final weights (the same sequences for every preset of a seed): KL = "
                 "KL(sampler‖learner), KL(learner‖sampler), JS = Jensen–Shannon; nats per position — the "
                 "divergences "
                 "themselves, not estimates from sampled tokens."
                 + (" Sampled-token rows: token means over every sampled token of the preset's runs; k1, k3: "
                    "KL(sampler‖learner); k3_rev: KL(learner‖sampler); nats per token." if (~probe).any() else "")
                 + " In brackets the 95% bootstrap interval (seeds resampled, then sequences within them).")
    out = ["## Train–rollout mismatch per preset", "", intro, ""]
    for model, sub in table.groupby(table["model"].astype(str), sort=False):
        presets = [p for p in order if p in set(sub["preset"])]
        is_probe = sub["metric"].map(is_probe_metric).astype(bool)
        metrics = list(dict.fromkeys(sub.loc[is_probe, "metric"])) + list(dict.fromkeys(sub.loc[~is_probe, "metric"]))
        rows = []
        for metric in metrics:
            m = sub[sub["metric"] == metric].set_index("preset")
            rows.append([PROBE_LABELS.get(metric, metric),
                         *(_ci(m.at[p, "estimate"], m.at[p, "lo"], m.at[p, "hi"]) if p in m.index else "–"
                           for p in presets)])
        for label, part in (("seeds / sequences", sub[~is_probe]), ("probe seeds / sequences", sub[is_probe])):
            if part.empty:
                continue
            counts = part.groupby("preset")[["seeds", "sequences"]].max()
            rows.append([label, *(f"{int(counts.at[p, 'seeds'])} / {int(counts.at[p, 'sequences'])}"
                                  if p in counts.index else "–" for p in presets)])
        out += [f"### {model}", "", *_table(["metric", *presets], rows), ""]
    return out


def _cost_section(cms: list) -> list[str]:
    if not cms:
        return []
    out = ["## MXFP8 cost per micro-batch", ""]
    for model, cm in cms:
        head = f"**{model}**: " if model else ""
        if isinstance(cm, str):
            out += [f"- {head}no fit: {cm}"]
            continue
        out += [f"- {head}{cm.verdict}",
                f"  - status `{cm.status}`; Δfixed {cm.delta_fixed * 1e3:.4g} ms per micro-batch; per-token "
                f"saving {cm.per_token_saving:.4g} s/token; fits: "
                + "; ".join(f"{p} {f.fixed * 1e3:.4g} ms + {f.per_token * 1e6:.4g} µs/token (n = {f.n})"
                            for p, f in cm.fits.items())]
    return out + [""]


def _power_section(rows: list[PowerRow]) -> list[str]:
    if not rows:
        return []
    est = rows[0].estimate
    intro = (f"What this sweep's design can resolve on the exact probe KL (docs/results/power.md; "
             f"fp8rl_core.metrics.power): σ² of the paired log-ratio between seeds and within a seed (one-way "
             f"ANOVA), se of log(ratio) for the design, the smallest ratio resolved at {est.level:.0%} with "
             f"{est.power:.0%} power (a ratio ≤ 1/f or ≥ f), and the seeds the paper's ratio needs at this many "
             "probe sequences per seed.")
    body = [[r.claim, r.model, f"{r.seeds} × {r.sequences}", _cell(r.between), _cell(r.within), _cell(r.se),
             f"{r.resolvable:.3g}", "–" if r.target is None else _cell(r.target),
             "–" if r.seeds_for_target is None else str(r.seeds_for_target)] for r in rows]
    return ["## Power", "", intro, "",
            *_table(["comparison", "model", "seeds × sequences", "σ² between", "σ² within", "se(log ratio)",
                     "resolvable factor f", "paper's ratio", "seeds it needs"], body), ""]


def _factors_section(rows: list[FactorAcrossModels]) -> list[str]:
    if not rows:
        return []
    intro = ("Is a claim's factor (candidate / baseline exact probe KL) the same on each model of the sweep? The "
             "quotient of a model's factor and the first model's, with a 95% bootstrap interval (each factor paired "
             "by seed and probe sequence, the models resampled independently). Where the models differ in how many "
             "128×128 blocks a matrix has (the MoE mini: one block covers a whole expert matrix; the MoE small: "
             "≥ 4×4 blocks per matrix), claim (d)'s row is the block-size ablation.")
    body = [[r.claim, f"{r.candidate} / {r.baseline}", f"{r.reference}: {_cell(r.comparison.a)}×",
             f"{r.model}: {_cell(r.comparison.b)}×", _ci(r.comparison.ratio, r.comparison.lo, r.comparison.hi),
             f"{r.seeds[0]} + {r.seeds[1]} seeds, {r.sequences[0]} + {r.sequences[1]} sequences", r.verdict]
            for r in rows]
    return ["## Factors across models", "", intro, "",
            *_table(["claim", "factor", "first model", "model", "quotient (95% CI)", "units", "verdict"], body), ""]


def _fraction(v: float | None) -> str:
    return "–" if v is None else f"{v:.2%}"


def _requant_section(data: SweepData, n_boot: int, seed: int) -> list[str]:
    intro = ("Most RL stacks with an FP8 sampler sync BF16 weights and let the engine quantize them again (verl's FP8 "
             "rollout; vLLM's `quantization=\"mxfp8\"`, whose online MXFP8 rule preset `requant` runs). The KL of "
             "such a sampler relative to one fed the learner's bytes (`all`), 95% bootstrap CI, and the fraction of "
             "its E4M3 data / E8M0 scale bytes that differ from the learner's (W2, mean over syncs; double rounding: "
             "the learner quantizes its fp32 master, the sampler bf16(master)).")
    present = set(data.runs["preset"].astype(str)) if not data.runs.empty else set()
    missing = [p for p in (REQUANT_CANDIDATE, REQUANT_BASELINE) if p not in present]
    head = ["## Requantization: requant vs all", "", intro, ""]
    if missing:
        return head + [f"Not run: this sweep has no {' and no '.join(f'`{p}`' for p in missing)} runs, so the "
                       "requant/all KL ratio is not measured here.", ""]
    rows = requant_rows(data, n_boot=n_boot, seed=seed)
    if not rows:
        return head + ["Not run: the `requant` and `all` runs share no KL measure (no tokens or probe table).", ""]
    body = []
    for r in rows:
        b = r.bytes_differ
        kinds = sorted({k.rsplit("/", 1)[-1] for k in b if k.count("/") == 2})
        per = "; ".join(f"{k} {_fraction(b.get(requant_column('data_bytes_differ', k)))} / "
                        f"{_fraction(b.get(requant_column('scale_bytes_differ', k)))}" for k in kinds)
        overall = (f"{_fraction(b.get(requant_column('data_bytes_differ')))} / "
                   f"{_fraction(b.get(requant_column('scale_bytes_differ')))}") if b else "–"
        ratio = "–" if r.ratio is None else _ci(r.ratio, r.lo, r.hi)
        body.append([r.model, measure_label(r.measure), ratio, overall + (f" ({per})" if per else ""), r.verdict])
    return head + [*_table(["model", "measure", "requant / all (95% CI)", "bytes differing: data / scale", "verdict"],
                           body), ""]


def _verl_section(data: SweepData) -> list[str]:
    """fp8rl's KL of each verl run against verl's own of the same tokens (:mod:`.agreement`)."""
    rows = verl_agreement(data)
    if not rows:
        return []
    bad = [a.name for a in rows if not a.agrees]
    return ["## fp8rl's KL against verl's own", "",
           "Each verl run's train–rollout KL is computed twice from the same tokens of verl's batch: by fp8rl from "
           "the captured tokens table and by verl (`rollout_corr/k3_kl`, `rollout_corr/kl`, float32). They agree "
           f"when the largest per-step k3 difference is at most {VERL_K3_ABS_TOL:.2g} + {VERL_K3_REL_TOL:g} × the "
           "run's largest per-step k3; a disagreement is a bug in one of them (a run whose tokens are a sample of "
           "each step's batch, `verl.token_sequences`, has no row: verl's numbers cover the whole batch). "
           f"**{len(rows) - len(bad)} of {len(rows)} verl runs agree**"
           + (f"; they disagree in {', '.join(bad)}." if bad else "."), "",
           *_table(["run", "steps", "k3 verl", "k3 fp8rl", "k1 verl", "k1 fp8rl", "largest step difference (k3)",
                    "bound", "agree"],
                   [[a.name, a.steps, f"{a.verl_k3:.4g}", f"{a.fp8rl_k3:.4g}", f"{a.verl_k1:.4g}", f"{a.fp8rl_k1:.4g}",
                     f"{a.max_diff:.2g}", f"{a.bound:.2g}", "yes" if a.agrees else "**no**"] for a in rows]),
           "", "k3 and k1: means over the run's steps.", ""]


def _verl_cost_lines(data: SweepData) -> list[str]:
    """What fp8rl cost: one line per verl run that timed its parts (fp8rl_core.verl.costs), its measured share."""
    if data.runs.empty or "fp8rl/added_share" not in data.runs.columns:
        return []
    lines = [f"- {r['name']}: {100 * r['fp8rl/added_share']:.1f}% of the step ({r['fp8rl/added_s']:.2f} s a step: "
             f"export {r['fp8rl/export_s']:.2f} s, checks {r['fp8rl/checks_s']:.2f} s, masters' copy "
             f"{r['fp8rl/keep_s']:.2f} s, token capture {r['fp8rl/capture_s']:.2f} s)"
             for r in data.runs.to_dict("records")
             if r.get("backend") == "verl" and r.get("fp8rl/added_share") == r.get("fp8rl/added_share")
             and r.get("fp8rl/added_share") is not None]
    return ["## What fp8rl cost", "", "fp8rl's parts inside each verl run, timed in the run, as a share of verl's "
            "mean step (`timing_s/step`; docs/gpu.md, What fp8rl costs inside verl):", "", *lines, ""] if lines else []


def _checks_section(data: SweepData) -> list[str]:
    ch = data.checks
    if ch.empty or "condition" not in ch.columns:
        return []
    passed = ch["passed"].astype(bool)
    rows = []
    for c in CONDITIONS:
        sel = ch["condition"] == c
        if not sel.any():
            continue
        runs = ch.loc[sel, "run_id"].nunique() if "run_id" in ch.columns else 1
        rows.append([c, int(sel.sum()), int(passed[sel].sum()), int((~passed[sel]).sum()), runs])
    out = ["## Weight-sync checks", "", f"{int(passed.sum())} of {len(ch)} checks passed.", "",
           *_table(["condition", "checks", "passed", "failed", "runs"], rows), ""]
    groups = sync_groups(data)
    if groups:
        out += ["By what the sampler holds after a sync (its preset): claim (c) counts only the syncs on the learner's "
                "grid; the others' key checks show what the last column says.", "",
                *_table(["sampler holds", "presets", "runs", "syncs", "key checks passed", "all checks passed",
                         "what the key checks show"],
                        [[g.label, ", ".join(g.presets) or "–", g.runs, g.syncs,
                          ", ".join(f"{c} {t}" for c, t in g.key_tallies()) or "–", str(g.checks), g.shows]
                         for g in groups]), ""]
    return out


def _figures(data: SweepData, out: Path, table: pd.DataFrame, cms: list, n_boot: int,
             seed: int) -> list[tuple[str, str]]:
    """Draw every figure the data allows: [(file name, caption)]."""
    figs: list[tuple[str, str]] = []
    kl_metrics = [m for m in ("probe_kl", "k3") if not table.empty and (table["metric"] == m).any()]
    if kl_metrics:
        rows = table[table["metric"].isin(kl_metrics)].assign(sweep=data.sweep)
        plots.kl_by_preset(rows, out / "kl_by_preset.png", kl_metrics if len(kl_metrics) > 1 else kl_metrics[0])
        caption = {("probe_kl", "k3"): "Train–rollout KL per sampler preset: exact probe KL (left) and sampled-token "
                                       "k3 (right), 95% CI",
                   ("probe_kl",): "Train–rollout KL per sampler preset: exact probe KL, 95% CI",
                   ("k3",): "Train–rollout KL (k3) per sampler preset, 95% CI"}[tuple(kl_metrics)]
        figs.append(("kl_by_preset.png", caption))
        if "k3" in kl_metrics:
            plots.kl_over_steps(data, out / "kl_over_steps.png", "k3", n_boot=n_boot, seed=seed)
            figs.append(("kl_over_steps.png", "KL (k3) per RL step, mean over seeds, 95% CI band"))
    if not data.steps.empty and "mean_reward" in data.steps.columns and not data.runs.empty:
        plots.reward_over_steps(data, out / "reward_over_steps.png")
        figs.append(("reward_over_steps.png", "RL reward per step: each seed (thin) and the mean over seeds (thick)"))
    for i, (model, cm) in enumerate(cms):
        if isinstance(cm, str):
            continue
        mb = data.microbatches
        if model is not None:
            mb = with_run_columns(mb, data.runs, ["model"])
            mb = mb[mb["model"].astype(str) == model].drop(columns="model")
        name = "microbatch_time.png" if len(cms) == 1 else f"microbatch_time_{i + 1}.png"
        plots.microbatch_time(mb, cm, out / name, title=model or data.sweep)
        figs.append((name, f"Seconds per micro-batch vs tokens, BF16 vs MXFP8{f' ({model})' if model else ''}"))
    st = data.steps
    if not st.empty and "run_id" in st.columns and any(c in st.columns for c in plots.STEP_PHASES):
        joined = with_run_columns(st, data.runs, ["preset", "model", "seed"]).dropna(subset=["preset"])
        if not joined.empty:
            plots.step_breakdown(joined, out / "step_breakdown.png", presets=preset_order(data), title=data.sweep)
            figs.append(("step_breakdown.png", "Mean seconds per RL step by phase and preset"))
    if data.matrix:
        plots.detection_matrix(data.matrix, out / "detection_matrix.png")
        figs.append(("detection_matrix.png", "Detection matrix: injected faults × checks"))
    return figs


def write_report(data: SweepData, out_dir: str | Path, *, trace_paths: Any = None, generated: str | None = None,
                 n_boot: int = 2000, seed: int = 0, metrics: Sequence[str] = REPORT_METRICS, figures: bool = True,
                 inputs: bool = True) -> Path:
    """Write ``summary.md`` and the figures of ``data`` into ``out_dir`` (created if missing); return the
    path of ``summary.md``. ``figures``: draw the PNGs (off: the summary without its figures section);
    ``inputs``: also store ``data`` and these settings in ``out_dir/inputs/``, from which
    :func:`~.inputs.check_tables` renders the tables again (:mod:`.inputs`).

    ``trace_paths``: GPU profiler traces for claim g (see :func:`~fp8rl_core.report.verdicts.evaluate_claims`).
    ``generated``: an optional stamp (e.g. a date) printed under the title — nothing else depends on
    when the report is written. ``n_boot``, ``seed``: every bootstrap's settings. ``metrics``: the
    sampled-token rows of the per-preset mismatch tables (the exact probe rows
    :data:`~fp8rl_core.report.data.PROBE_METRICS` come first whenever ``data.probe`` is not empty)."""
    if inputs:
        save_inputs(data, out_dir, n_boot=n_boot, seed=seed, metrics=metrics, traces=trace_paths is not None)
    if not data.matching.empty:  # a fixed-weights sweep: its own report
        return write_matching_report(data, out_dir, n_boot=n_boot, seed=seed, generated=generated, figures=figures)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = evaluate_claims(data, trace_paths=trace_paths, n_boot=n_boot, seed=seed)
    absent = absent_claims(data, rows)
    parts = []
    if not data.probe.empty:
        parts.append(interval_table(data, PROBE_METRICS, by=("model", "preset"), n_boot=n_boot, seed=seed))
    if not data.tokens.empty:
        parts.append(interval_table(data, metrics, by=("model", "preset"), n_boot=n_boot, seed=seed))
    parts = [p for p in parts if not p.empty]
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else (parts[0] if parts else pd.DataFrame())
    cms = cost_models(data, n_boot=n_boot, seed=seed)
    figs = _figures(data, out, table, cms, n_boot, seed) if figures else []

    r = data.runs
    models = sweep_models(data)
    seeds = sorted({int(s) for s in r["seed"]}) if not r.empty else []
    lines = [f"# fp8rl report: {data.sweep}", ""]
    if generated:
        lines += [f"Generated {generated}.", ""]
    lines += [f"Sweep `{data.sweep}`: {len(r)} finished runs; models {', '.join(models) or '–'}; presets "
              f"{', '.join(preset_order(data)) or '–'}; seeds {', '.join(map(str, seeds)) or '–'}"
              + ("; MXFP8 emulated on CPU." if data.emulated else "."), ""]
    untokened = verl_runs_without_tokens(data)
    if untokened:
        lines += [VERL_NOTE.format(runs=", ".join(untokened)), ""]
    lines += ["## The paper's claims", "",
              "Paper: docs/design.md, reference results (single seed, B200). Verdict: *reproduced* when the 95% CI lies on "
              "the claimed side; *contradicted* when it lies on the other side of no change; *unresolved* when it "
              "includes no change (the why says what sample a resolution would need); *not measurable here* when "
              "this setup cannot show it (reason given)."
              + (" Each KL claim is measured twice: *exact probe KL* (primary: the exact full-vocabulary KL per "
                 "position on a fixed held-out probe batch at the final weights, paired by seed and probe sequence) "
                 "and *sampled-token k3* (the k3 estimator on the tokens the sampler drew, paired by prompt; on "
                 "very peaked policies it is dominated by rare tokens, so its intervals are wide)."
                 if not data.probe.empty else "")
              + " " + TAIL_NOTE, ""]
    if rows:
        lines += _table(["claim", "paper", "measured (CI)", "verdict", "why"],
                        [[c.claim, c.paper, c.measured, f"**{c.verdict}**", c.why] for c in rows])
    else:
        lines += ["No claim can be tested on this sweep."]
    lines += [""]
    if absent:
        lines += ["Not tested by this sweep: " + "; ".join(f"{a.claim} (needs {a.needs})" for a in absent) + ".",
                  ""]
    if not r.empty:
        lines += _runs_section(data)
    lines += _kl_section(table, preset_order(data))
    lines += _verl_section(data)
    lines += _verl_cost_lines(data)
    lines += _requant_section(data, n_boot, seed)
    lines += _factors_section(factors_across_models(data, n_boot=n_boot, seed=seed))
    lines += _power_section(power_rows(data))
    lines += _cost_section(cms)
    lines += _checks_section(data)
    if figs:
        lines += ["## Figures", ""]
        for name, caption in figs:
            lines += [f"### {caption}", "", f"![{caption}]({name})", ""]
    path = out / "summary.md"
    path.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")
    return path


def check_tables(report_dir: str | Path) -> TableCheck:
    """Render the report in ``report_dir`` again from its stored inputs (:mod:`.inputs`) with today's code —
    the same bootstrap settings and metrics, no figures — and compare its table lines with the stored
    ``summary.md``'s, byte for byte."""
    import tempfile

    folder = Path(report_dir)
    data, settings = load_inputs(folder)
    stored = (folder / "summary.md").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="fp8rl-check-") as tmp:
        today = write_report(data, tmp, figures=False, inputs=False, **settings).read_text(encoding="utf-8")
    return compare_tables(str(folder), stored, today)
