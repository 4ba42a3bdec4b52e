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

import time

import torch

from .basic import CheckResult

__all__ = ["check_behaviour"]


def check_behaviour(sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor, mean_bound: float,
                    max_bound: float) -> CheckResult:
    """W7: mean and max |Δlogp| over every probe position; passes when both are within their bounds.
    ``measured`` = the mean; offenders name the worst positions (sequence, position, Δ)."""
    t0 = time.perf_counter()
    if sampler_logprobs.shape != learner_logprobs.shape:
        raise ValueError(f"probe log-probs disagree in shape: sampler {tuple(sampler_logprobs.shape)}, "
                         f"learner {tuple(learner_logprobs.shape)}")
    d = (sampler_logprobs.float() - learner_logprobs.float()).abs()
    finite = torch.isfinite(d)
    mean = float(d[finite].mean()) if finite.any() else float("inf")
    mx = float(d[finite].max()) if finite.any() else float("inf")
    if not bool(finite.all()):
        mean = mx = float("inf")
    offenders: list[str] = []
    if mean > mean_bound or mx > max_bound:
        flat = torch.where(finite, d, torch.full_like(d, float("inf"))).flatten()
        for i in flat.topk(min(5, flat.numel())).indices.tolist():
            r, c = divmod(i, d.shape[-1])
            offenders.append(f"probe sequence {r} position {c + 1}: |Δlogp| {float(d[r, c]):.3g}")
    return CheckResult("W7", not offenders, mean, mean_bound, offenders, len(offenders),
                       time.perf_counter() - t0, f"probe |Δlogp| mean {mean:.3g} (bound {mean_bound:g}), "
                       f"max {mx:.3g} (bound {max_bound:g}) over {d.numel()} positions")
