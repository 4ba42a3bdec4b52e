"""Prefect tasks of the ``upstream-drift`` check: read one version set's sources and check fp8rl's upstream
internals in them (:mod:`adapters.upstream`), then record the result in an MLflow run — the versions as
params, the counts as metrics, every path's result as a tag and a row of the ``paths`` table, every name that
does not hold as a row of the ``breakages`` table, the verdict as a tag. The GPU set installed on this host (``make check-gpu-set``, tools/gpu_set_check.py's JSON) is read
and recorded the same way in a run of its own. What is recorded: docs/gpu.md (Upstream internals, The nightly
drift check, The GPU set installed on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters import tracking, upstream

__all__ = ["GpuSetCheck", "GpuSetImport", "GpuSetRecord", "UpstreamRecord", "check_gpu_set", "check_upstream",
           "record_gpu_set", "record_upstream"]

ROOT = Path(__file__).resolve().parents[1]

#: the ``breakages`` table's columns, in order (one row per listed internal that does not hold; ``paths``: the
#: keys of the paths it is used on, comma-separated)
COLUMNS = ("package", "version", "module", "name", "category", "problem", "use", "used_by", "paths")
#: the ``paths`` table's columns (one row per package version and path of fp8rl_core/upstream.py's PATHS)
PATH_COLUMNS = ("package", "version", "path", "label", "status", "names", "broken", "default")


@dataclass(frozen=True)
class UpstreamRecord:
    """One check as recorded: its MLflow run, ``verdict`` (``holds``: every path the releases run holds;
    ``drift``: a name of one does not), the versions read, the counts, the names that do not hold (on any path),
    every path's result and ``failing``: the names that do not hold on a path their release runs."""

    mlflow_run: str
    verdict: str
    versions: Mapping[str, str]
    checked: int
    breakages: tuple[upstream.Breakage, ...]
    paths: tuple[upstream.PathCheck, ...] = ()
    failing: tuple[upstream.Breakage, ...] = ()
    gpu_set: GpuSetRecord | None = None


#: why a module of the GPU set does not import on a CPU host, as tools/gpu_set_check.py words it → its kind; a
#: ``not-in-set`` or ``other`` failure is a drift, the rest are what a CPU host cannot do
WHY_KINDS = (("needs the NVIDIA driver", "gpu"), ("a source build", "source-build"),
             ("which the GPU set does not hold", "not-in-set"), ("which the set's library lacks", "symbol"),
             ("needs the library", "library"))
#: the kinds that are a drift of the set itself (the rest: what a CPU host cannot do)
DRIFT_KINDS = ("not-in-set", "symbol", "other")
#: the ``gpu_set_imports`` table's columns (one row per module that does not import)
IMPORT_COLUMNS = ("module", "kind", "why", "error", "seconds")


@dataclass(frozen=True)
class GpuSetImport:
    """One module imported in the scratch venv: ``ok``, else ``why`` (tools/gpu_set_check.py's words) and the
    error's first line; ``kind``: :data:`WHY_KINDS`' name for ``why`` (``ok`` when it imported)."""

    module: str
    ok: bool
    why: str
    error: str
    seconds: float

    @property
    def kind(self) -> str:
        return "ok" if self.ok else next((k for text, k in WHY_KINDS if text in self.why), "other")


@dataclass(frozen=True)
class GpuSetCheck:
    """tools/gpu_set_check.py's result: the Python, the lock's size, the install's and the imports' seconds, the
    disk (the venv, uv's cache of the downloads, both together), what the venv holds that differs from the lock
    (the source builds aside), every module's import."""

    python: str
    pins: int
    install_s: float
    imports_s: float
    wall_s: float
    venv_bytes: int
    cache_bytes: int
    disk_bytes: int
    set_problems: tuple[str, ...]
    imports: tuple[GpuSetImport, ...]

    @classmethod
    def read(cls, path: str | Path) -> GpuSetCheck:
        d = json.loads(Path(path).read_text())
        rows = tuple(GpuSetImport(r["module"], r["ok"], r.get("why", ""), r.get("error", ""), float(r.get("seconds", 0)))
                     for r in d["imports"])
        return cls(d["python"], int(d["pins"]), float(d["install_s"]), float(d["imports_s"]), float(d["wall_s"]),
                   int(d["venv_bytes"]), int(d["cache_bytes"]), int(d["disk_bytes"]), tuple(d["set_problems"]), rows)

    def count(self, kind: str) -> int:
        return sum(i.kind == kind for i in self.imports)

    @property
    def drift(self) -> tuple[str, ...]:
        """What is wrong with the set itself: a difference from the lock, a module it lacks, an unexplained failure."""
        return self.set_problems + tuple(f"{i.module}: {i.why}" for i in self.imports if i.kind in DRIFT_KINDS)


