"""The learner: a policy model, its precision (BF16 baseline or emulated MXFP8), an optimizer and a
weight version — one object that takes rollout batches and produces GRPO updates.

Precision
---------
``bf16`` — the baseline: every layer off-grid; forwards run under CPU autocast to bfloat16 (what a
    Megatron BF16 learner computes), fp32 master weights and AdamW state.
``mxfp8`` — the layers selected by ``layers`` (a preset ``none``/``all``/``half`` or name patterns, see
    :mod:`.patterns`) are swapped for the Transformer-Engine-faithful MXFP8 emulation of
    :mod:`.mxfp8` (fprop/dgrad/wgrad operands quantized to MXFP8); the rest stays BF16 as above.

The learner's weights as the sampler must receive them (docs/design.md, W2/W4):
:meth:`Learner.forward_weights` — the rowwise MXFP8 QuantizedTensor of every on-grid layer's master
weight, exactly the forward GEMM's operand; :meth:`Learner.bf16_view` — every other parameter as the
round-to-nearest-even BF16 of its fp32 master.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ..grids import QuantizedTensor, bf16_view
from .config import LearnerConfig
from .grpo import RolloutBatch, StepResult, completion_logprobs, grpo_step
from .mxfp8 import apply_recipe, bf16_autocast, forward_weights
from .patterns import resolve_layers

__all__ = ["Learner"]


class Learner:
    """Owns the policy's fp32 master weights, the optimizer and the weight version."""

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig) -> None:
        self.device = torch.device(cfg.device)
        self.model = model.to(self.device)
        self.cfg = cfg
        if cfg.precision == "mxfp8":
            sel = cfg.layers if isinstance(cfg.layers, str) else list(cfg.layers)
            self.layers: list[str] = apply_recipe(model, resolve_layers(model, sel), cfg.recipe)
        else:
            self.layers = []
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )
        self.version = 0

    def autocast(self) -> contextlib.AbstractContextManager:
        return bf16_autocast(self.device.type)

    def step(self, batch: RolloutBatch, *, trace_path: Path | None = None, emittable: int | None = None) -> StepResult:
        """One GRPO update; the version advances by one. The batch is moved to the learner's device.
        ``emittable``: the ids the sampler can emit, for the result's ``head_logmass`` (:func:`grpo_step`)."""
        batch = batch.to(self.device)
        res = grpo_step(self.model, self.optimizer, batch, self.cfg.grpo, version=self.version,
                        autocast=self.autocast(), trace_path=trace_path, emittable=emittable)
        self.version = res.version
        return res

    @torch.no_grad()
    def logprobs(self, prompt_ids: torch.Tensor, completion_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The learner's log-probs of given completions at the current weights (the train side of KL)."""
        self.model.eval()
        with self.autocast():
            return completion_logprobs(self.model, *(t.to(self.device) for t in (prompt_ids, completion_ids, mask))).cpu()

    @torch.no_grad()
    def full_logprobs(self, sequences: torch.Tensor) -> torch.Tensor:
        """Log-probs over the whole vocabulary of each next token of ``sequences`` [B, T]: [B, T-1, V], from
        the learner's *training* forward (BF16 autocast, MXFP8 layers as configured) at the current
        weights — the learner side of the exact full-vocabulary train–rollout KL."""
        self.model.eval()
        with self.autocast():
            logits = self.model(input_ids=sequences.to(self.device)).logits[:, :-1]
        return torch.log_softmax(logits.float(), dim=-1).cpu()

    @torch.no_grad()
    def probe_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        """Log-probs of each token of ``sequences`` [B, T] given its prefix, [B, T-1] (``full``: over the
        vocabulary, [B, T-1, V]) — computed in fp32, without autocast, on the weights exactly as a synced
        sampler holds them: on-grid layers through their MXFP8 forward operands (as always), every other
        parameter as its BF16 view. This is the learner side of the exact behaviour check (docs/design.md, W7)
        against a float32 sampler engine; the fp32 master weights are restored afterwards."""
        self.model.eval()
        views = self.bf16_view()
        params = dict(self.model.named_parameters())
        saved = {n: params[n].detach().clone() for n in views}
        try:
            for n, v in views.items():
                params[n].copy_(v.to(params[n].dtype))
            with torch.autocast(self.device.type, enabled=False):
                logits = self.model(input_ids=sequences.to(self.device)).logits[:, :-1].float().cpu()
            logp = torch.log_softmax(logits, dim=-1)
        finally:
            for n, t in saved.items():
                params[n].copy_(t)
        if full:
            return logp
        return logp.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)

    def nonfinite_parameters(self) -> list[str]:
        """Names of the parameters holding NaN or Inf (a sync of them is refused)."""
        return [n for n, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]

    def forward_weights(self) -> dict[str, QuantizedTensor]:
        """Rowwise MXFP8 operands of every on-grid layer at the current master weights."""
        return forward_weights(self.model)

    def bf16_view(self) -> dict[str, torch.Tensor]:
        """Every parameter not covered by :meth:`forward_weights`, as RNE BF16 of its fp32 master."""
        on_grid = {n for n in self.layers}
        out = {}
        for name, p in self.model.named_parameters():
            owner = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
            if owner in on_grid and name.endswith(".weight") or name in on_grid:
                continue
            out[name] = bf16_view(p.detach())
        return out
