"""Per-micro-batch timers: where the learner's time goes (quantization, GEMMs, everything else).

The MXFP8 emulation reports the seconds it spends quantizing operands and multiplying them into the
*active* :class:`Timers` (if any); the training step measures wall time around each micro-batch and
attributes the remainder to ``other``. Timing is opt-in and costs two ``perf_counter`` calls per event.

    timers = Timers()
    with timers.active():
        loss = model(...)            # MXFP8 layers call timers.add("quantize", dt) / ("gemm", dt)
    timers.totals()                  # {"quantize": ..., "gemm": ...}
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from typing import Iterator

import torch

__all__ = ["Timers", "current", "timed"]

_local = threading.local()


class Timers:
    """Accumulates seconds per kind (``quantize``, ``gemm``, ...) and event counts."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, kind: str, seconds: float) -> None:
        self.seconds[kind] += seconds
        self.counts[kind] += 1

    def totals(self) -> dict[str, float]:
        return dict(self.seconds)

    @contextlib.contextmanager
    def active(self) -> Iterator["Timers"]:
        """Make this the timer that :func:`timed` reports to (nestable; restores the previous one)."""
        prev = getattr(_local, "timers", None)
        _local.timers = self
        try:
            yield self
        finally:
            _local.timers = prev


def current() -> Timers | None:
    """The active :class:`Timers`, or None when nobody is timing."""
    return getattr(_local, "timers", None)


@contextlib.contextmanager
def timed(kind: str) -> Iterator[None]:
    """Add the wall time of the block to the active timers under ``kind`` (no-op when none is active).
    While a torch.profiler is recording, the block is also a ``record_function(kind)`` range, so a
    trace shows the learner's phases by name (:func:`fp8rl_core.metrics.trace.phase_times`)."""
    label = torch.profiler.record_function(kind) if torch.autograd._profiler_enabled() else contextlib.nullcontext()
    t = current()
    with label:
        if t is None:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t.add(kind, time.perf_counter() - t0)
