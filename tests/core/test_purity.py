"""fp8rl_core is the pure library: nothing under it may import Prefect, MLflow or Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fp8rl_core

FORBIDDEN = {"prefect", "mlflow", "ray"}
CORE = Path(fp8rl_core.__file__).parent


def forbidden_imports(root: Path) -> list[str]:
    """Every ``import X`` / ``from X import`` (also inside functions) of a forbidden package under root."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "import_module",
                "__import__",
            ) and node.args and isinstance(node.args[0], ast.Constant):
                names = [str(node.args[0].value)]
            else:
                continue
            hits += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    return hits


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
