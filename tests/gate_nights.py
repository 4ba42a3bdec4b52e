"""Nights for the history gate's replay tests, built from real nightly-sized outputs: the committed per-step and
per-token tables of two sweeps on the nightly's models (docs/results/dense-matching and moe-grids: the mini dense
and MoE models, 4 presets each, seeds 0–2, 8 steps of 4 prompts × group 4 — the nightly's own step size). Each of
those 24 runs is one run identity of a night, its steps 1–3 (the nightly's 3 steps) the steps a night logs.

How a night differs from the data (noise drawn from the data, seeded by the night's number):

- mismatch (k3, gen_kl_error, mean |Δlogp|, token_mult_prob_error) and reward: the step's own, every night — a
  nightly runs one seed on one machine, and fp8rl's CPU runs repeat bit for bit at a given thread count
  (docs/library.md, Determinism). Whether the nightly's numbers really repeat is what issue 65's item 7a measures;
  ``resample=True`` gives the other extreme: the step's 64 sequences resampled with replacement (a bootstrap over
  sequences, the metrics recomputed by :mod:`fp8rl_core.metrics.mismatch`) and the reward as 64 Bernoulli draws at
  the step's rate — a night whose sampler drew other sequences (docs/correctness.md says what the gate can and
  cannot catch then);
- seconds (generate, learner, export, transport, load, reset, checks; the step's total their sum plus the rest the
  data recorded): the data's value × a night factor (one per night: a run's median step time over its
  (model, preset) group's median, drawn from the 24 runs) × a step factor (a step's value over its run's median
  of steps 2–8, drawn per phase from the 168 such ratios);
- tail mass: 0 in the data, 0 every night (the floor of its rule is what is tested).

A planted regression changes a night as the real change would: ``kl2`` scales one preset's per-token log-ratios by
√2 (k3 ≈ ½ log²r doubles), ``sync3`` triples export + transport + load + reset, ``checks3`` triples the checks'
share of the step (checks_s grows, the step with it), ``reward`` removes ``drop`` from every step's reward.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from fp8rl_core.metrics import gen_kl_error, kl_estimators, token_mult_prob_error

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
SWEEPS = ("dense-matching", "moe-grids")
STEPS = (1, 2, 3)
PHASES = ("generate_s", "learner_s", "export_s", "transport_s", "load_s", "reset_s", "checks_s")
SYNC = ("export_s", "transport_s", "load_s", "reset_s")


@cache
def data() -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """(steps, tokens, run id → name) of the two sweeps, steps 1–8 of every run."""
    steps, tokens, names = [], [], {}
    for s in SWEEPS:
        inputs = RESULTS / s / "inputs"
        steps.append(pd.read_parquet(inputs / "steps.parquet"))
        tokens.append(pd.read_parquet(inputs / "tokens.parquet"))
        runs = pd.read_parquet(inputs / "runs.parquet")
        names |= dict(zip(runs.run_id, runs.name, strict=True))
    return pd.concat(steps, ignore_index=True), pd.concat(tokens, ignore_index=True), names


@cache
def _ratios() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(night factors, per-phase step factors) as the module docstring defines them."""
    steps, _, names = data()
    per_run = steps.groupby("run_id").total_s.median()
    group = per_run.groupby(lambda rid: names[rid].rsplit("·", 1)[0]).transform("median")
    night = (per_run / group).to_numpy()
    later = steps[steps.step >= 2]
    step = {p: (later[p] / later.groupby("run_id")[p].transform("median")).dropna().to_numpy() for p in PHASES}
    return night, {p: v[np.isfinite(v)] for p, v in step.items()}


def identities() -> dict[str, str]:
    """run id → run name of the 24 identities a night holds."""
    return dict(sorted(data()[2].items()))


@cache
def _cells() -> dict[tuple[str, int], tuple[dict, np.ndarray, np.ndarray, list[np.ndarray]]]:
    """(run id, step) → (the step's row, sampler and learner log-probs, each sequence's token indices)."""
    steps, tokens, _ = data()
    out = {}
    for (rid, step), tok in tokens[tokens.step.isin(STEPS)].groupby(["run_id", "step"]):
        row = steps[(steps.run_id == rid) & (steps.step == step)].iloc[0].to_dict()
        seq = tok.sequence.to_numpy()
        out[(rid, int(step))] = (row, tok.sampler_logprob.to_numpy(float), tok.learner_logprob.to_numpy(float),
                                 [np.flatnonzero(seq == q) for q in np.unique(seq)])
    return out


def night(n: int, plant: frozenset[str] = frozenset(), kl_preset: str = "dense-mini·bf16-sampler",
          drop: float = 0.3, resample: bool = False) -> dict[str, dict[int, dict[str, float]]]:
    """Night ``n``'s per-step metrics (MLflow names, as the experiment flow logs them) of every identity: run id →
    step → metric → value. ``plant``: regressions of the module docstring (``kl2`` on ``kl_preset``'s runs).
    ``resample``: the mismatch and reward of another night's sequences (the bootstrap and Bernoulli draws of the
    module docstring) rather than the step's own."""
    rng = np.random.default_rng(1000 + n)
    night_factors, step_factors = _ratios()
    factor = float(rng.choice(night_factors))
    cells = _cells()
    out: dict[str, dict[int, dict[str, float]]] = {}
    for rid, name in identities().items():
        out[rid] = {}
        for step in STEPS:
            row, s_all, l_all, seqs = cells[(rid, step)]
            if resample:
                idx = np.concatenate([seqs[i] for i in rng.integers(0, len(seqs), size=len(seqs))])
                s, lrn = s_all[idx], l_all[idx]
            else:
                s, lrn = s_all, l_all
            if "kl2" in plant and name.startswith(kl_preset):
                lrn = np.minimum(s + (lrn - s) * math.sqrt(2.0), 0.0)
            est = kl_estimators(s, lrn)
            secs = {p: float(row[p]) * factor * float(rng.choice(step_factors[p])) for p in PHASES}
            if "sync3" in plant:
                secs |= {p: 3.0 * secs[p] for p in SYNC}
            rest = max(float(row["total_s"]) - sum(float(row[p]) for p in PHASES), 0.0) * factor
            total = rest + sum(secs.values())
            if "checks3" in plant:
                share = 3.0 * secs["checks_s"] / total
                others = total - secs["checks_s"]
                secs["checks_s"] = share * others / (1.0 - share)
                total = others + secs["checks_s"]
            n_seq = int(row["sequences"])
            reward = (float(rng.binomial(n_seq, min(max(float(row["mean_reward"]), 0.0), 1.0))) / n_seq if resample
                      else float(row["mean_reward"]))
            if "reward" in plant:
                reward = max(reward - drop, 0.0)
            out[rid][step] = {
                "mismatch/k3": est["k3"], "mismatch/gen_kl_error": gen_kl_error(s, lrn),
                "mismatch/mean_abs_logprob_diff": est["mean_abs_logprob_diff"],
                "mismatch/token_mult_prob_error": token_mult_prob_error(s, lrn), "mismatch/tail_mass": 0.0,
                "reward/mean": reward, "time/step_s": total, **{f"time/{p}": v for p, v in secs.items()},
            }
    return out
