"""A user's checkpoint as it is (fp8rl_core.learner.checkpoint_spec, .checkpoint_config, .vocab_tail): the model
read from its config.json as transformers reads it, a disagreeing spec refused in one line, bad checkpoints refused
in one line, and the conventions real Qwen3 checkpoints carry, each on a tiny checkpoint saved here by the installed
transformers' save_pretrained — a Qwen3-MoE with the expert count under the name transformers writes, the config
spellings of transformers 4 and 5 (rope_theta + rope_scaling, num_experts; rope_parameters), tied word embeddings,
a tokenizer shorter than the vocabulary with an untrained tail, generation_config.json with two EOS ids, rope
scaling, no BOS, a chat template that takes enable_thinking."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.learner.checkpoint_spec import checkpoint_spec, spec_disagreement
from fp8rl_core.learner.checkpoints import spec_problems
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec, spec_hash
from fp8rl_core.learner.vocab_tail import emittable_ids, restrict, tail_mass
from fp8rl_core.model_kind import ModelKind, model_kind
from tests import gsm8k_data

#: Qwen3's chat template's shape in small: the thinking switch rendered after the generation prompt
THINKING_TEMPLATE = (gsm8k_data.CHAT_TEMPLATE + "{% if add_generation_prompt and enable_thinking is defined and "
                     "not enable_thinking %}<think>\n\n</think>\n\n{% endif %}")
SPEC = dict(name="qwen3-user", kind="dense", vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
            tie_word_embeddings=True)
#: a tiny Qwen3-MoE in transformers' own terms: head_dim (32) is not hidden_size over the heads (16), the norm eps
#: and rope theta are not the defaults
MOE = dict(vocab_size=128, hidden_size=64, intermediate_size=192, num_hidden_layers=1, num_attention_heads=4,
           num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
           moe_intermediate_size=96, num_experts=4, num_experts_per_tok=2)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def saved(d: Path, kind: str, **fields) -> Path:
    """A tiny Qwen3 (``qwen3``) or Qwen3-MoE (``qwen3_moe``) built from transformers' config class with the sizes of
    :data:`MOE` (``fields`` over them; None: left to transformers) and saved by ``save_pretrained``: config.json as
    the installed transformers writes it, model.safetensors."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    sizes = {k: v for k, v in (MOE | fields).items() if v is not None}
    if kind == "qwen3":
        sizes = {k: v for k, v in sizes.items() if k not in ("moe_intermediate_size", "num_experts",
                                                               "num_experts_per_tok")}
    config = (Qwen3Config if kind == "qwen3" else Qwen3MoeConfig)(**sizes)
    AutoModelForCausalLM.from_config(config).save_pretrained(d)
    return d


def transformers4(d: Path, theta: float, rope_scaling: dict | None) -> dict:
    """``d``'s config.json (as the installed transformers wrote it) in transformers 4's spelling: rope as
    ``rope_theta`` and ``rope_scaling`` (its type as ``type``), Qwen3-MoE's expert count as ``num_experts``, the
    dtype as ``torch_dtype``."""
    cfg = json.loads((d / "config.json").read_text())
    experts = cfg.pop("num_local_experts", None) or cfg.pop("num_experts", None)
    old = {k: v for k, v in cfg.items() if k not in ("rope_parameters", "dtype")}
    old |= {"rope_theta": theta, "rope_scaling": rope_scaling, "torch_dtype": "float32",
            "transformers_version": "4.57.1"}
    if experts is not None:
        old["num_experts"] = experts
    return old


def write_checkpoint(d: Path, **spec) -> Path:
    """A tiny Qwen3 (tied embeddings, 512 rows) with a BPE tokenizer of at most 400 ids (no BOS; the ids beyond it
    untrained), a Qwen3-style chat template and Qwen3's generation_config.json (two EOS ids)."""
    build_model(ModelSpec(**(SPEC | spec)), 0).save_pretrained(d)
    gsm8k_data.train_tokenizer(gsm8k_data.corpus(gsm8k_data.problems(32)), d, vocab_size=400)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": THINKING_TEMPLATE}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "pad_token_id": 0}))
    return d


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen3-user")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    return gsm8k_data.write_dataset(tmp_path_factory.mktemp("data"), 8, 4)


def native(ckpt: Path, files, data: dict | None = None, **extra) -> RunConfig:
    """The native run of ``ckpt`` on the dataset ``files`` (``data``: more of the data section)."""
    section = {"train": str(files[0]), "val": str(files[1]), "max_response_length": 16} | (data or {})
    return RunConfig.model_validate({"model_path": str(ckpt), "data": section, "sampler": {"max_model_len": 160}} | extra)


