"""The checks as pure functions: expected names and BF16 views agree with the exporter (two independent
derivations), and each check fires on the failure it exists for."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.checks import (
    check_coverage,
    check_derived_state,
    check_grid_bytes,
    check_grid_fingerprints,
    check_precision,
    check_precision_fingerprints,
    check_version,
    differing_bytes,
    expected_grid_tensors,
    expected_sync_names,
    sampler_bf16_views,
)
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.export import export_weights

DENSE = ModelSpec(name="x", kind="dense", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32)
MOE = ModelSpec(**(DENSE.model_dump() | dict(kind="moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)))
TIED = ModelSpec(**(DENSE.model_dump() | dict(tie_word_embeddings=True)))


@pytest.fixture(params=[(DENSE, "all", "mxfp8"), (DENSE, "half", "mxfp8"), (DENSE, "none", "mxfp8"),
                        (DENSE, "all", "requant"), (MOE, "all", "mxfp8"), (MOE, "all", "block128"),
                        (MOE, "all", "requant"), (TIED, "all", "mxfp8")],
                ids=["dense-all", "dense-half", "dense-bf16", "dense-requant", "moe-all", "moe-block128", "moe-requant",
                     "tied-all"])
def case(request):
    spec, sel, grid = request.param
    learner = Learner(build_model(spec, 0), LearnerConfig(precision="mxfp8", layers="all"))
    schemes = sampler_schemes(gemm_layers(learner.model), sel, grid)
    return learner, schemes, export_weights(learner.model, learner.forward_weights(), schemes)


def test_expected_names_and_views_agree_with_the_exporter(case):
    learner, schemes, exported = case
    names = expected_sync_names([n for n, _ in learner.model.named_parameters()], gemm_layers(learner.model), schemes)
    assert names == set(exported)
    views, skip = sampler_bf16_views(learner.model, schemes)
    assert set(views) == {n for n, t in exported.items() if t.dtype != torch.uint8}
    for n, v in views.items():
        assert torch.equal(v, exported[n]), n
    assert all(n.endswith(("w13_weight", "w2_weight")) for n in skip)


def snapshot(tensors: dict, written: int, version: int | None = None, schemes: dict | None = None) -> dict:
    """An engine snapshot (the format of Sampler.state) of an engine holding ``tensors``."""
    layers = {p: {"scheme": s, "processed": 1} for p, s in (schemes or {}).items()}
    rank = {"version": written if version is None else version, "written": {n: written for n in tensors},
            "layers": layers, "fingerprints": fingerprints(tensors),
            "shapes": {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in tensors.items()}}
    return {"ranks": [rank], "cache_blocks": 0, "cache_resets": 1, "instance": "x"}


def test_a_clean_sync_passes_every_check(case):
    learner, schemes, exported = case
    engine = {n: (t.float() if t.dtype == torch.bfloat16 else t) for n, t in exported.items()}  # a float32 engine
    names = expected_sync_names([n for n, _ in learner.model.named_parameters()], gemm_layers(learner.model), schemes)
    st = [snapshot(engine, 3, schemes=schemes)]
    assert check_coverage(st, names, 3).passed
    assert check_grid_bytes(engine, learner.forward_weights(), schemes, learner.layers).passed
    grid = expected_grid_tensors(learner.forward_weights(), schemes, learner.layers)
    assert check_grid_fingerprints(st, fingerprints(grid)).passed
    views, skip = sampler_bf16_views(learner.model, schemes)
    layer_schemes = {p: schemes.get(p, "bf16") for p in {n.rsplit(".", 1)[0] for n in exported}}
    assert check_precision(engine, views, layer_schemes, schemes, skip).passed
    assert check_precision_fingerprints(st, fingerprints(views), schemes, skip).passed
    assert check_version(st + st, 3, [(2, 2)], [2, 3]).passed


def test_each_check_fires_on_its_failure():
    learner = Learner(build_model(DENSE, 0), LearnerConfig(precision="mxfp8", layers="all"))
    schemes = sampler_schemes(gemm_layers(learner.model), "half")
    exported = export_weights(learner.model, learner.forward_weights(), schemes)
    names = expected_sync_names([n for n, _ in learner.model.named_parameters()], gemm_layers(learner.model), schemes)
    # W1: a dropped tensor, a stray one, one not written by this sync
    dropped = {n: t for n, t in exported.items() if n != "model.layers.0.mlp.down_proj.weight"} | {"stray.weight": torch.zeros(1)}
    st = snapshot(dropped, 4)
    st["ranks"][0]["written"]["model.norm.weight"] = 3
    r = check_coverage([st], names, 4)
    assert not r.passed and r.measured == 3
    assert any("missing model.layers.0.mlp.down_proj.weight" in o for o in r.offenders)
    assert "model.norm.weight last written by sync 3" in r.offenders and "extra stray.weight" in r.offenders
    # W2: one flipped byte in a scale — in full and by fingerprint
    bad = dict(exported)
    s = bad["model.layers.1.self_attn.qkv_proj.weight_scale"].clone()
    s[0, 0] ^= 1
    bad["model.layers.1.self_attn.qkv_proj.weight_scale"] = s
    r = check_grid_bytes(bad, learner.forward_weights(), schemes, learner.layers)
    assert not r.passed and r.measured == 1 and r.offenders == ["model.layers.1.self_attn.qkv_proj.weight_scale"]
    grid = expected_grid_tensors(learner.forward_weights(), schemes, learner.layers)
    r = check_grid_fingerprints([snapshot(bad, 4)], fingerprints(grid))
    assert not r.passed and r.offenders == ["model.layers.1.self_attn.qkv_proj.weight_scale"]
    # W4: a BF16 tensor sent through an FP8 round trip; a layer on the grid that should not be
    views, skip = sampler_bf16_views(learner.model, schemes)
    rt = dict(exported)
    w = rt["model.layers.0.self_attn.o_proj.weight"]
    rt["model.layers.0.self_attn.o_proj.weight"] = w.float().to(torch.float8_e4m3fn).to(torch.bfloat16)
    engine_schemes = dict(schemes) | {"model.layers.0.mlp.gate_up_proj": "mxfp8"}
    r = check_precision(rt, views, engine_schemes, schemes, skip)
    assert not r.passed and "model.layers.0.self_attn.o_proj.weight" in r.offenders
    assert any("grid of model.layers.0.mlp.gate_up_proj" in o for o in r.offenders)
    r = check_precision_fingerprints([snapshot(rt, 4, schemes=engine_schemes)], fingerprints(views), schemes, skip)
    assert not r.passed and r.count == 2
    # W5: one replica behind; a rollout on other weights; stale content under a new tag
    assert not check_version([snapshot(exported, 4), snapshot(exported, 3)], 4).passed
    assert not check_version([snapshot(exported, 4)], 4, [(3, 4)]).passed
    r = check_version([snapshot(exported, 4)], 4, [], [3])
    assert not r.passed and r.offenders == ["engine holds the weights of version 3 under tag 4"]
    # W6: processing twice and never, a cache holding blocks, no reset, a stale derived copy
    r = check_derived_state(2, 0, {"a": 1, "b": 1, "c": 1}, {"a": 2, "b": 3, "c": 1}, ["d"])
    assert not r.passed and r.count == 5
    assert check_derived_state(0, 1, {"a": 1}, {"a": 2}).passed


@pytest.mark.parametrize("n", [1, 7, 8, 30, 4096 + 6])
def test_differing_bytes_counts_every_differing_byte_at_any_size_and_offset(n):
    g = torch.Generator().manual_seed(n)
    want = torch.randint(0, 256, (n + 3,), dtype=torch.uint8, generator=g)
    for got_, want_ in ((want[:n].clone(), want[:n]), (want[3:].clone(), want[3:])):  # aligned, odd offset
        assert differing_bytes(got_, want_) == 0
        flips = sorted({0, n - 1, n // 2})
        got_[flips] ^= 0x80
        assert differing_bytes(got_, want_) == len(flips)
        assert differing_bytes(got_.view(torch.float8_e4m3fn), want_) == len(flips)


def test_compute_copies_pass_fail_per_rank_and_never_count_skipped_layers_as_passed():
    from fp8rl_core.checks.basic import check_compute_copies

    ok = {"rank": 0, "tp": 2, "tier": "fingerprints", "checked": 10, "experts": 8, "offenders": [],
          "not_checked": {"model.layers.0.mlp.gate": "BF16: the CPU kernel's prepacked weight is the only copy"},
          "seconds": 0.01}
    bad = ok | {"rank": 1, "offenders": ["tp rank 1/2: model.layers.0.mlp.experts.w13_weight expert 0: compute copy "
                                         "≠ dequantized held bytes at [0, 0] (-0.5 vs 0.5; 4096 elements differ)"]}
    r = check_compute_copies([ok, ok | {"rank": 1}])
    assert r.passed and r.condition == "W6" and r.count == 0 and "20 tensors" in r.detail
    assert r.detail == ("compute copy vs dequantized held bytes (fingerprints): 20 tensors (16 experts) on 2 ranks; "
                        "not checked, 1 layers: BF16: the CPU kernel's prepacked weight is the only copy")
    r = check_compute_copies([ok, bad])
    assert not r.passed and r.failing_ranks == [1] and r.offenders == bad["offenders"]
    r = check_compute_copies([ok, None])
    assert r.passed and "not run on 1 ranks" in r.detail
    assert check_compute_copies([None, None]) is None
