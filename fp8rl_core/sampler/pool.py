"""The engine pool: live sampler engines reused across runs by identity, least recently used evicted.

Rule: an engine's identity is its engine name (:mod:`.engines`) and what it builds at start
(:func:`fp8rl_core.sampler.config.engine_key`); configurations with one identity share one engine,
re-synced (:func:`acquire`); at most ``max_live`` stay alive, an evicted one closes in the background
while the next starts, one in-process engine at most; :func:`release_all` closes them all and waits.
docs/library.md (Engine reuse).
"""

from __future__ import annotations

from collections.abc import Mapping
import threading
from pathlib import Path

import torch

from fp8rl_core.sampler.config import MX_GRID, SamplerConfig, engine_key
from fp8rl_core.sampler.engines import start_sampler
from fp8rl_core.sampler.seam import Sampler, SyncTiming, engine_config

__all__ = ["acquire", "closing", "release_all"]

_ENGINES: dict[tuple[str, str], Sampler] = {}
_CLOSING: dict[threading.Thread, Sampler] = {}
_LOCK = threading.Lock()


def _close_in_background(sampler: Sampler) -> None:
    if sampler.in_process:  # no process to tear down: its close is quick, and it must not overlap a start
        sampler.close()
        return

    def close() -> None:
        try:
            sampler.close()
        finally:
            with _LOCK:
                _CLOSING.pop(threading.current_thread(), None)

    # not a daemon: an interpreter exiting mid-shutdown waits for it (the engine's processes then free
    # their shared memory themselves)
    thread = threading.Thread(target=close, name="fp8rl-engine-close")
    with _LOCK:
        _CLOSING[thread] = sampler
    thread.start()


def closing() -> tuple[Sampler, ...]:
    """The engines whose shutdown started and has not finished yet."""
    with _LOCK:
        return tuple(_CLOSING.values())


def acquire(checkpoint: str | Path, schemes: Mapping[str, str], tensors: Mapping[str, torch.Tensor],
            cfg: SamplerConfig = SamplerConfig(), *, version: int = 0, mx_grid: str = MX_GRID,
            work_root: str | Path | None = None, max_live: int = 2) -> tuple[Sampler, SyncTiming | None]:
    """A live engine of ``cfg.engine`` (:mod:`.engines`) for (checkpoint config, schemes, cfg) loaded with ``tensors`` at
    ``version``: the running one when its key matches (then the weights are synced in — no second startup), else a
    new one, after shutting down the least recently used engines beyond ``max_live - 1`` (each holds its KV cache
    and worker processes). Returns the sampler and the sync timing (None for a fresh start).

    An engine's identity is its engine name and what it builds at start
    (:func:`fp8rl_core.sampler.config.engine_key`, :attr:`Sampler.key`): the model config, the per-layer schemes,
    dtype, KV-cache dtype, lengths and memory. Anything else — which learner the weights come from (BF16 or MXFP8),
    the sampling seed — is per sync or per request, so several sampler configurations with one key reuse one engine
    (:func:`acquire`); a test proves that an engine re-synced to weights A after serving weights B generates exactly
    what a freshly started engine on A generates. Each live engine holds its KV cache and worker processes, so at
    most ``max_live`` stay alive; :func:`release_all` shuts them down (a flow does so at its end).

    An evicted engine stops in the background: a spawned vLLM engine's close (:meth:`VllmSampler.close`) waits for
    vLLM's engine core and worker processes to exit, and most of that wait is each process's interpreter tearing
    down — its final garbage collection over vLLM's and torch's object graph (measured: bench/README.md, Engine
    shutdown). Waiting would add all of it to the next run's engine start, so :func:`acquire` hands the evicted
    engine to a thread and starts the next one meanwhile. The processes are still left to exit on their own (not
    killed): that is what frees their shared-memory queues (:data:`fp8rl_core.sampler.vllm.quiet.SHUTDOWN_S`).
    :func:`release_all` closes the live engines the same way, all at once, and returns when every shutdown it
    started, or an eviction started, has finished. An in-process engine (``SamplerConfig.process = "in-process"``)
    has no process to wait for: it is closed at once, in the caller's thread; and since vLLM keeps an in-process
    engine's parallel groups and worker extension process-wide, at most one in-process engine stays live
    (:func:`acquire` closes the live one before it starts another in-process engine).
    """
    key = (cfg.engine, engine_key(engine_config(checkpoint, schemes, mx_grid), cfg))
    live = _ENGINES.pop(key, None)
    if live is not None and not live.alive:  # died (or closed): its weights are gone, start afresh
        _close_in_background(live)
        live = None
    if live is not None:
        _ENGINES[key] = live  # most recently used last
        live.cfg = cfg
        return live, live.sync(tensors, version)
    if cfg.vllm.process == "in-process":  # at most one in-process engine per process (fp8rl_core.sampler.vllm.compat, 3)
        for k in [k for k, s in _ENGINES.items() if s.in_process]:
            _ENGINES.pop(k).close()
    while len(_ENGINES) >= max(1, max_live):
        _close_in_background(_ENGINES.pop(next(iter(_ENGINES))))
    sampler = start_sampler(checkpoint, schemes, tensors, cfg, version=version, mx_grid=mx_grid,
                            work_root=work_root)
    _ENGINES[key] = sampler
    return sampler, None


def release_all() -> None:
    """Shut every engine started by :func:`acquire` down (concurrently) and wait until each has stopped,
    evicted ones included."""
    for s in list(_ENGINES.values()):
        _close_in_background(s)
    _ENGINES.clear()
    with _LOCK:
        threads = list(_CLOSING)
    for t in threads:
        t.join()
