"""fp8rl's GRPO numbers against verl's own on one batch: the advantages (``compute_grpo_outcome_advantage``), the
per-token clipped objective and its aggregate (the registered ``"vanilla"`` policy loss with ``agg_loss``), the
gradient w.r.t. the log-probs, the micro-batched aggregate, and a whole :func:`grpo_step` on a tiny Qwen3.

fp8rl's loss is verl's ``loss_agg_mode="token-mean"`` (the batch's unmasked tokens weigh alike; each
micro-batch divides by the whole step's token count, verl's ``batch_num_tokens``), not ``seq-mean-token-mean``
nor ``seq-mean-token-sum`` — shown below on a batch whose completions differ in length. The batch: five groups
of four (ties, an all-ones and an all-zeros group), completions of 1 to 6 tokens padded to 6 with garbage
log-probs under the padding, and ratios on both sides of both clip bounds and past the dual-clip bound.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from fp8rl_core.learner.config import GRPOConfig
from fp8rl_core.learner.grpo import (
    RolloutBatch,
    completion_logprobs,
    group_advantages,
    grpo_step,
    plan_microbatches,
    policy_loss_tokens,
    token_mean,
)
from tests.core.learner.test_grpo import tiny_model

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

G, EPS_LOW, EPS_HIGH, CLIP_C = 4, 0.2, 0.28, 3.0
REWARDS = torch.tensor([1.0, 0, 0, 1,      # ties
                        1, 1, 1, 1,        # all equal: no signal
                        0, 0, 0, 1,        # one right
                        0.5, 1, 0.5, 0,    # ties in the middle
                        0, 0, 0, 0])       # all equal at zero
B, T = REWARDS.numel(), 6
LENGTHS = torch.tensor([(5 * i) % T + 1 for i in range(B)])  # 1 … 6 tokens, every length several times
MASK = (torch.arange(T).unsqueeze(0) < LENGTHS.unsqueeze(1)).float()
#: the ratios the tokens get, cycled over the batch's tokens: below 1 − ε_low (clipped on A < 0), inside,
#: between 1 + ε_low and 1 + ε_high (clipped only by a symmetric bound), above 1 + ε_high (clipped on A > 0),
#: above the dual-clip bound c = 3 (bounded on A < 0)
RHO = torch.tensor([0.5, 0.7, 0.9, 1.0, 1.1, 1.25, 1.5, 4.0])


def verl_actor_config(**batch_info):
    from verl.workers.config.actor import ActorConfig

    cfg = ActorConfig(strategy="fsdp", clip_ratio=EPS_LOW, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH,
                      clip_ratio_c=CLIP_C, ppo_mini_batch_size=B // G, ppo_micro_batch_size_per_gpu=1, rollout_n=G)
    cfg.global_batch_info.update(batch_info)  # as verl's actor sets it before each micro-batch's loss
    return cfg


def verl_advantages(rewards: torch.Tensor, mask: torch.Tensor, norm: bool) -> torch.Tensor:
    """verl's GRPO advantages [B, T]: the outcome reward on each completion's last token, groups by uid."""
    scores = torch.zeros_like(mask)
    last = mask.sum(-1).long() - 1
    scores[torch.arange(mask.shape[0]), last] = rewards
    index = np.array([f"prompt-{i // G}" for i in range(mask.shape[0])], dtype=object)
    adv, _ = core_algos.compute_grpo_outcome_advantage(scores, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm)
    return adv


def verl_loss(monkeypatch, old, new, adv, mask, mode="token-mean", **batch_info):
    """verl's vanilla policy loss: (aggregate, the per-token loss matrix it aggregated, its metrics)."""
    seen = {}
    agg = core_algos.agg_loss

    def capture(loss_mat, loss_mask, loss_agg_mode, **kw):
        seen["loss_mat"] = loss_mat
        return agg(loss_mat=loss_mat, loss_mask=loss_mask, loss_agg_mode=loss_agg_mode, **kw)

    monkeypatch.setattr(core_algos, "agg_loss", capture)
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    loss, metrics = vanilla(old, new, adv, mask, loss_agg_mode=mode, config=verl_actor_config(**batch_info))
    return loss, seen["loss_mat"], metrics


def logprobs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """New log-probs [B, T] and old ones giving the ratios RHO on the real tokens; garbage under the padding."""
    gen = torch.Generator().manual_seed(seed)
    new = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64).float()
    rho = RHO[torch.arange(B * T) % len(RHO)].reshape(B, T)
    garbage = 5 * torch.rand(B, T, generator=gen)
    old = torch.where(MASK.bool(), new - torch.log(rho), new + garbage)
    return new, old


