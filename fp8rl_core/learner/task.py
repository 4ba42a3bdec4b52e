"""A verifiable synthetic task with a tokenizer-free vocabulary: multi-digit addition.

Rule: fixed token ids (PAD 0, BOS 1, EOS 2, ``+`` 3, ``=`` 4, digits 5..14), fixed-length prompts and
answers, operands and answer least-significant digit first by default (one relative-position pattern
serves every digit for a RoPE model); reward 1.0 for an exact answer, partial credit below it; a
held-out split by a fixed hash of the operand pair. Specified in docs/library.md (The addition task).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BOS",
    "DIGIT0",
    "EOS",
    "EQUALS",
    "PAD",
    "PLUS",
    "TASK_VOCAB_SIZE",
    "AdditionTask",
    "Prompts",
    "decode",
    "encode",
]

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
DIGIT0 = 5
TASK_VOCAB_SIZE = 15

_SPELLING = {PAD: "_", BOS: "^", EOS: "$", PLUS: "+", EQUALS: "="} | {DIGIT0 + d: str(d) for d in range(10)}
_IDS = {c: i for i, c in _SPELLING.items()}
_TOKEN = re.compile(r"\[(\d+)\]|(.)", re.S)

# Hash for the train/eval partition: two rounds of multiply-add modulo the Mersenne prime 2^31 − 1
# with an xor-shift between them; every intermediate product stays below 2^62 (exact in int64).
_P = 2**31 - 1
_M1, _C1, _M2 = 1_103_515_245, 12_345, 2_147_483_629
_BUCKETS = 10_000


def encode(text: str) -> list[int]:
    """Token ids of a string in the task's spelling (``'^12+34=64$'``); ``[n]`` stands for id n."""
    ids = []
    for m in _TOKEN.finditer(text):
        if m.group(1) is not None:
            ids.append(int(m.group(1)))
        elif m.group(2) in _IDS:
            ids.append(_IDS[m.group(2)])
        else:
            raise ValueError(
                f"cannot encode {m.group(2)!r} at position {m.start()} of {text!r}; valid characters are "
                f"{''.join(_IDS)!r} and '[n]' for any other id n"
            )
    return ids


def decode(ids: torch.Tensor | list[int]) -> str:
    """The readable spelling of a 1-D sequence of ids (inverse of :func:`encode`)."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"decode takes a 1-D sequence of ids, got shape {tuple(ids.shape)}")
        ids = ids.tolist()
    return "".join(_SPELLING.get(int(i), f"[{int(i)}]") for i in ids)


@dataclass(frozen=True)
class Prompts:
    """A batch of addition problems: ``prompt_ids`` [n, P], ``answer_ids`` [n, A] (EOS included), ``a``/``b`` [n]."""

    prompt_ids: torch.Tensor
    answer_ids: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def prompt_mask(self) -> None:
        """None: every prompt has the task's length (no padding)."""
        return None

    @property
    def sequences(self) -> torch.Tensor:
        """Prompt followed by answer, [n, P + A] (for teacher forcing)."""
        return torch.cat([self.prompt_ids, self.answer_ids], dim=1)

    def repeat_interleave(self, k: int) -> "Prompts":
        """Each problem k times in a row (rows g·k … g·k+k−1 are problem g), e.g. for GRPO groups."""
        return Prompts(*(t.repeat_interleave(k, dim=0) for t in (self.prompt_ids, self.answer_ids, self.a, self.b)))


