"""What the adapter tests share: PostgreSQL (the Debian binaries) and an MLflow tracking server on it,
started by :mod:`adapters.tracking_server` once per test module that asks for them (``servers``, also the
flow tests' through tests/flows/conftest.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from adapters import tracking_server as ts


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
