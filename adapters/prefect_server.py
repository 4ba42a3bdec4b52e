"""Prefect's temporary API server kept out of the terminal's Ctrl-C.

Without ``PREFECT_API_URL``, Prefect starts a temporary API server as a child process at the first client
(Prefect's docs: "Starting temporary server"). A terminal's Ctrl-C sends SIGINT to the whole foreground process
group, that child included: it died at once, and the interrupted flow then retried reporting its end to nothing
(connection-refused tracebacks for a minute or more). A signal blocked in the thread that starts a child stays
blocked in the child (POSIX: the mask is inherited across fork and exec; a handler the child installs does not
unblock it), so the server started by :func:`start_temporary_server` never receives SIGINT. It still ends on
SIGTERM, which is how Prefect stops it at exit.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["start_temporary_server"]


def start_temporary_server() -> str | None:
    """Start Prefect's temporary API server now, with SIGINT blocked in it, when no ``PREFECT_API_URL`` is set
    (later clients of this process reuse it). Returns its URL, or ``None`` when a server is configured or
    this is not the main thread (where Ctrl-C is handled; the server then starts as Prefect starts it)."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or threading.current_thread() is not threading.main_thread():
        return None
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:  # a Ctrl-C meanwhile stays pending here and is delivered when the mask is restored
        with get_client(sync_client=True) as client:
            return str(client.api_url)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
