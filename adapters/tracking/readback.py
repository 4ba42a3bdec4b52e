"""Reading a sweep back from MLflow: its finished runs (resume), its parent run, its tables (reports)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from .store import client, tracking_uri

__all__ = ["RUN_TABLES", "find_finished", "find_sweep_run", "run_json", "sweep_json", "sweep_tables"]


def find_finished(sweep: str, run_id: str) -> str | None:
    """The MLflow run id of a FINISHED run with this fp8rl run id in the sweep's experiment, if any."""
    c = client()
    exp = c.get_experiment_by_name(sweep)
    if exp is None:
        return None
    runs = c.search_runs([exp.experiment_id],
                         filter_string=f"tags.`fp8rl.run_id` = '{run_id}' and attributes.status = 'FINISHED'",
                         max_results=1)
    return runs[0].info.run_id if runs else None


#: the tables every finished run logs under ``tables/`` (tasks.stages.record_run)
RUN_TABLES = ("steps", "tokens", "microbatches", "kl_summary", "probe", "checks", "matching", "matching_checks",
              "matching_engines")


def sweep_tables(sweep: str, dest: str | Path, sweep_id: str | None = "latest") -> dict:
    """Everything a report needs from a sweep's MLflow experiment: ``runs`` (one dict per FINISHED run —
    MLflow run id, fp8rl run id, name, params as logged, final metrics) and, per table of
    :data:`RUN_TABLES`, the concatenated rows of every run (with its fp8rl ``run_id``). Parquet files
    are read where a local artifact store keeps them, else downloaded under ``dest``. The newest FINISHED MLflow run wins when a run id was run twice;
    runs that are not FINISHED, and runs without an fp8rl run id (e.g. a report run), are left out.
    ``sweep_id``: only runs of that expansion of the config (tag ``fp8rl.sweep_id``, a hash of its run
    ids: a changed config is a new expansion); ``"latest"`` (default) the expansion of the newest
    FINISHED run; None every expansion. An expansion's runs are the run ids its parent run's ``sweep.json``
    lists (``run_ids``), whichever expansion ran them — a sweep extended by more seeds skips the runs an
    earlier expansion finished, and its report still pools them; a parent recorded without ``run_ids``:
    the runs tagged with its id. Raises ``LookupError`` naming the known experiments when the
    sweep has none."""
    import pyarrow.parquet as pq
    from mlflow import artifacts

    c = client()
    exp = c.get_experiment_by_name(sweep)
    if exp is None:
        known = sorted(e.name for e in c.search_experiments())
        raise LookupError(f"no MLflow experiment named {sweep!r} at {tracking_uri()}; known: {', '.join(known) or 'none'}")
    found = c.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                          order_by=["attributes.start_time DESC"], max_results=5000)
    found = [r for r in found if r.data.tags.get("fp8rl.run_id")]
    if sweep_id == "latest":
        sweep_id = found[0].data.tags.get("fp8rl.sweep_id") if found else None
    if sweep_id is not None:
        parent = find_sweep_run(sweep, sweep_id)
        listed = (sweep_json(parent) or {}).get("run_ids") if parent is not None else None
        found = [r for r in found if (r.data.tags.get("fp8rl.run_id") in listed if listed is not None
                                      else r.data.tags.get("fp8rl.sweep_id") == sweep_id)]
    runs, seen = [], set()
    uri = tracking_uri()
    tables: dict[str, list[dict]] = {t: [] for t in RUN_TABLES}
    for r in found:
        rid = r.data.tags.get("fp8rl.run_id")
        if rid in seen:
            continue
        seen.add(rid)
        runs.append({"mlflow_run": r.info.run_id, "run_id": rid, "name": r.info.run_name,
                     "params": dict(r.data.params), "metrics": dict(r.data.metrics)})
        folder = Path(dest) / r.info.run_id
        folder.mkdir(parents=True, exist_ok=True)
        # the run's tables/ folder: read where it lies when the artifact store is a local folder, else in one
        # download, by the run's artifact URI, which search_runs returned (the client's calls by run id look the
        # run up again for each file: one database query per table and run)
        tables_uri = f"{r.info.artifact_uri.rstrip('/')}/tables"
        got = _local_folder(tables_uri) or Path(artifacts.download_artifacts(
            artifact_uri=tables_uri, dst_path=str(folder), tracking_uri=uri))
        for t in RUN_TABLES:
            path = got / f"{t}.parquet"
            if not path.is_file():
                continue
            rows = pq.read_table(path).to_pylist()
            if t in ("steps", "tokens", "checks", "matching", "matching_checks", "matching_engines"):  # the others carry their run id already
                rows = [row | {"run_id": rid} for row in rows]
            tables[t].extend(rows)
    return {"sweep": sweep, "experiment_id": exp.experiment_id, "sweep_id": sweep_id,
            "runs": list(reversed(runs))} | tables



def _local_folder(artifact_uri: str) -> Path | None:
    """The folder an artifact URI names when the store is a local folder (a path or ``file://``), if it exists."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(artifact_uri)
    if parsed.scheme not in ("", "file") or (parsed.scheme == "file" and parsed.netloc not in ("", "localhost")):
        return None
    folder = Path(unquote(parsed.path) if parsed.scheme else artifact_uri)
    return folder if folder.is_dir() else None


def find_sweep_run(sweep: str, sweep_id: str | None = None) -> str | None:
    """The newest parent run of the sweep (of the expansion ``sweep_id``, when given), if any."""
    c = client()
    exp = c.get_experiment_by_name(sweep)
    if exp is None:
        return None
    where = "tags.`fp8rl.kind` = 'sweep'" + (f" and tags.`fp8rl.sweep_id` = '{sweep_id}'" if sweep_id else "")
    runs = c.search_runs([exp.experiment_id], filter_string=where, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def run_json(mlflow_run: str, name: str, run=None) -> dict | None:
    """The JSON artifact ``name`` (top level) of ``mlflow_run`` — read where it lies when the store is a local
    folder, else downloaded — or None if the run has none. ``run``: the run already fetched (saves a request)."""
    c = client()
    run = run if run is not None else c.get_run(mlflow_run)
    folder = _local_folder(run.info.artifact_uri)
    if folder is not None:
        path = folder / name
        return json.loads(path.read_text()) if path.is_file() else None
    if name not in {f.path for f in c.list_artifacts(mlflow_run)}:
        return None
    with tempfile.TemporaryDirectory() as d:
        return json.loads(Path(c.download_artifacts(mlflow_run, name, d)).read_text())


def sweep_json(parent: str) -> dict | None:
    """The ``sweep.json`` the sweep's parent run ``parent`` logged — the validated sweep config as a
    mapping, with the ``config`` file and ``overrides`` it was read with — or None if it has none."""
    return run_json(parent, "sweep.json")
