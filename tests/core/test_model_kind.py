"""One definition of a model's kind (fp8rl_core/model_kind.py): from specs, Hugging Face configs of every
MoE family fp8rl meets, and names — the name rule held against every spec in configs/models/, and the
modules that ask (spec, sampler engine, reports) agreeing on Qwen3-30B-A3B."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.model_kind import ModelKind, is_moe, model_kind
from fp8rl_core.sampler.seam import _architecture

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"

#: Qwen/Qwen3-30B-A3B's config.json, the fields that decide the kind (the published values)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 128,
                 "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
                 "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_qwen3_30b_a3b_is_moe_from_its_spec_its_config_and_its_name():
    spec = load_model_spec(MODELS / "qwen3-30b-a3b.yaml")
    want = ModelKind(moe=True, experts=128, experts_per_token=8, shared_experts=0)
    assert model_kind(spec) == want and spec.is_moe
    assert model_kind(QWEN3_30B_A3B) == want
    assert model_kind(spec.hf_config()) == want  # the transformers config object the learner builds
    for name in ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "Qwen3-235B-A22B", "qwen3-moe-mini", "Mixtral-8x7B"):
        assert model_kind(name) == ModelKind(moe=True), name
    assert _architecture(QWEN3_30B_A3B | {"architectures": None}) == "Qwen3MoeForCausalLM"


def test_dense_models_are_dense():
    spec = load_model_spec(MODELS / "qwen3-8b.yaml")
    assert model_kind(spec) == ModelKind(moe=False) and not spec.is_moe and model_kind(spec).name == "dense"
    assert not is_moe({"model_type": "qwen3", "intermediate_size": 12288})
    for name in ("qwen3-8b", "Qwen/Qwen3-8B", "qwen3-dense-mini", "qwen3-dense-tiny-tied"):
        assert not is_moe(name), name
    assert _architecture({"num_attention_heads": 32}) == "Qwen3ForCausalLM"


@pytest.mark.parametrize("config, want", [
    # Qwen2-MoE (Qwen1.5-MoE-A2.7B): 60 routed experts, one shared expert of width 5632
    ({"num_experts": 60, "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632},
     ModelKind(True, 60, 4, 1)),
    # Mixtral-8x7B
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, ModelKind(True, 8, 2, 0)),
    # DeepSeek-V3: 256 routed, 1 shared
    ({"n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8}, ModelKind(True, 256, 8, 1)),
    # a config that names the field but has one expert (or none) is dense
    ({"num_experts": 1}, ModelKind(False)),
    ({"num_experts": None}, ModelKind(False)),
])
def test_every_moe_family_reads_its_own_fields(config, want):
    assert model_kind(config) == want


def test_a_spec_kind_that_disagrees_with_its_experts_is_named():
    with pytest.raises(ValueError, match="model kind 'moe' disagrees with its num_experts = None"):
        model_kind({"kind": "moe"})


def test_the_name_rule_agrees_with_every_spec_in_configs_models():
    specs = sorted(MODELS.glob("*.yaml"))
    assert len(specs) >= 9
    for path in specs:
        spec = load_model_spec(path)
        assert is_moe(spec.name) == spec.is_moe, f"{path.name}: the name says {model_kind(spec.name).name}, the spec {spec.kind}"
