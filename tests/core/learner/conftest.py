"""Checkpoints as other programs write them, for the tests of checkpoints from elsewhere
(fp8rl_core.learner.checkpoints): :func:`hf_checkpoint`, a Hugging Face directory (``save_pretrained``), with
or without the task tokenizer. A checkpoint verl's own trainer saved is measured in tests/flows/test_verl.py
(its sweep's run has ``verl.save_checkpoints``).
"""

from __future__ import annotations

from pathlib import Path

from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.verl.data import write_task_tokenizer


def hf_checkpoint(directory: Path, spec: ModelSpec, *, seed: int = 0, tokenizer: bool = True) -> Path:
    """A freshly built model of ``spec`` saved into ``directory`` (config.json, model.safetensors), with the
    task tokenizer beside it when ``tokenizer`` (as a verl run's model folder has it)."""
    model = build_model(spec, seed)
    model.save_pretrained(directory)
    if tokenizer:
        write_task_tokenizer(directory, spec.vocab_size)
    return directory
