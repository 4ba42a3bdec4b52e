"""A GSM8K-format RL dataset written by the tests, and a small BPE tokenizer trained on it (no download).

:func:`problems` makes grade-school word problems from templates, each with a worked solution ending in
``#### <answer>`` (GSM8K's form); :func:`rows` turns them into verl's RL dataset rows as verl's own
``examples/data_preprocess/gsm8k.py`` writes them (``data_source`` ``openai/gsm8k``, the question plus verl's
instruction as one user message, ``reward_model.ground_truth`` the number, ``extra_info`` with the split,
index, question and answer); :func:`write_dataset` writes ``train.parquet`` and ``val.parquet``.
:func:`train_tokenizer` trains a byte-level BPE with the ``tokenizers`` library on the dataset's text and saves
``tokenizer.json`` and a ``tokenizer_config.json`` (with a chat template) that transformers' ``AutoTokenizer``
loads — the tokenizer a tiny model of that vocabulary can be trained with.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

DATA_SOURCE = "openai/gsm8k"
#: verl's instruction after each question (examples/data_preprocess/gsm8k.py)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Mark", "Janet", "Carla")
_ITEMS = ("clips", "apples", "books", "marbles", "stickers", "pencils", "cookies", "shells")


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str  #: worked steps, then ``#### <answer>``
    answer: int


def _problem(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, k = rng.randint(2, 90), rng.randint(2, 90), rng.randint(2, 9)
    kind = rng.randrange(3)
    if kind == 0:
        q = f"{name} has {a} {item}. A friend gives {name} {b} more {item}. How many {item} does {name} have now?"
        ans, steps = a + b, f"{name} has {a} + {b} = {a + b} {item}."
    elif kind == 1:
        a = a + b
        q = f"{name} had {a} {item} and gave away {b} of them. How many {item} does {name} have left?"
        ans, steps = a - b, f"{name} has {a} - {b} = {a - b} {item} left."
    else:
        q = f"{name} buys {k} boxes of {item} with {a} {item} in each box. How many {item} does {name} buy?"
        ans, steps = k * a, f"{name} buys {k} * {a} = {k * a} {item}."
    return Problem(q, f"{steps}\n#### {ans}", ans)


def problems(n: int, seed: int = 0) -> list[Problem]:
    """``n`` word problems (deterministic in ``seed``)."""
    rng = random.Random(seed)
    return [_problem(rng) for _ in range(n)]


def rows(items: list[Problem], split: str) -> list[dict]:
    """verl's RL dataset rows of ``items`` (the columns of verl's gsm8k preprocessing)."""
    return [{"data_source": DATA_SOURCE,
             "prompt": [{"role": "user", "content": f"{p.question} {INSTRUCTION}"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
             "extra_info": {"split": split, "index": i, "answer": p.solution, "question": p.question}}
            for i, p in enumerate(items)]


def write_dataset(directory: str | Path, n_train: int = 48, n_val: int = 16, seed: int = 0) -> tuple[Path, Path]:
    """``train.parquet`` and ``val.parquet`` of fresh problems in ``directory``; returns their paths."""
    import pandas as pd

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    items = problems(n_train + n_val, seed)
    out = directory / "train.parquet", directory / "val.parquet"
    pd.DataFrame(rows(items[:n_train], "train")).to_parquet(out[0], index=False)
    pd.DataFrame(rows(items[n_train:], "test")).to_parquet(out[1], index=False)
    return out


def corpus(items: list[Problem]) -> list[str]:
    """The text a tokenizer of this data is trained on: prompts as verl feeds them, and the solutions."""
    return [f"{p.question} {INSTRUCTION}" for p in items] + [p.solution for p in items]


def train_tokenizer(texts: list[str], directory: str | Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE of at most ``vocab_size`` tokens trained on ``texts`` (the special tokens
    :data:`SPECIAL` first: ids 0, 1, 2), saved into ``directory`` as ``tokenizer.json`` and a
    ``tokenizer_config.json`` with :data:`CHAT_TEMPLATE` (eos ``<|im_end|>``, pad ``<|endoftext|>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "unk_token": None, "model_max_length": 4096, "chat_template": CHAT_TEMPLATE}, indent=1))
    return directory


def write_gsm8k_home(home: str | Path, n_train: int = 64, n_test: int = 16) -> Path:
    """``home/data/gsm8k/{train,test}.parquet``, where verl's ``examples/data_preprocess/gsm8k.py`` saves by
    default (``~/data/gsm8k``) and what configs/gpu/*.yaml read: fresh problems (deterministic); returns
    ``home``."""
    train, val = write_dataset(Path(home) / "data" / "gsm8k", n_train, n_test)
    val.rename(val.with_name("test.parquet"))
    return Path(home)


def write_checkpoint(directory: str | Path, models_dir: str | Path, items: list[Problem], *, vocab_size: int = 1000,
                     steps: int = 150, seed: int = 0) -> Path:
    """A checkpoint a dataset run trains from: ``directory`` with a tiny Qwen3 (``gsm8k-dense-mini``, the dense
    mini's shape with room for the chat-templated prompts: 128 positions; its spec written to ``models_dir``),
    the BPE tokenizer trained on ``items`` (:func:`train_tokenizer`) and weights fine-tuned on their chat-templated
    prompts and solutions for ``steps`` Adam steps (loss on the solution and ``<|im_end|>`` only), so sampled
    answers are sometimes right and verl's scorer gives a group differing rewards. The tokenizer is shorter than
    the model's vocabulary (``len(tokenizer)`` ≤ ``vocab_size`` = 1000 < the spec's 1024 rows) and the rows beyond
    it stay as initialised (their output rows get no gradient): an untrained tail, as a real checkpoint's (Qwen3:
    151,669 tokens, 151,936 rows), which verl's vLLM rollout masks. Deterministic in ``seed``."""
    import torch
    import yaml
    from transformers import AutoTokenizer

    from fp8rl_core.learner.models import build_model
    from fp8rl_core.learner.spec import ModelSpec

    mini = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "models" / "qwen3-dense-mini.yaml").read_text())
    spec_dict = mini | {"name": "gsm8k-dense-mini", "max_position_embeddings": 128}
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    (models_dir / "gsm8k-dense-mini.yaml").write_text(yaml.safe_dump(spec_dict, sort_keys=False))
    directory = train_tokenizer(corpus(items), directory, vocab_size)
    tok = AutoTokenizer.from_pretrained(str(directory))
    seqs, starts = [], []
    for p in items:
        prompt = tok.apply_chat_template([{"role": "user", "content": f"{p.question} {INSTRUCTION}"}],
                                         add_generation_prompt=True, tokenize=False)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        starts.append(len(ids))
        seqs.append(ids + tok(p.solution, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    target = ids.clone()
    for i, (s, n) in enumerate(zip(starts, map(len, seqs))):
        target[i, :s] = -100
        target[i, n:] = -100
    model = build_model(ModelSpec(**spec_dict), seed)
    tail = len(tok)
    model.get_output_embeddings().weight.register_hook(lambda g: torch.cat([g[:tail], torch.zeros_like(g[tail:])]))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        for _ in range(steps):
            batch = torch.randint(0, len(seqs), (16,), generator=g)
            loss = model(input_ids=ids[batch], labels=target[batch]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    model.save_pretrained(directory)
    return directory