@dataclass(frozen=True)
class GpuSetRecord:
    """The GPU set's install as recorded: its MLflow run, ``verdict`` (``holds``: the set matches the lock and every
    module imports or fails for what a CPU host lacks; ``drift``: otherwise) and the check."""

    mlflow_run: str
    verdict: str
    check: GpuSetCheck


@task(name="upstream-check", cache_policy=NO_CACHE)
def check_upstream(mode: str = "latest", trees: Mapping[str, str] | None = None,
                   index: str = upstream.INDEX) -> tuple[upstream.Report, ...]:
    """fp8rl's upstream internals in the sources of ``mode``'s versions (``installed``, ``gpu``, ``latest``),
    packages in ``trees`` read from those folders; one report per package version, with its paths (whether a
    path's distribution has the version asked on ``index``)."""
    return tuple(upstream.check(src, index=index) for src in upstream.sources(mode, trees, index))


@task(name="record-upstream-check", cache_policy=NO_CACHE)
def record_upstream(mlflow_run: str, reports: tuple[upstream.Report, ...]) -> UpstreamRecord:
    """Log ``reports`` into ``mlflow_run``: params ``<package>`` = version and ``<package>.source`` = what was
    read; metrics ``names/checked``, ``names/broken`` (on any path), ``names/failing`` (on a path the release
    runs), ``names/missing``, ``names/signature``, ``names/kind``, ``paths/checked``, ``paths/holds``,
    ``paths/broken``, ``paths/absent`` (not released for the version, or removed) and per package
    ``<package>/checked``, ``<package>/broken``, ``<package>/failing``; tags ``path.<key>`` (the path's status:
    ``holds``, ``broken``, why it does not run) and ``default.<package>`` (the path its release runs by
    default, ``per model`` where it chooses per model); the ``paths`` table (parquet + CSV, one row per package
    version and path, :data:`PATH_COLUMNS`), the ``breakages`` table (one row per name that does not hold,
    :data:`COLUMNS`) and ``upstream.json`` (every report); tag ``verdict``: ``drift`` when a name of a path the
    release runs does not hold, else ``holds``."""
    breakages = tuple(b for r in reports for b in r.breakages)
    failing = tuple(b for r in reports for b in r.failing)
    paths = tuple(p for r in reports for p in r.paths)
    tracking.log_params(mlflow_run, {r.package: r.version for r in reports} | {f"{r.package}.source": r.where for r in reports})
    metrics = {"names/checked": sum(r.checked for r in reports), "names/broken": len(breakages),
               "names/failing": len(failing),
               **{f"names/{c}": sum(r.count(c) for r in reports) for c in ("missing", "signature", "kind")},
               "paths/checked": len(paths), "paths/holds": sum(p.status == "holds" for p in paths),
               "paths/broken": sum(p.fails for p in paths), "paths/absent": sum(bool(p.absent) for p in paths)}
    for r in reports:
        metrics |= {f"{r.package}/checked": r.checked, f"{r.package}/broken": len(r.breakages),
                    f"{r.package}/failing": len(r.failing)}
    tracking.log_metrics(mlflow_run, metrics)
    for p in paths:
        tracking.set_tag(mlflow_run, f"path.{p.path.key}", p.status)
    for r in reports:
        if r.default is not None:
            tracking.set_tag(mlflow_run, f"default.{r.package}", r.default.path or "per model")
    path_rows = [{"package": r.package, "version": r.version} | p.row() for r in reports for p in r.paths]
    rows = [b.row() for b in breakages]
    tracking.log_json(mlflow_run, "upstream.json", [{"package": r.package, "version": r.version, "source": r.where,
                                                     "checked": r.checked, "breakages": [b.row() for b in r.breakages],
                                                     "paths": [p.row() for p in r.paths],
                                                     "default": r.default_line()}
                                                    for r in reports])
    if path_rows:
        tracking.log_table(mlflow_run, "paths", path_rows)
        tracking.log_csv(mlflow_run, "paths", path_rows)
    if rows:
        tracking.log_table(mlflow_run, "breakages", rows)
        tracking.log_csv(mlflow_run, "breakages", rows)
    verdict = "drift" if failing else "holds"
    tracking.set_tag(mlflow_run, "verdict", verdict)
    return UpstreamRecord(mlflow_run, verdict, {r.package: r.version for r in reports},
                          int(metrics["names/checked"]), breakages, paths, failing)


