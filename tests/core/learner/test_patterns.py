"""Which layers are on the grid: GEMM layer names of real tiny Qwen3 / Qwen3-MoE models, the
whole-component pattern language (the W4 substring traps), and the exact preset lists."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from fp8rl_core.learner.patterns import ALL_PATTERNS, PRESETS, gemm_layers, matches, resolve_layers, resolve_names

COMMON = dict(
    vocab_size=1024, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, attn_implementation="eager",
)


def dense(layers: int = 2, **kw) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=layers, **{**COMMON, **kw}))


def moe(layers: int = 2, **kw) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    cfg = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, **{**COMMON, **cfg, **kw}))


ATTN = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
DENSE_MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def block(i: int, rel: list[str]) -> list[str]:
    return [f"model.layers.{i}.{r}" for r in rel]


# --------------------------------------------------------------------------------------------------
# GEMM layer names
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_gemm_layers_of_a_dense_model(tied):
    m = dense(2, tie_word_embeddings=tied)
    assert (m.lm_head.weight is m.model.embed_tokens.weight) == tied
    expected = block(0, ATTN + DENSE_MLP) + block(1, ATTN + DENSE_MLP) + ["lm_head"]
    assert gemm_layers(m) == expected  # no embed_tokens (a lookup), no norms; lm_head tied or not


def test_gemm_layers_of_a_moe_model_name_expert_parameters_and_the_router():
    m = moe(2)
    per_block = ATTN + EXPERTS + ["mlp.gate"]  # model order: experts are registered before the router
    assert gemm_layers(m) == block(0, per_block) + block(1, per_block) + ["lm_head"]
    # the expert names are parameter names; the router is a module holding a 2-D weight
    params = dict(m.named_parameters())
    assert params["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 64, 64)
    assert params["model.layers.0.mlp.experts.down_proj"].shape == (4, 64, 32)
    assert type(m.get_submodule("model.layers.0.mlp.gate")).__name__ == "Qwen3MoeTopKRouter"


# --------------------------------------------------------------------------------------------------
# Patterns: whole components, never substrings
# --------------------------------------------------------------------------------------------------
ROUTER = "model.layers.0.mlp.gate"
GATE_UP = "model.layers.0.mlp.experts.gate_up_proj"
EXP_DOWN = "model.layers.0.mlp.experts.down_proj"
GATE_PROJ = "model.layers.0.mlp.gate_proj"
UP_PROJ = "model.layers.0.mlp.up_proj"
DOWN_PROJ = "model.layers.0.mlp.down_proj"
Q = "model.layers.0.self_attn.q_proj"
Q10 = "model.layers.10.self_attn.q_proj"
LM = "lm_head"

TRIPLES = [
    # the router vs gate_proj vs gate_up_proj (the classic substring bugs)
    ("mlp.gate", ROUTER, True),
    ("mlp.gate", GATE_PROJ, False),
    ("mlp.gate", GATE_UP, False),
    ("gate", ROUTER, True),
    ("gate", GATE_PROJ, False),
    ("gate", GATE_UP, False),
    ("gate_proj", GATE_PROJ, True),
    ("gate_proj", ROUTER, False),
    ("gate_proj", GATE_UP, False),
    ("gate_up_proj", GATE_UP, True),
    ("gate_up_proj", GATE_PROJ, False),
    ("up_proj", UP_PROJ, True),
    ("up_proj", GATE_UP, False),
    ("gate*", GATE_PROJ, True),  # an explicit glob inside a component may widen on purpose
    ("gate*", ROUTER, True),
    ("gate*", GATE_UP, True),
    # experts
    ("mlp.experts.*", GATE_UP, True),
    ("mlp.experts.*", EXP_DOWN, True),
    ("mlp.experts.*", DOWN_PROJ, False),
    ("mlp.experts.*", ROUTER, False),
    ("experts.down_proj", EXP_DOWN, True),
    ("down_proj", EXP_DOWN, True),
    ("down_proj", DOWN_PROJ, True),
    ("mlp.down_proj", DOWN_PROJ, True),
    ("mlp.down_proj", EXP_DOWN, False),
    ("mlp.**.down_proj", EXP_DOWN, True),
    ("mlp.**.down_proj", DOWN_PROJ, True),  # '**' may match zero components
    ("mlp.*.down_proj", DOWN_PROJ, False),  # '*' is exactly one component
    # blocks
    ("layers.0.**", Q, True),
    ("layers.0.**", Q10, False),
    ("layers.1.**", Q10, False),
    ("layers.1*.**", Q10, True),
    ("layers.*.mlp.gate", ROUTER, True),
    ("layers.*.gate", ROUTER, False),
    ("layers.**.gate", ROUTER, True),
    ("model.layers.0.mlp.gate", ROUTER, True),
    ("model.layers.0.mlp.gate.weight", ROUTER, False),
    ("**", Q, True),
    # attention and head
    ("self_attn.q_proj", Q, True),
    ("q_proj", Q, True),
    ("q", Q, False),
    ("proj", Q, False),
    ("*_proj", Q, True),
    ("*_proj", ROUTER, False),
    ("self_attn.*", Q, True),
    ("self_attn.*", ROUTER, False),
    ("self_attn", Q, True),
    ("lm_head", LM, True),
    ("head", LM, False),
    ("lm_head", Q, False),
]


@pytest.mark.parametrize("pattern,name,expected", TRIPLES)
def test_patterns_match_whole_components(pattern, name, expected):
    assert matches(pattern, name) is expected


def test_the_triples_use_real_layer_names():
    real = set(gemm_layers(moe(2))) | set(gemm_layers(dense(2)))
    used = {name for _, name, _ in TRIPLES} - {Q10}  # Q10 stands for a deeper model
    assert used <= real


@pytest.mark.parametrize(
    "selection,expected",
    [
        (["mlp.gate"], [f"model.layers.{i}.mlp.gate" for i in (0, 1)]),
        (["mlp.experts.gate_up_proj"], [f"model.layers.{i}.mlp.experts.gate_up_proj" for i in (0, 1)]),
        (["layers.1.mlp.experts.*"], block(1, EXPERTS)),
        (["all", "!mlp.experts.*"], block(0, ATTN) + block(1, ATTN)),
        (["!layers.0.**", "self_attn.q_proj", "self_attn.o_proj"],  # order of entries does not matter
         ["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.o_proj"]),
        (["lm_head", "layers.0.self_attn.q_proj"], ["model.layers.0.self_attn.q_proj", "lm_head"]),  # model order
        (("half", "mlp.gate"), ["model.layers.0.mlp.gate"] + block(1, ATTN + EXPERTS + ["mlp.gate"])),
        ([], []),
    ],
)
def test_pattern_lists_resolve_in_model_order(selection, expected):
    assert resolve_layers(moe(2), selection) == expected


@pytest.mark.parametrize(
    "selection,message",
    [
        ("al", ["unknown layer preset 'al'", "none, all, half", "model.layers.0.self_attn.q_proj"]),
        ("mlp.gate", ["unknown layer preset 'mlp.gate'", "list of layer patterns"]),
        (["mlp.gate_proj"], ["'mlp.gate_proj' matches no GEMM layer", "model.layers.0.self_attn.q_proj"]),
        (["all", "!mlp.gate_proj"], ["'!mlp.gate_proj' matches no GEMM layer"]),
        (["!mlp.experts.*"], ["only excludes", "['all', '!mlp.experts.*']"]),
        (["mlp..gate"], ["'mlp..gate' is malformed"]),
        ([".mlp"], ["'.mlp' is malformed"]),
        (["!"], ["'!' is malformed"]),
    ],
)
def test_bad_selections_name_the_problem(selection, message):
    with pytest.raises(ValueError) as err:
        resolve_layers(moe(2), selection)
    for part in message:
        assert part in str(err.value)


def test_non_string_pattern_is_a_type_error():
    with pytest.raises(TypeError, match="must be a string, got int 3"):
        resolve_names(["lm_head"], ["lm_head", 3])


# --------------------------------------------------------------------------------------------------
# Presets, exactly
# --------------------------------------------------------------------------------------------------
def test_presets_on_a_dense_model():
    m = dense(4)
    blocks = {i: block(i, ATTN + DENSE_MLP) for i in range(4)}
    assert resolve_layers(m, "none") == []
    assert resolve_layers(m, "all") == blocks[0] + blocks[1] + blocks[2] + blocks[3]  # no lm_head
    half = resolve_layers(m, "half")
    assert half == blocks[1] + blocks[3]
    assert 2 * len(half) == len(resolve_layers(m, "all"))  # exactly 50% on a dense model


def test_presets_on_a_moe_model_keep_router_and_lm_head_off_the_grid():
    m = moe(2)
    assert resolve_layers(m, "all") == block(0, ATTN + EXPERTS) + block(1, ATTN + EXPERTS)
    assert resolve_layers(m, "half") == block(1, ATTN + EXPERTS)
    assert resolve_layers(m, "all") == resolve_layers(m, list(ALL_PATTERNS))
    assert not any(n.endswith("mlp.gate") or n == "lm_head" for n in resolve_layers(m, "all"))


def test_half_takes_every_other_block_of_each_block_type():
    # decoder_sparse_step=2: blocks 1 and 3 are MoE, 0 and 2 dense -> half = the second of each type
    m = moe(4, decoder_sparse_step=2)
    kinds = [type(m.model.layers[i].mlp).__name__ for i in range(4)]
    assert kinds == ["Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock", "Qwen3MoeMLP", "Qwen3MoeSparseMoeBlock"]
    assert resolve_layers(m, "half") == block(2, ATTN + DENSE_MLP) + block(3, ATTN + EXPERTS)


@pytest.mark.parametrize("layers,chosen", [(2, [1]), (3, [1]), (4, [1, 3]), (5, [1, 3]), (6, [1, 3, 5])])
def test_half_blocks_by_depth(layers, chosen):
    names = [f"model.layers.{i}.{r}" for i in range(layers) for r in ATTN + DENSE_MLP] + ["lm_head"]
    assert resolve_names(names, "half") == [n for n in names if any(n.startswith(f"model.layers.{i}.") for i in chosen)]


def test_half_of_a_single_block_is_an_error():
    with pytest.raises(ValueError, match="preset 'half' selects no block.*1 decoder block"):
        resolve_layers(dense(1), "half")


def test_presets_are_the_documented_three():
    assert PRESETS == ("none", "all", "half")
