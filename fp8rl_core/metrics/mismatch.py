"""Train–rollout mismatch per token, from the two log-prob columns of the loop's token table.

With ``log r = log p_learner − log p_sampler`` on a token *sampled from the sampler*, Schulman's
estimators of KL(sampler ‖ learner) are (http://joschu.net/blog/kl-approx.html)::

    k1 = −log r             unbiased, high variance, can be negative per token
    k2 = (log r)² / 2       biased, low variance, ≥ 0
    k3 = (r − 1) − log r    unbiased, low variance, ≥ 0

Means over all sampled tokens of a step (or a run) are returned with the mean and max |Δ log p|.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["kl_estimators", "summarize_steps"]


def kl_estimators(sampler_logprobs: Sequence[float], learner_logprobs: Sequence[float]) -> dict[str, float]:
    """Token-mean k1, k2, k3 of KL(sampler‖learner) and mean/max |Δ log p| (see the module docstring)."""
    if len(sampler_logprobs) != len(learner_logprobs):
        raise ValueError(f"log-prob columns differ in length: {len(sampler_logprobs)} vs {len(learner_logprobs)}")
    n = len(sampler_logprobs)
    if n == 0:
        raise ValueError("no tokens: cannot estimate KL from an empty table")
    k1 = k2 = k3 = abs_sum = 0.0
    abs_max = 0.0
    for s, lrn in zip(sampler_logprobs, learner_logprobs):
        log_r = lrn - s
        k1 += -log_r
        k2 += 0.5 * log_r * log_r
        k3 += math.expm1(log_r) - log_r
        abs_sum += abs(log_r)
        abs_max = max(abs_max, abs(log_r))
    return {"k1": k1 / n, "k2": k2 / n, "k3": k3 / n, "mean_abs_logprob_diff": abs_sum / n,
            "max_abs_logprob_diff": abs_max, "tokens": float(n)}


def summarize_steps(steps: Iterable[Mapping[str, float]], columns: Sequence[str]) -> dict[str, float]:
    """Mean of each timing column over the steps, and the total of ``total_s``."""
    rows = list(steps)
    if not rows:
        raise ValueError("no steps to summarize")
    out = {f"{c}_mean": sum(float(r[c]) for r in rows) / len(rows) for c in columns}
    out["total_s"] = sum(float(r["total_s"]) for r in rows)
    return out
