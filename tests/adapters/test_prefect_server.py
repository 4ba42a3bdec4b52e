"""Prefect's temporary API server as :func:`adapters.prefect_server.start_temporary_server` starts it: SIGINT blocked
in the server's process and in nothing else, so a Ctrl-C to the whole process group leaves it serving (the flow
test interrupts a real sweep this way: tests/flows/test_pipelines.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# starts the server, ignores SIGINT itself (before it says it is ready, so that a loaded machine cannot deliver the
# test's Ctrl-C first and end the caller, whose exit hook would stop the server) so that only the server's own mask
# is under test, then prints its URL and whether its own mask was restored
SCRIPT = """
import signal, sys
from adapters.prefect_server import start_temporary_server
url = start_temporary_server()
mask_restored = signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set()
signal.signal(signal.SIGINT, signal.SIG_IGN)
print(url, flush=True)
print(mask_restored, flush=True)
sys.stdin.read()  # until the test closes it: then a normal exit, whose hooks stop the server
"""


def _blocked(pid: int) -> int:
    """The process's blocked-signals mask (``SigBlk`` in /proc/PID/status)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigBlk:"))
    return int(line.split()[1], 16)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.timeout(180)
def test_the_temporary_server_survives_a_ctrl_c_to_the_group_and_the_caller_keeps_its_mask(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.rstrip("/").endswith("/api"), url
        assert proc.stdout.readline().strip() == "True"  # the caller's own mask restored: it still gets Ctrl-C
        (server,) = [c for c in _children(proc.pid) if b"uvicorn" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert _blocked(server) & (1 << (signal.SIGINT - 1))
        assert not _blocked(server) & (1 << (signal.SIGTERM - 1))  # Prefect stops it with SIGTERM at exit
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        time.sleep(2)
        assert proc.poll() is None  # the caller ignores SIGINT: a server gone now was stopped by the signal itself
        assert Path(f"/proc/{server}").exists(), "the server died of the group's SIGINT"
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as r:
            assert r.status == 200
        proc.stdin.close()  # the caller's normal exit stops its server (Prefect's exit hook: SIGTERM)
        assert proc.wait(timeout=60) == 0
        deadline = time.time() + 15
        while Path(f"/proc/{server}").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{server}").exists()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
