"""A user's RL dataset as the native loop's task: prompts from a parquet file in verl's RL dataset format,
scored by a function with verl's reward signature.

Rule, as verl's trainer reads the same files: a prompt is its row's chat messages through the checkpoint's chat
template (``add_generation_prompt=True``), tokenized without added special tokens (verl's ``RLHFDataset``,
``verl/utils/dataset/rl_dataset.py``); a prompt longer than ``max_prompt_length`` is an error (verl's default
``data.truncation: error``). A completion is decoded up to and with its EOS, ``skip_special_tokens=True``, and
scored as verl's reward manager calls a scorer: ``score(data_source=, solution_str=, ground_truth=,
extra_info=)`` (``verl/experimental/reward_loop/reward_manager/naive.py``). Each step draws its prompts from
the training file without replacement, by a generator seeded with the step's seed; a batch is left-padded with
the tokenizer's pad id to its longest prompt (``prompt_mask`` marks the prompts' tokens). docs/configs.md,
"The data".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch

__all__ = ["DataPrompts", "DatasetTask"]

#: a scorer: verl's reward function signature, keyword arguments
Score = Callable[..., Any]


@dataclass(frozen=True)
class DataPrompts:
    """A batch of dataset prompts: ``prompt_ids`` [n, P] left-padded, ``prompt_mask`` [n, P] (1 on the
    prompt's tokens), ``rows`` the row of each in the ``split``'s file."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    rows: tuple[int, ...]
    split: Literal["train", "eval"] = "train"

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def repeat_interleave(self, k: int) -> "DataPrompts":
        """Each prompt k times in a row (rows g·k … g·k+k−1 are prompt g), e.g. for GRPO groups."""
        return DataPrompts(self.prompt_ids.repeat_interleave(k, dim=0), self.prompt_mask.repeat_interleave(k, dim=0),
                           tuple(r for r in self.rows for _ in range(k)), self.split)


class DatasetTask:
    """The training (``train``) and validation (``val``) files of a run's ``data`` section, the tokenizer
    saved in ``tokenizer_dir`` (the checkpoint's) and ``score``, the run's scorer."""

    def __init__(self, train: str, val: str, prompt_key: str, tokenizer_dir: str | Path, max_prompt_length: int,
                 max_response_length: int, score: Score, chat_template_kwargs: Mapping[str, object] | None = None) -> None:
        self.files = {"train": str(train), "eval": str(val)}
        self.prompt_key = prompt_key
        self.tokenizer_dir = str(tokenizer_dir)
        self.max_prompt_length = max_prompt_length
        self.max_new_tokens = max_response_length
        self.score = score
        #: passed to the chat template (verl's ``data.apply_chat_template_kwargs``, e.g. ``enable_thinking``)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._ids: dict[tuple[str, int], list[int]] = {}

    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        if tok.eos_token_id is None or tok.pad_token_id is None:
            raise ValueError(f"{self.tokenizer_dir}: the tokenizer has no {'eos' if tok.eos_token_id is None else 'pad'} "
                             "token; the native loop stops a completion at EOS and pads with the pad token")
        return tok

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @cached_property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends a completion: the tokenizer's EOS, then the checkpoint's ``generation_config.json``
        ``eos_token_id`` (an id or a list: Qwen3's ``<|im_end|>`` and ``<|endoftext|>``) — vLLM's stop ids in a
        verl rollout of the checkpoint (its EOS, plus the generation config's)."""
        import json

        ids = [self.eos_id]
        gen = Path(self.tokenizer_dir) / "generation_config.json"
        if gen.is_file():
            more = json.loads(gen.read_text()).get("eos_token_id")
            ids += [int(i) for i in (more if isinstance(more, list) else [more] if more is not None else [])]
        return tuple(dict.fromkeys(ids))

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @cached_property
    def _tables(self) -> dict[str, dict[str, list]]:
        import pyarrow.parquet as pq

        cols = [self.prompt_key, "data_source", "reward_model", "extra_info"]
        out = {}
        for split, path in self.files.items():
            have = pq.read_schema(path).names
            out[split] = pq.read_table(path, columns=[c for c in cols if c in have]).to_pydict()
        return out

    def size(self, split: Literal["train", "eval"] = "train") -> int:
        return len(self._tables[split][self.prompt_key])

    def prompt_ids(self, row: int, split: Literal["train", "eval"] = "train") -> list[int]:
        """The token ids of a row's prompt (the module's rule), checked against ``max_prompt_length``."""
        key = (split, row)
        if key not in self._ids:
            messages = self._tables[split][self.prompt_key][row]
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **self.chat_template_kwargs)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > self.max_prompt_length:
                raise ValueError(f"{self.files[split]}: row {row}: the prompt has {len(ids)} tokens with the chat "
                                 f"template, more than data.max_prompt_length = {self.max_prompt_length}")
            self._ids[key] = ids
        return self._ids[key]

    def make(self, rows: list[int], split: Literal["train", "eval"] = "train") -> DataPrompts:
        """The prompts of the file's ``rows``, left-padded to the longest."""
        ids = [self.prompt_ids(r, split) for r in rows]
        width = max(map(len, ids))
        padded = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in ids], dtype=torch.long)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids], dtype=torch.long)
        return DataPrompts(padded, mask, tuple(rows), split)

    def draw(self, n: int, seed: int, split: Literal["train", "eval"] = "train") -> list[int]:
        """``n`` rows of the split's file without replacement, by a permutation from ``seed`` (all of them when
        the file has fewer than ``n``: then again from the start). Deterministic in (n, seed, split)."""
        size = self.size(split)
        order = torch.randperm(size, generator=torch.Generator().manual_seed(int(seed))).tolist()
        return [order[i % size] for i in range(n)]

    def prompts(self, n: int, seed: int, split: Literal["train", "eval"] = "train") -> DataPrompts:
        """``n`` prompts of the split (:meth:`draw`), left-padded (:meth:`make`)."""
        return self.make(self.draw(n, seed, split), split)

    def reward(self, prompts: DataPrompts, completion_ids: torch.Tensor) -> torch.Tensor:
        """Float32 score of each row of ``completion_ids`` [n, L] (padded with the pad id) for its prompt's row:
        the completion up to and with its EOS, pad ids dropped, decoded and scored (the module's rule)."""
        if completion_ids.shape[0] != len(prompts):
            raise ValueError(f"completion_ids has {completion_ids.shape[0]} rows for {len(prompts)} prompts")
        table = self._tables[prompts.split]
        infos = table.get("extra_info") or [None] * self.size(prompts.split)
        out = []
        for row, ids in zip(prompts.rows, completion_ids.tolist()):
            end = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
            if end is not None:
                ids = ids[: end + 1]
            text = self.tokenizer.decode([t for t in ids if t != self.pad_id], skip_special_tokens=True)
            value = self.score(data_source=table["data_source"][row], solution_str=text,
                               ground_truth=table["reward_model"][row]["ground_truth"], extra_info=infos[row])
            out.append(float(value["score"] if isinstance(value, dict) else value))
        return torch.tensor(out, dtype=torch.float32)
