"""The second opinion on the held bytes (fp8rl_core.checks.checksum), without an engine: the digests each rank's
parameters must have, computed from the learner's expectation of the tiny dense Qwen3 (every layer on the grid)
at tensor parallel 1 and 2, against weight-checker answers keyed as vLLM keys them (``dp:pp:pcp:tp:name``): the
rank's own slice agrees; one rank holding a faulty slice fails naming that rank and the parameter; a parameter
vLLM does not report fails; BF16 layers and unknown parameters are named as not compared; no checker, not run.
The engine's own answers (vLLM's code) are tested on a live engine in tests/core/test_correctness.py."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fp8rl_core.checks.checksum import check_engine_checksums, engine_name, expected_checksums, sha256
from fp8rl_core.checks.expected import expected_from_learner
from fp8rl_core.checks.faults import fault
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import slice_for_rank

MODELS = Path(__file__).resolve().parents[3] / "configs" / "models"
SPEC = load_model_spec(MODELS / "qwen3-dense-tiny.yaml")


@pytest.fixture(scope="module")
def setup():
    learner = Learner(build_model(SPEC, 0), LearnerConfig(precision="mxfp8", layers="all"))
    schemes = sampler_schemes(gemm_layers(learner.model), "all")
    exp = expected_from_learner(learner, schemes)
    return learner, exp, ModelLayout.from_hf_config(SPEC.hf_config().to_dict())


def _vllm_keys(tensors_by_rank: dict[int, dict[str, torch.Tensor]]) -> dict[str, str]:
    """What vLLM's weight checker answers for ranks holding these tensors (SHA-256 of the raw bytes)."""
    return {f"dp0:pp0:pcp0:tp{r}:{n}": hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()
            for r, ts in tensors_by_rank.items() for n, t in ts.items()}


def _held(exp, dtype=torch.float32):
    return {n: t for n, t in exp.grid.items()} | {n: t.to(dtype) for n, t in exp.views.items()}


def test_engine_keys_name_the_rank_and_the_sync_tensor():
    assert engine_name("dp0:pp0:pcp0:tp1:model.layers.0.mlp.experts.routed_experts.w13_weight") == (
        1, "model.layers.0.mlp.experts.w13_weight")
    assert engine_name("dp0:pp0:pcp0:tp0:lm_head.weight") == (0, "lm_head.weight")
    assert sha256(torch.tensor([1.0])) == hashlib.sha256(b"\x00\x00\x80?").hexdigest()


def test_one_rank_agrees_and_a_changed_parameter_is_named(setup):
    _, exp, layout = setup
    dtypes = {n: "float32" for n in exp.views}
    want, skipped = expected_checksums(exp, dtypes, [0], layout)
    assert skipped == {} and len(want) == len(exp.grid) + len(exp.views)
    held = _held(exp)
    res = check_engine_checksums(_vllm_keys({0: held}), want)
    assert res.passed and res.offenders == [] and res.condition == "vllm_checksum"
    assert f"{len(want)} of {len(want)} parameters agree on 1 ranks" in res.detail
    # the engine holds its BF16 views in bfloat16: other bytes than the float32 expectation
    assert not check_engine_checksums(_vllm_keys({0: _held(exp, torch.bfloat16)}), want).passed
    bad = dict(held)
    name = "model.layers.1.mlp.down_proj.weight_scale"
    bad[name] = bad[name].clone()
    bad[name].view(-1)[3] ^= 1  # one E8M0 scale byte
    res = check_engine_checksums(_vllm_keys({0: bad}), want)
    assert not res.passed and res.failing_ranks == [0] and len(res.offenders) == 1
    assert res.offenders[0].startswith(f"tp rank 0/1: {name}: vLLM's SHA-256 ")
    del bad[name]
    res = check_engine_checksums(_vllm_keys({0: bad}), want)
    assert res.offenders == [f"tp rank 0/1: {name}: not among vLLM's checksummed parameters"]
    assert check_engine_checksums(None, want) is None  # no checker: not run, never passed


def test_two_ranks_each_against_its_slice_and_a_fault_on_rank_1_names_it(setup):
    learner, exp, layout = setup
    dtypes = {n: "bfloat16" for n in exp.views}
    want, _ = expected_checksums(exp, dtypes, [0, 1], layout)
    full = _held(exp, torch.bfloat16)
    slices = {r: dict(slice_for_rank(full, layout, r, 2).tensors) for r in (0, 1)}
    assert check_engine_checksums(_vllm_keys(slices), want).passed
    swapped = fault("qkv-order-swapped").on_export(SimpleNamespace(learner=learner), dict(full))
    slices[1] = dict(slice_for_rank(swapped, layout, 1, 2).tensors)
    res = check_engine_checksums(_vllm_keys(slices), want)
    assert not res.passed and res.failing_ranks == [1]
    assert [o.split(": vLLM")[0] for o in res.offenders] == ["tp rank 1/2: model.layers.0.self_attn.qkv_proj.weight",
                                                             "tp rank 1/2: model.layers.0.self_attn.qkv_proj.weight_scale"]


def test_bf16_layers_and_unknown_parameters_are_named_as_not_compared(setup):
    _, exp, layout = setup
    layer = "model.layers.0.mlp.down_proj"
    views = dict(exp.views) | {f"{layer}.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}
    exp2 = SimpleNamespace(grid={n: t for n, t in exp.grid.items() if not n.startswith(layer)}, views=views, skip=())
    want, skipped = expected_checksums(exp2, {}, [0], layout, bf16_layers=(layer,))
    assert (0, f"{layer}.weight") not in want and skipped == {
        f"{layer}.weight": "BF16 layer: the CPU kernel's prepacked weight (read by probe, W4)"}
    engine = _vllm_keys({0: _held(SimpleNamespace(grid=exp2.grid, views={n: t for n, t in views.items()
                                                                         if n not in skipped}), torch.bfloat16)})
    engine["dp0:pp0:pcp0:tp0:" + f"{layer}.weight"] = hashlib.sha256(b"").hexdigest()  # prepacked: emptied
    engine["dp0:pp0:pcp0:tp0:model.extra.weight"] = "0" * 64
    res = check_engine_checksums(engine, want, skipped)
    assert res.passed, res.offenders
    assert "not compared, 2 parameters without a learner expectation (e.g. model.extra.weight)" in res.detail
    assert "BF16 layer: the CPU kernel's prepacked weight" in res.detail
