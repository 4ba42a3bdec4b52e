"""The vocabulary tail: the ids a sampler can never emit, and the learner's distribution restricted like it.

Rule (one for every engine fp8rl drives and every preset): a sampler emits only the ids below its checkpoint's
tokenizer length, ``len(tokenizer)`` — verl's vLLM rollout sets the logits of ids ≥ ``len(tokenizer)`` to −inf
(verl 0.9.1, ``verl/workers/rollout/vllm_rollout/utils.py``, ``monkey_patch_compute_logits``, called by
``vLLMHttpServer.run_server`` with ``vocab_size=len(tokenizer)``), and fp8rl's own vLLM engine applies the same
mask (:meth:`fp8rl_core.sampler.seam.Sampler.limit_vocabulary`). A checkpoint without a tokenizer (fp8rl's own
warm start, the addition task's ids) and one whose tokenizer covers its vocabulary have no tail.
Which engine follows the rule is its row's ``masks_tail`` (:data:`fp8rl_core.sampler.capabilities.CAPABILITIES`,
read by the run config; verl's SGLang rollout does not mask: nothing is cut there).

The comparisons that judge precision (W7's probe, the exact probe KL) restrict the learner the same way
(:func:`restrict`: log-softmax over the emittable ids), so the mask is not counted as a precision error; the
mass the learner puts on the tail is its own number (:func:`tail_mass`). docs/correctness.md (W7) and
docs/metrics.md ("The vocabulary tail").
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["emittable_ids", "restrict", "tail_mass"]

def emittable_ids(checkpoint: str | Path | None, vocab_size: int) -> int | None:
    """How many ids (0 … n-1) a masking sampler of ``checkpoint`` can emit: ``len(tokenizer)`` of its tokenizer
    where it has one and that is shorter than ``vocab_size`` (the model's embedding rows); None (no tail) for no
    checkpoint directory, no tokenizer, or a tokenizer as long as the vocabulary or longer."""
    if checkpoint is None:
        return None
    path = Path(checkpoint).expanduser()
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(str(path)))
    return n if n < vocab_size else None


def restrict(logprobs: torch.Tensor, emittable: int | None) -> torch.Tensor:
    """Full-vocabulary log-probs [..., V] → the same distribution conditioned on the ids below ``emittable``
    [..., emittable] (log-softmax over those ids: what a sampler that masks the tail computes). None: unchanged."""
    if emittable is None:
        return logprobs
    head = logprobs[..., :emittable]
    return head - torch.logsumexp(head, dim=-1, keepdim=True)


def tail_mass(logprobs: torch.Tensor, emittable: int | None) -> torch.Tensor:
    """The probability [...] that full-vocabulary log-probs [..., V] put on the ids at and beyond ``emittable``
    (0 where there is no tail)."""
    if emittable is None or emittable >= logprobs.shape[-1]:
        return torch.zeros(logprobs.shape[:-1], dtype=torch.float32)
    return torch.logsumexp(logprobs[..., emittable:].float(), dim=-1).exp()
