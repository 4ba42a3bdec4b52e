"""Per-rank checks on a real sync of the tiny dense Qwen3 (MXFP8 learner, every layer on the grid) split
over 2 and 4 ranks: clean shards pass; a fault planted in one rank's shard — a fault of the catalogue
applied to that rank only, a flipped scale byte, a kv-head replica taken from the wrong shard — fails
naming that rank, the layer and the first differing position."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fp8rl_core.checks.faults import fault
from fp8rl_core.checks.ranks import check_rank_fingerprints, check_rank_shards, first_difference
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import slice_for_rank

SPEC = load_model_spec(Path(__file__).resolve().parents[3] / "configs" / "models" / "qwen3-dense-tiny.yaml")


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
