"""Tensor-parallel slices of a real sync (the tiny Qwen3 models' weights on the learner's MXFP8 grid):
each rank's slice follows vLLM's sharding rules, the slices reassemble to the full tensors, a rank's
on-grid slice is exactly the learner's quantization of that rank's part of the master, and a cut that
would split a 32-element block fails naming the layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fp8rl_core.grids import quantize
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import ShardError, shard_kind, shard_tensor, slice_for_rank

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "models"
DENSE = load_model_spec(CONFIGS / "qwen3-dense-tiny.yaml")  # 8 q heads, 2 kv heads, head_dim 32, H 256, I 768
MOE = load_model_spec(CONFIGS / "qwen3-moe-tiny.yaml")  # the same attention, 8 experts of I 128


def _sync(spec):
    learner = Learner(build_model(spec, 0), LearnerConfig(precision="mxfp8", layers="all"))
    schemes = sampler_schemes(gemm_layers(learner.model), "all")
    full = export_weights(learner.model, learner.forward_weights(), schemes)
    return learner, full, ModelLayout.from_hf_config(spec.hf_config().to_dict())


@pytest.fixture(scope="module")
def dense():
    return _sync(DENSE)


@pytest.fixture(scope="module")
def moe():
    return _sync(MOE)


A = "model.layers.1.self_attn"
M = "model.layers.1.mlp"


def test_every_sync_tensor_has_a_rule(dense, moe):
    kinds = {shard_kind(n) for _, full, _ in (dense, moe) for n in full}
    assert kinds == {"qkv", "merged", "row", "experts_w13", "experts_w2", "vocab", "replicated"}
    with pytest.raises(ShardError, match="no tensor-parallel rule for sync tensor 'model.layers.0.mystery.weight'"):
        shard_kind("model.layers.0.mystery.weight")
    # the bytes a requant layer computes itself are cut as its weight and scales are
    assert [shard_kind(f"{A}.{layer}.{t}") for layer in ("qkv_proj", "o_proj") for t in ("mx_data", "mx_scale")] == \
        ["qkv", "qkv", "row", "row"]
    assert [shard_kind(f"model.layers.0.mlp.experts.{w}_{t}") for w in ("w13", "w2") for t in ("mx_data", "mx_scale")] \
        == ["experts_w13"] * 2 + ["experts_w2"] * 2


@pytest.mark.parametrize("tp", [2, 4])
def test_dense_slices_reassemble_to_the_full_tensors(dense, tp):
    _, full, layout = dense
    slices = [slice_for_rank(full, layout, r, tp) for r in range(tp)]
    q, kv, hd = layout.q_size, layout.kv_size, layout.head_dim
    for suffix in ("weight", "weight_scale"):
        # qkv: q cut by heads; k, v: kv_heads=2 → tp=2 one head each, tp=4 each head on 2 consecutive ranks
        name = f"{A}.qkv_proj.{suffix}"
        parts = [s.tensors[name] for s in slices]
        qp = q // tp
        kvp = hd  # tp >= kv heads (2): one kv head per rank
        assert all(p.shape == (qp + 2 * kvp, full[name].shape[1]) for p in parts)
        assert torch.equal(torch.cat([p[:qp] for p in parts]), full[name][:q])
        heads = [full[name][q:q + kv].reshape(2, hd, -1), full[name][q + kv:].reshape(2, hd, -1)]
        for r, p in enumerate(parts):
            head = r * 2 // tp  # vLLM: shard = rank // (tp / kv_heads)
            assert torch.equal(p[qp:qp + kvp], heads[0][head]) and torch.equal(p[qp + kvp:], heads[1][head])
        # gate_up: each rank gate_r | up_r
        name = f"{M}.gate_up_proj.{suffix}"
        i = full[name].shape[0] // 2
        parts = [s.tensors[name] for s in slices]
        gate = torch.cat([p[: i // tp] for p in parts])
        up = torch.cat([p[i // tp:] for p in parts])
        assert torch.equal(torch.cat([gate, up]), full[name])
        # row-parallel: columns (data K, scales K/32) side by side
        for layer in (f"{A}.o_proj", f"{M}.down_proj"):
            name = f"{layer}.{suffix}"
            assert torch.equal(torch.cat([s.tensors[name] for s in slices], 1), full[name])
    # vocabulary-parallel embeddings and lm_head; norms replicated
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(torch.cat([s.tensors[name] for s in slices]), full[name])
    for name in ("model.norm.weight", f"{A}.q_norm.weight", "model.layers.0.input_layernorm.weight"):
        assert all(torch.equal(s.tensors[name], full[name]) for s in slices)
    # fingerprints are those of the rank's own tensors
    assert slices[1].fingerprints == fingerprints(slices[1].tensors)
    assert slices[0].fingerprints[f"{A}.o_proj.weight"] != slices[1].fingerprints[f"{A}.o_proj.weight"]


@pytest.mark.parametrize("tp", [2, 4])
def test_a_ranks_on_grid_slice_is_the_quantized_slice_of_its_master(dense, tp):
    """Rowwise 1×32 blocks never straddle a rank's cut, so each rank's bytes are the learner's grid applied
    to exactly that rank's part of the fp32 master — independent of the slicing code."""
    learner, full, layout = dense
    grid = learner.cfg.recipe.fwd_grid
    w = {n: p.detach().float() for n, p in learner.model.named_parameters()}
    hd = layout.head_dim
    for r in range(tp):
        s = slice_for_rank(full, layout, r, tp).tensors
        kv_head = r * 2 // tp
        qkv_master = torch.cat([w[f"{A}.q_proj.weight"].chunk(tp)[r],
                                w[f"{A}.k_proj.weight"][kv_head * hd:(kv_head + 1) * hd],
                                w[f"{A}.v_proj.weight"][kv_head * hd:(kv_head + 1) * hd]])
        rows = {
            f"{A}.qkv_proj": qkv_master,
            f"{M}.gate_up_proj": torch.cat([w[f"{M}.gate_proj.weight"].chunk(tp)[r],
                                            w[f"{M}.up_proj.weight"].chunk(tp)[r]]),
            f"{A}.o_proj": w[f"{A}.o_proj.weight"].chunk(tp, 1)[r],
            f"{M}.down_proj": w[f"{M}.down_proj.weight"].chunk(tp, 1)[r],
        }
        for layer, master in rows.items():
            q = quantize(master, grid, axis=-1)
            assert torch.equal(s[f"{layer}.weight"], q.data.contiguous().view(torch.uint8)), (layer, r)
            assert torch.equal(s[f"{layer}.weight_scale"], q.scale), (layer, r)


