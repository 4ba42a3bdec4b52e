"""SIGTERM and SIGINT handled for the length of a block (a run that must end KILLED, a sweep that must
cancel its runs), the previous handlers restored after."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager

__all__ = ["on_signals"]


@contextmanager
def on_signals(react: Callable):
    """While the block runs, SIGTERM and SIGINT call ``react(signum, frame, previous_handler)``; the previous
    handlers come back after. Main thread only (elsewhere Python cannot install handlers: a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, frame: react(signum, frame, previous[signum]))
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
