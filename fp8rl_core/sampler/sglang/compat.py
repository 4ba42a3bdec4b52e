"""Every workaround to SGLang's internals in one place, and the entry point of fp8rl's SGLang server process.

Rule: the SGLang engine (:mod:`.engine`) runs ``python -m fp8rl_core.sampler.sglang.compat <server args>`` in
``.venv-sglang``; this module installs :data:`WORKAROUNDS` (each written for :data:`SGLANG_VERSION`, each with a
test in tests/core/sampler/sglang/test_engine.py that fails once upstream makes it unnecessary or breaks it)
and starts SGLang's own HTTP server. SGLang spawns its scheduler processes, which import this module again as
``__mp_main__``, so the workarounds are in place there before SGLang's modules load. :func:`rpc` is the
custom weight loader every request of fp8rl goes through: SGLang 0.5.12 offers no per-rank call that returns
a value, so fp8rl's per-rank operations (:mod:`.worker`) travel as ``update_weights_from_tensor`` requests
whose one tensor name is the JSON call and whose answer each rank writes to a file. Long form: docs/gpu.md,
"Tensor-parallel ranks and SGLang" (The SGLang engine) and docs/design.md (Engines). Importing this module in
the caller's process imports nothing of SGLang (:func:`rpc_payload` is all the caller uses).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

__all__ = ["RPC", "SGLANG_VERSION", "WORKAROUNDS", "install", "rpc", "rpc_payload"]

#: the SGLang version every workaround below is written for (constraints-sglang.txt pins it)
SGLANG_VERSION = "0.5.12"
#: the custom weight loader fp8rl's requests name (``server_args.custom_weight_loader`` and ``load_format``)
RPC = "fp8rl_core.sampler.sglang.compat.rpc"

#: name → (where in SGLang 0.5.12, what goes wrong on a CPU torch without sgl-kernel, what this module does)
WORKAROUNDS = {
    "torchvision-ops": ("srt/utils/common.py imports torchvision.io",
                        "PyPI's torchvision links libtorch_cuda, its _meta_registrations fail: "
                        "'operator torchvision::nms does not exist'",
                        "define the schemas of torchvision::nms and ::qnms before torchvision loads"),
    "sgl-kernel-kvcacheio": ("srt/mem_cache/memory_pool_host.py:46 `from sgl_kernel.kvcacheio import ...`",
                             "imported unconditionally off NPU/XPU/MPS; the CPU kernel package is not on PyPI",
                             "a placeholder `sgl_kernel` with only `kvcacheio` (its functions raise if ever called); "
                             "every other sgl_kernel module stays absent so SGLang's own fallbacks stay in use"),
    "logits-pin-memory": ("srt/layers/logits_processor.py:541-546, 613-617 `torch.tensor(..., pin_memory=True)`",
                          "pinning needs an accelerator: log-probs of given tokens raise on CPU",
                          "that module's `torch.tensor` drops pin_memory when no accelerator is present"),
}

_KVCACHEIO = (
    "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct",
    "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf", "transfer_kv_per_layer_ph_lf",
)
_PLACEHOLDER = "fp8rl placeholder"


def _missing_kernel(name: str):
    def call(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.kvcacheio.{name}: sgl-kernel is not installed (fp8rl's placeholder "
                                  "for SGLang's import on CPU; the host KV cache is not supported)")
    call.__name__ = name
    return call


class _KernelPlaceholder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``sgl_kernel`` and ``sgl_kernel.kvcacheio`` when no real sgl-kernel is installed."""

    names = ("sgl_kernel", "sgl_kernel.kvcacheio")

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname == "sgl_kernel")

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = _PLACEHOLDER
        if module.__name__ == "sgl_kernel.kvcacheio":
            for name in _KVCACHEIO:
                setattr(module, name, _missing_kernel(name))


class _TorchWithoutPinning(types.ModuleType):
    """``torch`` for SGLang's logits processor: ``tensor(..., pin_memory=True)`` without an accelerator
    builds an ordinary tensor (what pinning would only speed up); everything else is torch's."""

    def __init__(self, torch) -> None:
        super().__init__("torch")
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def tensor(self, *args, pin_memory: bool = False, **kwargs):
        if pin_memory and self._torch.accelerator.is_available():
            return self._torch.tensor(*args, pin_memory=True, **kwargs)
        return self._torch.tensor(*args, **kwargs)


def _torchvision_ops() -> None:
    import torch

    for op in ("nms", "qnms"):
        try:
            torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:  # defined already (by torchvision's own C ops, or an earlier install)
            pass


def _kernel_placeholder() -> None:
    import importlib.util

    if any(isinstance(f, _KernelPlaceholder) for f in sys.meta_path):
        return
    if importlib.util.find_spec("sgl_kernel") is None:  # a real sgl-kernel is used as it is
        sys.meta_path.append(_KernelPlaceholder())


def _logits_without_pinning() -> None:
    import torch
    from sglang.srt.layers import logits_processor

    if not isinstance(logits_processor.torch, _TorchWithoutPinning):
        logits_processor.torch = _TorchWithoutPinning(torch)


def install() -> None:
    """Install every workaround (idempotent); SGLang's modules are imported here, after the first two."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    _torchvision_ops()
    _kernel_placeholder()
    _logits_without_pinning()


def rpc_payload(request: str) -> str:
    """One rank's ``serialized_named_tensors`` entry for :func:`rpc`: SGLang 0.5.12's format (base64 of a pickled
    list of (name, tensor), read by its ``SafeUnpickler``, each tensor then moved with ``.to(device)``), holding
    one empty tensor named ``request``. Built without SGLang (the caller's venv has none)."""
    import base64
    import pickle

    import torch

    return base64.b64encode(pickle.dumps([(request, torch.empty(0))])).decode()


def rpc(model, named_tensors) -> None:
    """SGLang's custom-loader signature, used as fp8rl's per-rank call: the one tensor's name is the JSON
    ``{"op", "args", "out"}``; the rank runs :func:`.worker.call` and writes its answer (or the error it
    raised) to ``<out>/rank<r>.json``. An error is answered, never raised: SGLang's scheduler dies on any
    exception of a custom loader."""
    from sglang.srt.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    from fp8rl_core.sampler.sglang import worker

    rank, tp = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    (request, _), = list(named_tensors)
    req = json.loads(request)
    try:
        answer = {"ok": True, "result": worker.call(model, rank, tp, req["op"], req.get("args", {}))}
    except Exception as e:  # noqa: BLE001 — the error crosses back instead of killing the engine
        answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    out = Path(req["out"])
    tmp = out / f".rank{rank}.json"
    tmp.write_text(json.dumps(answer))
    tmp.replace(out / f"rank{rank}.json")


def _exit_with_parent(parent: int) -> None:
    """End this server (its whole process tree) once the process that started it is gone: the server runs in a
    session of its own, so nothing else would stop it if its caller died without closing it."""
    import threading
    import time

    from sglang.srt.utils import kill_process_tree

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        kill_process_tree(os.getpid(), include_parent=True)

    threading.Thread(target=watch, name="fp8rl-parent-watch", daemon=True).start()


def main(argv: list[str]) -> None:
    """SGLang's ``launch_server`` with the workarounds installed (and ended with its caller: ``FP8RL_SGLANG_PARENT``)."""
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    if parent := os.environ.get("FP8RL_SGLANG_PARENT"):
        _exit_with_parent(int(parent))
    server_args = prepare_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if os.environ.get("FP8RL_SGLANG_SERVER") == "1":  # the server process and its spawned children
    install()

if __name__ == "__main__":
    main(sys.argv[1:])
