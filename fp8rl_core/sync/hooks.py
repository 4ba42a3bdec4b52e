"""Hooks on the weight-sync path: the points where something other than production may act.

Production passes nothing and gets :data:`NO_HOOKS` (every hook a no-op). The fault catalogue
(:class:`fp8rl_core.checks.faults.Fault`) subclasses :class:`SyncHooks` to perturb exactly one step of
the *real* path — the exporter, the transport files, the worker's in-place load, the cache reset —
which is what makes the detection matrix honest: nothing else of the path is replaced.

Where each hook is called::

    start_pipeline   schemes_for_engine(configured)    the schemes the engine and exporter use
    sync_weights     on_export(pipe, tensors)          after export_weights, before any transport
                     skips_replica(index)              replica ``index`` gets no sync
    Sampler.sync     sync_bucket_mb(configured)        the sync's bucket size
                     on_transport(handle)              the written sync, before the engine reads it
                     worker_hook()                     "module:function" the worker calls around its reload
                     resets_prefix_cache()             whether the cache is reset after the load
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NO_HOOKS", "SyncHooks"]


class SyncHooks:
    """No-op hooks (see the module docstring); subclass and override what you perturb."""

    def schemes_for_engine(self, configured: Mapping[str, str]) -> Mapping[str, str]:
        return configured

    def on_export(self, pipe: Any, tensors: dict) -> dict:
        return tensors

    def skips_replica(self, index: int) -> bool:
        return False

    def sync_bucket_mb(self, configured: float) -> float:
        return configured

    def on_transport(self, handle: Any) -> None:
        return None

    def worker_hook(self) -> str | None:
        """``"module:function"`` called in the engine's worker with (worker, phase) around the reload."""
        return None

    def resets_prefix_cache(self) -> bool:
        return True


NO_HOOKS = SyncHooks()
