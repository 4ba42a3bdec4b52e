"""One run's train–rollout mismatch as ``kl_summary`` rows: per step and for the whole run, with bootstrap
confidence intervals over sequences.

The token table of a run (:func:`fp8rl_core.loop.rollout_and_learn`: step, sequence, sampler_logprob,
learner_logprob per sampled token) goes through :func:`fp8rl_core.metrics.mismatch.token_mismatch`
(every metric) and, for the metrics in :data:`CI_METRICS`, :func:`fp8rl_core.metrics.stats.cluster_bootstrap`
over per-sequence units (a sequence's tokens share a prompt and a sampling path, so they are not
independent draws; resampling tokens would understate the interval). Sequence ids are (step, sequence):
the loop numbers sequences from 0 in every step.

Rows follow the ``kl_summary`` schema (:mod:`fp8rl_core.schemas`): ``step`` is the step number, or None
for the whole-run row; ``<metric>_lo`` / ``<metric>_hi`` are the interval bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .mismatch import metric_units, sequence_table, token_mismatch
from .stats import cluster_bootstrap

__all__ = ["BOOTSTRAP_RESAMPLES", "CI_LEVEL", "CI_METRICS", "run_kl_summary"]

#: defaults of the run's intervals (also the experiment config's ``metrics`` section defaults)
BOOTSTRAP_RESAMPLES = 1000
CI_LEVEL = 0.95

#: metrics that get a bootstrap interval (token means and sequence means; maxima have none)
CI_METRICS = ("k1", "k3", "k1_rev", "k3_rev", "mean_abs_logprob_diff", "mean_abs_prob_diff",
              "token_mult_prob_error", "chi2_token", "chi2_seq", "log_ppl_diff")


def _row(s: np.ndarray, lrn: np.ndarray, ids: np.ndarray, meta: Mapping, step: int | None, n_boot: int,
         level: float, seed: int) -> dict:
    row = dict(meta) | {"step": step} | token_mismatch(s, lrn, ids)
    row["tokens"], row["sequences"] = int(row["tokens"]), int(row["sequences"])
    row["chi2_seq_clamped"] = int(row.get("chi2_seq_clamped", 0))
    if n_boot > 0:
        table = sequence_table(s, lrn, ids)
        for m in CI_METRICS:
            num, den = metric_units(table, m)
            ci = cluster_bootstrap(num, den, n_boot=n_boot, level=level, seed=seed)
            row[f"{m}_lo"], row[f"{m}_hi"] = float(ci.lo), float(ci.hi)
    return row


def run_kl_summary(tokens: Sequence[Mapping], *, run_id: str, preset: str, model: str, seed: int,
                   n_boot: int = BOOTSTRAP_RESAMPLES, level: float = CI_LEVEL, boot_seed: int = 0) -> list[dict]:
    """``kl_summary`` rows of one run: one per step (in step order), then the whole-run row (step None).

    ``tokens``: the run's token rows (keys step, sequence, sampler_logprob, learner_logprob). Intervals
    at ``level`` from ``n_boot`` sequence resamples (0: none), seeded by ``boot_seed``."""
    if not tokens:
        raise ValueError(f"run {run_id}: the token table is empty — no sampled tokens to measure KL on")
    steps = np.array([int(t["step"]) for t in tokens])
    s = np.array([float(t["sampler_logprob"]) for t in tokens])
    lrn = np.array([float(t["learner_logprob"]) for t in tokens])
    ids = np.stack([steps, np.array([int(t["sequence"]) for t in tokens])], axis=1)
    meta = {"run_id": run_id, "preset": preset, "model": model, "seed": int(seed)}
    rows = []
    for st in sorted(set(steps.tolist())):
        sel = steps == st
        rows.append(_row(s[sel], lrn[sel], ids[sel], meta, int(st), n_boot, level, boot_seed))
    rows.append(_row(s, lrn, ids, meta, None, n_boot, level, boot_seed))
    return rows
