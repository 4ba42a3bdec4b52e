"""A plain PyTorch sampler on the learner's own model: the reference rollout when no engine is used.

``sample_completions`` draws completions token by token from ``softmax(logits / temperature)`` with a
KV cache, stops a row at EOS, and returns the log-prob of each sampled token under the distribution it
was drawn from (temperature applied), so a GRPO step can be fed exactly what an engine would hand over.
Deterministic for a given seed (a local ``torch.Generator``).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["sample_completions"]


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int,
    pad_id: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    autocast: contextlib.AbstractContextManager | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """→ (completion_ids [B, T] padded with ``pad_id``, mask [B, T] (EOS included), logprobs [B, T])."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    model.eval()
    g = torch.Generator().manual_seed(seed)
    b = prompt_ids.shape[0]
    ids = torch.full((b, max_new_tokens), pad_id, dtype=torch.long)
    mask = torch.zeros((b, max_new_tokens), dtype=torch.long)
    logps = torch.zeros((b, max_new_tokens), dtype=torch.float32)
    done = torch.zeros(b, dtype=torch.bool)
    past = None
    inp = prompt_ids
    with autocast if autocast is not None else contextlib.nullcontext():
        for t in range(max_new_tokens):
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logp = torch.log_softmax(out.logits[:, -1].float() / temperature, dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=g).squeeze(-1)
            live = ~done
            ids[live, t] = tok[live]
            mask[live, t] = 1
            logps[live, t] = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)[live]
            done |= tok == eos_id
            if done.all():
                break
            inp = tok.unsqueeze(-1)
    return ids, mask, logps