class AdditionTask(BaseModel):
    """``digits``-digit addition (operands 0 … 10^digits − 1). The rules: docs/library.md (The addition task)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digits: int = Field(default=3, ge=1, le=9)
    reverse_operands: bool = True
    reverse_answer: bool = True
    eval_fraction: float = Field(default=0.1, ge=0.001, le=0.5)

    @property
    def prompt_len(self) -> int:
        return 2 * self.digits + 3

    @property
    def answer_len(self) -> int:
        return self.digits + 2

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.answer_len

    @property
    def max_new_tokens(self) -> int:
        """What a rollout samples at most: the answer and one more token."""
        return self.answer_len + 1

    @property
    def eos_id(self) -> int:
        return EOS

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The ids that end a completion: the task's EOS."""
        return (EOS,)

    @property
    def pad_id(self) -> int:
        return PAD

    def is_eval_pair(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """True where the operand pair belongs to the held-out evaluation split (a fixed hash partition)."""
        idx = a.to(torch.int64) * 10**self.digits + b.to(torch.int64)
        h = ((idx % _P) * _M1 + _C1) % _P
        h = h ^ (h >> 15)
        h = (h * _M2) % _P
        return (h % _BUCKETS) < round(self.eval_fraction * _BUCKETS)

    def _digits_msb_first(self, x: torch.Tensor, width: int) -> torch.Tensor:
        powers = 10 ** torch.arange(width - 1, -1, -1, dtype=torch.int64)
        return (x.unsqueeze(1) // powers) % 10

    def make(self, a: torch.Tensor, b: torch.Tensor) -> Prompts:
        """Prompts for explicit operand pairs (no split check)."""
        a = torch.as_tensor(a, dtype=torch.int64).reshape(-1)
        b = torch.as_tensor(b, dtype=torch.int64).reshape(-1)
        hi = 10**self.digits
        if a.shape != b.shape:
            raise ValueError(f"operands a and b must have the same length, got {a.numel()} and {b.numel()}")
        if ((a < 0) | (a >= hi) | (b < 0) | (b >= hi)).any():
            raise ValueError(f"operands must lie in 0..{hi - 1} for digits={self.digits}")
        n = a.numel()
        col = lambda v: torch.full((n, 1), v, dtype=torch.int64)  # noqa: E731
        da, db = self._digits_msb_first(a, self.digits), self._digits_msb_first(b, self.digits)
        if self.reverse_operands:
            da, db = da.flip(1), db.flip(1)
        prompt = torch.cat([col(BOS), da + DIGIT0, col(PLUS), db + DIGIT0, col(EQUALS)], dim=1)
        s = self._digits_msb_first(a + b, self.digits + 1)
        if self.reverse_answer:
            s = s.flip(1)
        answer = torch.cat([s + DIGIT0, col(EOS)], dim=1)
        return Prompts(prompt, answer, a, b)

    def prompts(self, n: int, seed: int, split: Literal["train", "eval"] = "train") -> Prompts:
        """n problems drawn uniformly (with replacement) from the split's operand pairs.

        Deterministic: the same (n, seed, split) gives the same prompts; a local generator is used, so the
        global RNG is untouched.
        """
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        g = torch.Generator().manual_seed(int(seed) * 2 + (split == "eval"))
        hi = 10**self.digits
        want_eval = split == "eval"
        a_parts, b_parts, have, drawn = [], [], 0, 0
        while have < n:
            if drawn > 1000 * n + 100_000 and have == 0:
                raise ValueError(f"the {split} split of {self.digits}-digit addition with eval_fraction="
                                 f"{self.eval_fraction} holds no operand pairs; use more digits or another fraction")
            m = max(64, int(2 * (n - have) / min(self.eval_fraction, 1 - self.eval_fraction)))
            a = torch.randint(0, hi, (m,), generator=g, dtype=torch.int64)
            b = torch.randint(0, hi, (m,), generator=g, dtype=torch.int64)
            keep = self.is_eval_pair(a, b) == want_eval
            a_parts.append(a[keep])
            b_parts.append(b[keep])
            have += int(keep.sum())
            drawn += m
        return self.make(torch.cat(a_parts)[:n], torch.cat(b_parts)[:n])

    def reward(self, prompts: Prompts, completion_ids: torch.Tensor) -> torch.Tensor:
        """Float32 reward per row of ``completion_ids`` [n, L] (any L ≥ 0): 1 exact, 0.5·fraction, 0.

        The exact rule: docs/library.md (The addition task). Vectorised over the batch.
        """
        ans = prompts.answer_ids
        n, A = ans.shape
        if A != self.answer_len:
            raise ValueError(f"prompts have answers of length {A}, but this task's answers have {self.answer_len}")
        if completion_ids.dim() != 2 or completion_ids.shape[0] != n:
            raise ValueError(f"completion_ids must have shape [{n}, L], got {tuple(completion_ids.shape)}")
        if completion_ids.dtype.is_floating_point or completion_ids.dtype == torch.bool:
            raise ValueError(f"completion_ids must be integer token ids, got dtype {completion_ids.dtype}")
        c = completion_ids.to(torch.int64)[:, :A]
        if c.shape[1] < A:
            c = torch.cat([c, torch.full((n, A - c.shape[1]), PAD, dtype=torch.int64)], dim=1)
        before_eos = torch.cumsum(c == EOS, dim=1) == 0
        right = (c[:, : A - 1] == ans[:, : A - 1]) & before_eos[:, : A - 1]
        exact = right.all(dim=1) & (c[:, A - 1] == EOS)
        partial = 0.5 * right.to(torch.float32).mean(dim=1)
        return torch.where(exact, torch.ones(n), partial)
