"""fp8rl's RL task as verl's dataset: the parquet files ``data.train_files`` / ``data.val_files`` name.

verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``) reads one row per prompt with the columns of
verl's own preprocessing scripts (``examples/data_preprocess/gsm8k.py``)::

    data_source   "fp8rl/addition"            → which reward function scores the row (verl passes it on)
    prompt        [{"role": "user", "content": "^700+590="}]   chat messages; the content is the task's
                                                 prompt in its one-character spelling (learner/task.py)
    ability       "arithmetic"
    reward_model  {"style": "rule", "ground_truth": "2010$"}   the task's answer, EOS spelled ``$``
    extra_info    {"split", "index", "step", "a", "b", "task": {digits, reverse_operands, …}}

The rows are the prompts fp8rl's own loop draws (:func:`fp8rl_core.loop.rollout_and_learn`): step ``s``
of a run with seed ``k`` uses ``task.prompts(prompts_per_step, seed=k·1_000_003 + s, split="train")``.
The train file holds steps 1 … ``loop.steps`` in that order, and the overrides turn verl's shuffling off
(``data.shuffle=false``), so verl's batch ``s`` is the native run's step ``s``. The validation file holds
held-out (``split="eval"``) prompts only.

Why the text form: verl samples through a tokenizer and scores decoded text. With the model's own
tokenizer (Qwen3's: every digit, ``^``, ``+``, ``=`` and ``$`` is one token) the prompt is a short string;
the answer ends with the literal ``$`` (the task's EOS), because verl decodes responses with
``skip_special_tokens=True`` — a tokenizer's end-of-sequence token never reaches the reward function.
:func:`write_task_tokenizer` writes a tokenizer whose ids *are* the task's ids (``^`` = 1, ``$`` = 2,
``0`` = 5 …) with a chat template that adds nothing, for the fp8rl models (``configs/models``): through it
verl feeds exactly the prompt ids the native loop feeds, and the model's EOS (id 2, ``$``) stays text.

verl and its dependencies (pandas/pyarrow, datasets, tokenizers) are imported inside the functions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fp8rl_core.learner.task import DIGIT0, EOS, PAD, TASK_VOCAB_SIZE, AdditionTask, decode

if TYPE_CHECKING:
    from fp8rl_core.config.schema import RunConfig

__all__ = ["DATA_SOURCE", "TOKENIZER_PAD", "VerlData", "data_rows", "step_seed", "write_dataset",
           "write_model_dir", "write_task_tokenizer"]

#: the ``data_source`` of every row; :func:`fp8rl_core.verl.reward.compute_score` scores only these
DATA_SOURCE = "fp8rl/addition"
#: the task tokenizer's padding token: the first id the task never produces (a model's vocabulary is larger)
TOKENIZER_PAD = "<pad>"


@dataclass(frozen=True)
class VerlData:
    """The two parquet files of one run and their row counts."""

    train: Path
    val: Path
    train_rows: int
    val_rows: int


def step_seed(run_seed: int, step: int) -> int:
    """The prompt seed of RL step ``step`` (1-based) in fp8rl's loop (:func:`fp8rl_core.loop.rollout_and_learn`)."""
    return run_seed * 1_000_003 + step


def _rows(task: AdditionTask, n: int, seed: int, split: str, start: int, step: int | None) -> list[dict]:
    p = task.prompts(n, seed=seed, split=split)
    spec = task.model_dump(mode="json")
    out = []
    for i in range(len(p)):
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": decode(p.prompt_ids[i])}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": decode(p.answer_ids[i])},
            "extra_info": {"split": split, "index": start + i, "step": step, "a": int(p.a[i]), "b": int(p.b[i]),
                           "task": spec},
        })
    return out


def data_rows(run: "RunConfig") -> tuple[list[dict], list[dict]]:
    """(train rows, validation rows) of ``run``: ``loop.steps × loop.prompts_per_step`` training prompts in
    the native loop's step order, and ``loop.prompts_per_step`` held-out prompts (seed ``run.seed + 90_001``
    — the split the checks' probe batch draws from, never trained on)."""
    task, n = run.warmstart.task, run.loop.prompts_per_step
    train: list[dict] = []
    for step in range(1, run.loop.steps + 1):
        train += _rows(task, n, step_seed(run.seed, step), "train", len(train), step)
    return train, _rows(task, n, run.seed + 90_001, "eval", 0, None)


def write_dataset(run: "RunConfig", directory: str | Path) -> VerlData:
    """Write ``train.parquet`` and ``val.parquet`` of ``run`` (:func:`data_rows`) into ``directory``."""
    import pandas as pd

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train, val = data_rows(run)
    paths = directory / "train.parquet", directory / "val.parquet"
    for rows, path in zip((train, val), paths):
        pd.DataFrame(rows).to_parquet(path, index=False)
    return VerlData(paths[0], paths[1], len(train), len(val))


def write_task_tokenizer(directory: str | Path, vocab_size: int | None = None) -> Path:
    """A Hugging Face tokenizer whose ids are the task's ids, saved into ``directory`` (beside a model's
    ``config.json``): one token per character of the task's spelling (``_ ^ $ + = 0 … 9`` → 0 … 14),
    ``<pad>`` = 15 as its only special token, unknown characters → ``<pad>``; a chat template that writes
    the messages' contents back to back (no role markers, no generation prompt), so
    ``apply_chat_template([{"role": "user", "content": "^700+590="}])`` gives exactly the task's prompt ids.
    ``$`` (the task's and the fp8rl models' EOS, ``eos_token_id = 2`` in their config) is an ordinary
    token: decoding with ``skip_special_tokens=True`` keeps it, so the reward sees where the answer ended.
    ``vocab_size`` (the model's): the vocabulary is filled up to it with tokens no text produces
    (``<unused16>`` …), so the tokenizer's length is the model's vocabulary — verl masks the rollout's logits
    beyond the tokenizer's length, and a shorter tokenizer would show a false train–rollout mismatch."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {decode([i]): i for i in range(TASK_VOCAB_SIZE)} | {TOKENIZER_PAD: TASK_VOCAB_SIZE}
    vocab |= {f"<unused{i}>": i for i in range(len(vocab), vocab_size or 0)}
    assert vocab["_"] == PAD and vocab["$"] == EOS and vocab["0"] == DIGIT0
    tok = Tokenizer(models.WordLevel(vocab, unk_token=TOKENIZER_PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=TOKENIZER_PAD, unk_token=TOKENIZER_PAD,
                                   model_max_length=4096)
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    directory = Path(directory)
    fast.save_pretrained(str(directory))
    return directory


def write_model_dir(checkpoint: str | Path, directory: str | Path, vocab_size: int) -> Path:
    """verl's ``model.path`` for a run on fp8rl's own warm start: the checkpoint's files (``config.json``,
    ``model.safetensors``) copied into ``directory`` with the task tokenizer beside them
    (:func:`write_task_tokenizer`, filled up to the model's ``vocab_size``). Returns the directory."""
    import shutil

    src, directory = Path(checkpoint), Path(directory)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: no config.json; expected the run's warm-start checkpoint directory")
    directory.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name in ("config.json", "generation_config.json") or f.suffix == ".safetensors":
            shutil.copy2(f, directory / f.name)
    return write_task_tokenizer(directory, vocab_size)
