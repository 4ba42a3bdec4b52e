"""bench/engine.py, one in-process cycle on the tiny dense model, so the engine benchmark cannot rot: a start,
a sync, a generation and a close are each timed, and the close gives the engine's memory back."""

from __future__ import annotations

from bench.engine import cycles
from fp8rl_core.sampler.pool import release_all


def test_one_in_process_cycle_is_timed_in_every_part():
    release_all()  # one in-process engine per process: the engine tests' pool may still hold one
    (row,) = cycles("qwen3-dense-tiny", "in-process", 1)
    assert row["model"] == "qwen3-dense-tiny" and row["process"] == "in-process"
    assert all(row[k] > 0 for k in ("start", "sync", "generate", "close", "rss_mb"))
