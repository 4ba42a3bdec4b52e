"""Values logged to an MLflow run as soon as they exist: params (flattened), metrics, tags, JSON, text,
files and tables (parquet, CSV). A run that fails later keeps them. The client API throughout: no global
"active run", so runs are explicit and thread-safe."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mlflow.entities import Metric, Param

from .store import client

__all__ = ["MAX_PARAM_LEN", "flatten", "log_csv", "log_file", "log_json", "log_metrics", "log_params", "log_table",
           "log_text", "plain_text", "set_tag"]

MAX_PARAM_LEN = 6000
#: an ANSI escape sequence (colours: Ray's task names and worker prefixes carry them into exception messages)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


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


def log_params(mlflow_run: str, params: Mapping[str, str]) -> None:
    """Params, sorted, each cut at MLflow's length limit, in batches of 100."""
    items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in sorted(params.items())]
    c = client()
    for i in range(0, len(items), 100):
        c.log_batch(mlflow_run, params=items[i:i + 100])


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
    """A list of row dicts as a parquet artifact ``tables/<name>.parquet``: every column any row has, in order
    of appearance (null where a row lacks it — pyarrow would otherwise take the first row's keys alone)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(dict.fromkeys(k for r in rows for k in r))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows]), p)
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


def plain_text(text: str) -> str:
    """``text`` without ANSI escape sequences."""
    return _ANSI.sub("", text)


def set_tag(mlflow_run: str, key: str, value: str) -> None:
    """A tag, as plain text (:func:`plain_text`) cut at 5000 characters."""
    client().set_tag(mlflow_run, key, plain_text(value)[:5000])

