"""Prefect tasks of the ``upstream-drift`` check: read one version set's sources and check fp8rl's upstream
internals in them (:mod:`adapters.upstream`), then record the result in an MLflow run — the versions as
params, the counts as metrics, every name that does not hold as a row of the ``breakages`` table, the verdict
as a tag. What is recorded: docs/gpu.md (Upstream internals, The nightly drift check)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters import tracking, upstream

__all__ = ["UpstreamRecord", "check_upstream", "record_upstream"]

#: the ``breakages`` table's columns, in order (one row per listed internal that does not hold)
COLUMNS = ("package", "version", "module", "name", "category", "problem", "use", "used_by")


@dataclass(frozen=True)
class UpstreamRecord:
    """One check as recorded: its MLflow run, ``verdict`` (``holds``: every name holds; ``drift``: some do
    not), the versions read, the counts and the names that do not hold."""

    mlflow_run: str
    verdict: str
    versions: Mapping[str, str]
    checked: int
    breakages: tuple[upstream.Breakage, ...]


@task(name="upstream-check", cache_policy=NO_CACHE)
def check_upstream(mode: str = "latest", trees: Mapping[str, str] | None = None,
                   index: str = upstream.INDEX) -> tuple[upstream.Report, ...]:
    """fp8rl's upstream internals in the sources of ``mode``'s versions (``installed``, ``gpu``, ``latest``),
    packages in ``trees`` read from those folders; one report per package version."""
    return tuple(upstream.check(src) for src in upstream.sources(mode, trees, index))


@task(name="record-upstream-check", cache_policy=NO_CACHE)
def record_upstream(mlflow_run: str, reports: tuple[upstream.Report, ...]) -> UpstreamRecord:
    """Log ``reports`` into ``mlflow_run``: params ``<package>`` = version and ``<package>.source`` = what was
    read; metrics ``names/checked``, ``names/broken``, ``names/missing``, ``names/signature``, ``names/kind``
    and per package ``<package>/checked``, ``<package>/broken``; the ``breakages`` table (parquet + CSV, one row
    per name that does not hold, :data:`COLUMNS`) and ``upstream.json`` (every report); tag ``verdict``."""
    breakages = tuple(b for r in reports for b in r.breakages)
    tracking.log_params(mlflow_run, {r.package: r.version for r in reports} | {f"{r.package}.source": r.where for r in reports})
    metrics = {"names/checked": sum(r.checked for r in reports), "names/broken": len(breakages),
               **{f"names/{c}": sum(r.count(c) for r in reports) for c in ("missing", "signature", "kind")}}
    for r in reports:
        metrics |= {f"{r.package}/checked": r.checked, f"{r.package}/broken": len(r.breakages)}
    tracking.log_metrics(mlflow_run, metrics)
    rows = [b.row() for b in breakages]
    tracking.log_json(mlflow_run, "upstream.json", [{"package": r.package, "version": r.version, "source": r.where,
                                                     "checked": r.checked, "breakages": [b.row() for b in r.breakages]}
                                                    for r in reports])
    if rows:
        tracking.log_table(mlflow_run, "breakages", rows)
        tracking.log_csv(mlflow_run, "breakages", rows)
    verdict = "drift" if breakages else "holds"
    tracking.set_tag(mlflow_run, "verdict", verdict)
    return UpstreamRecord(mlflow_run, verdict, {r.package: r.version for r in reports},
                          int(metrics["names/checked"]), breakages)
