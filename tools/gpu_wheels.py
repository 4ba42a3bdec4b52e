"""What ``bench/gpu.py`` needs on the lent GPU machine that the machine lacks, and the one command that runs it there.

The lent machine (tools/lent_gpu_packages.txt: Python 3.12.3, CUDA torch 2.11, no package registry) runs what is
already installed there plus wheels carried with the working tree (at most 64 MiB travel, the tree included). This
tool records what ``bench/gpu.py --cpu-smoke`` really imports (tools/importlog in a subprocess of this venv), maps
each module to its distribution (tools/import_closure.py), and splits them: on the lent machine, optional (imported
only when present, in ``try``/``except``), or lacking. The lacking ones are downloaded as wheels for CPython 3.12 /
manylinux x86_64 (``pip download --only-binary=:all: --no-deps``) into ``bench/wheels`` (ignored by git), their total
checked against what may travel; :data:`CARRIED` is the list as last computed (``make gpu-wheels`` fails when the
recorded list differs). :data:`COMMAND` is the line a session passes to the device tool (docs/gpu.md, The prepared benchmark):
it installs any carried wheels into a /tmp folder, puts it and the checkout on ``PYTHONPATH`` and runs the bench.
Rehearsed by tests/bench/test_gpu.py in a venv of the lent machine's packages only (:func:`rehearsal_pins`).

    python tools/gpu_wheels.py                    # record, compare with CARRIED, download into bench/wheels
    python tools/gpu_wheels.py --python-version 3.11 --dest DIR   # the same wheels for another CPython
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from import_closure import read_log  # noqa: E402

LENT = ROOT / "tools" / "lent_gpu_packages.txt"
WHEELS = ROOT / "bench" / "wheels"
#: what travels to the device machine: the working tree and the carried paths, together (the device tool's limit)
TRAVEL_LIMIT = 64 * 2**20
#: the distributions bench/gpu.py imports that the lent machine lacks (none: the MXFP8 recipe in
#: fp8rl_core/learner/recipe.py imports no pydantic, fp8rl_core.report loads its names on first use, so no
#: pandas/pandera); `make gpu-wheels` records the closure again and fails when this differs
CARRIED: tuple[str, ...] = ()
#: the lent machine's distributions bench/gpu.py imports itself or through fp8rl (their dependencies come with
#: them): what the rehearsal installs (tests/bench/test_gpu.py); `make gpu-wheels` checks each is imported
ON_MACHINE = ("matplotlib", "numpy", "torch", "xxhash")
#: imported when installed, skipped without (the importer and its guard): not carried
OPTIONAL = {
    "dill": "torch.utils._import_utils.dill_available(): importlib.util.find_spec('dill') before importing it",
}
DEPS = "/tmp/fp8rl-gpu-deps"
#: the device tool's command: carried wheels (if any) into DEPS, then the bench with DEPS and the checkout on
#: PYTHONPATH, its output under $OUT (what comes back). Arguments appended to it go to bench/gpu.py
COMMAND = (f"D={DEPS}; if ls bench/wheels/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index "
           "--no-deps --no-compile --upgrade --target $D bench/wheels/*.whl || exit 1; fi; "
           'PYTHONUNBUFFERED=1 PYTHONPATH=$D:$PWD python3 bench/gpu.py "$OUT/gpu"')
#: the manylinux tags of an x86_64 wheel the lent machine installs: glibc 2.28 at most, the floor its own torch
#: 2.11 wheel (manylinux_2_28) shows; its glibc is not in its notes
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *[f"manylinux_2_{n}_x86_64" for n in range(5, 29)]]
#: the rehearsal's versions where it cannot use the lent machine's: name → (version, why)
REHEARSAL_VERSIONS = {
    "torch": ("2.13.0", "the CPU wheel of the CPU set's torch in place of the machine's CUDA torch 2.11.0"),
    "numpy": ("2.4.6", "the machine's 2.5.2 is not on PyPI; 2.4.6 is PyPI's newest (2026-12-08)"),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lent_packages(path: Path = LENT) -> dict[str, str | None]:
    """The lent machine's packages: normalized name → the version the notes give, else None (``python``: its
    interpreter's version)."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[norm(name)] = version or None
    return out


