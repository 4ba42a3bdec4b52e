"""tools/gpu_host.py, the GPU host's floor: each shortfall named in the one line `make setup-gpu` prints before
anything installs, with the docs section saying why; a host at the floor passes. The script run for real here
(this machine's glibc, an interpreter that is not 3.12, nvcc hidden) and under Python 3.6, an old host's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_host  # noqa: E402
from gpu_host import Host  # noqa: E402

AT_FLOOR = Host(glibc=(2, 31), python=(3, 12), nvcc=(13, 0))
WHY = "— why: docs/gpu.md, The host floor"


def test_a_host_at_the_floor_passes():
    assert gpu_host.line(AT_FLOOR) == (0, "setup-gpu: host floor met: glibc 2.31, Python 3.12, nvcc 13.0")


@pytest.mark.parametrize(("host", "says"), [
    (AT_FLOOR._replace(glibc=(2, 28)), "glibc 2.28 < 2.31 (llguidance 1.7.6, vLLM's dependency, has wheels for "
                                       "manylinux_2_31 only)"),
    (AT_FLOOR._replace(python=(3, 11)), "python3.12 is Python 3.11, the set needs 3.12 (Megatron-Core 0.18)"),
    (AT_FLOOR._replace(python=None), "no python3.12 found (the set is CPython 3.12 only)"),
    (AT_FLOOR._replace(nvcc=None), "no nvcc on PATH or in $CUDA_HOME/bin (flash-attn, transformer-engine-torch "
                                   "build from source)"),
    (AT_FLOOR._replace(nvcc=(12, 8)), "nvcc is CUDA 12.8, flash-attn, transformer-engine-torch build against "
                                      "torch's CUDA 13"),
])
def test_each_shortfall_is_named_in_one_line(host, says):
    status, text = gpu_host.line(host)
    assert status == 1 and "\n" not in text
    assert text == f"setup-gpu: this host is below the GPU set's floor: {says} {WHY}"


def test_every_shortfall_at_once_is_still_one_line():
    status, text = gpu_host.line(Host(glibc=(2, 28), python=(3, 6), nvcc=None))
    assert status == 1 and text.count(";") == 2 and "\n" not in text and text.endswith(WHY)


def test_nvcc_is_asked_for_only_when_a_source_build_needs_it():
    no_cuda_builds = tuple(b for b in gpu_host.SOURCE_BUILDS if "nvcc" not in b.needs)
    assert [b.name for b in no_cuda_builds] == ["antlr4-python3-runtime"]
    assert gpu_host.shortfalls(AT_FLOOR._replace(nvcc=None), builds=no_cuda_builds) == []


def _run(python: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(ROOT / "tools" / "gpu_host.py"), *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_the_script_names_what_this_host_lacks():
    # this machine: glibc 2.36 (above the floor); the project's Python 3.11 given as the GPU Python; nvcc hidden
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists())
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")} | {"PATH": path}
    out = _run(sys.executable, "--python", sys.executable, env=env)
    assert out.returncode == 1 and out.stderr == ""
    assert out.stdout == (f"setup-gpu: this host is below the GPU set's floor: {sys.executable} is Python 3.11, the "
                          f"set needs 3.12 (Megatron-Core 0.18); no nvcc on PATH or in $CUDA_HOME/bin (flash-attn, "
                          f"transformer-engine-torch build from source) {WHY}\n")
    assert gpu_host.glibc() >= gpu_host.GLIBC_FLOOR


OLD_PYTHON = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python"  # the machine's pyenv


@pytest.mark.skipif(not OLD_PYTHON.exists(), reason=f"no Python 3.6 at {OLD_PYTHON}")
def test_an_old_hosts_python_can_run_it():
    out = _run(str(OLD_PYTHON), "--python", "no-such-python3.12")
    assert out.returncode == 1 and "no no-such-python3.12 found (the set is CPython 3.12 only)" in out.stdout
