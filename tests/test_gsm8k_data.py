"""tests/gsm8k_data.py: the GSM8K-format dataset the tests write and the BPE tokenizer trained on it."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq

from fp8rl_core.config.dataset import check_file
from tests import gsm8k_data


def test_problems_are_deterministic_word_problems_with_gsm8k_solutions():
    items = gsm8k_data.problems(40, seed=3)
    assert items == gsm8k_data.problems(40, seed=3) and items != gsm8k_data.problems(40, seed=4)
    assert len({p.question for p in items}) == 40
    for p in items:
        steps, final = p.solution.rsplit("\n", 1)
        assert final == f"#### {p.answer}" and p.answer > 0
        lhs, rhs = re.search(r"(\d+ [-+*] \d+) = (\d+)", steps).groups()
        assert eval(lhs) == int(rhs) == p.answer  # noqa: S307 — the test's own arithmetic


def test_the_files_are_in_verls_rl_format(tmp_path):
    train, val = gsm8k_data.write_dataset(tmp_path, 24, 8)
    assert check_file(str(train), "prompt") == str(train.resolve()) and check_file(str(val), "prompt")
    rows = pq.read_table(train).to_pylist()
    assert len(rows) == 24 and len(pq.read_table(val).to_pylist()) == 8
    r = rows[0]
    assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math"
    assert r["prompt"] == [{"role": "user", "content": f"{r['extra_info']['question']} {gsm8k_data.INSTRUCTION}"}]
    assert r["reward_model"] == {"style": "rule", "ground_truth": r["extra_info"]["answer"].rsplit("#### ", 1)[1]}
    assert r["extra_info"]["split"] == "train" and r["extra_info"]["index"] == 0


def test_the_tokenizer_is_a_small_bpe_of_the_datasets_text(tmp_path):
    from tokenizers import Tokenizer

    items = gsm8k_data.problems(64)
    d = gsm8k_data.train_tokenizer(gsm8k_data.corpus(items), tmp_path / "tok", vocab_size=400)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert 256 + 3 < tok.get_vocab_size() <= 400
    assert [tok.token_to_id(s) for s in gsm8k_data.SPECIAL] == [0, 1, 2]
    text = items[0].question + " " + gsm8k_data.INSTRUCTION
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and len(ids) < len(text.encode()) / 2  # merges learned from the data
    unseen = "Zoë paid 7 € — naïve?"
    assert tok.decode(tok.encode(unseen).ids) == unseen  # byte-level: any text
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|im_end|>" and cfg["chat_template"] == gsm8k_data.CHAT_TEMPLATE
