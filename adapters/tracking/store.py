"""Where the MLflow runs go: the tracking store, the artifact root, the client, a sweep's experiment.

``MLFLOW_TRACKING_URI`` when set, else a SQLite database ``mlflow.db`` in the working directory (the
project root) with artifacts under ``mlartifacts/<sweep>/``; one experiment per sweep, named after it.
A tracking server (``http(s)://``) keeps the artifacts itself. Specified in docs/deploy.md (Tracking server).
"""

from __future__ import annotations

import os
from pathlib import Path

from mlflow.tracking import MlflowClient

__all__ = ["artifact_root", "client", "experiment_id", "tracking_uri"]


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def artifact_root() -> Path:
    return Path(os.environ.get("FP8RL_ARTIFACTS", Path.cwd() / "mlartifacts"))


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

