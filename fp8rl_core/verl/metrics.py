"""A verl run's summary metrics from the per-step metrics verl's trainer logs (docs/metrics.md, verl runs).

verl logs, per RL step, its train–rollout mismatch (``rollout_corr/*`` from the rollout's own log-probs
against the actor's recomputed ones, ``training/rollout_probs_diff_*``), the reward and its timings. A
native run's summary metrics (``kl/k3``, ``reward/final``, ``time/warm_step_s`` …) are what the headline
columns and the report read, so :func:`summary` gives a verl run the same names where verl measures the
same quantity (verl's estimators are fp8rl's, docs/metrics.md; pooled per step here, per run there), and
keeps verl's own under ``verl/`` where fp8rl has none; the table of which metric comes from which is in
docs/metrics.md (verl runs).

No verl metric is the exact full-vocabulary KL on a probe batch (``kl/full_kl``): a verl run has no such
summary metric. The token-level ones (``kl/mean_abs_logprob_diff`` and every other estimator, with intervals)
come from the run's captured tokens table (:mod:`fp8rl_core.verl.capture`), as for native runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["VERL_METRICS", "summary"]

#: verl's per-step metrics :func:`summary` reads
VERL_METRICS = ("rollout_corr/k3_kl", "rollout_corr/kl", "critic/score/mean", "timing_s/step",
                "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "timing_s/update_weights")


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def summary(history: Mapping[str, Sequence[tuple[int, float]]]) -> dict[str, float]:
    """The summary metrics (module docstring) of verl's per-step ``history``: metric → (step, value) pairs;
    a metric verl did not log gives no summary metric."""
    by = {k: [v for _, v in sorted(h)] for k, h in history.items() if h}
    out: dict[str, float] = {}

    def put(name: str, src: str, fn) -> None:
        if src in by:
            out[name] = float(fn(by[src]))

    put("kl/k3", "rollout_corr/k3_kl", _mean)
    put("kl/k1", "rollout_corr/kl", _mean)
    put("verl/k3_kl", "rollout_corr/k3_kl", _mean)
    put("verl/kl", "rollout_corr/kl", _mean)
    put("reward/final", "critic/score/mean", lambda v: v[-1])
    put("reward/first", "critic/score/mean", lambda v: v[0])
    put("time/first_step_s", "timing_s/step", lambda v: v[0])
    if len(by.get("timing_s/step", ())) > 1:
        out["time/warm_step_s"] = _mean(by["timing_s/step"][1:])
    put("kl/mean_abs_prob_diff", "training/rollout_probs_diff_mean", _mean)
    put("kl/max_abs_prob_diff", "training/rollout_probs_diff_max", max)
    put("verl/update_weights_s", "timing_s/update_weights", _mean)
    if by:
        out["verl/steps"] = float(max(len(v) for v in by.values()))
    return out
