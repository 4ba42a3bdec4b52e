"""The house's import rules, read from the source.

- fp8rl_core is the pure library: nothing under it may import Prefect, MLflow or Ray.
- The layers hold: every module of fp8rl_core/, adapters/, tasks/ and flows/ sits in a layer of :data:`LAYERS`, and
  an import (at module level or inside a function, absolute or relative, ``importlib.import_module``
  with a literal name) may only go to the same or a lower rank. An upward import fails naming both
  modules, the importer's file and line, and their layers; a module in no layer fails naming itself.
- No module of fp8rl_core, adapters, tasks or flows is part of an import cycle (imports inside functions
  count), so that within a layer, too, each module can be read on top of the ones it imports.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fp8rl_core

FORBIDDEN = {"prefect", "mlflow", "ray"}
CORE = Path(fp8rl_core.__file__).parent
ROOT = CORE.parent

#: the layer order, bottom to top: a module may import its own rank or a lower one. A module belongs to
#: the longest entry that is its name or a package above it; a new module or subpackage outside every
#: entry fails the test until it is placed here.
LAYERS: dict[str, int] = {
    "fp8rl_core.vocabulary": 0,
    "fp8rl_core.identity": 0,  # content hashes (ids of runs, specs, warm starts, engines)
    "fp8rl_core.errors": 0,  # one message for a config or spec file's validation error
    "fp8rl_core.model_kind": 0,  # dense or MoE, experts, shared experts: one definition
    "fp8rl_core.upstream": 0,  # the upstream internals fp8rl touches: pure data (adapters/upstream.py checks them)
    "fp8rl_core.grids": 1,
    "fp8rl_core.learner": 2,
    "fp8rl_core.sync": 3,
    "fp8rl_core.sampler": 4,
    "fp8rl_core.loop": 5,
    "fp8rl_core.checks": 6,
    "fp8rl_core.metrics": 6,
    "fp8rl_core.schemas": 6,
    "fp8rl_core.config": 6,
    "fp8rl_core.correctness": 7,
    "fp8rl_core.correctness_series": 7,  # what the nightly correctness stage's series is: plan, verdicts, metrics
    "fp8rl_core.matching": 7,  # the fixed-weights experiment: drives the loop, asks the checks, over config
    "fp8rl_core.schedule": 7,  # the order a sweep's runs go to workers (over config's runs)
    "fp8rl_core.verl": 7,
    "fp8rl_core.report": 8,
    "adapters": 9,  # MLflow, Ray, PostgreSQL, Prefect's logging, OS signals: what tasks and flows talk to
    "tasks": 10,
    "flows": 11,
}
#: package ``__init__`` modules that hold no code of a layer: matched by exact name only (so they place
#: no module under them), importable from every layer
PACKAGE_ROOTS: dict[str, int] = {"fp8rl_core": 0}
#: the packages whose modules are layered
LAYERED = ("fp8rl_core", "adapters", "tasks", "flows")
#: this repository's top-level packages: an import of one of them is checked (bench/ and tests/ are in no
#: layer, so nothing layered may import them)
INTERNAL = {*LAYERED, "bench", "tests"}


def module_name(path: Path, root: Path) -> str:
    """``root/a/b/c.py`` → ``a.b.c``; ``root/a/b/__init__.py`` → ``a.b``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(root: Path, name: str) -> bool:
    if name.startswith("."):
        return False
    p = root.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports_in(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in the file (also inside functions): ``import a.b`` → ``a.b``;
    ``from a import b`` → ``a.b`` when that is a module under ``root``, else ``a``; relative imports
    resolved against the file's package; ``importlib.import_module("a.b")`` / ``__import__("a.b")``."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            head = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                up = node.level - 1
                if up < len(parts):
                    head = ".".join(parts[: len(parts) - up] + ([node.module] if node.module else []))
                else:  # above the top-level package: kept as written (Python refuses it)
                    head = "." * node.level + (node.module or "")
            for a in node.names:
                sub = f"{head}.{a.name}" if head else a.name
                out.append((node.lineno, sub if a.name != "*" and _is_module(root, sub) else head))
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("import_module", "__import__")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


#: integration subpackages (folders under the scanned root) and the forbidden packages each may import
#: *inside functions* — the brief's rule for an outside framework: its own subpackage, imported lazily.
#: verl runs on Ray, so fp8rl_core/verl builds verl's Ray actors; importing the module still loads no Ray
#: (:func:`test_importing_every_core_module_loads_none_of_them`).
LAZY_ALLOWED: dict[str, frozenset[str]] = {"verl": frozenset({"ray"})}


def _lines_inside_functions(path: Path) -> set[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {n.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom, ast.Call))}


