"""The learner end to end: warm-started dense and MoE policies, 5 GRPO steps on the addition task with
MXFP8 layers, every trainable tensor updated, versions advancing, forward weights on the grid."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl_core.grids import bf16_view, quantize
from fp8rl_core.learner.config import GRPOConfig, LearnerConfig, Recipe, WarmStartConfig
from fp8rl_core.learner.grpo import RolloutBatch
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.rollout import sample_completions
from fp8rl_core.learner.task import EOS, AdditionTask
from fp8rl_core.learner.warmstart import load_policy, warm_start

SPECS = {
    "dense": ModelSpec(name="qwen3-dense-grpo-test", kind="dense", vocab_size=1024, hidden_size=128,
                       intermediate_size=384, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, max_position_embeddings=64),
    "moe": ModelSpec(name="qwen3-moe-grpo-test", kind="moe", vocab_size=1024, hidden_size=128,
                     intermediate_size=384, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                     max_position_embeddings=64),
}
# A short warm start: the policy answers in the task's format with partly right digits, so rewards
# (exact match 1, partial credit otherwise) vary inside groups and GRPO has a signal.
WS = WarmStartConfig(steps=80, batch_size=32, lr=3e-3, warmup=10, eval_prompts=32, task=AdditionTask(digits=2))
G = 4


@pytest.fixture(scope="module", params=list(SPECS))
def policy(request, tmp_path_factory):
    res = warm_start(SPECS[request.param], WS, tmp_path_factory.mktemp("ws"))
    return request.param, res


def _rollout(learner: Learner, task: AdditionTask, step: int) -> RolloutBatch:
    prompts = task.prompts(8, seed=1000 + step).repeat_interleave(G)
    ids, mask, lp = sample_completions(learner.model, prompts.prompt_ids, task.answer_len, eos_id=EOS,
                                       seed=step, autocast=learner.autocast())
    return RolloutBatch(prompts.prompt_ids, ids, mask, task.reward(prompts, ids), lp, version=learner.version)


@pytest.mark.parametrize("layers", ["all", "half"])
def test_five_grpo_steps_update_every_tensor(policy, layers):
    kind, ws = policy
    model = load_policy(ws.path)
    learner = Learner(model, LearnerConfig(precision="mxfp8", layers=layers, lr=3e-4,
                                           grpo=GRPOConfig(group_size=G, tokens_per_microbatch=192)))
    assert learner.layers and all(".layers." in n for n in learner.layers)
    if kind == "moe":
        assert any(n.endswith("experts.gate_up_proj") for n in learner.layers)
        assert not any(n.endswith("mlp.gate") for n in learner.layers)  # the router stays BF16
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    group_spread = 0.0
    for step in range(5):
        batch = _rollout(learner, WS.task, step)
        res = learner.step(batch)
        assert res.version == step + 1 == learner.version
        assert math.isfinite(res.loss) and math.isfinite(res.grad_norm) and res.grad_norm > 0
        assert len(res.microbatches) > 1 and all(m.quantize_s > 0 and m.gemm_s > 0 for m in res.microbatches)
        group_spread = max(group_spread, float(batch.rewards.reshape(-1, G).std(dim=1).max()))
        # the train side of train-rollout KL: learner log-probs on exactly the sampled tokens
        assert torch.all((res.learner_logprobs <= 0) & ((res.learner_logprobs != 0) <= batch.completion_mask.bool()))
    assert group_spread > 0  # rewards varied within a group: the updates had signal
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


def test_forward_weights_are_the_grid_bytes_of_the_master_weights(policy):
    kind, ws = policy
    learner = Learner(load_policy(ws.path), LearnerConfig(precision="mxfp8", layers="all",
                                                           recipe=Recipe(rule="floor")))
    fw = learner.forward_weights()
    params = dict(learner.model.named_parameters())
    assert sorted(fw) == sorted(learner.layers)
    for name, qt in fw.items():
        w = params[name if name in params else name + ".weight"]
        ref = quantize(w.detach(), "mxfp8-e4m3-floor")
        assert torch.equal(qt.data.view(torch.uint8), ref.data.view(torch.uint8)), name
        assert torch.equal(qt.scale, ref.scale), name
    view = learner.bf16_view()
    covered = {n if n in params else n + ".weight" for n in fw}
    assert set(view) == set(params) - covered  # everything else travels as BF16 ...
    for name, t in view.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, bf16_view(params[name].detach()))  # ... RNE of fp32


def test_bf16_learner_is_the_baseline(policy):
    _, ws = policy
    learner = Learner(load_policy(ws.path), LearnerConfig(precision="bf16", lr=1e-4, grpo=GRPOConfig(group_size=G)))
    assert learner.layers == [] and learner.forward_weights() == {}
    res = learner.step(_rollout(learner, WS.task, 0))
    assert res.version == 1 and all(m.quantize_s == 0 for m in res.microbatches)


def test_bad_learner_settings_are_named():
    with pytest.raises(ValueError, match="precision must be 'bf16' or 'mxfp8'"):
        LearnerConfig(precision="fp8")
    with pytest.raises(ValueError, match="lr must be positive"):
        LearnerConfig(lr=0)
