"""Model specs (validation, hashing) and the Qwen3 / Qwen3-MoE builders (determinism, names, checkpoints)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec, load_model_spec, spec_hash
from fp8rl_core.learner.warmstart import load_policy

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "models"
DENSE = CONFIGS / "qwen3-dense-tiny.yaml"
MOE = CONFIGS / "qwen3-moe-tiny.yaml"
TIED = CONFIGS / "qwen3-dense-tiny-tied.yaml"

BASE = dict(
    name="t", kind="dense", vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
)
MOE_EXTRA = dict(kind="moe", moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def models():
    """One build of each shipped spec (seed 0), shared by the read-only tests below."""
    return {p.stem: build_model(load_model_spec(p), seed=0) for p in (DENSE, MOE, TIED)}


# ---------------------------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    "path, kind, params",
    [(DENSE, "dense", 3_541_504), (MOE, "moe", 4_336_128), (TIED, "dense", 3_279_360)],
)
def test_shipped_specs(models, path, kind, params):
    spec = load_model_spec(path)
    assert spec.name == path.stem and spec.kind == kind
    assert (spec.vocab_size, spec.hidden_size, spec.num_hidden_layers) == (1024, 256, 4)
    assert (spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim) == (8, 2, 32)
    assert spec.max_position_embeddings == 128
    assert sum(p.numel() for p in models[path.stem].parameters()) == params
    if kind == "moe":
        assert (spec.moe_intermediate_size, spec.num_experts, spec.num_experts_per_tok) == (128, 8, 2)


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


@pytest.mark.parametrize(
    "change, field, fragment",
    [
        ({"colour": "blue"}, "colour", "unknown field; valid fields here are: head_dim, hidden_size, intermediate_size, kind"),
        ({"kind": "sparse"}, "kind", "Input should be 'dense' or 'moe'"),
        ({"kind": "moe"}, "moe_intermediate_size", "required when kind is 'moe'"),
        ({**MOE_EXTRA, "num_experts": None}, "num_experts", "num_experts is required when kind is 'moe'"),
        ({"num_experts": 8}, "num_experts", "only valid for kind 'moe'; remove it or set kind: moe"),
        ({"intermediate_size": 256}, "intermediate_size", "must differ from hidden_size (both 256)"),
        ({**MOE_EXTRA, "moe_intermediate_size": 256}, "moe_intermediate_size", "must differ from hidden_size"),
        ({**MOE_EXTRA, "num_experts_per_tok": 9}, "num_experts_per_tok",
         "exceeds num_experts = 8; use a value in 1..8"),
        ({"num_key_value_heads": 3}, "num_key_value_heads", "valid num_key_value_heads for 8 heads: [1, 2, 4, 8]"),
        ({"vocab_size": 16}, "vocab_size", "greater than or equal to 32"),
        ({"hidden_size": 250}, "hidden_size",
         "not a multiple of 32 (the MXFP8 block size); use a multiple of 32 such as 224 or 256"),
        ({"intermediate_size": 700}, "intermediate_size", "not a multiple of 32"),
        ({"head_dim": 33}, "head_dim", "must be even"),
        ({"head_dim": 2}, "head_dim", "num_attention_heads·head_dim = 8·2 = 16"),
        ({"hidden_size": None}, "hidden_size", "required field is missing"),
        ({"num_hidden_layers": 0}, "num_hidden_layers", "greater than or equal to 1"),
        ({"name": "a/b"}, "name", "cannot be used as a directory name"),
        ({"tie_word_embeddings": "maybe"}, "tie_word_embeddings", "valid boolean"),
    ],
)
def test_bad_spec_names_file_and_field(tmp_path, change, field, fragment):
    data = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    path = _write(tmp_path, data)
    with pytest.raises(ValueError) as e:
        load_model_spec(path)
    line = next(ln for ln in str(e.value).splitlines() if ln.startswith(f"{path}: {field}: "))
    assert fragment in line


def test_every_problem_is_reported_at_once(tmp_path):
    path = _write(tmp_path, {**BASE, "vocab_size": 100, "intermediate_size": 256, "extra": 1})
    with pytest.raises(ValueError) as e:
        load_model_spec(path)
    fields = [ln.split(": ")[1] for ln in str(e.value).splitlines()]
    assert sorted(fields) == ["extra", "intermediate_size", "vocab_size"]


@pytest.mark.parametrize(
    "text, fragment",
    [("- 1\n- 2\n", "expected a mapping of ModelSpec fields"), ("name: [unclosed\n", "not valid YAML")],
)
def test_unreadable_yaml(tmp_path, text, fragment):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=fragment) as e:
        load_model_spec(path)
    assert str(e.value).startswith(f"{path}: ")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_model_spec(tmp_path / "nope.yaml")


def test_spec_is_frozen_and_hashable():
    spec = ModelSpec(**BASE)
    with pytest.raises(Exception, match="frozen"):
        spec.hidden_size = 512  # type: ignore[misc]
    assert {spec, ModelSpec(**BASE)} == {spec}


def test_spec_hash_is_sha256_of_the_canonical_json():
    spec = load_model_spec(DENSE)
    fields = dict(BASE, name="qwen3-dense-tiny", tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1e6,
                  moe_intermediate_size=None, num_experts=None, num_experts_per_tok=None)
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert spec_hash(spec) == hashlib.sha256(canon.encode()).hexdigest()
    assert spec_hash(spec) == spec_hash(load_model_spec(DENSE))
    assert spec_hash(spec) != spec_hash(spec.model_copy(update={"rope_theta": 1e4}))
    assert spec_hash(spec) != spec_hash(load_model_spec(TIED))


# ---------------------------------------------------------------------------------------------- build


@pytest.mark.parametrize("path", [DENSE, MOE], ids=["dense", "moe"])
def test_build_is_deterministic_and_leaves_global_rng_alone(models, path):
    spec = load_model_spec(path)
    rng = torch.get_rng_state()
    again = build_model(spec, seed=0).state_dict()
    other = build_model(spec, seed=1).state_dict()
    assert torch.equal(torch.get_rng_state(), rng)
    first = models[path.stem].state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    differing = [k for k in first if not torch.equal(first[k], other[k])]
    # every randomly initialised tensor differs; RMSNorm gains (ones) do not
    assert set(differing) == {k for k in first if first[k].dim() >= 2}
    assert all(t.dtype == torch.float32 for t in first.values())


def test_dense_parameter_names_and_shapes(models):
    m = models["qwen3-dense-tiny"]
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes["model.embed_tokens.weight"] == (1024, 256)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (256, 256)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (64, 256)
    assert shapes["model.layers.0.self_attn.v_proj.weight"] == (64, 256)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (256, 256)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (32,)
    assert shapes["model.layers.3.mlp.gate_proj.weight"] == (768, 256)
    assert shapes["model.layers.3.mlp.up_proj.weight"] == (768, 256)
    assert shapes["model.layers.3.mlp.down_proj.weight"] == (256, 768)
    assert shapes["lm_head.weight"] == (1024, 256)
    assert len(shapes) == 1 + 4 * 11 + 2  # embed, 11 per layer, final norm + lm_head
    assert m.lm_head.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr()
    assert m.config._attn_implementation == "eager"


def test_moe_parameter_names_and_shapes(models):
    m = models["qwen3-moe-tiny"]
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    for n in range(4):
        assert shapes[f"model.layers.{n}.mlp.experts.gate_up_proj"] == (8, 256, 256)  # [E, 2·I, H]
        assert shapes[f"model.layers.{n}.mlp.experts.down_proj"] == (8, 256, 128)  # [E, H, I]
        assert shapes[f"model.layers.{n}.mlp.gate.weight"] == (8, 256)  # router [E, H]
    assert not any("mlp.gate_proj" in k or "mlp.down_proj.weight" in k for k in shapes)
    cfg = m.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (8, 2, True)
    assert (cfg.decoder_sparse_step, cfg.mlp_only_layers, cfg.output_router_logits) == (1, [], False)


def test_tied_embeddings_share_storage(models):
    m = models["qwen3-dense-tiny-tied"]
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert "lm_head.weight" not in dict(m.named_parameters())  # one parameter, reachable by both names


def _checkpoint(model, tmp_path: Path) -> dict[str, torch.Tensor]:
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_moe_checkpoint_uses_per_expert_names(models, tmp_path):
    m = models["qwen3-moe-tiny"]
    ckpt = _checkpoint(m, tmp_path)
    assert not any("gate_up_proj" in k for k in ckpt)
    params = dict(m.named_parameters())
    for n in range(4):
        gate_up = params[f"model.layers.{n}.mlp.experts.gate_up_proj"]
        down = params[f"model.layers.{n}.mlp.experts.down_proj"]
        for e in range(8):
            p = f"model.layers.{n}.mlp.experts.{e}."
            assert torch.equal(ckpt[p + "gate_proj.weight"], gate_up[e, :128])  # gate rows first
            assert torch.equal(ckpt[p + "up_proj.weight"], gate_up[e, 128:])
            assert torch.equal(ckpt[p + "down_proj.weight"], down[e])
        assert torch.equal(ckpt[f"model.layers.{n}.mlp.gate.weight"], params[f"model.layers.{n}.mlp.gate.weight"])
    assert len(ckpt) == 1 + 4 * (9 + 8 * 3) + 2  # embed; attention, norms, router, experts; norm, lm_head
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert (cfg["moe_intermediate_size"], cfg["num_experts_per_tok"], cfg["norm_topk_prob"]) == (128, 2, True)
    assert (cfg["eos_token_id"], cfg["bos_token_id"], cfg["pad_token_id"], cfg["dtype"]) == (2, 1, 0, "float32")
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}


@pytest.mark.parametrize("name", ["qwen3-dense-tiny", "qwen3-moe-tiny", "qwen3-dense-tiny-tied"])
def test_checkpoint_round_trips_bit_exactly(models, tmp_path, name):
    m = models[name]
    ckpt = _checkpoint(m, tmp_path)
    assert ("lm_head.weight" in ckpt) == (name != "qwen3-dense-tiny-tied")
    back = load_policy(tmp_path)
    assert type(back) is type(m) and back.config._attn_implementation == "eager"
    want, got = m.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    if name.endswith("tied"):
        assert back.lm_head.weight is back.model.embed_tokens.weight
    ids = torch.randint(0, 15, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(m(input_ids=ids).logits, back(input_ids=ids).logits)


def test_build_rejects_bad_seed():
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        build_model(ModelSpec(**BASE), seed=-1)