def forbidden_imports(root: Path) -> list[str]:
    """Every ``import X`` / ``from X import`` (also inside functions) of a forbidden package under root,
    except the lazy ones :data:`LAZY_ALLOWED` permits in an integration subpackage."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        lazy = LAZY_ALLOWED.get(rel.parts[0], frozenset()) if len(rel.parts) > 1 else frozenset()
        inside = _lines_inside_functions(path) if lazy else set()
        hits += [f"{rel}:{line} {name}" for line, name in imports_in(path, root)
                 if name.split(".")[0] in FORBIDDEN and not (name.split(".")[0] in lazy and line in inside)]
    return hits


def layer_of(module: str) -> str | None:
    """The entry of :data:`LAYERS` (or :data:`PACKAGE_ROOTS`) that places ``module``; None if none does."""
    if module in PACKAGE_ROOTS:
        return module
    holders = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return max(holders, key=len) if holders else None


def rank(layer: str) -> int:
    return LAYERS[layer] if layer in LAYERS else PACKAGE_ROOTS[layer]


def layer_violations(root: Path, packages: tuple[str, ...] = LAYERED) -> list[str]:
    """Every module of ``packages`` under ``root`` in no layer, and every import that runs upward or to a
    module in no layer, as ``file:line importer (layer, rank) → imported (layer, rank): why``."""
    problems = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel, mod = path.relative_to(root), module_name(path, root)
            src = layer_of(mod)
            if src is None:
                problems.append(f"{rel}: module {mod} is in no layer — place it in LAYERS ({Path(__file__).name})")
                continue
            for line, target in imports_in(path, root):
                if target.split(".")[0] not in INTERNAL:
                    continue
                dst = layer_of(target)
                where = f"{rel}:{line} {mod} ({src}, rank {rank(src)}) → {target}"
                if dst is None:
                    problems.append(f"{where} (in no layer): imports a module outside the layers")
                elif rank(dst) > rank(src):
                    problems.append(f"{where} ({dst}, rank {rank(dst)}): imports upward")
    return problems


def import_cycles(root: Path, packages: tuple[str, ...] = LAYERED) -> list[list[str]]:
    """The import cycles among the modules of ``packages`` under ``root``: each set of modules that import
    one another, directly or through others (every import form of :func:`imports_in`), sorted; ``[]``
    when there is none. An import of a name inside a module counts as an import of that module."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            graph[module_name(path, root)] = {t for _, t in imports_in(path, root) if t.split(".")[0] in packages}

    def known(target: str) -> str:  # ``a.b.NAME`` (an unresolved name) → the module ``a.b``
        while target not in graph and "." in target:
            target = target.rpartition(".")[0]
        return target

    edges = {m: {known(t) for t in targets} - {m} for m, targets in graph.items()}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {m: reach(m) for m in edges}
    cycles = {tuple(sorted(m2 for m2 in reached[m] if m in reached[m2])) for m in edges if m in reached[m]}
    return sorted(list(c) for c in cycles)


# ---------------------------------------------------------------------------------- forbidden packages
def test_no_forbidden_import_in_the_source():
    assert forbidden_imports(CORE) == []
    assert len(list(CORE.rglob("*.py"))) >= 8  # the scan really looked at the package


@pytest.mark.parametrize(
    "line", ["import mlflow", "from prefect import flow", "import ray.data as rd", "def f():\n    import mlflow.pyfunc",
             "import importlib\nimportlib.import_module('prefect')"]
)
def test_the_scan_catches_each_form(tmp_path, line):
    (tmp_path / "m.py").write_text(line + "\n")
    assert len(forbidden_imports(tmp_path)) == 1


def test_an_integration_subpackage_may_import_its_framework_lazily_only(tmp_path):
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "lazy.py").write_text("def f():\n    import ray\n    return ray\n")
    (tmp_path / "verl" / "eager.py").write_text("import ray\n")
    (tmp_path / "verl" / "other.py").write_text("def f():\n    import mlflow\n")
    (tmp_path / "sync").mkdir()
    (tmp_path / "sync" / "lazy.py").write_text("def f():\n    import ray\n")
    assert forbidden_imports(tmp_path) == ["sync/lazy.py:2 ray", "verl/eager.py:1 ray", "verl/other.py:2 mlflow"]


