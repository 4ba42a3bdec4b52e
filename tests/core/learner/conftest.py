"""Checkpoints as other programs write them, for the tests of checkpoints from elsewhere
(fp8rl_core.learner.checkpoints) and the fixed-weights experiment on them (tests/core/test_matching.py).

:func:`hf_checkpoint`: a Hugging Face directory (``save_pretrained``), with or without the task tokenizer.
:func:`save_like_verl`: a model saved by verl's own checkpoint manager (``FSDPCheckpointManager.save_checkpoint``
with ``save_contents=['hf_model']``, what ``verl.save_checkpoints`` asks of a verl run) — one gloo rank, the
model under fsdp2, in a subprocess of its own (torch.distributed stays out of the test process): the exact
on-disk layout of a verl run's ``trainer.default_local_dir`` without a trainer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.verl.data import write_task_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def hf_checkpoint(directory: Path, spec: ModelSpec, *, seed: int = 0, tokenizer: bool = True) -> Path:
    """A freshly built model of ``spec`` saved into ``directory`` (config.json, model.safetensors), with the
    task tokenizer beside it when ``tokenizer`` (as a verl run's model folder has it)."""
    model = build_model(spec, seed)
    model.save_pretrained(directory)
    if tokenizer:
        write_task_tokenizer(directory, spec.vocab_size)
    return directory


_VERL_SAVE = r"""
import socket, sys, tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoTokenizer
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

from fp8rl_core.learner.warmstart import load_policy
from fp8rl_core.verl.data import write_task_tokenizer

src, root, steps = sys.argv[1], Path(sys.argv[2]), [(int(s), float(f)) for s, f in (a.split(":") for a in sys.argv[3:])]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
for step, scale in steps:
    model = load_policy(src)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(scale)
    fully_shard(model)
    if step == steps[0][0]:
        tok = AutoTokenizer.from_pretrained(str(write_task_tokenizer(tempfile.mkdtemp(), model.config.vocab_size)))
    manager = FSDPCheckpointManager(model=model, optimizer=None, lr_scheduler=None, processing_class=tok,
                                    checkpoint_config={"save_contents": ["hf_model"], "load_contents": ["hf_model"]})
    manager.save_checkpoint(str(root / f"global_step_{step}" / "actor"), global_step=step)
(root / "latest_checkpointed_iteration.txt").write_text(str(steps[-1][0]))
dist.destroy_process_group()
"""


def save_like_verl(source: Path, root: Path, steps: dict[int, float]) -> Path:
    """``source``'s model (an HF directory) saved by verl's FSDP checkpoint manager into ``root`` as a verl run's
    checkpoint folder: ``global_step_N/actor/huggingface`` for each ``N`` of ``steps``, its embedding scaled by
    ``steps[N]`` (other weights at each step), the task tokenizer as the run's processing class."""
    root.mkdir(parents=True, exist_ok=True)
    args = [f"{n}:{f}" for n, f in sorted(steps.items())]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", _VERL_SAVE, str(source), str(root), *args], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return root
