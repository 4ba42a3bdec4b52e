"""A user's checkpoint as it is (fp8rl_core.learner.checkpoint_spec, .vocab_tail): the model read from its
config.json, a disagreeing spec refused in one line, bad checkpoints refused in one line, and the conventions real
Qwen3 checkpoints carry, each on a tiny checkpoint built here — tied word embeddings, a tokenizer shorter than the
vocabulary with an untrained tail, generation_config.json with two EOS ids, rope_parameters (transformers 5) and
rope scaling, no BOS, a chat template that takes enable_thinking."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.learner.checkpoint_spec import checkpoint_spec
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec, spec_hash
from fp8rl_core.learner.vocab_tail import emittable_ids, restrict, tail_mass
from tests import gsm8k_data

#: Qwen3's chat template's shape in small: the thinking switch rendered after the generation prompt
THINKING_TEMPLATE = (gsm8k_data.CHAT_TEMPLATE + "{% if add_generation_prompt and enable_thinking is defined and "
                     "not enable_thinking %}<think>\n\n</think>\n\n{% endif %}")
SPEC = dict(name="qwen3-user", kind="dense", vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
            tie_word_embeddings=True)


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


def test_a_path_that_is_not_a_checkpoint_is_one_line_naming_the_file(tmp_path, ckpt):
    with pytest.raises(ValueError, match=r"config.json: missing — model_path must be a Hugging Face checkpoint"):
        checkpoint_spec(tmp_path)
    bad = write_checkpoint(tmp_path / "llama")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(cfg | {"model_type": "llama"}))
    with pytest.raises(ValueError) as e:
        checkpoint_spec(bad)
    assert str(e.value) == (f"{bad / 'config.json'}: model_type 'llama' is an architecture fp8rl has no layout for; "
                            "valid: qwen3 (Qwen3ForCausalLM), qwen3_moe (Qwen3MoeForCausalLM)")
    (bad / "config.json").write_text(json.dumps(cfg | {"intermediate_size": 256}))
    with pytest.raises(ValueError) as e:
        checkpoint_spec(bad)
    assert "\n" not in str(e.value) and str(e.value).startswith(
        f"{bad / 'model.safetensors'}: its weights do not match {bad / 'config.json'} in 3 tensors: ")


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


def test_rope_parameters_and_rope_scaling_are_read_in_both_spellings(tmp_path):
    from fp8rl_core.learner.warmstart import load_policy

    d = write_checkpoint(tmp_path / "yarn")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["rope_parameters"] == {"rope_theta": 1_000_000.0, "rope_type": "default"}  # transformers 5's
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10_000.0}
    (d / "config.json").write_text(json.dumps(cfg | {"rope_parameters": yarn}))
    spec = checkpoint_spec(d)
    assert spec.rope_theta == 10_000.0
    assert dict(spec.rope_scaling) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert spec.hf_config().rope_parameters == yarn  # the learner's model of the spec: the checkpoint's rope
    assert load_policy(d).config.rope_parameters["rope_type"] == "yarn"
    # transformers 4's spelling: rope_theta and rope_scaling (with "type")
    old = {k: v for k, v in cfg.items() if k != "rope_parameters"} | {
        "rope_theta": 10_000.0, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}
    (d / "config.json").write_text(json.dumps(old))
    assert checkpoint_spec(d) == spec


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
