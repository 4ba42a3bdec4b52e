"""fp8rl's vLLM rollout for verl: what the learner sends at each sync, and the classes verl runs it with.

At each sync verl hands the rollout adapter ``(name, tensor)`` pairs in Hugging Face checkpoint names;
fp8rl changes *what* is sent, not how (:func:`mxfp8_weights`): a layer the rollout holds on the learner's
grid goes as uint8 E4M3 bytes plus ``…weight_scale`` (uint8 E8M0, 1×32 blocks along K), quantized from the
master weight by Transformer Engine's rule (TE's ``MXFP8Quantizer`` on a GPU, :func:`fp8rl_core.grids.quantize`
otherwise — the CPU learner's fprop bytes); every other tensor as its BF16 view. verl's own
``BucketedWeightSender``/``Receiver`` carry the pairs unchanged.

The classes (built on first attribute access; importing this module loads neither verl nor Ray):
``Fp8rlServerAdapter`` (verl's ``ServerAdapter`` sending :func:`mxfp8_weights` and the sync's version),
``Fp8rlHttpServer`` (verl's ``vLLMHttpServer`` with fp8rl's worker extension and a ``collective_rpc`` that
returns the workers' results), ``Fp8rlReplica`` (launches it) and ``Fp8rlVerlWorkerExtension`` (fp8rl's
worker extension mixed with verl's; receives with verl's receiver and loads through ``fp8rl_load_shards``
with the payload's sync hooks). verl's name ``"vllm"`` is kept so verl's ``name == "vllm"`` branches apply.
The long form: docs/gpu.md, "The rollout through verl".
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from fp8rl_core.grids import bf16_view, quantize
from fp8rl_core.grids.schemes import Sent, layer_scheme
from fp8rl_core.grids.te import compact_rowwise_scales
from fp8rl_core.sync.layout import sync_name
from fp8rl_core.verl.costs import COSTS_FILE, append_cost
from fp8rl_core.verl.startup import STARTUP_FILE, mark

__all__ = ["TE_GRID", "mxfp8_weights", "quantize_rowwise", "scale_name"]

#: the MXFP8 grid Transformer Engine quantizes on (E4M3 elements, rceil E8M0 scales): the only one TE's
#: quantizer may produce here
TE_GRID = "mxfp8-e4m3-rceil"


def scale_name(weight_name: str) -> str:
    """``X.weight`` → ``X.weight_scale``: where the E8M0 scales of an on-grid weight travel."""
    return f"{weight_name}_scale"


def _te_rowwise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """TE's own rowwise MXFP8 bytes of ``w`` (compact [N, K/32] scales), or None without TE / a GPU."""
    if not w.is_cuda:
        return None
    try:
        import transformer_engine.pytorch as te
        import transformer_engine_torch as tex
    except ImportError:
        return None
    q = te.MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    t = q(w.reshape(-1, w.shape[-1]).contiguous())
    if getattr(t, "_with_gemm_swizzled_scales", False):
        raise RuntimeError("TE returned GEMM-swizzled MXFP8 scales; the export cuts unswizzled ones (optimize_for_gemm off)")
    data = t._rowwise_data.view(torch.uint8).reshape(w.shape)
    return data, compact_rowwise_scales(t._rowwise_scale_inv, w.shape)  # TE pads: fp8rl_core.grids.te


def quantize_rowwise(w: torch.Tensor, grid: str = TE_GRID) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 E4M3 data, uint8 E8M0 scales per 1×32 block along the last dim) of ``w`` on ``grid``:
    Transformer Engine's quantizer for TE's grid when importable (GPU), :func:`fp8rl_core.grids.quantize`
    otherwise — the two agree bit for bit on TE's rule (bench/gpu.py checks CUDA against CPU)."""
    te = _te_rowwise(w) if grid == TE_GRID else None
    if te is not None:
        return te
    qt = quantize(w.detach(), grid, axis=-1)
    return qt.data.contiguous().view(torch.uint8), qt.scale.contiguous()


def mxfp8_weights(weights: Iterable[tuple[str, torch.Tensor]], schemes: Mapping[str, str],
                  grid: str = TE_GRID) -> Iterator[tuple[str, torch.Tensor]]:
    """What fp8rl sends for verl's stream ``weights`` (checkpoint names), lazily, in order (see the module
    docstring). ``schemes``: vLLM layer prefix → scheme, as in the rollout's ``quantization_config``."""
    for name, t in weights:
        prefix = sync_name(name).rpartition(".")[0]
        if name.endswith(".weight") and layer_scheme(schemes, prefix).sent is Sent.BYTES:
            data, scale = quantize_rowwise(t, grid)
            yield name, data
            yield scale_name(name), scale
        elif t.is_floating_point():
            yield name, bf16_view(t.detach())
        else:
            yield name, t


