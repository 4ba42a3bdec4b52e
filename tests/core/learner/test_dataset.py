"""fp8rl_core.learner.dataset: a user's GSM8K-format files as the native loop's task — the prompts verl's own
dataset class makes of them, left-padded; the scores verl's own scorer gives the decoded completions."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.learner.dataset import DatasetTask
from tests import gsm8k_data


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    tok = gsm8k_data.train_tokenizer(gsm8k_data.corpus(gsm8k_data.problems(40)), root / "model", 600)
    train, val = gsm8k_data.write_dataset(root / "data", 24, 8)
    return tok, train, val


def _task(files, score=None, max_prompt_length=96):
    from verl.utils.reward_score import default_compute_score

    tok, train, val = files
    return DatasetTask(str(train), str(val), "prompt", tok, max_prompt_length, 32, score or default_compute_score)


def test_prompts_are_the_ones_verls_dataset_makes_left_padded(files):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    task = _task(files)
    tok, train, _ = files
    batch = task.prompts(6, seed=3)
    assert batch.rows == task.prompts(6, seed=3).rows and torch.equal(batch.prompt_ids, task.prompts(6, seed=3).prompt_ids)
    assert len(set(batch.rows)) == 6 and batch.rows != task.prompts(6, seed=4).rows  # no repeat within a step
    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    ds = RLHFDataset(str(train), tokenizer, OmegaConf.create({
        "prompt_key": "prompt", "max_prompt_length": 96, "truncation": "error", "filter_overlong_prompts": False,
        "return_raw_chat": True, "cache_dir": str(tok.parent / "cache")}))
    lengths = set()
    for i, row in enumerate(batch.rows):
        real = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        # verl's dataset of the same file: the chat template of the row's messages, tokenized as verl does
        text = tokenizer.apply_chat_template(ds[row]["raw_prompt"], add_generation_prompt=True, tokenize=False)
        assert real == tokenizer(text, add_special_tokens=False)["input_ids"] == task.prompt_ids(row)
        width = batch.prompt_ids.shape[1]
        assert batch.prompt_mask[i].tolist() == [0] * (width - len(real)) + [1] * len(real)  # left padding
        assert (batch.prompt_ids[i][: width - len(real)] == task.pad_id).all()
        lengths.add(len(real))
    assert len(lengths) > 1  # prompts of different lengths in one batch
    group = batch.repeat_interleave(3)
    assert group.rows[:3] == (batch.rows[0],) * 3 and torch.equal(group.prompt_mask[4], batch.prompt_mask[1])
    assert task.prompts(30, seed=0).rows[24:] == task.prompts(30, seed=0).rows[:6]  # a small file: again from its start


def test_completions_are_scored_by_verls_scorer_up_to_their_eos(files):
    task = _task(files)
    items = gsm8k_data.problems(24)  # the training file's problems, in its order
    batch = task.make([0, 1, 2, 3])
    tok = task.tokenizer

    def ids(text: str, eos: bool = True) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"] + ([task.eos_id] if eos else [])

    right, wrong = items[0].solution, items[1].solution.rsplit("#### ", 1)[0] + f"#### {items[1].answer + 1}"
    # after EOS nothing counts (here: a right answer to row 2 sampled after the stop); no EOS: the whole completion
    rows = [ids(right), ids(wrong), ids("no answer") + ids(items[2].solution), ids(items[3].solution, eos=False)]
    width = max(map(len, rows))
    completions = torch.tensor([r + [task.pad_id] * (width - len(r)) for r in rows])
    assert task.reward(batch, completions).tolist() == [1.0, 0.0, 0.0, 1.0]
    seen = []
    scored = _task(files, lambda **kw: seen.append(kw) or 0.5).reward(batch, completions)
    assert scored.tolist() == [0.5] * 4 and seen[0]["solution_str"] == right and seen[0]["ground_truth"] == str(items[0].answer)
    assert seen[0]["data_source"] == "openai/gsm8k" and seen[0]["extra_info"]["index"] == 0
    # a validation batch is scored against the validation file's rows
    val_items = gsm8k_data.problems(32)[24:]
    val = task.prompts(1, seed=0, split="eval")
    ok = torch.tensor([ids(val_items[val.rows[0]].solution)])
    assert val.split == "eval" and task.reward(val, ok).tolist() == [1.0]


def test_a_prompt_longer_than_the_limit_is_refused_naming_the_file_and_row(files):
    task = _task(files, max_prompt_length=20)
    with pytest.raises(ValueError, match=r"train.parquet: row 5: the prompt has \d+ tokens with the chat template, "
                                         r"more than data.max_prompt_length = 20"):
        task.make([5])