def test_kv_heads_replicate_when_tp_exceeds_them(dense):
    """tp=8 over 8 q heads and 2 kv heads: one q head per rank; ranks 0-3 hold kv head 0, ranks 4-7 kv
    head 1 (vLLM's num_kv_head_replicas = tp / kv_heads = 4)."""
    _, full, layout = dense
    name = f"{A}.qkv_proj.weight"
    parts = [shard_tensor(name, full[name], layout, r, 8) for r in range(8)]
    hd = layout.head_dim
    assert all(p.shape == (3 * hd, 256) for p in parts)
    assert all(torch.equal(parts[r][hd:], parts[0][hd:]) for r in range(4))
    assert all(torch.equal(parts[r][hd:], parts[4][hd:]) for r in range(4, 8))
    assert not torch.equal(parts[0][hd:], parts[4][hd:])
    k = full[name][layout.q_size:layout.q_size + layout.kv_size]
    assert torch.equal(parts[5][hd:2 * hd], k[hd:])
    with pytest.raises(ShardError, match="not divisible by tensor-parallel size 3"):
        shard_tensor(name, full[name], layout, 0, 3)


@pytest.mark.parametrize("tp", [2, 4])
def test_moe_experts_tensor_parallel(moe, tp):
    _, full, layout = moe
    e = "model.layers.0.mlp.experts"
    slices = [slice_for_rank(full, layout, r, tp) for r in range(tp)]
    for suffix in ("weight", "weight_scale"):
        w13 = [s.tensors[f"{e}.w13_{suffix}"] for s in slices]
        i = full[f"{e}.w13_{suffix}"].shape[1] // 2
        assert all(p.shape[:2] == (8, 2 * i // tp) for p in w13)
        gate = torch.cat([p[:, : i // tp] for p in w13], 1)
        up = torch.cat([p[:, i // tp:] for p in w13], 1)
        assert torch.equal(torch.cat([gate, up], 1), full[f"{e}.w13_{suffix}"])
        assert torch.equal(torch.cat([s.tensors[f"{e}.w2_{suffix}"] for s in slices], 2), full[f"{e}.w2_{suffix}"])
    # the router is replicated
    assert all(torch.equal(s.tensors["model.layers.0.mlp.gate.weight"], full["model.layers.0.mlp.gate.weight"])
               for s in slices)


def test_moe_experts_expert_parallel_follow_vllms_linear_placement(moe):
    """enable_expert_parallel with 3 ranks over 8 experts: ranks hold 3, 3, 2 whole experts, in order (the
    experts alone: this model's 8 attention heads cannot be cut in 3)."""
    _, full, layout = moe
    e = "model.layers.0.mlp.experts"
    experts = {n: t for n, t in full.items() if n.startswith(e)}
    slices = [slice_for_rank(experts, layout, r, 3, expert_parallel=True) for r in range(3)]
    assert [s.tensors[f"{e}.w13_weight"].shape[0] for s in slices] == [3, 3, 2]
    for n in (f"{e}.w13_weight", f"{e}.w13_weight_scale", f"{e}.w2_weight", f"{e}.w2_weight_scale"):
        assert torch.equal(torch.cat([s.tensors[n] for s in slices]), full[n])
        assert slices[0].tensors[n].shape[1:] == full[n].shape[1:]  # whole experts: no cut inside


def test_k_per_rank_not_a_multiple_of_32_fails_clearly(dense, moe):
    _, full, layout = dense
    o = {n: full[n] for n in (f"{A}.o_proj.weight", f"{A}.o_proj.weight_scale")}
    with pytest.raises(ShardError, match=r"model.layers.1.self_attn.o_proj: K = 256 over tensor-parallel size 16 "
                                         r"gives 16 columns per rank, not a multiple of the 32-element MXFP8 block"):
        slice_for_rank(o, layout, 0, 16)
    # the scales alone fail the same way (their K/32 = 8 columns cannot give whole blocks to 16 ranks)
    with pytest.raises(ShardError, match="K = 256 over tensor-parallel size 16"):
        shard_tensor(f"{A}.o_proj.weight_scale", full[f"{A}.o_proj.weight_scale"], layout, 0, 16, on_grid=True)
    # off the grid (a BF16 o_proj) the same cut is legal
    bf16 = export_weights(dense[0].model, {}, {})
    assert shard_tensor(f"{A}.o_proj.weight", bf16[f"{A}.o_proj.weight"], layout, 3, 16).shape == (256, 16)
    # experts: down's K is the expert intermediate size (128): tp=8 gives 16 per rank
    _, mfull, mlayout = moe
    w2 = {n: mfull[n] for n in ("model.layers.0.mlp.experts.w2_weight", "model.layers.0.mlp.experts.w2_weight_scale")}
    with pytest.raises(ShardError, match="experts: K = 128 over tensor-parallel size 8 gives 16 columns"):
        slice_for_rank(w2, mlayout, 0, 8)
    # a requant layer's own bytes: the same blocks, the same refusal (its data cut with its scales)
    mx = {f"{A}.o_proj.mx_data": full[f"{A}.o_proj.weight"], f"{A}.o_proj.mx_scale": full[f"{A}.o_proj.weight_scale"]}
    with pytest.raises(ShardError, match="o_proj: K = 256 over tensor-parallel size 16 gives 16 columns per rank"):
        slice_for_rank(mx, layout, 0, 16)  # the data's cut is refused first: mx_scale puts it on the grid
    assert slice_for_rank(mx, layout, 1, 2).tensors[f"{A}.o_proj.mx_scale"].shape == (256, 4)


def test_vocab_padding_rows_are_zero():
    """vLLM pads the vocabulary to a multiple of 64 before cutting it; rows past the real vocabulary are 0."""
    layout = ModelLayout(q_size=64, kv_size=32, intermediate_size=64, moe_intermediate_size=None, num_experts=None,
                         tie_word_embeddings=False, head_dim=16, vocab_size=1000)
    emb = torch.randn(1000, 8).to(torch.bfloat16)
    parts = [shard_tensor("model.embed_tokens.weight", emb, layout, r, 4) for r in range(4)]  # padded 1024 → 256 each
    assert all(p.shape == (256, 8) for p in parts)
    assert torch.equal(torch.cat(parts)[:1000], emb)
    assert not parts[3][232:].any() and parts[3][:232].any()
    with pytest.raises(ShardError, match="rank 4 is outside tensor-parallel size 4"):
        shard_tensor("model.embed_tokens.weight", emb, layout, 4, 4)