# ------------------------------------------------------------------------------------------------------
# verl's classes, subclassed on first use
# ------------------------------------------------------------------------------------------------------
def _cls(name: str) -> type:
    return globals()[name] if name in globals() else __getattr__(name)


def _server_adapter() -> type:
    from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

    class Fp8rlServerAdapter(ServerAdapter):
        """verl's vLLM adapter sending the learner's MXFP8 bytes (module docstring), then checking the sync."""

        fp8rl_checks = None

        async def update_weights(self, weights, global_steps: int | None = None,
                                 wire_format: str = "named_tensors", **kwargs):
            import asyncio

            if wire_format != "named_tensors":
                raise ValueError(f"fp8rl's rollout sends whole MXFP8 tensors (wire_format='named_tensors'); "
                                 f"got {wire_format!r}: BF16 deltas would bypass the learner's grid")
            from fp8rl_core.verl.payload import payload

            run = payload()
            version = int(global_steps or 0)
            timeline = bool(run is not None and run.reports and self.rollout_rank == 0)
            if timeline:  # fp8rl_core.verl.startup: the sync's start and end
                mark(Path(run.reports).parent / STARTUP_FILE, "sync_start", version=version)
            schemes, grid = (run.rollout_schemes, run.mx_grid) if run is not None else ({}, TE_GRID)
            checks = self._fp8rl_sync_checks(run, schemes, grid)
            masters: dict[str, torch.Tensor] = {}
            cost: dict[str, float] = {"keep_s": 0.0}
            weights = _timed(weights, cost, "source")  # verl's own stream (its gathering of the weights)
            t0 = time.perf_counter()
            if checks is not None:
                await asyncio.to_thread(checks.before_sync)
                weights = _kept(weights, masters, cost)
            checks_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = await super().update_weights(_timed(mxfp8_weights(weights, schemes, grid), cost, "pulled"),
                                               global_steps=global_steps, fp8rl_version=version, **kwargs)
            update_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            if checks is not None:
                await asyncio.to_thread(checks.after_sync, masters, version)
            checks_s += time.perf_counter() - t0
            if timeline:  # fp8rl_core.verl.costs: fp8rl's part
                own = cost["pulled"] - cost["source"]  # producing fp8rl's stream, less verl's
                append_cost(Path(run.reports).parent / COSTS_FILE, version,
                            {"export_s": own - cost["keep_s"], "update_s": update_s - own,
                             "keep_s": cost["keep_s"], "checks_s": checks_s})
                mark(Path(run.reports).parent / STARTUP_FILE, "sync_done", version=version)
            return out

        def _fp8rl_sync_checks(self, run, schemes: dict[str, str], grid: str):
            """The replica's :class:`~fp8rl_core.verl.checking.SyncChecks` by the run's payload ``run``
            (rollout rank 0 of each replica checks every rank of its engine; no payload: none)."""
            if self.fp8rl_checks is not None or self.rollout_rank != 0:
                return self.fp8rl_checks
            from fp8rl_core.verl.checking import SyncChecks
            from fp8rl_core.verl.server_sampler import ServerSampler

            if run is None or not self._ensure_server_handle():
                return None
            work = Path(run.reports or tempfile.gettempdir()).parent / "checks"
            sampler = ServerSampler(self.server_handle, self.model_config.local_path, schemes, grid, work,
                                    instance=f"verl-replica-{self.replica_rank}-{os.getpid()}")
            self.fp8rl_checks = SyncChecks(sampler, run, self.model_config.local_path)
            return self.fp8rl_checks

    return Fp8rlServerAdapter


def _timed(items: Iterable, into: dict[str, float], key: str) -> Iterator:
    """``items`` unchanged; the seconds spent producing them added to ``into[key]``."""
    into[key] = into.get(key, 0.0)
    it = iter(items)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            into[key] += time.perf_counter() - t0
            return
        into[key] += time.perf_counter() - t0
        yield item


