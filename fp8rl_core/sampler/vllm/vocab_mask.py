"""The vocabulary tail's mask in fp8rl's own vLLM engine: the logits of ids ≥ ``emittable`` set to −inf.

Rule: :mod:`fp8rl_core.learner.vocab_tail` — the same mask verl's vLLM rollout applies (verl 0.9.1,
``verl/workers/rollout/vllm_rollout/utils.py``, ``monkey_patch_compute_logits``: the model's ``compute_logits``
wrapped, its output's ``[..., len(tokenizer):]`` set to −inf), so sampling, the sampled tokens' log-probs
(``logprobs_mode="raw_logprobs"`` reads ``compute_logits``' output) and the prompt log-probs all see it. The
wrapper is installed once per model and reads the limit at each call, so a pooled engine serves the next run
with that run's limit (:meth:`fp8rl_core.sampler.seam.Sampler.limit_vocabulary`); None lifts it.
"""

from __future__ import annotations

from types import MethodType

import torch

__all__ = ["limit_vocabulary"]


def limit_vocabulary(model: torch.nn.Module, emittable: int | None) -> int | None:
    """Mask ``model``'s logits beyond ``emittable`` from now on (None: no mask); returns the limit set."""
    if not hasattr(model, "fp8rl_compute_logits"):
        model.fp8rl_compute_logits = model.compute_logits

        def compute_logits(self, *args, **kwargs):
            logits = self.fp8rl_compute_logits(*args, **kwargs)
            if logits is not None and self.fp8rl_emittable is not None:
                logits[..., self.fp8rl_emittable:] = float("-inf")
            return logits

        model.compute_logits = MethodType(compute_logits, model)
    model.fp8rl_emittable = None if emittable is None else int(emittable)
    return model.fp8rl_emittable
