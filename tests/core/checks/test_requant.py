"""W2 on a sampler that requantizes (preset requant): the bytes it must hold are vLLM's online MXFP8 rule on
the learner's BF16 view, the difference from the learner's own bytes is measured per layer kind, and a
byte off that computed expectation fails naming the tensor."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.checks import RequantDifference, check_requant_bytes, requant_expected
from fp8rl_core.checks.requant import layer_kind, requant_measure
from fp8rl_core.grids import bf16_view, quantize
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sampler.config import REQUANT_GRID
from fp8rl_core.sampler.presets import PRESETS

from .test_basic import DENSE, MOE


def _setup(spec, preset="requant"):
    learner = Learner(build_model(spec, 0), PRESETS[preset].learner_config())
    p = PRESETS[preset]
    schemes = p.schemes(gemm_layers(learner.model))
    return learner, schemes


def test_the_expected_bytes_are_the_rule_on_the_bf16_view_fused_in_vllms_order():
    learner, schemes = _setup(DENSE)
    want, diff = requant_expected(learner.model, learner.forward_weights(), schemes, learner.layers)
    assert set(schemes.values()) == {"requant"} and len(want) == 2 * len(schemes)
    params = dict(learner.model.named_parameters())
    qkv = [quantize(bf16_view(params[f"model.layers.0.self_attn.{m}_proj.weight"].detach()).float(), REQUANT_GRID,
                    axis=-1) for m in "qkv"]
    assert torch.equal(want["model.layers.0.self_attn.qkv_proj.mx_data"],
                       torch.cat([q.data.view(torch.uint8) for q in qkv]))
    assert torch.equal(want["model.layers.0.self_attn.qkv_proj.mx_scale"], torch.cat([q.scale for q in qkv]))
    # the learner quantizes its fp32 master: a few percent of the bytes differ (double rounding)
    assert 0.01 < diff.fraction("data") < 0.1 and diff.fraction("scale") < 0.05
    assert set(diff.data) == {"attention", "mlp"}
    data, total = diff.data["attention"]
    assert total == sum(params[f"model.layers.{i}.self_attn.{m}_proj.weight"].numel() for i in (0, 1) for m in "qkvo")
    assert diff.fraction("data", "attention") == data / total


def test_moe_experts_are_their_own_kind():
    learner, schemes = _setup(MOE)
    want, diff = requant_expected(learner.model, learner.forward_weights(), schemes, learner.layers)
    assert {"model.layers.0.mlp.experts.w13_mx_data", "model.layers.0.mlp.experts.w2_mx_scale"} <= set(want)
    assert set(diff.data) == {"attention", "experts"}
    m = diff.metrics()
    assert set(m) == {f"requant/{q}_bytes_differ{k}" for q in ("data", "scale") for k in ("", "/attention", "/experts")}
    assert all(0 <= v < 0.1 for v in m.values()) and m["requant/data_bytes_differ/experts"] > 0


def test_no_requant_layers_measure_nothing():
    learner, schemes = _setup(DENSE, "all")
    want, diff = requant_expected(learner.model, learner.forward_weights(), schemes, learner.layers)
    assert want == {} and diff == RequantDifference() and diff.metrics() == {}


def test_a_byte_off_the_computed_expectation_fails_naming_the_tensor():
    learner, schemes = _setup(DENSE)
    want, diff = requant_expected(learner.model, learner.forward_weights(), schemes, learner.layers)
    held = {n: t.clone() for n, t in want.items()}
    assert check_requant_bytes(held, want).passed
    held["model.layers.1.mlp.down_proj.mx_scale"].view(-1)[3] ^= 1
    r = check_requant_bytes(held, want)
    assert (r.condition, r.passed, r.measured) == ("W2", False, 1.0)
    n = want["model.layers.1.mlp.down_proj.mx_scale"].numel()
    assert r.offenders == [f"model.layers.1.mlp.down_proj.mx_scale (1 of {n} bytes differ from mxfp8-e4m3-rceil of "
                           "the learner's BF16 view)"]
    del held["model.layers.0.mlp.gate_up_proj.mx_data"]
    assert "model.layers.0.mlp.gate_up_proj.mx_data (engine missing" in check_requant_bytes(held, want).offenders[0]
    m = requant_measure(diff)
    assert m.passed and m.quantities == diff.metrics() and "of data bytes" in m.detail


@pytest.mark.parametrize("prefix, kind", [("model.layers.0.self_attn.qkv_proj", "attention"),
                                          ("model.layers.3.mlp.gate_up_proj", "mlp"),
                                          ("model.layers.1.mlp.experts", "experts")])
def test_layer_kinds(prefix, kind):
    assert layer_kind(prefix) == kind
