"""What the flow tests share: PostgreSQL (the Debian binaries) and an MLflow tracking server on it, started
by :mod:`flows.tracking_server` once per test module that asks for them; one warm-start cache per session
(tests/BUDGET.md says what each flow test costs and what is shared)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from flows import tracking_server as ts


def data_dir() -> Path:
    """A folder the ``postgres`` user can reach when we are root (pytest's tmp folders are 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="fp8rl-tracking-", dir="/tmp"))
    d.chmod(0o711)
    return d


@pytest.fixture(scope="module")
def servers():
    """(PostgreSQL, MLflow server on it with proxied artifacts), loopback ports, stopped after the module."""
    d = data_dir()
    try:
        with ts.Postgres(d) as db, ts.TrackingServer(db.uri, None, d, port=ts.free_port(), workers=1) as server:
            yield db, server
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def warmstart_cache(tmp_path_factory) -> Path:
    """The session's warm-start cache: the first sweep that needs a checkpoint trains it, later sweeps of
    the same model and warm-start config load it (as a rerun of ``make run`` loads ``.cache/warmstart``)."""
    return tmp_path_factory.mktemp("warmstart")
