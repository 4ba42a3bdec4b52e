"""fp8rl_core.learner.checkpoints: a path resolved into HF checkpoint directories (plain, one verl step in
FSDP's or Megatron's layout, a verl run's checkpoint folder), each checked (model type, weight files, a
vocabulary the probes can be spelled in) and identified by its weight files' bytes."""

from __future__ import annotations

import re
import shutil

from pathlib import Path

import pytest
import torch

from fp8rl_core.learner.checkpoints import (FP8RL_TOKENS, check_checkpoint, probe_tokens, resolve_checkpoints,
                                            spec_problems, weights_hash)
from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.learner.task import EOS, PAD, TASK_VOCAB_SIZE, AdditionTask, decode

from .conftest import hf_checkpoint

ROOT = Path(__file__).resolve().parents[3]

DENSE = load_model_spec(ROOT / "configs" / "models" / "qwen3-dense-mini.yaml")
MOE = load_model_spec(ROOT / "configs" / "models" / "qwen3-moe-mini.yaml")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return hf_checkpoint(tmp_path_factory.mktemp("dense") / "hf", DENSE)


def _verl_step(root, step, src, layout="actor/huggingface"):
    dst = root / f"global_step_{step}" / layout
    shutil.copytree(src, dst)
    return dst


def test_a_path_names_an_hf_directory_one_verl_step_or_every_step_of_a_verl_run(dense, tmp_path):
    assert resolve_checkpoints(dense) == [(dense, None)]
    run = tmp_path / "ckpts"
    steps = {n: _verl_step(run, n, dense) for n in (10, 2)}
    megatron = _verl_step(run, 3, dense, "actor/model/huggingface")  # Megatron's layout (v2)
    assert resolve_checkpoints(run) == [(steps[2], 2), (megatron, 3), (steps[10], 10)]  # in step order
    assert resolve_checkpoints(run / "global_step_3") == [(megatron, 3)]
    assert resolve_checkpoints(steps[10]) == [(steps[10], 10)]  # the HF directory itself knows its step


