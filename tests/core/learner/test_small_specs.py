"""The `small` model family: every matrix a sampler quantizes spans ≥ 4×4 blocks of 128×128, with
Qwen3's head dim and GQA ratios — so a 128×128 block grid sees many blocks per matrix, not one.

The models are built on the meta device (real module tree, shapes, no memory or init time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers, resolve_names
from fp8rl_core.learner.spec import load_model_spec

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "models"
BLOCK = 128


def _matrices(spec_name: str) -> dict[str, tuple[int, int]]:
    """Every on-grid matrix of the ``all`` preset, per expert for fused experts: name → (out, in)."""
    spec = load_model_spec(CONFIGS / f"{spec_name}.yaml")
    with torch.device("meta"):
        model = build_model(spec, seed=0)
    params = dict(model.named_parameters())
    out = {}
    for name in resolve_names(gemm_layers(model), "all"):
        w = params.get(f"{name}.weight", params.get(name))
        if w.dim() == 2:
            out[name] = tuple(w.shape)
        elif name.endswith("gate_up_proj"):  # [E, 2I, H]: gate and up of each expert, each [I, H]
            half = w.shape[1] // 2
            out |= {f"{name}.{e}.{p}": (half, w.shape[2]) for e in range(w.shape[0]) for p in ("gate", "up")}
        else:  # down_proj [E, H, I]
            out |= {f"{name}.{e}": tuple(w.shape[1:]) for e in range(w.shape[0])}
    return out


@pytest.mark.parametrize("spec_name, count", [("qwen3-dense-small", 4 * 7), ("qwen3-moe-small", 4 * (4 + 8 * 3))])
def test_every_quantized_matrix_spans_4x4_blocks_of_128(spec_name, count):
    mats = _matrices(spec_name)
    assert len(mats) == count
    small = {n: s for n, s in mats.items() if s[0] < 4 * BLOCK or s[1] < 4 * BLOCK or s[0] % BLOCK or s[1] % BLOCK}
    assert not small, f"matrices under 4×4 blocks of {BLOCK} (or not whole blocks): {small}"


def test_dense_small_shapes_and_qwen3_8b_ratios():
    spec = load_model_spec(CONFIGS / "qwen3-dense-small.yaml")
    big = load_model_spec(CONFIGS / "qwen3-8b.yaml")
    assert spec.head_dim == big.head_dim == 128
    assert spec.num_attention_heads // spec.num_key_value_heads == big.num_attention_heads // big.num_key_value_heads == 4
    assert spec.intermediate_size / spec.hidden_size == big.intermediate_size / big.hidden_size == 3
    mats = _matrices("qwen3-dense-small")
    assert mats["model.layers.0.self_attn.q_proj"] == (2048, 512)
    assert mats["model.layers.0.self_attn.k_proj"] == (512, 512)
    assert mats["model.layers.3.mlp.down_proj"] == (512, 1536)


def test_moe_small_shapes_and_qwen3_30b_a3b_ratios():
    spec = load_model_spec(CONFIGS / "qwen3-moe-small.yaml")
    big = load_model_spec(CONFIGS / "qwen3-30b-a3b.yaml")
    assert spec.head_dim == big.head_dim == 128
    assert spec.num_attention_heads // spec.num_key_value_heads == big.num_attention_heads // big.num_key_value_heads == 8
    assert spec.moe_intermediate_size == big.moe_intermediate_size == 768
    mats = _matrices("qwen3-moe-small")
    assert mats["model.layers.0.mlp.experts.gate_up_proj.7.up"] == (768, 512)
    assert mats["model.layers.0.mlp.experts.down_proj.0"] == (512, 768)
    assert mats["model.layers.0.self_attn.o_proj"] == (512, 4096)


def test_the_minis_are_what_the_small_family_fixes():
    """The minis stay for tests and smoke: at least one of their quantized matrices is a single 128 block
    or less on a side — the artefact the small family removes."""
    for name in ("qwen3-dense-mini", "qwen3-moe-mini"):
        assert any(min(s) <= BLOCK for s in _matrices(name).values())
