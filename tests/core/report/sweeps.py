"""Synthetic sweeps whose answer is known by construction, shared by the report tests (and the reporting
task's).

The builders plant the train–rollout mismatch of each preset: every sampled token's log-ratio
is ±δ·u (signs alternating within a sequence), with δ the preset's level and u a per-sequence factor
shared by all presets for the same (seed, step, sequence) — the same prompt — times a small
per-preset jitter. A sequence of L tokens then has k3 sum (L/2)·2(cosh(δu) − 1), so KL ratios are
about (δ_b/δ_a)² and exactly what :func:`expected_k3_ratio` recomputes from the rows with plain
numpy. Timings (steps, micro-batches) are planted the same way: affine cost lines and step times
with a known ratio.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fp8rl_core.report import SweepData

DENSE, MOE = "qwen3-dense-mini", "qwen3-moe-mini"
BASE_DELTA = 0.1
#: planted |log r| level per preset: KL ratios ≈ 0.89 (half), 0.84 (all), 2 (other-grid vs all),
#: 4 (all vs bf16-e2e) relative to the preset named in each claim
LEVELS = {
    "bf16-e2e": BASE_DELTA * math.sqrt(0.84 / 4.0),
    "bf16-sampler": BASE_DELTA,
    "half": BASE_DELTA * math.sqrt(0.89),
    "all": BASE_DELTA * math.sqrt(0.84),
    "other-grid": BASE_DELTA * math.sqrt(0.84 * 2.0),
}
PRECISION = {"bf16-e2e": "bf16"}


def _u(seed: int, step: int, seq: int) -> float:
    """The shared per-prompt factor: the same for every preset at (seed, step, sequence)."""
    return float(np.exp(0.3 * np.random.default_rng([seed, step, seq, 7]).standard_normal()))


def token_rows(preset: str, seed: int, *, delta: float, steps: int = 2, seqs: int = 8, length: int = 6,
               jitter: float = 0.02, shared: bool = True) -> list[dict]:
    """The ``tokens`` table of one run with planted log-ratios (see the module docstring)."""
    rows = []
    rng = np.random.default_rng([seed, sum(map(ord, preset))])
    for step in range(1, steps + 1):
        for seq in range(seqs):
            u = _u(seed, step, seq) if shared else float(np.exp(0.3 * rng.standard_normal()))
            x = delta * u * float(np.exp(jitter * rng.standard_normal()))
            for pos in range(length):
                s = -1.0 - 0.05 * pos
                rows.append({"step": step, "version": step - 1, "sequence": seq, "position": pos, "token": 3 + pos,
                             "sampler_logprob": s, "learner_logprob": s + (x if pos % 2 == 0 else -x)})
    return rows


def step_rows(preset: str, model: str, seed: int, steps: int = 2) -> list[dict]:
    """A valid ``steps`` table with planted times: generate 1.0 s (bf16-e2e) vs 0.76 s (all) on MoE;
    step time without checks in the ratio 0.893 (MoE) and 1.05 (dense) of all vs bf16-e2e."""
    rng = np.random.default_rng([seed, sum(map(ord, preset + model))])
    moe = "moe" in model
    fast = preset != "bf16-e2e"
    rows = []
    for step in range(1, steps + 1):
        noise = float(np.exp(0.01 * rng.standard_normal()))
        gen = (0.76 if (fast and moe) else 1.0) * noise
        step_s = (0.893 if moe else 1.05) * 2.0 if fast else 2.0
        step_s *= noise
        parts = {"generate_s": gen, "learner_s": 0.5 * noise, "export_s": 0.05, "transport_s": 0.02, "load_s": 0.03,
                 "reset_s": 0.01}
        rows.append({"step": step, "version": step - 1, "new_version": step, "sequences": 8, "tokens": 48,
                     "cached_tokens": 0, "mean_reward": 0.5, "loss": 0.1, "grad_norm": 1.0, "clip_fraction": 0.0,
                     "mean_abs_logprob_diff": 0.05, "max_abs_logprob_diff": 0.2, "k3": 0.0012, **parts,
                     "total_s": step_s + 0.1, "checks_s": 0.1, "microbatches": 2, "sync_bytes": 1000,
                     "sync_buckets": 1, "check/W2": 1.0})
    return rows


def check_rows(steps: int = 2, fail_w2_at: int | None = None) -> list[dict]:
    """A ``checks`` table: the cheap tier (W1, W2, W4, W5, W6) at each sync; all pass unless
    ``fail_w2_at`` names a sync where W2 fails with 3 offenders."""
    rows = []
    for sync in range(1, steps + 1):
        for cond in ("W1", "W2", "W4", "W5", "W6"):
            bad = cond == "W2" and sync == fail_w2_at
            rows.append({"version": sync, "sync": sync, "tier": "cheap", "why": "every sync", "report_seconds": 0.1,
                         "condition": cond, "passed": not bad, "measured": 3.0 if bad else 0.0, "bound": 0.0,
                         "count": 3 if bad else 0, "seconds": 0.01, "detail": "bytes equal",
                         "offenders": "model.layers.0.mlp.down_proj" if bad else ""})
    return rows


def microbatch_rows(run_id: str, precision: str, budget: int, *, fixed: float, per_token: float, steps: int = 2,
                    n: int = 4, noise: float = 0.01) -> list[dict]:
    """Micro-batches of ``budget`` padded tokens (16-token rows) costing ``fixed + per_token·tokens``
    seconds, times a 1% log-normal noise."""
    rng = np.random.default_rng([budget, len(precision), int(fixed * 1e6)])
    rows = []
    for step in range(1, steps + 1):
        for i in range(n):
            secs = (fixed + per_token * budget) * float(np.exp(noise * rng.standard_normal()))
            rows.append({"run_id": run_id, "precision": precision, "step": step, "microbatch": i,
                         "tokens_per_microbatch": budget, "rows": budget // 16, "tokens": budget,
                         "real_tokens": budget - 3, "seconds": secs,
                         "quantize_s": 0.2 * secs if precision == "mxfp8" else 0.0, "gemm_s": 0.3 * secs})
    return rows


def make_sweep(*, presets=tuple(LEVELS), models=(DENSE, MOE), seeds=(0, 1, 2), levels=None, checks=True,
               fail_w2=False, microbatches=None, emulated=True, steps=True, shared=True, name="synthetic") -> SweepData:
    """A sweep over models × presets × seeds with the planted levels (``levels`` overrides some)."""
    lv = dict(LEVELS) | dict(levels or {})
    runs, toks, sts, chs = [], [], [], []
    for model in models:
        for preset in presets:
            for seed in seeds:
                rid = f"{model}-{preset}-{seed}"
                runs.append({"run_id": rid, "name": f"{model[6:]}/{preset}/s{seed}", "preset": preset, "model": model,
                             "seed": seed, "learner_precision": PRECISION.get(preset, "mxfp8"),
                             "tokens_per_microbatch": 1024, "group_size": 4, "time/step_s": 2.0, "kl/k3": 0.01})
                toks += [r | {"run_id": rid} for r in token_rows(preset, seed, delta=lv[preset], shared=shared)]
                if steps:
                    sts += [r | {"run_id": rid} for r in step_rows(preset, model, seed)]
                if checks:
                    bad = 2 if (fail_w2 and rid == f"{models[0]}-{presets[-1]}-{seeds[0]}") else None
                    chs += [r | {"run_id": rid} for r in check_rows(fail_w2_at=bad)]
    return SweepData(sweep=name, runs=pd.DataFrame(runs), tokens=pd.DataFrame(toks), steps=pd.DataFrame(sts),
                     checks=pd.DataFrame(chs), microbatches=pd.DataFrame(microbatches or []), emulated=emulated)


def cost_sweep(bf16: tuple[float, float], mxfp8: tuple[float, float], *, emulated: bool = True) -> SweepData:
    """A micro-batch sweep: presets bf16-e2e (BF16 learner) and all (MXFP8), five token budgets; the
    tuples are (fixed s, per-token s) of each precision's planted cost line."""
    runs, mbs = [], []
    for preset, prec, (fixed, per_tok) in (("bf16-e2e", "bf16", bf16), ("all", "mxfp8", mxfp8)):
        for budget in (256, 512, 1024, 2048, 4096):
            rid = f"{preset}-{budget}"
            runs.append({"run_id": rid, "name": rid, "preset": preset, "model": DENSE, "seed": 0,
                         "learner_precision": prec, "tokens_per_microbatch": budget, "group_size": 4})
            mbs += microbatch_rows(rid, prec, budget, fixed=fixed, per_token=per_tok)
    return SweepData(sweep="microbatch-sweep", runs=pd.DataFrame(runs), microbatches=pd.DataFrame(mbs),
                     emulated=emulated)


def expected_k3_ratio(data: SweepData, model: str, baseline: str, candidate: str) -> float:
    """Token-mean k3 of candidate / baseline straight from the token rows: mean of e^x − 1 − x."""
    t = data.tokens.merge(data.runs[["run_id", "model", "preset"]], on="run_id")
    x = t["learner_logprob"] - t["sampler_logprob"]
    k3 = np.exp(x) - 1.0 - x
    sel = t["model"] == model
    return float(k3[sel & (t["preset"] == candidate)].mean() / k3[sel & (t["preset"] == baseline)].mean())


def by_id(rows, cid, model=None):
    """The one row of claim ``cid`` (on ``model``, if given) among a sweep's claim rows."""
    hits = [r for r in rows if r.id == cid and (model is None or r.model == model)]
    assert len(hits) == 1, [r.claim for r in rows]
    return hits[0]