def test_importing_every_core_module_loads_none_of_them():
    code = (
        "import pkgutil, sys, importlib, fp8rl_core\n"
        "for m in pkgutil.walk_packages(fp8rl_core.__path__, 'fp8rl_core.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(k for k in sys.modules if k.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------------------------------------ the layers
def test_every_module_sits_in_a_layer_and_imports_only_down():
    assert layer_violations(ROOT) == []
    scanned = [p for pkg in LAYERED for p in (ROOT / pkg).rglob("*.py")]
    assert len(scanned) >= 50 and {module_name(p, ROOT).split(".")[0] for p in scanned} == set(LAYERED)


def test_imports_resolve_to_the_module_they_name(tmp_path):
    """Relative and ``from package import module`` forms name the module itself, not its package; a
    package ``__init__`` resolves ``.`` to itself."""
    files = {"pkg/__init__.py": "from . import a\nfrom .sub import b\n",
             "pkg/a.py": "from .sub.b import X\nfrom . import sub\nfrom pkg.sub import b, Y\nimport pkg.a as q\n"
                         "def f():\n    from ..pkg import a\n",
             "pkg/sub/__init__.py": "from .. import a\nfrom ..a import Z\n",
             "pkg/sub/b.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert sorted(imports_in(tmp_path / "pkg/__init__.py", tmp_path)) == [(1, "pkg.a"), (2, "pkg.sub.b")]
    assert sorted(imports_in(tmp_path / "pkg/a.py", tmp_path)) == [
        (1, "pkg.sub.b"), (2, "pkg.sub"), (3, "pkg.sub"), (3, "pkg.sub.b"), (4, "pkg.a"), (6, "..pkg")]
    assert sorted(imports_in(tmp_path / "pkg/sub/__init__.py", tmp_path)) == [(1, "pkg.a"), (2, "pkg.a")]
    assert ("fp8rl_core.report.plots" in {t for _, t in imports_in(CORE / "report" / "markdown.py", ROOT)})


def _copy_tree(tmp_path: Path) -> Path:
    """The layered packages' sources, copied: a planted import changes the copy, never the repository."""
    for pkg in LAYERED:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


# (file in the copy, line planted at its end, the two modules the failure must name)
PLANTED = [
    # the exporter reading the naming from the sampler
    ("fp8rl_core/sync/export.py", "from fp8rl_core.sampler.seam import Sampler",
     "fp8rl_core.sync.export (fp8rl_core.sync, rank 3) → fp8rl_core.sampler.seam (fp8rl_core.sampler, rank 4)"),
    # lazy imports inside a function
    ("fp8rl_core/sampler/vllm/worker.py", "def f():\n    import fp8rl_core.loop",
     "fp8rl_core.sampler.vllm.worker (fp8rl_core.sampler, rank 4) → fp8rl_core.loop (fp8rl_core.loop, rank 5)"),
    ("fp8rl_core/grids/api.py", "def f():\n    from fp8rl_core.learner import models",
     "fp8rl_core.grids.api (fp8rl_core.grids, rank 1) → fp8rl_core.learner.models (fp8rl_core.learner, rank 2)"),
    # relative imports, one and two levels up
    ("fp8rl_core/checks/matrix.py", "from .. import correctness",
     "fp8rl_core.checks.matrix (fp8rl_core.checks, rank 6) → fp8rl_core.correctness (fp8rl_core.correctness, rank 7)"),
    ("fp8rl_core/sync/transport.py", "from ..loop import Pipeline",
     "fp8rl_core.sync.transport (fp8rl_core.sync, rank 3) → fp8rl_core.loop (fp8rl_core.loop, rank 5)"),
    ("fp8rl_core/loop.py", "from .checks import faults",
     "fp8rl_core.loop (fp8rl_core.loop, rank 5) → fp8rl_core.checks.faults (fp8rl_core.checks, rank 6)"),
    # importlib with a literal name; the core reaching into tasks; tasks into flows
    ("fp8rl_core/metrics/stats.py", "import importlib\nimportlib.import_module('fp8rl_core.report.plots')",
     "fp8rl_core.metrics.stats (fp8rl_core.metrics, rank 6) → fp8rl_core.report.plots (fp8rl_core.report, rank 8)"),
    ("fp8rl_core/correctness.py", "from tasks import stages",
     "fp8rl_core.correctness (fp8rl_core.correctness, rank 7) → tasks.stages (tasks, rank 10)"),
    ("tasks/reporting.py", "from flows.cli import main",
     "tasks.reporting (tasks, rank 10) → flows.cli (flows, rank 11)"),
    # the core reaching into an adapter; an adapter into tasks, lazily
    ("fp8rl_core/report/markdown.py", "from adapters import tracking",
     "fp8rl_core.report.markdown (fp8rl_core.report, rank 8) → adapters.tracking (adapters, rank 9)"),
    ("adapters/tracking/record.py", "def f():\n    from tasks.stages import LIVE",
     "adapters.tracking.record (adapters, rank 9) → tasks.stages (tasks, rank 10)"),
]


@pytest.mark.parametrize("file, line, names", PLANTED, ids=[f"{p[0]}|{p[1].splitlines()[-1].strip()}" for p in PLANTED])
def test_a_planted_back_import_fails_naming_both_modules(tmp_path, file, line, names):
    root = _copy_tree(tmp_path)
    target = root / file
    lines = target.read_text().splitlines()
    target.write_text("\n".join(lines + [line]) + "\n")
    got = layer_violations(root)
    assert len(got) == 1, got
    planted_at = len(lines) + len(line.splitlines())
    assert got == [f"{file}:{planted_at} {names}: imports upward"]


def test_a_downward_import_passes(tmp_path):
    root = _copy_tree(tmp_path)
    with open(root / "fp8rl_core/report/plots.py", "a") as fh:
        fh.write("\ndef f():\n    from fp8rl_core.correctness import inject\n    from ..loop import Pipeline\n")
    assert layer_violations(root) == []


def test_a_module_in_no_layer_fails_naming_itself(tmp_path):
    """A new subpackage must be placed; nothing layered may import bench/ (in no layer)."""
    root = _copy_tree(tmp_path)
    (root / "fp8rl_core" / "newpkg").mkdir()
    (root / "fp8rl_core" / "newpkg" / "__init__.py").write_text("")
    (root / "fp8rl_core" / "newpkg" / "thing.py").write_text("import torch\n")
    spec = root / "fp8rl_core" / "grids" / "spec.py"
    n = len(spec.read_text().splitlines())
    spec.write_text(spec.read_text() + "import bench.checks\n")
    assert layer_violations(root) == [
        f"fp8rl_core/grids/spec.py:{n + 1} fp8rl_core.grids.spec (fp8rl_core.grids, rank 1) → bench.checks "
        "(in no layer): imports a module outside the layers",
        "fp8rl_core/newpkg/__init__.py: module fp8rl_core.newpkg is in no layer — place it in LAYERS (test_purity.py)",
        "fp8rl_core/newpkg/thing.py: module fp8rl_core.newpkg.thing is in no layer — place it in LAYERS "
        "(test_purity.py)",
    ]


# --------------------------------------------------------------------------------------- import cycles
def test_no_module_is_part_of_an_import_cycle():
    cycles = import_cycles(ROOT)
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


@pytest.mark.parametrize("file, line, cycle", [
    ("fp8rl_core/grids/native.py", "def f():\n    from .mx import BLOCK",
     ["fp8rl_core.grids.mx", "fp8rl_core.grids.native"]),
    ("fp8rl_core/grids/native.py", "from . import api",
     ["fp8rl_core.grids.api", "fp8rl_core.grids.mx", "fp8rl_core.grids.native"]),
    ("flows/verl_correctness.py", "def f():\n    from flows.pipelines import _flow_run",
     ["flows.pipelines", "flows.verl_correctness"]),
    ("adapters/signals.py", "def f():\n    from tasks import stages",
     ["adapters.signals", "adapters.tracking", "adapters.tracking.lifecycle", "tasks.stages"]),
], ids=["lazy, two modules", "through a third module", "between two flows modules", "across packages"])
def test_a_planted_import_cycle_is_found_naming_its_modules(tmp_path, file, line, cycle):
    """A lazy import closes a cycle as surely as a module-level one; a cycle through other modules is
    named whole (grids.api imports grids.mx, which imports grids.native; tasks.stages imports
    adapters.tracking, whose lifecycle module imports adapters.signals); flows.pipelines imports
    flows.verl_correctness inside a function."""
    root = _copy_tree(tmp_path)
    with open(root / file, "a") as fh:
        fh.write(f"\n{line}\n")
    assert import_cycles(root) == [cycle]
