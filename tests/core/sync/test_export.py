"""Export to the sampler's names and layout: fused order, on-grid bytes, BF16 views, ties, errors."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import bf16_view
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.export import SyncError, export_weights
from fp8rl_core.sync.layout import ModelLayout, to_checkpoint

DENSE = ModelSpec(name="x", kind="dense", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32)
MOE = ModelSpec(**(DENSE.model_dump() | dict(kind="moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)))
TIED = ModelSpec(**(DENSE.model_dump() | dict(tie_word_embeddings=True)))


def _learner(spec, precision="mxfp8", layers="all"):
    return Learner(build_model(spec, 0), LearnerConfig(precision=precision, layers=layers))


def test_dense_on_grid_export_is_the_learners_forward_bytes_in_vllm_order():
    learner = _learner(DENSE)
    fw = learner.forward_weights()
    schemes = sampler_schemes(gemm_layers(learner.model), "all")
    out = export_weights(learner.model, fw, schemes)
    p = "model.layers.1.self_attn"
    q, k, v = (fw[f"{p}.{s}_proj"] for s in "qkv")
    assert out[f"{p}.qkv_proj.weight"].dtype == torch.uint8 and out[f"{p}.qkv_proj.weight"].shape == (64 + 32 + 32, 64)
    assert torch.equal(out[f"{p}.qkv_proj.weight"], torch.cat([q.data, k.data, v.data]).view(torch.uint8))
    assert torch.equal(out[f"{p}.qkv_proj.weight_scale"], torch.cat([q.scale, k.scale, v.scale]))
    assert out[f"{p}.qkv_proj.weight_scale"].shape == (128, 64 // 32)
    m = "model.layers.0.mlp"
    assert torch.equal(out[f"{m}.gate_up_proj.weight"],
                       torch.cat([fw[f"{m}.gate_proj"].data, fw[f"{m}.up_proj"].data]).view(torch.uint8))
    # everything off the GEMM set is the BF16 view of its master
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.0.input_layernorm.weight"):
        assert out[name].dtype == torch.bfloat16
        assert torch.equal(out[name], bf16_view(dict(learner.model.named_parameters())[name].detach()))
    # the split back to checkpoint shards returns each member's own bytes
    layout = ModelLayout.from_hf_config(DENSE.hf_config().to_dict())
    shards = dict(to_checkpoint(f"{p}.qkv_proj.weight", out[f"{p}.qkv_proj.weight"], layout))
    assert list(shards) == [f"{p}.q_proj.weight", f"{p}.k_proj.weight", f"{p}.v_proj.weight"]
    assert torch.equal(shards[f"{p}.k_proj.weight"], k.data.view(torch.uint8))


def test_moe_experts_and_router():
    learner = _learner(MOE)
    fw = learner.forward_weights()
    schemes = sampler_schemes(gemm_layers(learner.model), "all")
    assert "model.layers.0.mlp.gate" not in schemes and schemes["model.layers.0.mlp.experts"] == "mxfp8"
    out = export_weights(learner.model, fw, schemes)
    e = "model.layers.0.mlp.experts"
    assert out[f"{e}.w13_weight"].shape == (4, 64, 64) and out[f"{e}.w2_weight"].shape == (4, 64, 32)
    assert torch.equal(out[f"{e}.w13_weight"], fw[f"{e}.gate_up_proj"].data.view(torch.uint8))
    assert torch.equal(out[f"{e}.w2_weight_scale"], fw[f"{e}.down_proj"].scale)
    assert out["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16  # router stays BF16
    layout = ModelLayout.from_hf_config(MOE.hf_config().to_dict())
    shards = dict(to_checkpoint(f"{e}.w13_weight_scale", out[f"{e}.w13_weight_scale"], layout))
    assert len(shards) == 8 and torch.equal(shards[f"{e}.2.up_proj.weight_scale"], fw[f"{e}.gate_up_proj"].scale[2, 32:])


def test_bf16_sampler_gets_bf16_views_even_from_an_mxfp8_learner():
    learner = _learner(DENSE)
    out = export_weights(learner.model, learner.forward_weights(), {})
    assert all(t.dtype == torch.bfloat16 for t in out.values())
    w = dict(learner.model.named_parameters())
    p = "model.layers.0.self_attn"
    assert torch.equal(out[f"{p}.qkv_proj.weight"], bf16_view(torch.cat([w[f"{p}.{s}_proj.weight"] for s in "qkv"]).detach()))


def test_tied_lm_head_is_sent_once_as_the_embedding():
    learner = _learner(TIED)
    out = export_weights(learner.model, learner.forward_weights(), sampler_schemes(gemm_layers(learner.model), "all"))
    assert "lm_head.weight" not in out and "model.embed_tokens.weight" in out


def test_sampler_on_grid_needs_the_learner_on_grid():
    learner = _learner(DENSE, precision="bf16")
    schemes = sampler_schemes(gemm_layers(learner.model), "all")
    with pytest.raises(SyncError, match="learner keeps .* in BF16"):
        export_weights(learner.model, learner.forward_weights(), schemes)


@pytest.mark.parametrize("selection, match", [
    (["self_attn.q_proj"], "fuses .*select all of them or none"),
    (["mlp.experts.gate_up_proj"], "fuses"),
    (["lm_head"], "keeps lm_head in BF16"),
])
def test_schemes_refuse_partial_fused_layers(selection, match):
    names = gemm_layers(build_model(MOE if "experts" in selection[0] else DENSE, 0))
    with pytest.raises(ValueError, match=match):
        sampler_schemes(names, selection)


def test_half_and_block128_schemes():
    names = gemm_layers(build_model(DENSE, 0))
    assert sampler_schemes(names, "half") == {f"model.layers.1.{p}": "mxfp8" for p in
                                              ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    assert set(sampler_schemes(names, "all", "block128").values()) == {"block128"}