def test_advantages_equal_verls_grpo_advantages():
    for scale in (True, False):  # GRPO; Dr. GRPO (no std)
        ours = group_advantages(REWARDS, G, scale=scale, eps=1e-6).unsqueeze(-1) * MASK
        theirs = verl_advantages(REWARDS, MASK, scale)
        assert torch.equal(ours, theirs), (ours - theirs).abs().max()
    adv = group_advantages(REWARDS, G)
    s = math.sqrt(1 / 3)  # the unbiased std of [1, 0, 0, 1]
    assert torch.allclose(adv[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (s + 1e-6))
    assert torch.equal(adv[4:8], torch.zeros(4)) and torch.equal(adv[16:], torch.zeros(4))  # all equal: 0, not NaN
    assert torch.allclose(adv[8:12], torch.tensor([-0.5, -0.5, -0.5, 1.5]))  # std of [0, 0, 0, 1] is 1/2
    assert (adv > 0).any() and (adv < 0).any()


def test_the_per_token_loss_its_token_mean_and_their_gradient_equal_verls_vanilla_loss(monkeypatch):
    new, old = logprobs()
    adv = group_advantages(REWARDS, G)
    mine = new.clone().requires_grad_(True)
    per_token = policy_loss_tokens(mine, old, adv.unsqueeze(-1), EPS_LOW, EPS_HIGH, CLIP_C)
    loss = token_mean(per_token, MASK, float(MASK.sum()))
    (grad,) = torch.autograd.grad(loss, mine)

    theirs = new.clone().requires_grad_(True)
    v_loss, v_tokens, metrics = verl_loss(monkeypatch, old, theirs, verl_advantages(REWARDS, MASK, True), MASK)
    (v_grad,) = torch.autograd.grad(v_loss, theirs)

    real = MASK.bool()
    assert torch.equal(per_token[real], v_tokens[real])  # every real token, bit for bit
    assert torch.equal(loss, v_loss), (float(loss), float(v_loss))
    assert torch.equal(grad, v_grad)
    assert (grad[~real] == 0).all()  # the padding: no gradient, whatever its log-probs

    # the batch engages every branch, on real tokens
    a = adv.unsqueeze(-1).expand(B, T)
    rho = torch.exp(new - old)
    n = float(MASK.sum())
    case = {"A>0 ρ>1+ε_high": (a > 0) & (rho > 1 + EPS_HIGH), "A<0 ρ<1−ε_low": (a < 0) & (rho < 1 - EPS_LOW),
            "A<0 ρ>c": (a < 0) & (rho > CLIP_C), "A>0 inside": (a > 0) & (rho > 1 - EPS_LOW) & (rho < 1 + EPS_HIGH),
            "A<0 inside": (a < 0) & (rho > 1 - EPS_LOW) & (rho < 1 + EPS_HIGH), "A=0": a == 0}
    for name, where in case.items():
        assert (where & real).any(), name
    # the sign: where nothing clips, dL/dlogp = −ρA/N, so a descent step raises a positive advantage's log-prob
    free = (case["A>0 inside"] | case["A<0 inside"]) & real
    assert torch.allclose(grad[free], (-rho * a / n)[free], rtol=1e-6)
    assert (grad[case["A>0 inside"] & real] < 0).all() and (grad[case["A<0 inside"] & real] > 0).all()
    # clipped (and dual-clipped) tokens carry no gradient; their loss is the bound's
    for name in ("A>0 ρ>1+ε_high", "A<0 ρ<1−ε_low", "A<0 ρ>c"):
        assert (grad[case[name] & real] == 0).all(), name
    dual = case["A<0 ρ>c"] & real
    assert torch.allclose(per_token[dual], (-CLIP_C * a)[dual])
    assert metrics["actor/pg_clipfrac"] > 0 and metrics["actor/pg_clipfrac_lower"] > 0


def test_fp8rls_aggregate_is_verls_token_mean_and_no_other_mode(monkeypatch):
    new, old = logprobs(1)
    adv = group_advantages(REWARDS, G)
    ours = token_mean(policy_loss_tokens(new, old, adv.unsqueeze(-1), EPS_LOW, EPS_HIGH, CLIP_C), MASK, float(MASK.sum()))
    v_adv = verl_advantages(REWARDS, MASK, True)
    modes = {m: float(verl_loss(monkeypatch, old, new, v_adv, MASK, mode=m)[0])
             for m in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")}
    assert float(ours) == modes["token-mean"]
    for m in ("seq-mean-token-mean", "seq-mean-token-sum"):  # lengths differ: these weigh tokens otherwise
        assert abs(modes[m] - float(ours)) > 1e-3, (m, modes)


def test_the_micro_batches_shares_sum_to_the_whole_batchs_token_mean_as_verls_do(monkeypatch):
    new, old = logprobs(2)
    adv = group_advantages(REWARDS, G)
    v_adv = verl_advantages(REWARDS, MASK, True)
    total = float(MASK.sum())
    plan = plan_microbatches((LENGTHS + 3).tolist(), 24)  # prompts of 3 tokens, as grpo_step plans them
    assert len(plan) > 4 and len({len(mb) for mb in plan}) > 1
    whole_new = new.clone().requires_grad_(True)
    whole = token_mean(policy_loss_tokens(whole_new, old, adv.unsqueeze(-1), EPS_LOW, EPS_HIGH, CLIP_C), MASK, total)
    (whole_grad,) = torch.autograd.grad(whole, whole_new)
    ours, theirs, own = torch.zeros(()), torch.zeros(()), torch.zeros(())
    grad = torch.zeros(B, T)
    for rows in plan:
        idx = torch.tensor(rows)
        part = new[idx].clone().requires_grad_(True)
        share = token_mean(policy_loss_tokens(part, old[idx], adv[idx].unsqueeze(-1), EPS_LOW, EPS_HIGH, CLIP_C),
                           MASK[idx], total)
        v_share = verl_loss(monkeypatch, old[idx], new[idx], v_adv[idx], MASK[idx], batch_num_tokens=total)[0]
        assert torch.equal(share, v_share)
        (grad[idx],) = torch.autograd.grad(share, part)
        ours, theirs = ours + share.detach(), theirs + v_share
        # the classic bug: each micro-batch normalised by its own tokens (then averaged over micro-batches)
        own = own + token_mean(policy_loss_tokens(new[idx], old[idx], adv[idx].unsqueeze(-1), EPS_LOW, EPS_HIGH,
                                                  CLIP_C), MASK[idx], float(MASK[idx].sum())) / len(plan)
    assert torch.allclose(ours, whole, rtol=1e-6, atol=1e-7) and torch.allclose(theirs, whole, rtol=1e-6, atol=1e-7)
    assert abs(float(own) - float(whole.detach())) > 1e-3, (float(own), float(whole.detach()))
    assert torch.equal(grad, whole_grad)  # each token's gradient is its own: the same wherever it was packed


def test_a_grpo_step_is_the_step_verls_loss_gives(monkeypatch):
    """A whole :func:`grpo_step` (sampler old log-probs, micro-batches of a few rows, SGD lr 1, no grad clip) moves
    every weight by minus the gradient of verl's token-mean vanilla loss of the whole batch; its loss, advantages
    and clip fraction are verl's."""
    base = tiny_model()
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(5, 64, (B // G, 3), generator=gen).repeat_interleave(G, 0)
    ids = torch.randint(3, 64, (B, T), generator=gen)
    with torch.no_grad():
        lp = completion_logprobs(base.eval(), prompts, ids, MASK.long())
    rho = RHO[torch.arange(B * T) % len(RHO)].reshape(B, T)
    batch = RolloutBatch(prompts, ids, MASK.long(), REWARDS, (lp - torch.log(rho)) * MASK)
    cfg = GRPOConfig(group_size=G, clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH, clip_ratio_c=CLIP_C,
                     old_logprobs="sampler", tokens_per_microbatch=24, max_grad_norm=1e9)

    model = copy.deepcopy(base)
    res = grpo_step(model, torch.optim.SGD(model.parameters(), lr=1.0), batch, cfg, version=0)
    assert len(res.microbatches) > 4

    ref = copy.deepcopy(base).train()
    new = completion_logprobs(ref, prompts, ids, MASK.long())
    v_adv = verl_advantages(REWARDS, MASK, True)
    v_loss, _, metrics = verl_loss(monkeypatch, batch.sampler_logprobs, new, v_adv, MASK)
    v_loss.backward()

    assert torch.equal(res.advantages.unsqueeze(-1) * MASK, v_adv)
    assert math.isclose(res.loss, float(v_loss.detach()), rel_tol=1e-5)
    assert math.isclose(res.clip_fraction, metrics["actor/pg_clipfrac"], rel_tol=1e-6)
    assert 0 < res.clip_fraction < 1
    moved = 0
    for (name, p0), p1, pr in zip(base.named_parameters(), model.parameters(), ref.parameters()):
        want = p0.detach() - pr.grad
        assert torch.allclose(p1.detach(), want, atol=1e-6, rtol=1e-5), (name, (p1 - want).abs().max())
        moved += int(not torch.equal(p1, p0))
    assert moved == len(list(base.parameters()))


def test_without_the_dual_clip_the_loss_differs_from_verls_exactly_where_it_binds(monkeypatch):
    """What this comparison found: fp8rl's loss had no dual clip (verl's ``clip_ratio_c``, default 3), so on a
    negative advantage with ρ > 3 it took −ρA (and its gradient) where verl takes −3A (none). Only there."""
    new, old = logprobs()
    adv = group_advantages(REWARDS, G).unsqueeze(-1)
    v_tokens = verl_loss(monkeypatch, old, new, verl_advantages(REWARDS, MASK, True), MASK)[1]
    plain = policy_loss_tokens(new, old, adv, EPS_LOW, EPS_HIGH, math.inf)  # no dual clip
    differ = (plain != v_tokens) & MASK.bool()
    binds = (adv < 0) & (torch.exp(new - old) > CLIP_C) & MASK.bool()
    assert differ.any() and torch.equal(differ, binds)
    assert (plain[binds] > v_tokens[binds]).all()
