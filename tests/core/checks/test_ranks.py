"""Per-rank checks on a real sync of the tiny dense Qwen3 (MXFP8 learner, every layer on the grid) split
over 2 and 4 ranks: clean shards pass; a fault planted in one rank's shard — a fault of the catalogue
applied to that rank only, a flipped scale byte, a kv-head replica taken from the wrong shard — fails
naming that rank, the layer and the first differing position. Under preset ``requant`` (the tiny dense and
MoE Qwen3), each rank's slice of the bytes its layers must compute is the rule applied to that rank's part
of the learner's BF16 view, and one byte wrong on one rank fails W2 naming the rank and the tensor."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fp8rl_core.checks.expected import expected_from_learner
from fp8rl_core.checks.faults import fault
from fp8rl_core.checks.ranks import check_rank_fingerprints, check_rank_shards, expected_sync_tensors, first_difference
from fp8rl_core.grids import bf16_view, quantize
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.sampler.config import REQUANT_GRID
from fp8rl_core.sampler.presets import PRESETS, sampler_schemes
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import slice_for_rank

MODELS = Path(__file__).resolve().parents[3] / "configs" / "models"
SPEC = load_model_spec(MODELS / "qwen3-dense-tiny.yaml")  # 8 q heads, 2 kv heads, head_dim 32, H 256, I 768
MOE_SPEC = load_model_spec(MODELS / "qwen3-moe-tiny.yaml")  # the same attention, 8 experts of I 128


@pytest.fixture(scope="module")
def sync():
    learner = Learner(build_model(SPEC, 0), LearnerConfig(precision="mxfp8", layers="all"))
    schemes = sampler_schemes(gemm_layers(learner.model), "all")
    full = export_weights(learner.model, learner.forward_weights(), schemes)
    return learner, full, ModelLayout.from_hf_config(SPEC.hf_config().to_dict())


def _live(slices):
    """What each rank's engine holds when every shard is right: its own copy of its slice."""
    return {s.rank: {n: t.clone() for n, t in s.tensors.items()} for s in slices}


@pytest.mark.parametrize("tp", [2, 4])
def test_clean_shards_pass_both_tiers(sync, tp):
    _, full, layout = sync
    slices = [slice_for_rank(full, layout, r, tp) for r in range(tp)]
    live = _live(slices)
    res = check_rank_shards(slices, live)
    assert res.passed and res.measured == 0 and res.offenders == []
    assert check_rank_fingerprints(slices, {r: fingerprints(t) for r, t in live.items()}).passed
    # a rank may hold its BF16 views in float32 (the same values): still equal
    live[1]["model.norm.weight"] = live[1]["model.norm.weight"].float()
    assert check_rank_shards(slices, live).passed


@pytest.mark.parametrize("tp", [2, 4])
def test_a_catalogue_fault_in_one_ranks_shard_names_that_rank(sync, tp):
    """qkv-order-swapped (k and v of layer 0 fused in the wrong order) reaches rank 1 only."""
    learner, full, layout = sync
    bad_full = fault("qkv-order-swapped").on_export(SimpleNamespace(learner=learner), dict(full))
    slices = [slice_for_rank(full, layout, r, tp) for r in range(tp)]
    live = _live(slices)
    live[1] = dict(slice_for_rank(bad_full, layout, 1, tp).tensors)
    res = check_rank_shards(slices, live)
    assert not res.passed
    layer = "model.layers.0.self_attn.qkv_proj"
    assert [o.split(":")[0] for o in res.offenders] == [f"tp rank 1/{tp}, layer {layer}, weight",
                                                        f"tp rank 1/{tp}, layer {layer}, weight_scale"]
    q_rows = layout.q_size // tp  # rank 1's k rows start right after its q rows
    assert f"first difference at [{q_rows}, " in res.offenders[0]
    fps = check_rank_fingerprints(slices, {r: fingerprints(t) for r, t in live.items()})
    assert not fps.passed and all(o.startswith(f"tp rank 1/{tp}, layer {layer}") for o in fps.offenders)


