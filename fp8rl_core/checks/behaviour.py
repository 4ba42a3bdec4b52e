"""W7 behaviour: on a fixed probe batch the sampler's token log-probs match the learner's for the same
weights, within the run's declared bound.

The learner side is :meth:`fp8rl_core.learner.learner.Learner.probe_logprobs` — fp32, on the weights
exactly as a synced sampler holds them (on-grid layers through the learner's MXFP8 forward operands and
activation rule, everything else as its BF16 view) — and the sampler side is the live engine's prompt
log-probs of the same sequences (prompt-logprob requests bypass the prefix cache). With a float32 engine
both run the same arithmetic up to summation order: measured |Δlogp| ≤ 1e-6 with BF16 weights, mean
1e-4 / max 8e-3 on the learner's grid (fp32 summation order flips a few FP8 activation roundings). A
BF16 engine adds BF16 activations and accumulations; a sampler on another grid (block FP8) differs by
that grid's rounding — the bound is declared per run (:class:`~fp8rl_core.checks.runner.CheckPolicy`).
"""

from __future__ import annotations

import math
import time

import torch

from .basic import CheckResult

__all__ = ["behaviour_numbers", "check_behaviour", "judged_differences"]


def judged_differences(sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                       min_prob: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(|Δlogp| per probe position, which positions W7 judges): those where the learner or the sampler gives the
    probe token at least ``min_prob`` (0: every position), and any non-finite one."""
    if sampler_logprobs.shape != learner_logprobs.shape:
        raise ValueError(f"probe log-probs disagree in shape: sampler {tuple(sampler_logprobs.shape)}, "
                         f"learner {tuple(learner_logprobs.shape)}")
    s, lrn = sampler_logprobs.float(), learner_logprobs.float()
    d = (s - lrn).abs()
    if min_prob <= 0:
        return d, torch.ones_like(d, dtype=torch.bool)
    # a position both sides deem negligible says nothing of a rounding engine (policy.W7_COARSE_MIN_PROB)
    return d, (torch.maximum(s, lrn) >= math.log(min_prob)) | ~torch.isfinite(d)


def behaviour_numbers(sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                      min_prob: float = 0.0) -> tuple[float, float]:
    """W7's (mean, max) |Δlogp| over the judged probe positions (:func:`judged_differences`); inf where one is not
    finite, 0 where none is judged."""
    d, judged = judged_differences(sampler_logprobs, learner_logprobs, min_prob)
    if not bool(torch.isfinite(d[judged]).all()):
        return float("inf"), float("inf")
    return (float(d[judged].mean()), float(d[judged].max())) if judged.any() else (0.0, 0.0)


def check_behaviour(sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, mean_bound: float,
                    max_bound: float, min_prob: float = 0.0) -> CheckResult:
    """W7: mean and max |Δlogp| over the probe positions where the learner or the sampler gives the probe token at
    least ``min_prob`` (0: every position; :func:`judged_differences`); passes when both are within their bounds.
    ``measured`` = the mean; offenders name the worst judged positions (sequence, position, Δ)."""
    t0 = time.perf_counter()
    d, judged = judged_differences(sampler_logprobs, learner_logprobs, min_prob)
    mean, mx = behaviour_numbers(sampler_logprobs, learner_logprobs, min_prob)
    offenders: list[str] = []
    if mean > mean_bound or mx > max_bound:
        flat = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
        flat = torch.where(judged, flat, torch.full_like(flat, -1.0)).flatten()
        for i in flat.topk(min(5, int(judged.sum()))).indices.tolist():
            r, c = divmod(i, d.shape[-1])
            offenders.append(f"probe sequence {r} position {c + 1}: |Δlogp| {float(d[r, c]):.3g}")
    return CheckResult("W7", not offenders, mean, mean_bound, offenders, len(offenders),
                       time.perf_counter() - t0, f"probe |Δlogp| mean {mean:.3g} (bound {mean_bound:g}), "
                       f"max {mx:.3g} (bound {max_bound:g}) over {d.numel()} positions"
                       + (f" ({int(judged.sum())} judged: p ≥ {min_prob:g} on either side)" if min_prob > 0 else ""))
