"""The project's Prefect settings wherever the ``fp8rl`` command runs.

Prefect reads ``prefect.toml`` from the working directory only. Run from any other folder, it keeps its state
in ``~/.prefect`` and sends telemetry, whose heartbeat can print a "database is locked" traceback in the
terminal. :func:`use_project_settings` exports the project's ``prefect.toml`` (the one source
of these settings) as Prefect's environment variables — ``PREFECT_`` and the setting's path joined by ``_``,
upper-cased (Prefect's settings reference) — when the working directory has no ``prefect.toml`` of its own.
The relative paths then name ``.prefect/`` in that folder, as ``mlflow.db`` and ``logs/`` do; a variable the
user set wins.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

__all__ = ["PROJECT_SETTINGS", "prefect_environment", "use_project_settings"]

PROJECT_SETTINGS = Path(__file__).resolve().parents[1] / "prefect.toml"


def prefect_environment(toml: Path = PROJECT_SETTINGS) -> dict[str, str]:
    """Each setting of ``toml`` as Prefect's environment variable → its value (booleans as ``true``/``false``)."""
    out: dict[str, str] = {}

    def walk(path: tuple[str, ...], table: dict) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk((*path, key), value)
            else:
                text = str(value).lower() if isinstance(value, bool) else str(value)
                out["_".join(("PREFECT", *path, key)).upper()] = text

    walk((), tomllib.loads(toml.read_text()))
    return out


def use_project_settings(cwd: Path | None = None) -> dict[str, str]:
    """Export the project's settings unless ``cwd`` (the working directory) has a ``prefect.toml``; before Prefect
    is imported. Returns what it set."""
    if ((cwd or Path.cwd()) / "prefect.toml").is_file():
        return {}
    added = {k: v for k, v in prefect_environment().items() if k not in os.environ}
    os.environ.update(added)
    return added
