"""Every change fp8rl makes to verl's internals for a CPU host, each with the version it applies to.

One place for them (docs/gpu.md, "verl on CPU"). Each patch has a ``*_needed`` function that inspects the
installed upstream and says whether it still is; tests/verl/test_patches.py asserts each is needed and
works, so a verl release that fixes (or moves) the code fails that test instead of silently diverging.

``process_group_backend``   verl 0.9.1 ``verl.utils.distributed.initialize_global_process_group_ray``
                            builds the backend string ``cpu:gloo,{device}:{backend}`` — on the CPU platform
                            ``cpu:gloo,cpu:gloo``, which torch refuses (a device type named twice). The
                            actor workers' call (``verl.workers.engine_workers``) gets ``gloo`` instead.

Wrapped, not changed (verl's function still runs, unchanged; fp8rl reads what it was given):

``calculate_debug_metrics`` verl 0.9.1 ``verl.utils.debug.metrics.calculate_debug_metrics(data)``, which both
                            trainers call once per RL step with the batch's sampled tokens and both sides'
                            log-probs — bound at import in ``verl.trainer.ppo.v1.trainer_base`` (the default
                            trainer), imported at call time in ``RayPPOTrainer.fit`` (the legacy one). Wrapped
                            in the trainer process to capture each step's tokens (:mod:`fp8rl_core.verl.capture`);
                            tests/verl/test_capture.py fails when verl renames or moves it.

What needs no patch: the device and its module, the ``gloo`` collective backend, no CUDA IPC and Ray's
resource name are the platform's (:mod:`fp8rl_core.verl.platform`); the FSDP engine for ``cpu`` is a
registry entry (:mod:`fp8rl_core.verl.engine`); vLLM's sleep mode is off by config
(:mod:`fp8rl_core.verl.overrides`); vLLM-CPU's packed weights are reloaded by fp8rl's worker extension.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["VERL_VERSION", "apply", "process_group_backend_needed"]

#: the verl release these patches are written against
VERL_VERSION = "0.9.1"

_APPLIED: set[str] = set()


def default_backend() -> str:
    """The backend string verl's ``initialize_global_process_group_ray`` builds by default on this platform."""
    import inspect

    from verl.utils import distributed
    from verl.utils.device import get_device_name, get_nccl_backend

    src = inspect.getsource(distributed.initialize_global_process_group_ray)
    if 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' not in src:
        return "(changed upstream)"
    return f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"


def _duplicate_device(backend: str) -> bool:
    devices = [part.split(":", 1)[0] for part in backend.split(",") if ":" in part]
    return len(devices) != len(set(devices))


def process_group_backend_needed() -> bool:
    """Whether verl's default process-group backend names a device type twice on this platform."""
    return _duplicate_device(default_backend())


def _patch_process_group_backend() -> None:
    from verl.utils import distributed
    from verl.workers import engine_workers

    upstream = distributed.initialize_global_process_group_ray

    @functools.wraps(upstream)
    def initialize(timeout_second: Any = None, backend: str | None = None) -> Any:
        if backend is None and process_group_backend_needed():
            backend = "gloo"
        return upstream(timeout_second=timeout_second, backend=backend)

    initialize.fp8rl_patch = "process_group_backend"
    engine_workers.initialize_global_process_group_ray = initialize


def apply() -> list[str]:
    """Apply the patches this host needs (idempotent); returns the names applied in this process."""
    import torch

    if torch.cuda.is_available():
        return []
    if "process_group_backend" not in _APPLIED and process_group_backend_needed():
        _patch_process_group_backend()
        _APPLIED.add("process_group_backend")
    return sorted(_APPLIED)
