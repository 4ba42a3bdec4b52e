"""The GRPO step: group-relative advantages, a PPO-style clipped objective, token-budget micro-batches.

Rule: GRPO as in Shao et al. 2024 ("DeepSeekMath", §4.1), the loss as verl/DAPO write it — per-group
advantages (no critic, no KL-to-reference term), a clipped (and dual-clipped) token-mean surrogate against the
learner's or the sampler's old log-probs, micro-batches packed by a token budget independent of precision,
gradients weighted to equal the full-batch loss. Specified in docs/library.md (The GRPO step); equal to verl's
``compute_grpo_outcome_advantage`` and ``"vanilla"`` policy loss with ``loss_agg_mode="token-mean"``
(tests/core/learner/test_grpo_vs_verl.py).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator

import torch

from .config import GRPOConfig
from .timers import Timers

__all__ = [
    "RolloutBatch",
    "StepResult",
    "MicroBatchTiming",
    "group_advantages",
    "microbatch_rows",
    "plan_microbatches",
    "clipped_tokens",
    "policy_loss_tokens",
    "token_mean",
    "completion_logprobs",
    "completion_logprobs_and_head",
    "grpo_step",
]


@dataclass
class RolloutBatch:
    """What a sampler hands the learner: token ids, masks, rewards and the sampler's log-probs.

    ``prompt_ids`` [B, P] (prompts of equal length, or left-padded to it: ``prompt_mask`` [B, P] then marks
    each prompt's tokens, which end its row; None: every token is the prompt's), ``completion_ids`` [B, T] padded with
    any id where ``completion_mask`` is 0, ``completion_mask`` [B, T] (1 on sampled tokens, EOS
    included), ``rewards`` [B], ``sampler_logprobs`` [B, T] (log-prob under the sampler of each sampled
    token; ignored where the mask is 0), ``version``: the weight version the sampler used.
    Rows are grouped: rows ``g·G … g·G+G−1`` are the G samples of prompt g.
    """

    prompt_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    rewards: torch.Tensor
    sampler_logprobs: torch.Tensor
    version: int = 0
    prompt_mask: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> "RolloutBatch":
        """The same batch with every tensor on ``device`` (itself when already there)."""
        fields = ("prompt_ids", "completion_ids", "completion_mask", "rewards", "sampler_logprobs")
        fields += ("prompt_mask",) if self.prompt_mask is not None else ()
        if all(getattr(self, f).device == torch.device(device) for f in fields):
            return self
        return replace(self, **{f: getattr(self, f).to(device) for f in fields})

    def validate(self, group_size: int) -> None:
        b, t = self.completion_ids.shape
        checks = {
            "prompt_ids": (self.prompt_ids.dim() == 2 and self.prompt_ids.shape[0] == b, f"[{b}, P]"),
            "completion_mask": (tuple(self.completion_mask.shape) == (b, t), f"[{b}, {t}]"),
            "rewards": (tuple(self.rewards.shape) == (b,), f"[{b}]"),
            "sampler_logprobs": (tuple(self.sampler_logprobs.shape) == (b, t), f"[{b}, {t}]"),
        }
        if self.prompt_mask is not None:
            checks["prompt_mask"] = (self.prompt_mask.shape == self.prompt_ids.shape, f"{list(self.prompt_ids.shape)}")
        for name, (ok, want) in checks.items():
            if not ok:
                raise ValueError(f"RolloutBatch.{name} has shape {tuple(getattr(self, name).shape)}, expected {want}")
        if b % group_size:
            raise ValueError(f"RolloutBatch has {b} rows, not a multiple of group_size={group_size}")
        if not torch.isfinite(self.rewards).all():
            raise ValueError("RolloutBatch.rewards contains NaN or Inf")
        if (self.completion_mask.sum(-1) == 0).any():
            raise ValueError("RolloutBatch has a row with an empty completion (mask all zero)")


@dataclass(frozen=True)
class MicroBatchTiming:
    rows: int
    tokens: int  # padded tokens processed (rows × max length)
    real_tokens: int  # prompt + completion tokens that are not padding
    seconds: float
    quantize_s: float
    gemm_s: float

    @property
    def other_s(self) -> float:
        return max(self.seconds - self.quantize_s - self.gemm_s, 0.0)


def microbatch_rows(run_id: str, precision: str, step: int, tokens_per_microbatch: int,
                    timings: Iterable[MicroBatchTiming]) -> list[dict]:
    """The ``microbatches`` table rows (:mod:`fp8rl_core.schemas.steps`) of one step from its
    :class:`MicroBatchTiming` list (``StepResult.microbatches``), in order."""
    return [{"run_id": run_id, "precision": precision, "step": step, "microbatch": i,
             "tokens_per_microbatch": tokens_per_microbatch, "rows": t.rows, "tokens": t.tokens,
             "real_tokens": t.real_tokens, "seconds": t.seconds, "quantize_s": t.quantize_s, "gemm_s": t.gemm_s,
             "other_s": t.other_s} for i, t in enumerate(timings)]


@dataclass
class StepResult:
    """Everything a step produced; tensors are detached fp32 on CPU."""

    loss: float
    learner_logprobs: torch.Tensor  # [B, T], 0 where the mask is 0
    advantages: torch.Tensor  # [B]
    grad_norm: float  # before clipping
    grad_norms: dict[str, float]  # per parameter, before clipping
    microbatches: list[MicroBatchTiming]
    seconds: float  # whole step incl. optimizer
    optimizer_s: float
    version: int  # the new weight version
    clip_fraction: float
    mean_reward: float
    extra: dict[str, float] = field(default_factory=dict)
    #: [B, T]: log of the learner's mass on the ids the sampler can emit at each sampled position (0 where the
    #: mask is 0; ``learner_logprobs − head_logmass`` is the learner restricted like the sampler); None: no tail
    head_logmass: torch.Tensor | None = None


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: reward minus its group's mean, optionally over the group's std."""
    r = rewards.to(torch.float32).reshape(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale:
        adv = adv / (r.std(dim=1, keepdim=True, unbiased=True) + eps)
    return adv.reshape(-1)


def plan_microbatches(lengths: list[int], tokens_per_microbatch: int) -> list[list[int]]:
    """Greedy in-order packing of rows so that ``len(mb) · max(len in mb) ≤ budget`` (see module doc)."""
    plan: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i, n in enumerate(lengths):
        new_max = max(cur_max, n)
        if cur and (len(cur) + 1) * new_max > tokens_per_microbatch:
            plan.append(cur)
            cur, new_max = [], n
        cur.append(i)
        cur_max = new_max
    if cur:
        plan.append(cur)
    return plan


def clipped_tokens(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """Where the clipped term is the one ``min(ρ A, clip(ρ, 1−ε_low, 1+ε_high) A)`` takes (bool, ``ratio``'s shape).

    That is where clipping removes the gradient: ``ρ > 1+ε_high`` on a positive advantage (the update
    would raise an already raised probability further) and ``ρ < 1−ε_low`` on a negative one. A ratio
    outside the bounds on the other side is *not* clipped — the unclipped term is smaller and is taken —
    and a zero advantage is never clipped. This is PPO's clip fraction with DAPO's separate bounds
    ("clip-higher"); ``advantages`` broadcasts against ``ratio`` (e.g. [B, 1] against [B, T])."""
    a = advantages.expand_as(ratio)
    return ((ratio > 1 + eps_high) & (a > 0)) | ((ratio < 1 - eps_low) & (a < 0))


#: the bound of the log-ratio before its exponential, as verl's vanilla policy loss clamps it (``negative_approx_kl``)
LOG_RATIO_BOUND = 20.0


def policy_loss_tokens(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                       eps_low: float, eps_high: float, clip_ratio_c: float) -> torch.Tensor:
    """The per-token GRPO loss, to be minimised: ``−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A)``, and on a negative
    advantage at most ``−c·A`` (dual-clip, ``c = clip_ratio_c``); ``ρ = exp(clamp(logp − logp_old, ±20))``.
    ``advantages`` broadcasts against ``logprobs`` (e.g. [B, 1] against [B, T]); no mask is applied here
    (:func:`token_mean` applies it).

    Rule: PPO's clipped surrogate (Schulman et al. 2017, eq. 7) with DAPO's separate bounds (Yu et al. 2025,
    "clip-higher") and dual-clip PPO's bound on negative advantages (Ye et al. 2020, arXiv:1912.09729, eq. 5),
    exactly as verl writes it: ``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla`` (the registered
    ``"vanilla"`` policy loss, verl 0.9.1: ``pg_losses`` before ``agg_loss``), its log-ratio clamp at ±20
    included. With ``old_logprobs`` the learner's own (ρ = 1 in value) neither the clamp nor the dual clip
    ever engages. Checked against verl's numbers in tests/core/learner/test_grpo_vs_verl.py."""
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    a = advantages
    clipped = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    return torch.where(a < 0, torch.minimum(-a * clip_ratio_c, clipped), clipped)


def token_mean(loss_tokens: torch.Tensor, mask: torch.Tensor, total_tokens: float) -> torch.Tensor:
    """``Σ mask·loss / total_tokens``: one micro-batch's share of the step's token-mean loss, where
    ``total_tokens`` counts the unmasked tokens of the whole step (all its micro-batches), so the shares
    of the micro-batches sum to the whole batch's token mean — every token weighs the same wherever it
    was packed.

    Rule: verl's ``agg_loss(loss_mat, loss_mask, "token-mean", batch_num_tokens=…)``
    (``verl.trainer.ppo.core_algos``, verl 0.9.1: ``masked_sum(loss_mat, loss_mask) / batch_num_tokens``
    with ``dp_size`` 1), DAPO's token-level policy-gradient loss (Yu et al. 2025, §3.3)."""
    return (loss_tokens * mask).sum() / total_tokens


def completion_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor, prompt_mask: torch.Tensor | None = None) -> torch.Tensor:
    """log π(y_t | x, y_<t) of each completion token under ``model`` (fp32 log-softmax), 0 where masked
    (:func:`completion_logprobs_and_head` without the vocabulary tail)."""
    return completion_logprobs_and_head(model, prompt_ids, completion_ids, completion_mask, prompt_mask)[0]


def completion_logprobs_and_head(model: torch.nn.Module, prompt_ids: torch.Tensor, completion_ids: torch.Tensor,
                                 completion_mask: torch.Tensor, prompt_mask: torch.Tensor | None = None,
                                 emittable: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(y_t | x, y_<t) of each completion token under ``model`` (fp32 log-softmax over the whole
    vocabulary), 0 where masked; and, with ``emittable`` (the ids a sampler can emit,
    :mod:`fp8rl_core.learner.vocab_tail`), log π(ids < emittable | x, y_<t) at each position — the log of the
    learner's mass on the emittable ids, so that ``logp − head`` is the learner restricted like the sampler
    (None without a tail). One forward for both.

    Sequences are ``prompt ‖ completion`` trimmed to the longest unmasked completion in the batch; the
    attention mask hides completion padding, which only ever follows the real tokens (causal), so the
    padding changes nothing before it. Left-padded prompts (``prompt_mask``) are hidden the same way and
    each row's positions count from its first prompt token, as the engine that sampled it counted them.
    """
    p = prompt_ids.shape[1]
    t_used = int(completion_mask.sum(-1).max())
    comp = completion_ids[:, :t_used]
    mask = completion_mask[:, :t_used]
    ids = torch.cat([prompt_ids, comp], dim=1)
    real = torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask.to(prompt_ids.dtype)
    attn = torch.cat([real, mask.to(prompt_ids.dtype)], dim=1)
    positions = None if prompt_mask is None else (torch.cumsum(attn, dim=1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False).logits
    pred = logits[:, p - 1 : p - 1 + t_used].float()
    full = torch.log_softmax(pred, dim=-1)
    logp = full.gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(completion_ids.shape, dtype=torch.float32)
    out[:, :t_used] = logp * mask
    if emittable is None or emittable >= full.shape[-1]:
        return out, None
    head = torch.zeros(completion_ids.shape, dtype=torch.float32)
    head[:, :t_used] = torch.logsumexp(full.detach()[..., :emittable], dim=-1) * mask
    return out, head


@contextlib.contextmanager
def _maybe_profile(trace_path: Path | None) -> Iterator[None]:
    if trace_path is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        yield
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace_path))


def grpo_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: GRPOConfig,
    *,
    version: int,
    autocast: contextlib.AbstractContextManager | None = None,
    trace_path: Path | None = None,
    emittable: int | None = None,
) -> StepResult:
    """One GRPO update of ``model`` on ``batch``; returns the new version ``version + 1`` and metrics.

    ``autocast`` is entered around every forward (the learner passes its BF16 autocast so off-grid layers
    compute in BF16); ``trace_path`` records a torch.profiler Chrome trace of the step there; ``emittable``: the
    ids the sampler can emit (None: all), for :attr:`StepResult.head_logmass` — the loss is unchanged by it.
    """
    batch.validate(cfg.group_size)
    t_step = time.perf_counter()
    model.train()
    adv = group_advantages(batch.rewards, cfg.group_size, cfg.scale_rewards, cfg.adv_eps)
    mask = batch.completion_mask.to(torch.float32)
    total_tokens = float(mask.sum())
    lengths = (batch.prompt_ids.shape[1] + batch.completion_mask.sum(-1)).tolist()  # as computed: prompts padded
    real = batch.completion_mask.sum(-1) + (batch.prompt_ids.shape[1] if batch.prompt_mask is None
                                            else batch.prompt_mask.sum(-1))
    plan = plan_microbatches([int(n) for n in lengths], cfg.tokens_per_microbatch)

    optimizer.zero_grad(set_to_none=True)
    learner_lp = torch.zeros_like(mask)
    head_lp = None
    timings: list[MicroBatchTiming] = []
    loss_total = 0.0
    clipped = 0.0
    with _maybe_profile(trace_path):
        for rows in plan:
            idx = torch.tensor(rows)
            timers = Timers()
            t0 = time.perf_counter()
            with timers.active(), (autocast if autocast is not None else contextlib.nullcontext()):
                lp, head = completion_logprobs_and_head(
                    model, batch.prompt_ids[idx], batch.completion_ids[idx], batch.completion_mask[idx],
                    None if batch.prompt_mask is None else batch.prompt_mask[idx], emittable)
            m = mask[idx]
            old = lp.detach() if cfg.old_logprobs == "learner" else batch.sampler_logprobs[idx].to(torch.float32) * m
            a = adv[idx].unsqueeze(-1)
            per_token = policy_loss_tokens(lp, old, a, cfg.clip_eps_low, cfg.clip_eps_high, cfg.clip_ratio_c)
            loss = token_mean(per_token, m, total_tokens)  # this micro-batch's share of the token-mean loss
            ratio = torch.exp(lp.detach() - old)
            with timers.active():
                loss.backward()
            seconds = time.perf_counter() - t0
            learner_lp[idx] = lp.detach() * m
            if head is not None:
                head_lp = torch.zeros_like(mask) if head_lp is None else head_lp
                head_lp[idx] = head * m
            loss_total += float(loss.detach())
            clipped += float((clipped_tokens(ratio.detach(), a, cfg.clip_eps_low, cfg.clip_eps_high) * m).sum())
            n_max = int(max(lengths[i] for i in rows))
            timings.append(MicroBatchTiming(
                rows=len(rows), tokens=len(rows) * n_max, real_tokens=int(real[idx].sum()),
                seconds=seconds, quantize_s=timers.seconds.get("quantize", 0.0), gemm_s=timers.seconds.get("gemm", 0.0),
            ))
        t_opt = time.perf_counter()
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norms = {n: float(p.grad.norm()) for n, p in model.named_parameters() if p.grad is not None}
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        if not math.isfinite(loss_total) or not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)  # leave the weights as they were
            raise FloatingPointError(f"GRPO step {version + 1}: non-finite loss {loss_total} or grad norm {grad_norm}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        optimizer_s = time.perf_counter() - t_opt
    return StepResult(
        loss=loss_total,
        learner_logprobs=learner_lp,
        advantages=adv,
        grad_norm=grad_norm,
        grad_norms=grad_norms,
        microbatches=timings,
        seconds=time.perf_counter() - t_step,
        optimizer_s=optimizer_s,
        version=version + 1,
        clip_fraction=clipped / max(total_tokens, 1.0),
        mean_reward=float(batch.rewards.float().mean()),
        head_logmass=head_lp,
    )