@pytest.mark.parametrize("case, expect", [
    ("missing", "no such directory"),
    ("empty", "neither a Hugging Face checkpoint (no config.json) nor a verl checkpoint folder"),
    ("step-without-model", "a verl checkpoint without its actor's Hugging Face model"),
])
def test_a_path_that_names_no_checkpoint_says_what_would(tmp_path, case, expect):
    path = tmp_path / "x"
    if case == "empty":
        path.mkdir()
    if case == "step-without-model":
        path = tmp_path / "global_step_4"
        (path / "actor").mkdir(parents=True)
    with pytest.raises(ValueError, match=re.escape(expect)) as e:
        resolve_checkpoints(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_checkpoint_is_checked_for_its_model_type_and_weights(dense, tmp_path):
    config = check_checkpoint(dense)  # its config as transformers reads it
    assert (type(config).__name__, config.model_type, config.hidden_size) == ("Qwen3Config", "qwen3", DENSE.hidden_size)
    no_weights = tmp_path / "cfg-only"  # verl without 'hf_model' in save_contents writes config and tokenizer only
    no_weights.mkdir()
    shutil.copy(dense / "config.json", no_weights / "config.json")
    with pytest.raises(ValueError, match=r"no \*.safetensors weight files .*save_contents including 'hf_model'"):
        check_checkpoint(no_weights)
    (no_weights / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match=r"model_type 'llama' is not an architecture fp8rl's learner builds; valid: "
                                         r"qwen3 \(Qwen3ForCausalLM\), qwen3_moe \(Qwen3MoeForCausalLM\)"):
        check_checkpoint(no_weights)
    (no_weights / "config.json").write_text("{")
    with pytest.raises(ValueError, match="config.json: unreadable"):
        check_checkpoint(no_weights)


def test_the_identity_is_the_weight_files_bytes(dense, tmp_path):
    copy = shutil.copytree(dense, tmp_path / "elsewhere")
    assert weights_hash(copy) == weights_hash(dense)  # where it lies is not what it is
    from safetensors.torch import load_file, save_file

    w = load_file(copy / "model.safetensors")
    w["model.norm.weight"][0] += 1
    save_file(w, copy / "model.safetensors", metadata={"format": "pt"})
    assert weights_hash(copy) != weights_hash(dense)


def test_a_checkpoint_of_another_model_names_the_fields_that_differ(dense, tmp_path):
    assert spec_problems(dense, DENSE) == []
    assert spec_problems(dense, MOE) == ["kind dense vs moe"]
    wider = DENSE.model_copy(update={"hidden_size": 256})
    assert spec_problems(dense, wider) == ["hidden_size 128 vs 256"]
    moe = hf_checkpoint(tmp_path / "moe", MOE, tokenizer=False)  # its expert count as transformers writes it
    assert spec_problems(moe, MOE) == []
    assert spec_problems(moe, MOE.model_copy(update={"num_experts_per_tok": 1})) == ["num_experts_per_tok 2 vs 1"]


def test_the_probes_are_spelled_by_the_checkpoints_tokenizer_or_fp8rls_ids(dense, tmp_path):
    task = AdditionTask(digits=2)
    p = task.prompts(4, seed=1, split="eval")
    tok = probe_tokens(dense)  # the task tokenizer a verl run saves: the task's ids, its <pad> for PAD
    assert tok.pad == TASK_VOCAB_SIZE and tok.table[PAD + 1:] == FP8RL_TOKENS.table[PAD + 1:] and tok.eos == EOS
    assert torch.equal(tok.sequences(p), p.sequences) and (tok.prefix, tok.suffix) == ((), ())
    bare = hf_checkpoint(tmp_path / "bare", DENSE, tokenizer=False)  # fp8rl's own ids in its config
    assert probe_tokens(bare) == FP8RL_TOKENS
    cfg = (bare / "config.json").read_text().replace('"eos_token_id": 2', '"eos_token_id": 151645')
    (bare / "config.json").write_text(cfg)
    with pytest.raises(ValueError, match=r"no tokenizer, and its config is not fp8rl's task vocabulary \(eos_token_id "
                                         r"151645, vocab_size 1024; fp8rl's: eos_token_id 2"):
        probe_tokens(bare)


def _word_tokenizer(directory, vocab: dict[str, int], template: str | None, split: bool = True):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("." if split else r"\s+"), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", pad_token="<unk>",
                                   additional_special_tokens=[k for k in vocab if k.startswith("<|")])
    fast.chat_template = template
    fast.save_pretrained(str(directory))


def test_a_chat_template_wraps_the_prompts_and_a_merging_tokenizer_is_refused(tmp_path):
    spelled = "^$+=0123456789"
    vocab = {"<unk>": 0, "<|user|>": 1, "<|bot|>": 2} | {c: 100 + i for i, c in enumerate(spelled)}
    d = hf_checkpoint(tmp_path / "chat", DENSE, tokenizer=False)
    _word_tokenizer(d, vocab, "<|user|>{% for m in messages %}{{ m['content'] }}{% endfor %}"
                              "{% if add_generation_prompt %}<|bot|>{% endif %}")
    tok = probe_tokens(d)
    assert (tok.prefix, tok.suffix, tok.eos, tok.pad) == ((1,), (2,), vocab["$"], 0)
    p = AdditionTask(digits=2).prompts(3, seed=2, split="eval")
    ids = tok.prompts(p.prompt_ids)
    assert ids.shape == (3, p.prompt_ids.shape[1] + 2) and ids[:, 0].eq(1).all() and ids[:, -1].eq(2).all()
    assert ids[0, 1:-1].tolist() == [vocab[c] for c in decode(p.prompt_ids[0])]
    merging = hf_checkpoint(tmp_path / "merging", DENSE, tokenizer=False)  # splits at spaces only: "12" unknown
    _word_tokenizer(merging, vocab, None, split=False)
    with pytest.raises(ValueError, match="its tokenizer merges characters of the task's text"):
        probe_tokens(merging)