def record(out: Path, python: str = sys.executable) -> dict[str, set[str]]:
    """Run ``bench/gpu.py --cpu-smoke`` under ``python`` with the import log and return the distributions it
    imported (this venv's metadata), each with the modules of it that were imported."""
    log = out / "imports"
    env = dict(os.environ, FP8RL_IMPORT_LOG=str(log), PYTHONPATH=str(ROOT / "tools" / "importlog"))
    subprocess.run([python, str(ROOT / "bench" / "gpu.py"), str(out / "smoke"), "--cpu-smoke"], env=env, check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    return distributions(log)


def distributions(log: Path) -> dict[str, set[str]]:
    """The distributions (this interpreter's metadata) of the modules an import log holds, each with its modules;
    a module no distribution has as ``?module``."""
    found: dict[str, set[str]] = {}
    for imp in read_log(log):  # distribution "": the standard library or fp8rl; None: no distribution has it
        for dist in ("?" + imp.module if imp.distribution is None else imp.distribution).split(","):
            if dist:
                found.setdefault(norm(dist), set()).add(imp.module)
    return found


def split(found: dict[str, set[str]], lent: dict[str, str | None] | None = None) -> dict[str, list[str]]:
    """The imported distributions as ``on_machine``, ``optional`` (:data:`OPTIONAL`) and ``lacking``."""
    lent = lent_packages() if lent is None else lent
    out: dict[str, list[str]] = {"on_machine": [], "optional": [], "lacking": []}
    for dist in sorted(found):
        out["on_machine" if dist in lent else "optional" if dist in OPTIONAL else "lacking"].append(dist)
    return out


def pins(names: list[str] | tuple[str, ...]) -> list[str]:
    """``name==version`` of each distribution as this venv has it (the CPU set's pins)."""
    return [f"{n}=={metadata.version(n)}" for n in names]


def download(requirements: list[str], dest: Path, python_version: str = "3.12") -> list[tuple[str, int]]:
    """Wheels of ``requirements`` for CPython ``python_version`` on manylinux x86_64 into ``dest`` (binary only, no
    dependencies: each needed one is its own requirement); (file name, bytes) of each wheel there."""
    dest.mkdir(parents=True, exist_ok=True)
    if requirements:
        tags = [a for p in PLATFORMS for a in ("--platform", p)]
        abi = "cp" + python_version.replace(".", "")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
                        "--python-version", python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3",
                        "--abi", "none", *tags, "-d", str(dest), *requirements], check=True)
    return sorted((w.name, w.stat().st_size) for w in dest.glob("*.whl"))


def tree_bytes() -> int:
    """The bytes of the checkout's tracked files (what travels besides the carried wheels)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sum((ROOT / f).stat().st_size for f in files.split("\0") if f and (ROOT / f).is_file())


def rehearsal_pins(on_machine: list[str], lent: dict[str, str | None] | None = None) -> list[str]:
    """What the rehearsal venv installs: the lent machine's distributions that bench/gpu.py imports and pip (the
    command's installer), at the machine's version where the notes give one, :data:`REHEARSAL_VERSIONS` where that
    cannot be had here, else unpinned (:func:`rehearsal_constraints` pins them)."""
    lent = lent_packages() if lent is None else lent
    return [f"{n}=={REHEARSAL_VERSIONS[n][0]}" if n in REHEARSAL_VERSIONS else f"{n}=={lent[n]}" if lent.get(n) else n
            for n in sorted({*on_machine, "pip"})]


def rehearsal_constraints() -> str:
    """constraints.txt (the CPU set's pins) without the names :data:`REHEARSAL_VERSIONS` or the lent machine's
    notes give a version of: what fixes the rehearsal's other versions."""
    given = set(REHEARSAL_VERSIONS) | {n for n, v in lent_packages().items() if v}
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return "\n".join(x for x in lines if norm(x.split("==", 1)[0].strip()) not in given) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=WHEELS, help="folder for the wheels (default bench/wheels)")
    ap.add_argument("--python-version", default="3.12", help="the CPython they are for (the lent machine's: 3.12)")
    ap.add_argument("--distributions", type=Path, metavar="LOG", help="print the distributions of LOG's modules "
                    "(an import log's folder) in this interpreter's environment as JSON, and nothing else")
    args = ap.parse_args(argv)
    if args.distributions:
        print(json.dumps({d: sorted(m) for d, m in distributions(args.distributions).items()}, sort_keys=True))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        parts = split(record(Path(tmp)))
    print(f"bench/gpu.py imports from {len(parts['on_machine'])} distributions the lent machine has: "
          + ", ".join(parts["on_machine"]))
    print("optional, not carried: " + (", ".join(parts["optional"]) or "none"))
    print("lacking: " + (", ".join(parts["lacking"]) or "none"))
    if not set(ON_MACHINE) <= set(parts["on_machine"]):
        print(f"tools/gpu_wheels.py ON_MACHINE names {sorted(set(ON_MACHINE) - set(parts['on_machine']))}, which "
              "bench/gpu.py no longer imports", file=sys.stderr)
        return 1
    if parts["lacking"] != list(CARRIED):
        print(f"tools/gpu_wheels.py CARRIED is {list(CARRIED)}, the closure lacks {parts['lacking']}: set CARRIED to "
              "it (each lacking distribution, or make its import lazy)", file=sys.stderr)
        return 1
    for old in args.dest.glob("*.whl"):
        old.unlink()
    wheels = download(pins(CARRIED), args.dest, args.python_version)
    for name, size in wheels:
        print(f"{size / 2**20:8.2f} MiB  {name}")
    total, tree = sum(s for _, s in wheels), tree_bytes()
    print(f"{len(wheels)} wheels, {total / 2**20:.2f} MiB in {args.dest}; with the tracked tree "
          f"({tree / 2**20:.1f} MiB) {(total + tree) / 2**20:.1f} of the {TRAVEL_LIMIT // 2**20} MiB that may travel")
    if total + tree >= TRAVEL_LIMIT:
        print("over the limit: make an import lazy instead of carrying its wheel", file=sys.stderr)
        return 1
    print(f"device command (docs/gpu.md): {COMMAND}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