def test_the_model_is_read_from_the_checkpoint_and_a_spec_that_disagrees_is_one_line(tmp_path, ckpt, data):
    cfg = native(ckpt, data)
    assert cfg.model == "qwen3-user"  # model unset: the checkpoint's directory name
    assert cfg.spec() == ModelSpec(**SPEC)  # kind, shapes, tied embeddings, norm eps, rope from config.json
    # a spec file as well: agreeing, it is the run's spec (its hash, and so the run's id, as before)
    models = tmp_path / "models"
    models.mkdir()
    (models / "mine.yaml").write_text(yaml.safe_dump(SPEC | {"name": "mine"}))
    agreed = native(ckpt, data, model="mine", models_dir=str(models))
    assert spec_hash(agreed.spec()) == spec_hash(ModelSpec(**SPEC | {"name": "mine"}))
    # disagreeing: one line naming the field, both values and both files
    (models / "mine.yaml").write_text(yaml.safe_dump(SPEC | {"name": "mine", "intermediate_size": 224}))
    with pytest.raises(ValueError) as e:
        native(ckpt, data, model="mine", models_dir=str(models))
    msg = str(e.value)
    assert (f"model mine: intermediate_size is 224 in {models / 'mine.yaml'} but 192 in {ckpt / 'config.json'}; "
            "leave model unset to read the model from the checkpoint, or correct the spec") in msg


def test_a_qwen3_moe_as_the_installed_transformers_saves_it_reads_to_its_spec(tmp_path):
    d = saved(tmp_path / "moe", "qwen3_moe", rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})
    cfg = json.loads((d / "config.json").read_text())
    written = {k: cfg[k] for k in ("num_experts", "num_local_experts") if k in cfg}
    assert list(written.values()) == [4]  # transformers 5.19 writes num_local_experts (its num_experts attribute)
    spec = checkpoint_spec(d)
    assert spec == ModelSpec(name="moe", kind="moe", vocab_size=128, hidden_size=64, intermediate_size=192,
                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                             max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-5,
                             rope_theta=500_000.0, moe_intermediate_size=96, num_experts=4, num_experts_per_tok=2)
    # no head_dim in config.json (Qwen3MoeConfig has no such field): hidden_size over the heads, as transformers
    # builds it
    nohead = saved(tmp_path / "nohead", "qwen3_moe", head_dim=None)
    assert "head_dim" not in json.loads((nohead / "config.json").read_text()) and checkpoint_spec(nohead).head_dim == 16
    # the other readers of checkpoints agree: the fixed-weights experiment's spec check, the model's kind
    assert spec_problems(d, spec) == []
    assert spec_problems(d, spec.model_copy(update={"num_experts": 8})) == ["num_experts 4 vs 8"]
    assert model_kind(cfg) == ModelKind(moe=True, experts=4, experts_per_token=2)
    # a spec file that disagrees in the expert count: one line naming the field, both values and both files
    assert spec_disagreement(spec.model_copy(update={"num_experts": 8}), "mine.yaml", d) == (
        f"model moe: num_experts is 8 in mine.yaml but 4 in {d / 'config.json'}; leave model unset to read the model "
        "from the checkpoint, or correct the spec")


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_the_config_spellings_of_transformers_4_and_5_read_to_the_same_spec(tmp_path, kind):
    from fp8rl_core.learner.warmstart import load_policy

    new = saved(tmp_path / "t5", kind, rope_parameters=YARN | {"rope_theta": 10_000.0})  # the installed version's
    assert json.loads((new / "config.json").read_text())["rope_parameters"] == YARN | {"rope_theta": 10_000.0}
    old = shutil.copytree(new, tmp_path / "t4")
    (old / "config.json").write_text(json.dumps(transformers4(new, 10_000.0, {"type": "yarn", "factor": 4.0,
                                                                              "original_max_position_embeddings": 64})))
    spec = checkpoint_spec(new, "m")
    assert checkpoint_spec(old, "m") == spec
    assert (spec.kind, spec.rope_theta, dict(spec.rope_scaling)) == (
        "dense" if kind == "qwen3" else "moe", 10_000.0, YARN)
    assert (spec.num_experts, spec.num_experts_per_tok) == ((None, None) if kind == "qwen3" else (4, 2))
    assert spec.hf_config().rope_parameters == YARN | {"rope_theta": 10_000.0}  # the learner's model of the spec
    assert load_policy(old).config.rope_parameters["rope_type"] == "yarn"  # transformers loads the old spelling
    # the default rope in both spellings: no rope_scaling, the theta the file gives
    plain = saved(tmp_path / "plain5", kind, rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})
    plain4 = shutil.copytree(plain, tmp_path / "plain4")
    (plain4 / "config.json").write_text(json.dumps(transformers4(plain, 500_000.0, None)))
    assert checkpoint_spec(plain4, "m") == checkpoint_spec(plain, "m")
    assert (checkpoint_spec(plain, "m").rope_theta, checkpoint_spec(plain, "m").rope_scaling) == (500_000.0, None)


