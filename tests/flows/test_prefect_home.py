"""Prefect's state on a fresh machine: every file Prefect keeps lies under the project's ``.prefect/``
(prefect.toml), and a first flow on the embedded server — what ``make run`` starts, here through the ``fp8rl``
command from another folder — prints no warning and writes nothing into an empty home directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fresh_env(home: Path) -> dict[str, str]:
    """This environment as a fresh machine has it: an empty home, no Prefect settings of a person's."""
    home.mkdir()
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {"HOME": str(home)}


def test_every_file_prefect_keeps_is_under_the_projects_prefect_folder(tmp_path):
    code = ("import json; from prefect.settings import get_current_settings as g; s = g(); "
            "print(json.dumps({'home': str(s.home), 'profiles': str(s.profiles_path), "
            "'memo_store': str(s.server.memo_store_path), 'storage': str(s.results.local_storage_path), "
            "'logging': str(s.logging.config_path), 'db': s.server.database.connection_url.get_secret_value()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=fresh_env(tmp_path / "home"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    assert paths == {"home": ".prefect", "profiles": ".prefect/profiles.toml", "memo_store": ".prefect/memo_store.toml",
                     "storage": ".prefect/storage", "logging": ".prefect/logging.yml",
                     "db": "sqlite+aiosqlite:///.prefect/prefect.db"}


def test_the_fp8rl_command_run_outside_the_checkout_keeps_the_projects_prefect_settings(tmp_path):
    """Prefect reads prefect.toml from the working directory only: the command exports the project's file
    (adapters.prefect_settings), so a flow started from another folder keeps its state in that folder's
    ``.prefect/``, sends no telemetry (its heartbeat can print a "database is locked" traceback) and writes
    nothing into the home directory; a variable the user set wins. It is also a first flow on a fresh machine
    (what ``make run`` starts): the embedded server registers Prefect's blocks on its first start and memoizes
    that in the memo store — with the store outside ``.prefect/`` (in a ``~/.prefect`` that does not exist) it
    warns "Unable to write to memo_store.toml" —, and no warning of Prefect's server is printed."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    home = tmp_path / "home"
    code = ("import flows.cli\nfrom prefect import flow\nfrom prefect.settings import get_current_settings as g\n"
            "@flow\ndef fresh():\n    return 41 + 1\nprint('result', fresh())\ns = g()\n"
            "print('settings', s.home, s.server.analytics_enabled, s.server.memo_store_path, s.logging.level)\n")
    env = fresh_env(home) | {"PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "WARNING"}
    out = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "result 42" in out.stdout
    assert "settings .prefect False .prefect/memo_store.toml WARNING" in out.stdout, out.stdout
    assert "Traceback" not in text and "locked" not in text, text[-3000:]
    assert "memo_store" not in out.stderr and "Unable to" not in text, text[-3000:]
    assert not [line for line in text.splitlines() if "| WARNING | prefect.server" in line], text[-3000:]
    assert (work / ".prefect" / "memo_store.toml").is_file() and (work / ".prefect" / "prefect.db").is_file()
    assert list(home.iterdir()) == []
