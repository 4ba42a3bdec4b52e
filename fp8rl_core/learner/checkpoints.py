"""Checkpoints from outside fp8rl — a Hugging Face directory or a verl run's saved checkpoints — resolved,
checked and identified before anything runs, and the task's probes spelled in their vocabulary.

Rule: a path names (1) a Hugging Face checkpoint directory (``config.json`` and ``*.safetensors``); (2) one
verl checkpoint, ``global_step_N``, whose actor's HF model is taken (``actor/huggingface``, where verl's FSDP
checkpoint manager writes it, or ``actor/model/huggingface``, Megatron's layout); or (3) a verl run's
checkpoint folder (``trainer.default_local_dir``): every ``global_step_N`` in it, in step order. Each must be
a model fp8rl's learner builds (``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM``) of the run's model spec
(:func:`spec_problems`; its ``config.json`` read as transformers reads it, :mod:`.checkpoint_config`); its
identity is the SHA-256 of its weight files (:func:`weights_hash`). The probes (:class:`ProbeTokens`): the
task's text tokenized with the checkpoint's own tokenizer when it has one (one token per character of the
task's spelling, inside the tokenizer's chat template as verl feeds prompts), else fp8rl's task ids when its
config carries them. Every problem is one ``ValueError`` line naming the path
and what would be valid. docs/fixed-weights.md (Checkpoints from elsewhere).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .checkpoint_config import ARCHITECTURES, read_config, spec_fields
from .spec import ModelSpec
from .task import BOS, DIGIT0, EOS, EQUALS, PAD, PLUS, TASK_VOCAB_SIZE, Prompts, decode, encode

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = ["ARCHITECTURES", "FP8RL_TOKENS", "ProbeTokens", "check_checkpoint", "probe_tokens", "resolve_checkpoints",
           "spec_problems", "weights_hash"]

#: where a verl checkpoint ``global_step_N`` holds its actor's HF model: FSDP's manager, Megatron's (layout v2)
VERL_HF_DIRS = ("actor/huggingface", "actor/model/huggingface")
_STEP = re.compile(r"^global_step_(\d+)$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: the task ids a probe uses (PAD is filler: the tokenizer's pad)
_SPELLED = (BOS, PLUS, EQUALS, EOS, *range(DIGIT0, DIGIT0 + 10))
#: the spelling check: every character the task writes, in the contexts a prompt and an answer put it
_SAMPLES = ("^0123456789+9876543210=", "0123456789$", "^00+99=", "18$")


def _hf_dir(step_dir: Path) -> Path:
    for rel in VERL_HF_DIRS:
        if (step_dir / rel / "config.json").is_file():
            return step_dir / rel
    raise ValueError(f"{step_dir}: a verl checkpoint without its actor's Hugging Face model (no "
                     f"{' or '.join(f'{r}/config.json' for r in VERL_HF_DIRS)}); verl writes it with "
                     "actor_rollout_ref.actor.checkpoint.save_contents including 'hf_model'")


def resolve_checkpoints(path: str | Path) -> list[tuple[Path, int | None]]:
    """The HF checkpoint directories ``path`` names (see the module docstring), each with its verl global step
    (None for a plain HF directory), in step order."""
    p = Path(path).expanduser().resolve()
    if not p.is_dir():
        raise ValueError(f"{path}: no such directory; give a Hugging Face checkpoint directory (config.json and "
                         "*.safetensors), a verl checkpoint global_step_N or a verl run's checkpoint folder")
    if (p / "config.json").is_file():
        step = next((int(m[1]) for q in (p, *p.parents) if (m := _STEP.match(q.name))), None)
        return [(p, step)]
    if m := _STEP.match(p.name):
        return [(_hf_dir(p), int(m[1]))]
    steps = sorted((int(m[1]), q) for q in p.iterdir() if q.is_dir() and (m := _STEP.match(q.name)))
    if not steps:
        raise ValueError(f"{path}: neither a Hugging Face checkpoint (no config.json) nor a verl checkpoint folder "
                         "(no global_step_N in it)")
    return [(_hf_dir(q), n) for n, q in steps]


def _weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors weight files beside config.json (a verl checkpoint has them "
                         "with actor_rollout_ref.actor.checkpoint.save_contents including 'hf_model')")
    return files


def check_checkpoint(path: str | Path) -> PreTrainedConfig:
    """``path``'s transformers config (:func:`~.checkpoint_config.read_config`), after checking that it is a model
    fp8rl's learner builds with weight files."""
    path = Path(path)
    config = read_config(path)
    _weight_files(path)
    return config


def weights_hash(path: str | Path) -> str:
    """16 hex digits of the SHA-256 of ``path``'s weight files (each file's name and bytes, in name order)."""
    h = hashlib.sha256()
    for f in _weight_files(Path(path)):
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()[:16]


#: the spec fields that fix the learner's and the sampler's tensors
_SHAPE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "tie_word_embeddings", "moe_intermediate_size", "num_experts",
          "num_experts_per_tok")


