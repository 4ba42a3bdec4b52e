"""The vLLM naming shared by the exporter, the worker and the checks: learner layer → vLLM prefix, the
fused order, fused tensors → checkpoint shards."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.sync.layout import ModelLayout, fused_group, sampler_layer, sync_name, to_checkpoint


@pytest.mark.parametrize("name, expected", [
    ("model.layers.3.self_attn.k_proj", "model.layers.3.self_attn.qkv_proj"),
    ("model.layers.0.mlp.up_proj", "model.layers.0.mlp.gate_up_proj"),
    ("model.layers.1.mlp.experts.down_proj", "model.layers.1.mlp.experts"),
    ("model.layers.1.mlp.gate", "model.layers.1.mlp.gate"),
    ("model.layers.1.self_attn.o_proj", "model.layers.1.self_attn.o_proj"),
    ("lm_head", "lm_head"),
])
def test_sampler_layer_names(name, expected):
    assert sampler_layer(name) == expected


def test_fused_group_is_in_the_fused_order_whatever_the_input_order():
    layers = ["model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj",
              "model.layers.0.self_attn.k_proj", "model.layers.0.mlp.gate_proj", "model.layers.1.self_attn.q_proj"]
    assert fused_group("model.layers.0.self_attn.qkv_proj", layers) == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"]
    assert fused_group("model.layers.0.mlp.gate_up_proj", layers) == [
        "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert fused_group("model.layers.0.mlp.down_proj", layers) == []


def test_to_checkpoint_names_a_fused_tensor_that_does_not_match_the_config_sizes():
    layout = ModelLayout(q_size=4, kv_size=2, intermediate_size=3, moe_intermediate_size=None, num_experts=None,
                         tie_word_embeddings=False)
    shards = dict(to_checkpoint("model.layers.0.self_attn.qkv_proj.weight", torch.arange(8.0).view(8, 1), layout))
    assert list(shards) == [f"model.layers.0.self_attn.{s}_proj.weight" for s in "qkv"]
    assert shards["model.layers.0.self_attn.v_proj.weight"].flatten().tolist() == [6.0, 7.0]
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.gate_up_proj.weight' has 5 rows .* \[3, 3\]"):
        list(to_checkpoint("model.layers.0.mlp.gate_up_proj.weight", torch.zeros(5, 2), layout))


@pytest.mark.parametrize("name, shape", [
    ("model.layers.0.self_attn.qkv_proj.weight", (64 + 32 + 32, 64)),
    ("model.layers.0.self_attn.qkv_proj.weight_scale", (128, 2)),
    ("model.layers.0.mlp.gate_up_proj.weight", (2 * 96, 64)),
    ("model.layers.1.mlp.experts.w13_weight_scale", (4, 64, 2)),
    ("model.layers.1.mlp.experts.w2_weight", (4, 64, 32)),
    ("model.layers.1.mlp.gate.weight", (4, 64)),
    ("model.layers.0.self_attn.o_proj.weight", (64, 64)),
    ("model.norm.weight", (64,)),
])
def test_every_checkpoint_shard_maps_back_to_its_sync_tensor(name, shape):
    layout = ModelLayout(q_size=64, kv_size=32, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                         tie_word_embeddings=False)
    shards = list(to_checkpoint(name, torch.zeros(shape), layout))
    assert len(shards) >= 1 and {sync_name(n) for n, _ in shards} == {name}
