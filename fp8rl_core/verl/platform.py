"""verl's platform for a CPU-only host: ``PlatformCPU``, registered in verl's ``PlatformRegistry`` as ``cpu``.

verl 0.9.1 resolves one platform per process (``verl.plugin.platform.get_platform``; ``VERL_PLATFORM``
names it, the fallback is ``nvidia``) and asks it for the device module, the process-group backend, the
Ray resource its workers reserve and whether CUDA IPC exists. On a CPU host: the device is ``cpu``
(``torch.cpu``), the collective backend ``gloo``, no IPC (verl's weight transfer then takes its
shared-memory path) and Ray's resource ``GPU`` — verl's resource pools always reserve accelerators
(``use_gpu=True``), so a CPU node advertises rollout/actor slots as Ray GPUs (:data:`SLOTS_PER_NODE` by
default; ``ray_kwargs.ray_init.num_gpus``).

``current_device()`` returns ``"cpu"``, not an index: verl passes it straight to ``module.to(device=…)``,
FSDP's ``device_id`` and ``tensor.to(…)``, where an index means "the current accelerator". docs/gpu.md
(verl on CPU) lists what else is needed and :mod:`fp8rl_core.verl.patches` holds the upstream patches.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType
from typing import Any

import torch

__all__ = ["CPU_DEVICE", "PLATFORM", "SLOTS_PER_NODE", "PlatformCPU", "register"]

#: verl's platform name for it (``VERL_PLATFORM=cpu``)
PLATFORM = "cpu"
#: Ray "GPU" slots a CPU node advertises for verl's actor and rollout workers
SLOTS_PER_NODE = 2

_CLASS: type | None = None


class _CpuDeviceModule(ModuleType):
    """What verl calls on its device module (``get_torch_device()``), for the CPU: ``torch.cpu``'s own
    functions, and the CUDA caching-allocator calls (cache, IPC, memory statistics) as what they are on a
    CPU — nothing to free, no device memory in use."""

    def __init__(self) -> None:
        super().__init__("fp8rl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def ipc_collect() -> None:
        pass

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total


#: the device module verl's ``get_torch_device()`` returns on this platform
CPU_DEVICE = _CpuDeviceModule()


def _build() -> type:
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """verl on a CPU-only torch (module docstring)."""

        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self) -> ModuleType:
            return CPU_DEVICE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return not torch.cuda.is_available()

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            torch.cpu.synchronize()

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    PlatformCPU.__module__ = __name__
    PlatformCPU.__qualname__ = "PlatformCPU"
    return PlatformCPU


def register() -> type:
    """Register :class:`PlatformCPU` with the verl imported in this process (idempotent); returns it."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build()
    return _CLASS


def __getattr__(name: str) -> Any:
    """``PlatformCPU`` is built and registered on first access: verl's entry point (``verl.plugins``,
    pyproject.toml) names this attribute, so loading it at ``import verl`` registers the platform even in a
    process that imported this module before verl (an import alone would find it loaded and do nothing)."""
    if name == "PlatformCPU":
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if "verl" in sys.modules:  # imported after verl (with its plugins switched off, VERL_USE_EXTERNAL_PLUGINS=none)
    register()
