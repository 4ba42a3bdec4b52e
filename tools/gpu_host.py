"""The GPU host's floor: what ``make setup-gpu`` needs of the machine before it installs anything, checked in one
line (docs/gpu.md, The host floor).

The floor, and where each number comes from:

- glibc >= 2.31: the GPU set's wheel with the highest manylinux tag is llguidance 1.7.6 (vLLM's dependency),
  ``manylinux_2_31`` on x86_64; tests/upstream/test_gpu_install.py rehearses the install for a 2.31 host (it
  installs) and a 2.30 host (llguidance has no wheel for it);
- CPython 3.12: Megatron-Core 0.18's ``requires-python``; the lock is resolved for 3.12 only;
- ``nvcc`` of CUDA 13 on ``PATH`` (or ``$CUDA_HOME/bin``) when a source build needs it (:data:`SOURCE_BUILDS`):
  the set's torch is a CUDA 13 build and torch's extension builder refuses a toolkit of another major version.

:data:`SOURCE_BUILDS` is the one list of the packages ``make setup-gpu`` builds from source (PyPI has no wheel
of them): tools/gpu_lock.py splits the lock by it and writes it into the lock's header, the install rehearsal
allows exactly these to lack a wheel, docs/gpu.md's table names the same. Run by any ``python3`` (written for
3.6 and newer, so an old host's interpreter can say what is missing):

    python3 tools/gpu_host.py --python python3.12   # exit 1 with one line when the host is below the floor
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
from typing import NamedTuple, Optional, Tuple

GLIBC_FLOOR = (2, 31)
PYTHON = (3, 12)
CUDA_MAJOR = 13
DOCS = "docs/gpu.md, The host floor"


class SourceBuild(NamedTuple):
    """A package PyPI has as source only: ``module`` its top-level module, ``needs`` the host tools its build
    needs beyond the set (``nvcc``), ``what`` how it is built."""

    name: str
    module: str
    needs: Tuple[str, ...]
    what: str


SOURCE_BUILDS = (
    SourceBuild("antlr4-python3-runtime", "antlr4", (), "hydra-core's parser runtime, PyPI has 4.9.3 as an sdist only: "
                "pure Python, built by the set's setuptools, no compiler (seconds)"),
    SourceBuild("flash-attn", "flash_attn", ("nvcc",), "CUDA extension built against the set's torch (nvcc, ninja from the set)"),
    SourceBuild("transformer-engine-torch", "transformer_engine_torch", ("nvcc",), "TE's PyTorch extension, built against the set's torch "
                "(nvcc, cmake and ninja from the set)"),
)


class Host(NamedTuple):
    """What the floor asks about: glibc's version (None: not a glibc system), the Python's (None: not found),
    nvcc's CUDA release (None: no nvcc; (0, 0): found, release unreadable)."""

    glibc: Optional[Tuple[int, int]]
    python: Optional[Tuple[int, int]]
    nvcc: Optional[Tuple[int, int]]


def _version(text: str) -> Optional[Tuple[int, int]]:
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def glibc() -> Optional[Tuple[int, int]]:
    try:
        return _version(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError, AttributeError):
        return None


def python_version(python: str) -> Optional[Tuple[int, int]]:
    exe = shutil.which(python)
    if not exe:
        return None
    out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
    return _version(out.stdout) if out.returncode == 0 else None


def nvcc() -> Optional[Tuple[int, int]]:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    exe = shutil.which("nvcc") or (shutil.which("nvcc", path=os.path.join(cuda_home, "bin")) if cuda_home else None)
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    m = re.search(r"release (\d+)\.(\d+)", out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def probe(python: str) -> Host:
    return Host(glibc(), python_version(python), nvcc())


def _v(v: Tuple[int, int]) -> str:
    return "%d.%d" % v


def shortfalls(host: Host, python: str = "python3.12", builds=SOURCE_BUILDS) -> list:
    """What ``host`` lacks of the floor, one phrase each (empty: it meets the floor)."""
    out = []
    if host.glibc is None:
        out.append("no glibc found (the set's wheels are manylinux: glibc >= %s)" % _v(GLIBC_FLOOR))
    elif host.glibc < GLIBC_FLOOR:
        out.append("glibc %s < %s (llguidance 1.7.6, vLLM's dependency, has wheels for manylinux_2_31 only)"
                   % (_v(host.glibc), _v(GLIBC_FLOOR)))
    if host.python is None:
        out.append("no %s found (the set is CPython %s only)" % (python, _v(PYTHON)))
    elif host.python != PYTHON:
        out.append("%s is Python %s, the set needs %s (Megatron-Core 0.18)" % (python, _v(host.python), _v(PYTHON)))
    needing = [b.name for b in builds if "nvcc" in b.needs]
    if needing and host.nvcc is None:
        out.append("no nvcc on PATH or in $CUDA_HOME/bin (%s build from source)" % ", ".join(needing))
    elif needing and host.nvcc[0] != CUDA_MAJOR:
        out.append("nvcc is CUDA %s, %s build against torch's CUDA %d" % (_v(host.nvcc), ", ".join(needing), CUDA_MAJOR))
    return out


def line(host: Host, python: str = "python3.12") -> Tuple[int, str]:
    """(exit status, the one line ``make setup-gpu`` prints)."""
    missing = shortfalls(host, python)
    if missing:
        return 1, "setup-gpu: this host is below the GPU set's floor: %s — why: %s" % ("; ".join(missing), DOCS)
    return 0, "setup-gpu: host floor met: glibc %s, Python %s, nvcc %s" % (_v(host.glibc), _v(host.python),
                                                                            _v(host.nvcc) if host.nvcc else "not needed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.12", help="the interpreter make setup-gpu builds .venv-gpu with")
    args = parser.parse_args()
    status, text = line(probe(args.python), args.python)
    print(text)
    sys.exit(status)


if __name__ == "__main__":
    main()