def _kept(weights: Iterable[tuple[str, torch.Tensor]], into: dict[str, torch.Tensor],
          cost: dict[str, float] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` unchanged, each floating tensor also kept in ``into`` (a CPU copy): the learner's weights
    of this sync, from which the checks derive what the engine must hold; the copies' seconds added to
    ``cost["keep_s"]``."""
    for name, t in weights:
        if t.is_floating_point():
            t0 = time.perf_counter()
            into[name] = t.detach().to("cpu", copy=True)
            if cost is not None:
                cost["keep_s"] = cost.get("keep_s", 0.0) + time.perf_counter() - t0
        yield name, t


def _http_server() -> type:
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from fp8rl_core.verl.overrides import WORKER_EXTENSION

    class Fp8rlHttpServer(vLLMHttpServer):
        """verl's vLLM server with fp8rl's worker extension; RPC results come back; its ``server`` and
        ``server_up`` milestones (:mod:`fp8rl_core.verl.startup`)."""

        def __init__(self, *args, **kwargs):
            _mark_server("server")
            super().__init__(*args, **kwargs)

        async def launch_server(self, *args, **kwargs):
            out = await super().launch_server(*args, **kwargs)
            _mark_server("server_up")
            return out

        def _get_worker_extension_cls(self) -> str:
            return WORKER_EXTENSION

        async def collective_rpc(self, method, timeout: float | None = None, args: tuple = (),
                                 kwargs: dict[str, Any] | None = None):
            return await self.engine.collective_rpc(method=method, timeout=timeout, args=args, kwargs=kwargs)

        async def fp8rl_utility(self, method: str, *args):
            """An engine-core utility (:func:`fp8rl_core.sampler.vllm.compat.patch_engine_core`'s snapshot)."""
            return await self.engine.engine_core.call_utility_async(method, *args)

        async def fp8rl_generate(self, prompts: list, params) -> list:
            """The final outputs of one request per prompt (the checks' probe batch), in order."""
            import asyncio
            import uuid

            async def one(i: int, prompt):
                final = None
                async for out in self.engine.generate(prompt, params, request_id=f"fp8rl-{uuid.uuid4().hex}-{i}"):
                    final = out
                return final

            return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    return Fp8rlHttpServer


def _mark_server(milestone: str) -> None:
    """The vLLM server actor's ``milestone`` in the run's ``startup.jsonl`` (no payload: none)."""
    from fp8rl_core.verl.payload import payload

    run = payload()
    if run is not None and run.reports:
        mark(Path(run.reports).parent / STARTUP_FILE, milestone, pid=os.getpid())


def _replica() -> type:
    from verl.workers.rollout.vllm_rollout import vllm_async_server

    server = _cls("Fp8rlHttpServer")

    class Fp8rlReplica(vllm_async_server.vLLMReplica):
        """verl's vLLM replica launching :class:`Fp8rlHttpServer` as its Ray actor."""

        def __init__(self, *args, **kwargs):
            import ray  # lazily, as verl does: only verl's driver builds a replica (tests/core/test_purity.py)

            super().__init__(*args, **kwargs)
            self.server_class = ray.remote(server)

    return Fp8rlReplica


def _worker_extension() -> type:
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    from fp8rl_core.sampler.vllm.worker import Fp8rlWorkerExtension
    from fp8rl_core.sync.hooks import NO_HOOKS
    from fp8rl_core.verl.payload import payload

    class Fp8rlVerlWorkerExtension(Fp8rlWorkerExtension, vLLMColocateWorkerExtension):
        """fp8rl's RPCs + verl's colocate extension; verl's transfer feeds fp8rl's load (module docstring)."""

        def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done: bool = False,
                                    use_shm: bool = False, fp8rl_version: int | None = None) -> dict | None:
            if peft_config:  # LoRA adapters: verl's own path
                return super().update_weights_from_ipc(peft_config, base_sync_done, use_shm)
            device = self.device if self.device is not None else torch.device("cpu")
            receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=device, use_shm=use_shm)
            shards: list[tuple[str, torch.Tensor]] = []
            # the receiver reuses its buffer per bucket: keep copies until the whole sync is in (vLLM's
            # layer-wise reload post-processes a fused layer once all of its shards have arrived)
            receiver.receive_weights(lambda ws, is_last: shards.extend((n, t.clone()) for n, t in ws))
            version = self.fp8rl_weight_version + 1 if fp8rl_version is None else int(fp8rl_version)
            run = payload()
            hooks = run.hooks.at(self.fp8rl_tp_rank()["rank"], version) if run is not None else NO_HOOKS
            return self.fp8rl_load_shards(shards, version, hooks.worker_hook())

    return Fp8rlVerlWorkerExtension


_BUILDERS = {"Fp8rlServerAdapter": _server_adapter, "Fp8rlHttpServer": _http_server, "Fp8rlReplica": _replica,
             "Fp8rlVerlWorkerExtension": _worker_extension}


def __getattr__(name: str) -> Any:
    if name in _BUILDERS:
        cls = _BUILDERS[name]()
        cls.__module__ = __name__
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

