"""GRPO step mechanics on a tiny Qwen3: advantages, micro-batch planning, log-probs, accumulation."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from fp8rl_core.learner.config import GRPOConfig
from fp8rl_core.learner.grpo import (
    RolloutBatch,
    clipped_tokens,
    completion_logprobs,
    group_advantages,
    grpo_step,
    plan_microbatches,
)
from fp8rl_core.learner.rollout import sample_completions

EOS = 2


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attn_implementation="eager")
    return Qwen3ForCausalLM(cfg)


def rollout(model, groups: int = 3, g: int = 4, seed: int = 0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, 64, (groups, 6), generator=gen).repeat_interleave(g, 0)
    ids, mask, lp = sample_completions(model, prompts, 8, eos_id=EOS, seed=seed)
    rewards = (ids[:, 0] % 2).float()  # a deterministic, learnable reward on the first token
    return RolloutBatch(prompts, ids, mask, rewards, lp, version=0)


def test_group_advantages_values():
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_advantages(r, 4)
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards: no signal
    assert torch.allclose(group_advantages(r, 4, scale=False)[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))


@pytest.mark.parametrize(
    "lengths, budget, plan",
    [
        ([10, 10, 10, 10], 25, [[0, 1], [2, 3]]),
        ([10, 10, 10, 10], 40, [[0, 1, 2, 3]]),
        ([10, 10, 10, 10], 5, [[0], [1], [2], [3]]),  # one long sequence still gets a micro-batch
        ([4, 12, 4, 4], 24, [[0, 1], [2, 3]]),  # padded size counts: 2 × 12 = 24
        ([4, 4, 4, 12], 16, [[0, 1, 2], [3]]),
    ],
)
def test_plan_microbatches(lengths, budget, plan):
    assert plan_microbatches(lengths, budget) == plan
    for mb in plan_microbatches(lengths, budget):
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= budget


def test_completion_logprobs_ignore_padding():
    model = tiny_model().eval()
    batch = rollout(model)
    lp = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, batch.completion_mask)
    for i in range(batch.prompt_ids.shape[0]):  # one row at a time, with no padding at all
        n = int(batch.completion_mask[i].sum())
        one = completion_logprobs(model, batch.prompt_ids[i : i + 1], batch.completion_ids[i : i + 1, :n],
                                  batch.completion_mask[i : i + 1, :n])
        assert torch.allclose(lp[i, :n], one[0], atol=1e-5)
        assert (lp[i, n:] == 0).all()
    # the sampler here is the same fp32 model: its log-probs are the learner's
    assert torch.allclose(lp, batch.sampler_logprobs, atol=1e-4)


def test_left_padded_prompts_give_each_rows_unpadded_logprobs_and_the_same_step():
    """Prompts of different lengths, left-padded with a prompt mask (a dataset's batch): each row's completion
    log-probs are those of the row alone without padding (positions count from its first prompt token, as an
    engine given the unpadded prompt counts them), and a GRPO step on the padded batch is the step on the
    rows' own."""
    model = tiny_model().eval()
    batch = rollout(model)
    cut = torch.tensor([0, 2, 5]).repeat_interleave(4)  # each group's prompt loses its first 0, 2 or 5 tokens
    mask = (torch.arange(6).unsqueeze(0) >= cut.unsqueeze(1)).long()
    padded = torch.where(mask.bool(), batch.prompt_ids, 0)
    lp = completion_logprobs(model, padded, batch.completion_ids, batch.completion_mask, mask)
    for i in range(padded.shape[0]):
        n, c = int(batch.completion_mask[i].sum()), int(cut[i])
        one = completion_logprobs(model, batch.prompt_ids[i : i + 1, c:], batch.completion_ids[i : i + 1, :n],
                                  batch.completion_mask[i : i + 1, :n])
        assert torch.allclose(lp[i, :n], one[0], atol=1e-5), i
    assert not torch.allclose(lp, completion_logprobs(model, padded, batch.completion_ids, batch.completion_mask),
                              atol=1e-3)  # without the mask the pads would count as prompt tokens
    cfg = GRPOConfig(group_size=4, tokens_per_microbatch=40)
    stepped = []
    for b in (RolloutBatch(padded, batch.completion_ids, batch.completion_mask, batch.rewards, lp.detach(), prompt_mask=mask),):
        m = copy.deepcopy(model)
        res = grpo_step(m, torch.optim.SGD(m.parameters(), lr=0.1), b, cfg, version=0)
        assert res.microbatches and sum(t.real_tokens for t in res.microbatches) == int(mask.sum() + batch.completion_mask.sum())
        stepped.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    whole = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(stepped[0], whole)
    with pytest.raises(ValueError, match=r"RolloutBatch.prompt_mask has shape \(12, 5\), expected \[12, 6\]"):
        RolloutBatch(padded, batch.completion_ids, batch.completion_mask, batch.rewards, lp, prompt_mask=mask[:, 1:]).validate(4)


def test_microbatching_gives_the_full_batch_update():
    base = tiny_model()
    batch = rollout(base)
    results = {}
    for budget in (10_000, 20):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        res = grpo_step(model, opt, batch, GRPOConfig(tokens_per_microbatch=budget, max_grad_norm=1e9), version=3)
        results[budget] = (res, {n: p.detach().clone() for n, p in model.named_parameters()})
    (one, w1), (many, w2) = results[10_000], results[20]
    assert len(one.microbatches) == 1 and len(many.microbatches) > 3
    assert many.version == one.version == 4
    assert math.isclose(one.loss, many.loss, rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(one.grad_norm, many.grad_norm, rel_tol=1e-4)
    for n in w1:
        assert torch.allclose(w1[n], w2[n], atol=1e-6), n
    changed = [n for n, p in base.named_parameters() if not torch.equal(p, w1[n])]
    assert len(changed) == len(w1)  # every trainable tensor moved
    t = many.microbatches[0]
    assert t.seconds > 0 and t.tokens >= t.real_tokens > 0 and t.other_s >= 0


def test_sampler_old_logprobs_are_an_importance_ratio():
    model = tiny_model()
    batch = rollout(model)
    batch.sampler_logprobs = batch.sampler_logprobs - 0.5 * batch.completion_mask  # a mismatched sampler
    res = grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch,
                    GRPOConfig(old_logprobs="sampler"), version=0)
    # ρ = e^0.5 > 1.2 on every token: clipped exactly where the advantage is positive (there the clipped
    # term is the smaller one); on a negative advantage the unclipped ρA is taken
    mask = batch.completion_mask.float()
    positive = float(((res.advantages > 0).float().unsqueeze(-1) * mask).sum())
    assert 0 < positive < float(mask.sum())
    assert res.clip_fraction == positive / float(mask.sum())
    res2 = grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, GRPOConfig(), version=0)
    assert res2.clip_fraction == 0.0


