"""fp8rl_core.verl.data and .reward: fp8rl's task as verl's parquet dataset and custom reward function.

The dataset is read back through verl's own ``RLHFDataset`` with the task tokenizer; the reward function
is checked against fp8rl's own :meth:`AdditionTask.reward` on the same completions, passed the way verl's
reward manager passes them (decoded with ``skip_special_tokens=True``)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.learner.task import EOS, PAD, AdditionTask, decode, encode
from fp8rl_core.verl.data import DATA_SOURCE, data_rows, step_seed, write_dataset, write_task_tokenizer
from fp8rl_core.verl.reward import OTHER, completion_ids, compute_score

RUN = RunConfig(model="qwen3-dense-mini", seed=3, loop={"steps": 3, "prompts_per_step": 4})


def test_rows_are_the_native_loops_prompts_in_step_order():
    train, val = data_rows(RUN)
    task = RUN.warmstart.task
    assert len(train) == 12 and len(val) == 4
    for step in (1, 2, 3):
        p = task.prompts(4, seed=step_seed(3, step), split="train")  # what fp8rl_core.loop draws at this step
        rows = train[(step - 1) * 4: step * 4]
        assert [r["prompt"] for r in rows] == [[{"role": "user", "content": decode(x)}] for x in p.prompt_ids]
        assert [r["reward_model"]["ground_truth"] for r in rows] == [decode(x) for x in p.answer_ids]
        assert [(r["extra_info"]["a"], r["extra_info"]["b"], r["extra_info"]["step"]) for r in rows] == \
            [(int(a), int(b), step) for a, b in zip(p.a, p.b)]
    assert [r["extra_info"]["index"] for r in train] == list(range(12))
    ev = [(r["extra_info"]["a"], r["extra_info"]["b"]) for r in val]
    assert task.is_eval_pair(torch.tensor([a for a, _ in ev]), torch.tensor([b for _, b in ev])).all()
    assert {r["data_source"] for r in train + val} == {DATA_SOURCE}
    row = train[0]
    assert row["reward_model"]["style"] == "rule" and row["extra_info"]["task"] == task.model_dump(mode="json")


def test_task_tokenizer_ids_are_the_task_ids(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(write_task_tokenizer(tmp_path)))
    p = RUN.warmstart.task.prompts(3, seed=0)
    for ids in p.prompt_ids:
        msgs = [{"role": "user", "content": decode(ids)}]
        got = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        got = got["input_ids"] if isinstance(got, dict) or hasattr(got, "keys") else got
        assert list(got) == ids.tolist()
    assert tok.decode(encode("2010$__"), skip_special_tokens=True) == "2010$__"  # EOS and PAD stay text
    assert tok.pad_token_id == 15 and tok.convert_tokens_to_ids("$") == EOS


def test_parquet_loads_through_verls_rlhf_dataset(tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    data = write_dataset(RUN, tmp_path / "data")
    assert (data.train_rows, data.val_rows) == (12, 4)
    assert list(pd.read_parquet(data.train).columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    tok = AutoTokenizer.from_pretrained(str(write_task_tokenizer(tmp_path / "model")))
    # filter in this process: with worker processes, datasets' map swaps os.environ for a copy for good
    # (datasets/arrow_dataset.py, `os.environ = prev_env`), and later tests' environment changes miss Rich's
    cfg = OmegaConf.create({"max_prompt_length": RUN.warmstart.task.prompt_len, "filter_overlong_prompts_workers": None,
                            "cache_dir": str(tmp_path / "cache")})
    train, val = RLHFDataset(str(data.train), tok, cfg), RLHFDataset(str(data.val), tok, cfg)
    assert (len(train), len(val)) == (12, 4)  # none filtered: every prompt is exactly prompt_len tokens
    expect, _ = data_rows(RUN)
    for i in (0, 5, 11):
        item = train[i]
        assert item["raw_prompt"] == expect[i]["prompt"] and item["index"] == i
        assert item["reward_model"]["ground_truth"] == expect[i]["reward_model"]["ground_truth"]
        score = compute_score(item["data_source"], item["reward_model"]["ground_truth"],
                              item["reward_model"]["ground_truth"], item["extra_info"])
        assert score == 1.0


def _completions(answer: list[int]) -> list[list[int]]:
    """Completions of every reward class for one problem whose answer is ``answer`` (digits + EOS)."""
    d = answer[:-1]
    wrong = [5 + (x - 5 + 1) % 10 for x in d]
    return [
        answer,                              # exact → 1.0
        answer + encode("12$"),              # exact, anything after EOS ignored → 1.0
        d,                                   # right digits, no EOS → 0.5
        d[:2] + [EOS] + d[2:] + [EOS],       # EOS early: only the digits before it count
        d[:1] + wrong[1:] + [EOS],           # one digit right
        wrong + [EOS],                       # none right → 0.0
        [PAD] + d[1:] + [EOS],               # PAD is never a right digit
        [],                                  # empty
        d[:2],                               # shorter than the answer
    ]


@pytest.mark.parametrize("digits", [1, 3, 5])
def test_reward_equals_fp8rls_reward_on_the_same_completions(digits):
    task = AdditionTask(digits=digits)
    run = RunConfig(model="qwen3-dense-mini", warmstart={"task": {"digits": digits}}, loop={"steps": 1, "prompts_per_step": 6})
    rows, _ = data_rows(run)
    p = task.prompts(6, seed=step_seed(0, 1))
    for i, row in enumerate(rows):
        for comp in _completions(p.answer_ids[i].tolist()):
            ids = torch.tensor([comp + [PAD] * (task.answer_len + 3 - len(comp))])  # as the loop's batch: PAD after the end
            native = float(task.reward(_one(p, i), ids)[0])
            got = compute_score(DATA_SOURCE, decode(comp), row["reward_model"]["ground_truth"], row["extra_info"])
            assert got == native, (decode(comp), got, native)
    if digits == 3:  # the values themselves: 4 answer digits + EOS
        a = p.answer_ids[0].tolist()
        got = [compute_score(DATA_SOURCE, decode(c), rows[0]["reward_model"]["ground_truth"], rows[0]["extra_info"])
               for c in _completions(a)]
        assert got == [1.0, 1.0, 0.5, 0.25, 0.125, 0.0, 0.375, 0.0, 0.25]


def _one(p, i):
    from fp8rl_core.learner.task import Prompts

    return Prompts(p.prompt_ids[i:i + 1], p.answer_ids[i:i + 1], p.a[i:i + 1], p.b[i:i + 1])


def test_text_outside_the_task_spelling_is_never_a_right_digit():
    assert completion_ids("2010$") == encode("2010$")
    assert completion_ids("2 0x[$") == [7, OTHER, 5, OTHER, OTHER, EOS]
    task = AdditionTask(digits=3)
    p = task.make(torch.tensor([7]), torch.tensor([95]))  # 7 + 95 = 102 → reversed 2010$
    info = {"task": task.model_dump(mode="json"), "a": 7, "b": 95}
    assert compute_score(DATA_SOURCE, "2010$", "2010$", info) == 1.0
    assert compute_score(DATA_SOURCE, " 2010$", "2010$", info) == 0.0  # shifted by one: nothing in place
    assert compute_score(DATA_SOURCE, "2x10$", "2010$", info) == pytest.approx(0.5 * 3 / 4)
    assert float(task.reward(p, torch.tensor([encode("2[20]10$")]))[0]) == pytest.approx(0.5 * 3 / 4)


def test_reward_refuses_rows_it_did_not_write():
    info = {"task": AdditionTask(digits=3).model_dump(mode="json"), "a": 7, "b": 95}
    with pytest.raises(ValueError, match="data_source"):
        compute_score("openai/gsm8k", "2010$", "2010$", info)
    with pytest.raises(ValueError, match=r"extra_info lacks \['a'\]"):
        compute_score(DATA_SOURCE, "2010$", "2010$", {k: v for k, v in info.items() if k != "a"})
    with pytest.raises(ValueError, match="not the answer to 7 \\+ 95"):
        compute_score(DATA_SOURCE, "2010$", "3010$", info)