def spec_problems(path: str | Path, spec: ModelSpec) -> list[str]:
    """Where ``path``'s config (:func:`~.checkpoint_config.spec_fields`) differs from ``spec`` in what fixes the
    tensors (kind, shapes), each as ``field checkpoint vs spec``; [] when it is a checkpoint of the spec's model."""
    have = spec_fields(check_checkpoint(path))
    if have["kind"] != spec.kind:
        return [f"kind {have['kind']} vs {spec.kind}"]
    return [f"{f} {have.get(f)} vs {getattr(spec, f)}" for f in _SHAPE if have.get(f) != getattr(spec, f)]


@dataclass(frozen=True)
class ProbeTokens:
    """How the task's probes are spelled for a checkpoint: ``table`` maps each task id to the checkpoint's id
    (PAD to its padding id); prompts are wrapped in ``prefix`` … ``suffix`` (its chat template's ids around
    the user's message: verl's prompts). ``source``: ``fp8rl`` (the task's own ids) or the tokenizer's path."""

    table: tuple[int, ...]
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    source: str = field(default="fp8rl", compare=False)

    @property
    def eos(self) -> int:
        """The id that ends an answer (the task's EOS, ``$``)."""
        return self.table[EOS]

    @property
    def pad(self) -> int:
        return self.table[PAD]

    def _map(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.table, dtype=torch.long)[ids]

    def prompts(self, ids: torch.Tensor) -> torch.Tensor:
        """Task prompt ids [n, P] → the checkpoint's [n, len(prefix) + P + len(suffix)]."""
        n = ids.shape[0]
        parts = [torch.tensor(t, dtype=torch.long).expand(n, len(t)) for t in (self.prefix, self.suffix)]
        return torch.cat([parts[0], self._map(ids), parts[1]], dim=1)

    def sequences(self, p: Prompts) -> torch.Tensor:
        """Prompt and answer (teacher forcing) in the checkpoint's ids."""
        return torch.cat([self.prompts(p.prompt_ids), self._map(p.answer_ids)], dim=1)


FP8RL_TOKENS = ProbeTokens(tuple(range(TASK_VOCAB_SIZE)))


def _encode(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def probe_tokens(path: str | Path) -> ProbeTokens:
    """The probes' spelling for the checkpoint at ``path`` (see :class:`ProbeTokens`): its tokenizer when it
    has one (each character of the task one token, the same ids in context), else fp8rl's task ids when its
    config says it uses them (``eos_token_id`` the task's EOS and a vocabulary that holds the task's ids)."""
    path = Path(path)
    config = read_config(path)
    vocab = int(config.vocab_size or 0)
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        eos = config.eos_token_id
        if eos != EOS or vocab < TASK_VOCAB_SIZE:
            raise ValueError(f"{path}: no tokenizer, and its config is not fp8rl's task vocabulary (eos_token_id "
                             f"{eos!r}, vocab_size {vocab}; fp8rl's: eos_token_id {EOS}, vocab_size ≥ {TASK_VOCAB_SIZE}); "
                             "put the tokenizer the model was trained with beside config.json")
        return FP8RL_TOKENS
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    table = [0] * TASK_VOCAB_SIZE
    for i in _SPELLED:
        ids = _encode(tok, decode([i]))
        if len(ids) != 1:
            raise ValueError(f"{path}: its tokenizer spells the task's {decode([i])!r} as {len(ids)} tokens {ids}; the "
                             "probes need one token per character of the task's spelling (^, +, =, $, 0-9)")
        table[i] = ids[0]
    for text in _SAMPLES:
        got, want = _encode(tok, text), [table[int(t)] for t in encode(text)]
        if got != want:
            raise ValueError(f"{path}: its tokenizer merges characters of the task's text ({text!r} → {got}, not "
                             f"one token per character {want}); the probes need one token per character")
    pad = tok.pad_token_id if tok.pad_token_id is not None else table[EOS]
    table[PAD] = int(pad)
    prefix: list[int] = []
    suffix: list[int] = []
    if getattr(tok, "chat_template", None):
        text = _SAMPLES[0]
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False, enable_thinking=False)
        ids, body = _encode(tok, rendered), [table[int(t)] for t in encode(text)]
        at = next((k for k in range(len(ids) - len(body) + 1) if ids[k:k + len(body)] == body), None)
        if at is None:
            raise ValueError(f"{path}: its chat template does not keep the task's prompt as one run of tokens "
                             f"({text!r} → {ids}); the probes need the prompt's tokens inside it unchanged")
        prefix, suffix = ids[:at], ids[at + len(body):]
    bad = [t for t in (*table, *prefix, *suffix) if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"{path}: its tokenizer's ids {bad} are outside the model's vocabulary (vocab_size {vocab})")
    return ProbeTokens(tuple(table), tuple(prefix), tuple(suffix), str(path))