def test_a_flipped_scale_byte_is_found_at_its_position(sync):
    _, full, layout = sync
    slices = [slice_for_rank(full, layout, r, 4) for r in range(4)]
    live = _live(slices)
    name = "model.layers.2.mlp.down_proj.weight_scale"  # [256, 768/32/4 = 6] on each rank
    was = int(live[3][name][17, 4])
    live[3][name][17, 4] = was ^ 1
    res = check_rank_shards(slices, live)
    assert res.offenders == [f"tp rank 3/4, layer model.layers.2.mlp.down_proj, weight_scale: first difference at "
                             f"[17, 4] (engine 0x{was ^ 1:02x}, expected 0x{was:02x}); 1 of 1536 elements differ"]
    assert res.measured == 1


def test_a_kv_replica_loaded_from_the_wrong_shard(sync):
    """tp=4 over 2 kv heads: ranks 0 and 1 share kv head 0. Rank 1 holding rank 2's shard (kv head 1, and
    rank 2's q heads) is a wrong replica: named as rank 1, nothing else."""
    _, full, layout = sync
    slices = [slice_for_rank(full, layout, r, 4) for r in range(4)]
    live = _live(slices)
    name = "model.layers.3.self_attn.qkv_proj.weight"
    live[1][name] = slices[2].tensors[name].clone()
    res = check_rank_shards(slices, live)
    assert len(res.offenders) == 1 and res.offenders[0].startswith(
        "tp rank 1/4, layer model.layers.3.self_attn.qkv_proj, weight: first difference at [0, ")


def test_missing_extra_and_misshapen_tensors(sync):
    _, full, layout = sync
    slices = [slice_for_rank(full, layout, r, 2) for r in range(2)]
    live = _live(slices)
    del live[0]["lm_head.weight"]
    live[0]["model.layers.0.mlp.gate_up_proj.bias"] = torch.zeros(3)
    live[1]["model.layers.0.self_attn.o_proj.weight"] = full["model.layers.0.self_attn.o_proj.weight"]  # unsliced
    res = check_rank_shards(slices, live)
    assert sorted(res.offenders) == sorted([
        "tp rank 0/2: extra tensor model.layers.0.mlp.gate_up_proj.bias",
        "tp rank 0/2, layer lm_head, weight: missing, expected [512, 256]",
        "tp rank 1/2, layer model.layers.0.self_attn.o_proj, weight: shape [256, 256], expected [256, 128]",
    ])
    assert check_rank_shards(slices, {0: live[0]}).offenders[-1] == "tp rank 1/2: no shard read back"


def test_first_difference():
    a = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    b = a.clone()
    assert first_difference(a, b) is None
    b[2, 1] = 99
    b[2, 3] = 98
    assert first_difference(b, a) == ((2, 1), 99, 9, 2)
    # FP8 views compare as bytes: -0.0 and +0.0 differ
    z = torch.zeros(4, dtype=torch.float8_e4m3fn)
    neg = torch.tensor([-0.0, 0, 0, 0]).to(torch.float8_e4m3fn)
    assert first_difference(neg, z)[:3] == ((0,), 0x80, 0x00)


# ------------------------------------------------------------------------------------------------------
# preset requant: the bytes each rank's layers compute from their BF16 shard
# ------------------------------------------------------------------------------------------------------
def _requant(spec):
    """A learner of ``spec`` under preset requant, and what the engine must hold (on-grid kind: the bytes
    its requant layers compute) with the model's layout."""
    preset = PRESETS["requant"]
    learner = Learner(build_model(spec, 0), preset.learner_config())
    schemes = preset.schemes(gemm_layers(learner.model))
    assert set(schemes.values()) == {"requant"}
    exp = expected_from_learner(learner, schemes)
    return learner, exp, ModelLayout.from_hf_config(spec.hf_config().to_dict())


@pytest.fixture(scope="module")
def requant_dense():
    return _requant(SPEC)


@pytest.fixture(scope="module")
def requant_moe():
    return _requant(MOE_SPEC)


