"""adapters.dispatch: a local Ray that Ray gave up on as slow is started once more, after the processes of the
failed attempt are ended (the sweeps on a real local Ray: tests/flows/test_pipelines.py)."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from adapters.dispatch import SLOW_START, started_again_once


def _attempts(error: str):
    """A start that, the first time, leaves a process behind (as Ray's GCS and raylet are) and raises ``error``."""
    calls = []

    def start():
        calls.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        if len(calls) == 1:
            raise Exception(f"{error}. This could happen because some of the raylet failed to startup")  # Ray's type
        return "started"

    return start, calls


def test_a_slow_local_start_is_started_again_after_its_processes_are_ended(caplog):
    start, calls = _attempts(SLOW_START)
    try:
        assert started_again_once(start) == "started"
        first, second = calls
        assert first.wait(timeout=10) is not None  # the failed attempt's process: ended
        assert second.poll() is None  # the second attempt's: running
        assert "starting it once more" in caplog.text and "1 processes of that attempt ended" in caplog.text
    finally:
        for p in calls:
            p.kill()
            p.wait()


def test_any_other_failure_is_raised_and_its_processes_left_to_whoever_started_them():
    start, calls = _attempts("ConnectionError: the GCS refused")
    try:
        with pytest.raises(Exception, match="the GCS refused"):
            started_again_once(start)
        assert len(calls) == 1 and psutil.pid_exists(calls[0].pid) and calls[0].poll() is None
    finally:
        for p in calls:
            p.kill()
            p.wait()