def test_clipped_tokens_follow_the_bound_on_the_advantages_side():
    # bounds 0.8 and 1.3 (ε_low = 0.2, ε_high = 0.3); each row: one advantage, four ratios
    ratio = torch.tensor([[0.7, 0.9, 1.2, 1.4]] * 3)
    adv = torch.tensor([[1.0], [-1.0], [0.0]])
    got = clipped_tokens(ratio, adv, 0.2, 0.3)
    assert got.tolist() == [[False, False, False, True],   # A > 0: only above 1 + ε_high
                            [True, False, False, False],   # A < 0: only below 1 − ε_low
                            [False, False, False, False]]  # A = 0: the two terms are equal
    # 1.25 is outside a symmetric 0.2 bound but inside ε_high = 0.3: not clipped
    assert clipped_tokens(torch.tensor([[1.25]]), torch.tensor([[1.0]]), 0.2, 0.2).item() is True
    assert clipped_tokens(torch.tensor([[1.25]]), torch.tensor([[1.0]]), 0.2, 0.3).item() is False


def test_clip_fraction_counts_asymmetric_bounds_exactly():
    model = tiny_model()
    batch = rollout(model)
    mask = batch.completion_mask.float()
    learner = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, batch.completion_mask)
    # ratios ρ = exp(δ) cycling through 0.7, 0.9, 1.25, 1.4 over the positions: far from the bounds
    # 0.8 / 1.3 compared with the ~1e-5 the learner's recomputation may differ by
    pattern = torch.tensor([0.7, 0.9, 1.25, 1.4])
    rho = pattern[torch.arange(mask.shape[1]) % 4].expand_as(mask)
    batch.sampler_logprobs = (learner - torch.log(rho)) * mask
    cfg = GRPOConfig(old_logprobs="sampler", clip_eps_low=0.2, clip_eps_high=0.3)
    res = grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg, version=0)
    a = res.advantages.unsqueeze(-1)
    expected = float((((rho == 1.4) & (a > 0)) | ((rho == 0.7) & (a < 0))).float().mul(mask).sum())
    symmetric = float(((rho == 1.4) | (rho == 0.7)).float().mul(mask).sum())  # the old |ρ−1| > ε_low count
    assert 0 < expected < symmetric
    assert res.clip_fraction == expected / float(mask.sum())


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("rewards", torch.zeros(5), "RolloutBatch.rewards has shape (5,), expected [12]"),
        ("completion_mask", torch.ones(12, 3), "RolloutBatch.completion_mask has shape (12, 3)"),
        ("rewards", torch.full((12,), float("nan")), "rewards contains NaN"),
    ],
)
def test_bad_batches_are_named(field, value, words):
    model = tiny_model()
    batch = rollout(model)
    setattr(batch, field, value)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, GRPOConfig(), version=0)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="group_size must be at least 2"):
        GRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="old_logprobs must be 'learner' or 'sampler'"):
        GRPOConfig(old_logprobs="ref")
    with pytest.raises(ValueError, match=r"clip_ratio_c must be greater than 1 \(dual-clip bound\), got 1.0"):
        GRPOConfig(clip_ratio_c=1.0)