def _rule(view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = quantize(view.float(), REQUANT_GRID, axis=-1)
    return q.data.contiguous().view(torch.uint8), q.scale


@pytest.mark.parametrize("tp", [2, 4])
def test_a_ranks_requant_bytes_are_the_rule_on_its_part_of_the_bf16_view(requant_dense, requant_moe, tp):
    """Each rank's slice of the bytes the requant layers must compute equals the rule applied to the part
    of bf16(master) vLLM's loaders give that rank (cut here from the masters, not by the slicing code): the
    1×32 blocks never straddle a cut, so the slice of the whole requantization is the rank's own."""
    learner, exp, layout = requant_dense
    grid = expected_sync_tensors(exp, "grid")
    layers = learner.model.config.num_hidden_layers
    assert exp.grid == {} and set(grid) == set(exp.requant) and len(grid) == 4 * 2 * layers  # 4 GEMMs: data, scale
    w = {n: bf16_view(p.detach()) for n, p in learner.model.named_parameters()}
    hd = layout.head_dim
    for r in range(tp):
        s = slice_for_rank(grid, layout, r, tp).tensors
        kv = r * 2 // tp
        for i in range(layers):
            a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
            parts = {
                f"{a}.qkv_proj": torch.cat([w[f"{a}.q_proj.weight"].chunk(tp)[r],
                                            w[f"{a}.k_proj.weight"][kv * hd:(kv + 1) * hd],
                                            w[f"{a}.v_proj.weight"][kv * hd:(kv + 1) * hd]]),
                f"{m}.gate_up_proj": torch.cat([w[f"{m}.gate_proj.weight"].chunk(tp)[r],
                                                w[f"{m}.up_proj.weight"].chunk(tp)[r]]),
                f"{a}.o_proj": w[f"{a}.o_proj.weight"].chunk(tp, 1)[r],
                f"{m}.down_proj": w[f"{m}.down_proj.weight"].chunk(tp, 1)[r],
            }
            for layer, view in parts.items():
                data, scale = _rule(view)
                assert torch.equal(s[f"{layer}.mx_data"], data), (layer, r)
                assert torch.equal(s[f"{layer}.mx_scale"], scale), (layer, r)
    # the MoE tiny's routed experts: w13 = gate_r | up_r of every expert, w2 by the intermediate size (128/tp)
    learner, exp, layout = requant_moe
    grid = expected_sync_tensors(exp, "grid")
    params = dict(learner.model.named_parameters())
    e = "model.layers.0.mlp.experts"
    w13, w2 = (bf16_view(params[n].detach()) for n in exp.groups[e])  # [E, 2I, H], [E, H, I]
    for r in range(tp):
        s = slice_for_rank(grid, layout, r, tp).tensors
        gate, up = w13.chunk(2, 1)
        for name, view in ((f"{e}.w13", torch.cat([gate.chunk(tp, 1)[r], up.chunk(tp, 1)[r]], 1)),
                           (f"{e}.w2", w2.chunk(tp, 2)[r])):
            data, scale = _rule(view)
            assert torch.equal(s[f"{name}_mx_data"], data) and torch.equal(s[f"{name}_mx_scale"], scale), (name, r)


def test_one_wrong_requant_byte_on_one_rank_names_the_rank_and_the_tensor(requant_dense):
    """The engine test's planted fault (layer 0's qkv_proj, its first E4M3 data byte's lowest bit), on rank
    1 of 2 only: both tiers name rank 1 and ``mx_data``, the full tier its position; rank 0 passes."""
    _, exp, layout = requant_dense
    grid = expected_sync_tensors(exp, "grid")
    slices = [slice_for_rank(grid, layout, r, 2) for r in range(2)]
    live = _live(slices)
    name = "model.layers.0.self_attn.qkv_proj.mx_data"
    was = int(live[1][name][0, 0])
    live[1][name][0, 0] = was ^ 1
    res = check_rank_shards(slices, live)
    assert res.offenders == [f"tp rank 1/2, layer model.layers.0.self_attn.qkv_proj, mx_data: first difference at "
                             f"[0, 0] (engine 0x{was ^ 1:02x}, expected 0x{was:02x}); 1 of {live[1][name].numel()} "
                             "elements differ"]
    fps = check_rank_fingerprints(slices, {r: fingerprints(t) for r, t in live.items()})
    assert [o.split(":")[0] for o in fps.offenders] == ["tp rank 1/2, layer model.layers.0.self_attn.qkv_proj, mx_data"]