@task(name="gpu-set-check", cache_policy=NO_CACHE)
def check_gpu_set(result: str | None = None) -> GpuSetCheck:
    """``make check-gpu-set`` (several GB: the GPU set's wheels into a scratch venv, then the imports) and its
    result; ``result``: a result file already written (the check is not run)."""
    if result is None:
        folder = Path(tempfile.mkdtemp(prefix="fp8rl-gpu-set-result-"))
        result = str(folder / "gpu-set.json")
        out = subprocess.run(["make", "--no-print-directory", "check-gpu-set", f"GPU_SET_RESULT={result}"], cwd=ROOT,
                             env=os.environ.copy(), capture_output=True, text=True)
        if out.returncode:
            tail = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"make check-gpu-set exited with status {out.returncode}: {tail[0]}")
    return GpuSetCheck.read(result)


@task(name="record-gpu-set-check", cache_policy=NO_CACHE)
def record_gpu_set(mlflow_run: str, check: GpuSetCheck) -> GpuSetRecord:
    """Log ``check`` into ``mlflow_run``: params ``python``, ``pins``; metrics ``gpu_set/install_s``,
    ``gpu_set/imports_s``, ``gpu_set/wall_s``, ``gpu_set/venv_gb``, ``gpu_set/download_gb``, ``gpu_set/disk_gb``,
    ``gpu_set/set_problems``, ``gpu_set/modules``, ``gpu_set/imported`` and ``gpu_set/failed/<kind>`` for each kind
    of :data:`WHY_KINDS` and ``other``; the ``gpu_set_imports`` table (parquet + CSV, one row per module that does
    not import, :data:`IMPORT_COLUMNS`) and ``gpu_set.json`` (the whole check); tag ``verdict``."""
    tracking.log_params(mlflow_run, {"python": check.python, "pins": str(check.pins)})
    kinds = [k for _, k in WHY_KINDS] + ["other"]  # gpu, source-build, not-in-set, symbol, library, other
    tracking.log_metrics(mlflow_run, {
        "gpu_set/install_s": check.install_s, "gpu_set/imports_s": check.imports_s, "gpu_set/wall_s": check.wall_s,
        "gpu_set/venv_gb": check.venv_bytes / 1e9, "gpu_set/download_gb": check.cache_bytes / 1e9,
        "gpu_set/disk_gb": check.disk_bytes / 1e9, "gpu_set/set_problems": len(check.set_problems),
        "gpu_set/modules": len(check.imports), "gpu_set/imported": check.count("ok"),
        **{f"gpu_set/failed/{k}": check.count(k) for k in kinds}})
    rows = [{"module": i.module, "kind": i.kind, "why": i.why, "error": i.error, "seconds": i.seconds}
            for i in check.imports if not i.ok]
    tracking.log_json(mlflow_run, "gpu_set.json", {"set_problems": list(check.set_problems), "imports": rows,
                                                   "imported": [i.module for i in check.imports if i.ok]})
    if rows:
        tracking.log_table(mlflow_run, "gpu_set_imports", rows)
        tracking.log_csv(mlflow_run, "gpu_set_imports", rows)
    verdict = "drift" if check.drift else "holds"
    tracking.set_tag(mlflow_run, "verdict", verdict)
    return GpuSetRecord(mlflow_run, verdict, check)