def test_non_finite_step_leaves_weights_untouched():
    model = tiny_model()
    batch = rollout(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("inf")
    before["lm_head.weight"][0, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="non-finite"):
        grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, GRPOConfig(), version=7)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_profiler_trace_is_written(tmp_path):
    model = tiny_model()
    path = tmp_path / "trace" / "step.json"
    grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), rollout(model), GRPOConfig(), version=0, trace_path=path)
    trace = json.loads(path.read_text())
    assert any(ev.get("name", "").startswith("aten::") for ev in trace["traceEvents"])


def test_sampling_is_deterministic_and_stops_at_eos():
    model = tiny_model()
    prompts = torch.randint(5, 64, (4, 6), generator=torch.Generator().manual_seed(1))
    a = sample_completions(model, prompts, 10, eos_id=EOS, seed=5)
    b = sample_completions(model, prompts, 10, eos_id=EOS, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    ids, mask, _ = a
    for i in range(4):
        n = int(mask[i].sum())
        assert (mask[i, :n] == 1).all() and (mask[i, n:] == 0).all()
        assert EOS not in ids[i, : n - 1].tolist()


def test_the_head_logmass_restricts_the_learner_like_a_sampler_that_masks_the_tail_and_leaves_the_step_alone():
    """With ``emittable`` (the ids a sampler can emit) the step also returns, per sampled position, the log of the
    learner's mass on those ids: ``learner_logprobs − head_logmass`` is the learner's log-softmax over the
    emittable ids alone (vocab_tail.restrict), the loss and the update are those of the step without it."""
    from fp8rl_core.learner.vocab_tail import restrict

    model = tiny_model().eval()
    batch = rollout(model)
    batch.completion_ids.clamp_(max=39)  # a sampler that masks ids ≥ 40 emits none of them
    cfg = GRPOConfig(group_size=4, tokens_per_microbatch=40)
    plain, tailed = copy.deepcopy(model), copy.deepcopy(model)
    a = grpo_step(plain, torch.optim.SGD(plain.parameters(), lr=0.1), batch, cfg, version=0)
    b = grpo_step(tailed, torch.optim.SGD(tailed.parameters(), lr=0.1), batch, cfg, version=0, emittable=40)
    assert a.head_logmass is None and b.loss == a.loss and torch.equal(a.learner_logprobs, b.learner_logprobs)
    assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), tailed.parameters()))
    m = batch.completion_mask.bool()
    with torch.no_grad():
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        full = torch.log_softmax(model(input_ids=ids).logits[:, 5:-1].float(), dim=-1)
    want = restrict(full, 40).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    got = b.learner_logprobs - b.head_logmass
    assert torch.allclose(got[m], want[m], atol=1e-5)
    tail = 1 - b.head_logmass.exp()  # the learner's mass on ids 40…63 at each sampled position: a random model's
    assert float(tail[m].min()) > 0.2 and float(tail[m].max()) < 0.6 and (b.head_logmass[~m] == 0).all()
    assert grpo_step(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg, version=0,
                     emittable=64).head_logmass is None  # no tail: nothing to restrict