def test_a_path_that_is_not_a_checkpoint_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"config.json: missing — model_path must be a Hugging Face checkpoint"):
        checkpoint_spec(tmp_path)
    bad = saved(tmp_path / "bad", "qwen3_moe")
    file = bad / "config.json"
    cfg = json.loads(file.read_text())

    def refused(text: str) -> str:
        file.write_text(text)
        with pytest.raises(ValueError) as e:
            checkpoint_spec(bad)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert refused("{").startswith(f"{file}: unreadable (JSONDecodeError: ")
    assert refused("[]") == f"{file}: not a JSON object"
    assert refused(json.dumps(cfg | {"model_type": "llama"})) == (
        f"{file}: model_type 'llama' is not an architecture fp8rl's learner builds; "
        "valid: qwen3 (Qwen3ForCausalLM), qwen3_moe (Qwen3MoeForCausalLM)")
    assert refused(json.dumps(cfg | {"vocab_size": "many"})) == (
        f"{file}: transformers' config class of qwen3_moe refuses it: Validation error for field 'vocab_size': "
        "TypeError: Field 'vocab_size' expected int, got str (value: 'many')")
    assert refused(json.dumps(cfg | {"num_experts_per_tok": 8})) == (  # transformers takes it, the spec does not
        f"{file}: num_experts_per_tok: num_experts_per_tok = 8 exceeds num_experts = 4; use a value in 1..4")
    assert refused(json.dumps(cfg | {"moe_intermediate_size": 128})) == (
        f"{bad / 'model.safetensors'}: its weights do not match {file} in 2 tensors: model.layers.0.mlp.experts."
        "down_proj: checkpoint [4, 64, 96] vs config [4, 64, 128]; model.layers.0.mlp.experts.gate_up_proj: "
        "checkpoint [4, 192, 64] vs config [4, 256, 64]")
    (bad / "model.safetensors").unlink()
    assert refused(json.dumps(cfg)) == f"{bad}: no *.safetensors weight files beside config.json"


def test_tied_embeddings_no_bos_and_enable_thinking_as_verl_passes_it(ckpt, data):
    from fp8rl_core.learner.warmstart import load_policy

    model = load_policy(ckpt)
    assert checkpoint_spec(ckpt).tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    cfg = native(ckpt, data, {"apply_chat_template_kwargs": {"enable_thinking": False}})
    task = cfg.dataset_task(lambda **kw: 0.0)
    assert task.tokenizer.bos_token_id is None  # no BOS: a prompt starts with the template's first token
    ids = task.prompt_ids(0)
    start = task.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == start
    assert task.tokenizer.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain = native(ckpt, data).dataset_task(lambda **kw: 0.0).prompt_ids(0)
    assert ids[: len(plain)] == plain and len(ids) > len(plain)  # thinking on (the template's default): no block


def test_two_eos_ids_from_generation_config_end_a_completion(ckpt, data):
    task = native(ckpt, data).dataset_task(lambda **kw: 0.0)
    assert task.eos_id == 2 and task.eos_ids == (2, 0)  # the tokenizer's <|im_end|>, then generation_config's
    seen = []
    task.score = lambda **kw: seen.append(kw["solution_str"]) or 0.0
    prompts = task.prompts(2, seed=0, split="eval")
    hi = task.tokenizer.convert_tokens_to_ids("Ġ12") if "Ġ12" in task.tokenizer.get_vocab() else 40
    task.reward(prompts, torch.tensor([[hi, 0, hi, hi], [hi, hi, 2, hi]]))  # each cut at its first EOS id
    assert seen == [task.tokenizer.decode([hi]), task.tokenizer.decode([hi, hi])]


def test_the_tail_beyond_the_tokenizer_is_cut_like_verls_rollout_and_its_mass_measured(ckpt, data):
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(str(ckpt)))
    assert 256 < n <= 400 and emittable_ids(ckpt, 512) == n  # shorter than the 512 rows: a tail
    assert emittable_ids(ckpt, n) is None and emittable_ids(None, 512) is None
    assert native(ckpt, data).emittable() == n
    # the rule on numbers: 4 ids, 2 emittable
    logp = torch.log(torch.tensor([[0.4, 0.2, 0.3, 0.1]]))
    assert torch.allclose(restrict(logp, 2).exp(), torch.tensor([[2 / 3, 1 / 3]]))
    assert math.isclose(float(tail_mass(logp, 2)), 0.4, rel_tol=1e-6)
    assert restrict(logp, None) is logp and float(tail_mass(logp, None)) == 0.0
    # fp8rl's SGLang engine does not mask: a checkpoint with a tail is refused before anything starts
    with pytest.raises(ValueError, match=f"its tokenizer has {n} ids, fewer than the model's vocab_size 512"):
        native(ckpt, data, preset="bf16-e2e", sampler={"max_model_len": 160, "engine": "sglang"})
