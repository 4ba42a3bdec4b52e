"""What the flow tests share: PostgreSQL and an MLflow tracking server on it (``servers``, from
tests/adapters/conftest.py) once per test module that asks for them; one warm-start cache per session
(tests/BUDGET.md says what each flow test costs and what is shared); a run's metric history as step → value."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import tracking
from tests.adapters.conftest import servers  # noqa: F401 — a fixture: test_scale_out.py's tracking store
from tests.conftest import run_wide_dir


@pytest.fixture(scope="session")
def warmstart_cache(tmp_path_factory) -> Path:
    """The session's warm-start cache: the first sweep that needs a checkpoint trains it, later sweeps of
    the same model and warm-start config load it (as a rerun of ``make run`` loads ``.cache/warmstart``), on
    either xdist worker."""
    return run_wide_dir(tmp_path_factory, "flows-warmstart")


@pytest.fixture(scope="module")
def store(tmp_path_factory, warmstart_cache):
    """A module's temporary MLflow store (SQLite + artifacts), with the session's warm-start cache."""
    root = tmp_path_factory.mktemp("tracking")
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", "FP8RL_ARTIFACTS": str(root / "artifacts"),
            "root": root, "warmstart": str(warmstart_cache)}


@pytest.fixture()
def env(store, monkeypatch):
    """The flows pointed at ``store``: MLflow, the warm-start cache, reports and verl's work folders in it."""
    import flows.pipelines as pipelines

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["MLFLOW_TRACKING_URI"])
    monkeypatch.setenv("FP8RL_ARTIFACTS", store["FP8RL_ARTIFACTS"])
    monkeypatch.setenv("FP8RL_VERL_WORK", str(store["root"] / "verl"))
    monkeypatch.setattr(pipelines, "WARMSTART_CACHE", store["warmstart"])
    monkeypatch.setattr(pipelines, "REPORTS", str(store["root"] / "reports"))
    return store


def metric_history(run: str, key: str) -> dict[int, float]:
    """MLflow run ``run``'s logged values of metric ``key``: step → value."""
    return {m.step: m.value for m in tracking.client().get_metric_history(run, key)}


@pytest.fixture()
def import_log(tmp_path, monkeypatch) -> Path:
    """Every Python process started from here on records the top-level modules it imports into the folder
    returned (tools/importlog/sitecustomize.py on ``PYTHONPATH``, ``FP8RL_IMPORT_LOG``); a folder already named
    by ``FP8RL_IMPORT_LOG`` is used and kept (``python tools/import_closure.py --write`` reads it)."""
    import os

    folder = Path(os.environ.get("FP8RL_IMPORT_LOG") or tmp_path / "imports")
    root = Path(__file__).resolve().parents[2]
    path = [str(root / "tools" / "importlog"), os.environ.get("PYTHONPATH") or str(root)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("FP8RL_IMPORT_LOG", str(folder))
    return folder


def assert_closure_pinned(folder: Path) -> None:
    """Each top-level module recorded in ``folder`` maps to a distribution constraints-gpu.txt pins, or one of
    tools/import_closure.py's CPU-specific table; a miss names module, distribution and process."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import import_closure

    closure = import_closure.read_log(folder)
    assert len({e.process for e in closure}) > 3, closure  # the trainer, Ray's workers, vLLM's engine
    assert [str(m) for m in import_closure.unpinned(closure)] == []
