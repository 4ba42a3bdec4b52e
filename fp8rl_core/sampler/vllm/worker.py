"""The vLLM worker extension: load a sync in place, report the weight version, read weights back.

Rule: vLLM mixes ``worker_extension_cls`` into its worker class, so these methods run inside the worker
process, next to the model, called with ``LLM.collective_rpc(name, args=...)``; their names start with
``fp8rl_`` (the worker has an ``update_weights`` of its own). Loads go through vLLM's in-place reload
path (:meth:`fp8rl_load`), read-back through files (:meth:`fp8rl_read`), per-rank checks return only
their verdict (:meth:`fp8rl_check_rank`). Described in docs/library.md (The sampler and the weight sync).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from fp8rl_core.grids.schemes import Scheme, scheme
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import ModelLayout, sync_name, to_checkpoint
from fp8rl_core.sync.ranks import check_rank_tensors
from fp8rl_core.sync.transport import read_manifest, read_sync

__all__ = ["Fp8rlWorkerExtension"]


def _prefix(module_name: str) -> str:
    return module_name.removesuffix(".routed_experts")


def _held(s: Scheme, module: torch.nn.Module, base: str, w: str):
    """(read-back name, tensor) of the FP8 bytes a layer of scheme ``s`` holds besides its ``weight``, under the
    scheme's names (:attr:`~fp8rl_core.grids.schemes.Scheme.held`; ``base``: the layer's prefix and dot, with
    ``w13_`` / ``w2_`` for experts; ``w``: the expert weight, "" for a linear layer)."""
    if not s.quantized:
        return
    data_name, scale_name = s.held
    if s.on_learner_grid:  # the synced bytes themselves: the weight (read as such) and its scale parameter
        yield f"{base}{scale_name}", getattr(module, f"{w}_weight_scale" if w else "weight_scale")
        return
    sfx = f"_{w}" if w else ""
    yield f"{base}{data_name}", getattr(module, f"fp8rl_data{sfx}").view(torch.uint8)
    yield f"{base}{scale_name}", getattr(module, f"fp8rl_scale{sfx}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so -0.0 differs from 0.0 and a NaN equals itself)."""
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.uint8)


def _where_differs(name: str, copy: torch.Tensor, derived: torch.Tensor) -> str:
    """``name`` with the expert (for [E, N, K] experts) and first element where the compute copy differs."""
    if copy.shape != derived.shape:
        return f"{name}: compute copy shape {list(copy.shape)} ≠ held bytes' {list(derived.shape)}"
    diff = (_bits(copy) != _bits(derived)).nonzero()
    if diff.numel() == 0:  # bytes equal, fingerprints not: cannot happen for a deterministic fingerprint
        return f"{name}: compute copy fingerprint differs"
    first = [int(i) for i in diff[0]]
    expert = f" expert {first[0]}" if copy.dim() == 3 else ""
    idx = first[1:] if copy.dim() == 3 else first
    return (f"{name}{expert}: compute copy ≠ dequantized held bytes at {idx} ({copy[tuple(first)].item():g} vs "
            f"{derived[tuple(first)].item():g}; {int(diff.shape[0])} elements differ)")


class Fp8rlWorkerExtension:
    """Methods mixed into vLLM's worker (the ``fp8rl_*`` RPCs)."""

    fp8rl_weight_version: int = 0
    fp8rl_load_count: int = 0

    # -- weights in ---------------------------------------------------------------------------------
    def fp8rl_load(self, manifest_path: str, hook: str | None = None) -> dict:
        """Load the sync at ``manifest_path`` in place; the engine's version becomes the sync's, and
        every sync tensor read is tagged with it (the engine's own record of what this sync wrote, W1).
        ``hook`` (``"module:function"``, :meth:`fp8rl_core.sync.hooks.SyncHooks.worker_hook`) is called
        with the worker and the phase ("before", "after") around the reload — only the fault catalogue
        (:mod:`fp8rl_core.checks.faults`) names one.

        The manifest path of a sync (:mod:`fp8rl_core.sync.transport`) is read
        bucket by bucket; each sync tensor is split into checkpoint-format shards
        (:func:`~fp8rl_core.sync.layout.to_checkpoint`) and fed to vLLM's in-place reload path
        (``model_runner.reload_weights(weights_iterator=…)``): layers are rebuilt from their recorded
        metadata, loaded through vLLM's own weight loaders, post-load processing runs once per layer when all
        of a layer's elements have arrived, and the results are copied into the live tensors. A layer that
        receives nothing keeps its old tensors (vLLM's fallback) — exactly the silent failure W1 guards.
        """
        t0 = time.perf_counter()
        manifest = read_manifest(manifest_path)
        layout = ModelLayout.from_hf_config(self.model_runner.model_config.hf_config)
        version = int(manifest["version"])
        written = self.__dict__.setdefault("fp8rl_written", {})
        count = 0

        def shards():
            nonlocal count
            for name, tensor in read_sync(manifest_path):
                count += 1
                written[name] = version
                yield from to_checkpoint(name, tensor, layout)

        self._fp8rl_reload(shards(), version, hook)
        return {"version": self.fp8rl_weight_version, "tensors": count, "seconds": time.perf_counter() - t0}

    def fp8rl_load_shards(self, shards: list[tuple[str, torch.Tensor]], version: int, hook: str | None = None) -> dict:
        """Load checkpoint-format ``shards`` (HF names, :func:`~fp8rl_core.sync.layout.to_checkpoint`'s
        output: what verl's weight transfer delivers) in place, through the same reload path as
        :meth:`fp8rl_load` (``hook`` as there); every sync tensor a shard belongs to is tagged with
        ``version`` (W1)."""
        t0 = time.perf_counter()
        written = self.__dict__.setdefault("fp8rl_written", {})
        for name, _ in shards:
            written[sync_name(name)] = int(version)
        self._fp8rl_reload(iter(shards), int(version), hook)
        return {"version": self.fp8rl_weight_version, "tensors": len(shards), "seconds": time.perf_counter() - t0}

    def _fp8rl_reload(self, shards, version: int, hook: str | None) -> None:
        around = None
        if hook:
            module, _, fn = hook.partition(":")
            around = getattr(importlib.import_module(module), fn)
            around(self, "before")
        self.model_runner.reload_weights(weights_iterator=shards)
        if around is not None:
            around(self, "after")
        self.fp8rl_weight_version = version
        self.fp8rl_load_count += 1

    def fp8rl_set_version(self, version: int, names: list[str] | None = None) -> int:
        """Set the engine's version (at start: the initial load wrote ``names`` at ``version``)."""
        self.fp8rl_weight_version = int(version)
        if names is not None:
            self.__dict__["fp8rl_written"] = {n: int(version) for n in names}
            self._fp8rl_engine_start()
        return self.fp8rl_weight_version

    def fp8rl_version(self) -> int:
        return self.fp8rl_weight_version

    def fp8rl_limit_vocabulary(self, emittable: int | None) -> int | None:
        """Mask the logits of ids ≥ ``emittable`` (None: none) — the vocabulary tail's rule
        (:mod:`fp8rl_core.sampler.vllm.vocab_mask`); returns the limit now in force."""
        from fp8rl_core.sampler.vllm.vocab_mask import limit_vocabulary

        return limit_vocabulary(self.model_runner.get_model(), emittable)

    # -- introspection --------------------------------------------------------------------------------
    def _fp8rl_layers(self):
        model = self.model_runner.get_model()
        for name, module in model.named_modules():
            scheme = getattr(getattr(module, "quant_method", None), "fp8rl_scheme", None)
            if scheme is not None:
                yield _prefix(name), module, scheme

    def fp8rl_layers(self) -> dict[str, dict]:
        """Per vLLM layer: its scheme and how many times post-load processing ran on it."""
        return {p: {"scheme": s, "processed": int(getattr(m, "fp8rl_processed", 0)), "type": type(m).__name__}
                for p, m, s in self._fp8rl_layers()}

    @torch.no_grad()
    def _fp8rl_probe(self, module: torch.nn.Module) -> torch.Tensor:
        k = getattr(module, "input_size_per_partition", None) or module.input_size
        dtype = self.model_runner.model_config.dtype
        eye = torch.eye(k, dtype=dtype, device=self.device)
        return module.quant_method.apply(module, eye).t().contiguous()

    def _fp8rl_tensors(self, effective: bool = False):
        """(sync name, tensor) of everything the engine computes with (see :meth:`fp8rl_read`)."""
        owned: set[int] = set()
        for prefix, module, name in self._fp8rl_layers():
            owned.update(id(p) for p in module.parameters(recurse=False))
            s = scheme(name)
            if hasattr(module, "w13_weight"):
                for w in ("w13", "w2"):
                    yield f"{prefix}.{w}_weight", getattr(module, f"{w}_weight")
                    yield from _held(s, module, f"{prefix}.{w}_", w)
                continue
            if not s.quantized:
                yield f"{prefix}.weight", self._fp8rl_probe(module)
                continue
            w = module.weight
            yield f"{prefix}.weight", w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn else w
            yield from _held(s, module, f"{prefix}.", "")
            if effective:
                yield f"{prefix}.effective", self._fp8rl_probe(module)
        for name, p in self.model_runner.get_model().named_parameters():
            if id(p) not in owned:
                yield name, p

    @torch.no_grad()
    def fp8rl_read(self, out_path: str, names: list[str] | None = None, effective: bool = False) -> dict:
        """Write what the engine computes with to ``out_path`` (safetensors); returns counts.

        What the engine computes with, under sync-tensor names, written to a
        safetensors file whose path is returned (tensors do not travel as RPC results either). For the
        plugin's FP8 layers the held bytes (``weight``, ``weight_scale``; a layer that quantizes itself —
        ``requant``, ``block128`` — the received BF16 ``weight`` and its own bytes: ``mx_data`` / ``mx_scale``,
        ``fp8_data`` / ``fp8_scale_inv``); for prepacked BF16 layers — the
        CPU worker packs the weight for oneDNN and empties ``weight`` — the *effective* weight recovered by a
        probe forward of the layer with an identity input: ``I · Wᵀ = Wᵀ`` exactly (every output element is
        one product with 1.0). ``effective=True`` probes the plugin's layers too (their dequantized operand).
        """
        wanted = None if names is None else set(names)
        out = {n: t.detach().cpu().contiguous().clone() for n, t in self._fp8rl_tensors(effective)
               if wanted is None or n in wanted}
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        save_file(out, out_path, metadata={"version": str(self.fp8rl_weight_version)})
        return {"version": self.fp8rl_weight_version, "tensors": len(out)}

    @torch.no_grad()
    def fp8rl_state(self, with_fingerprints: bool = True) -> dict:
        """The cheap-tier snapshot in one call: version, which sync version last wrote each tensor,
        per-layer scheme / processing count / fused output sizes / type, a fingerprint of every
        tensor the engine computes with (:mod:`fp8rl_core.sync.fingerprint`, computed on the device the
        tensors live on, small ones in one batch; only the 8-byte digests cross), and the cheap tier of
        :meth:`fp8rl_compute_check`."""
        from fp8rl_core.sync.fingerprint import fingerprints

        layers = {}
        for p, m, s in self._fp8rl_layers():
            sizes = getattr(m, "output_partition_sizes", None)
            layers[p] = {"scheme": s, "processed": int(getattr(m, "fp8rl_processed", 0)), "type": type(m).__name__,
                         "sizes": [int(x) for x in sizes] if sizes else None}
        tensors = list(self._fp8rl_tensors())
        shapes = {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in tensors}
        fps = fingerprints(tensors) if with_fingerprints else {}
        compute = self.fp8rl_compute_check(False) if with_fingerprints else None
        start = self._fp8rl_engine_start()
        return {"version": self.fp8rl_weight_version, "written": dict(self.__dict__.get("fp8rl_written", {})),
                "layers": layers, "fingerprints": fps, "shapes": shapes, "compute": compute,
                "engine_state": self.fp8rl_engine_state(start) if with_fingerprints else None}

    # -- the engine's other state (fp8rl_core.sampler.engine_state) --------------------------------------
    def _fp8rl_engine_start(self) -> dict:
        """This rank's record of its model's other state at the engine's start: taken at the start's
        ``fp8rl_set_version`` (native engines) or the first snapshot (an engine started by verl), kept after."""
        from fp8rl_core.sampler.engine_state import record

        if "fp8rl_engine_start" not in self.__dict__:
            self.__dict__["fp8rl_engine_start"] = record(self.model_runner.get_model())
        return self.__dict__["fp8rl_engine_start"]

    @torch.no_grad()
    def fp8rl_engine_state(self, start: dict | None = None) -> dict:
        """This rank's other state (every buffer, tensor attribute and plain module attribute no sync writes)
        against its engine start, and the attributes with a counterpart in the learner's config
        (:data:`fp8rl_core.sampler.vllm.attributes.COUNTERPARTS`); only the verdict and those values cross
        (:func:`fp8rl_core.sampler.engine_state.compare`)."""
        from fp8rl_core.sampler.engine_state import compare
        from fp8rl_core.sampler.vllm.attributes import COUNTERPARTS

        where = self.fp8rl_tp_rank()
        return compare(self.model_runner.get_model(), start or self._fp8rl_engine_start(), where["rank"], where["tp"],
                       COUNTERPARTS)

    # -- the compute copy ---------------------------------------------------------------------------
    def _fp8rl_compute_pairs(self):
        """(name, copy the engine computes with, that copy derived again from the held bytes) for every
        quantized tensor on this rank, experts included (each [E, N, K]); and {layer: why not checked} for
        the layers whose compute form has no second copy here (docs/correctness.md, The compute copy)."""
        pairs, skipped = [], {}
        for prefix, module, name in self._fp8rl_layers():
            experts = hasattr(module, "w13_weight")
            s = scheme(name)
            if not s.quantized:
                skipped[prefix] = ("BF16 experts: vLLM's kernel computes from the held weights" if experts else
                                   "BF16: the CPU kernel's prepacked weight is the only copy (read by probe, W4)")
                continue
            method = module.quant_method
            for w in (("w13", "w2") if experts else ("",)):
                sfx = f"_{w}" if w else ""
                copy = getattr(module, f"fp8rl_w{sfx}", None)
                if copy is None:
                    skipped[prefix] = f"{type(method).__name__}: the kernel computes from the held bytes"
                    break
                if s.on_learner_grid:  # the synced bytes themselves
                    data = getattr(module, f"{w}_weight" if w else "weight").data
                    scale = getattr(module, f"{w}_weight_scale" if w else "weight_scale").data
                else:  # the bytes the layer made of the BF16 view itself
                    data, scale = getattr(module, f"fp8rl_data{sfx}"), getattr(module, f"fp8rl_scale{sfx}")
                derived = s.dequantize_held(data, scale, method.scheme.grid)
                pairs.append((f"{prefix}.{w}_weight" if w else f"{prefix}.weight", copy, derived))
        return pairs, skipped

    @torch.no_grad()
    def fp8rl_compute_check(self, full: bool = False) -> dict:
        """Is what this rank computes with the dequantization of the bytes it holds? For every quantized
        tensor (experts included) the copy the layer's ``apply`` reads against that copy derived again from
        the held bytes by the layer's own rule: by fingerprint (cheap tier), or bit for bit with the first
        differing element named (``full``). Only the verdict crosses back."""
        t0 = time.perf_counter()
        where = self.fp8rl_tp_rank()
        pairs, skipped = self._fp8rl_compute_pairs()
        if full:
            bad = [(n, c, d) for n, c, d in pairs if c.shape != d.shape or not torch.equal(_bits(c), _bits(d))]
        else:
            got = fingerprints([(n, c) for n, c, _ in pairs])
            want = fingerprints([(n, d) for n, _, d in pairs])
            bad = [(n, c, d) for n, c, d in pairs if got[n] != want[n]]
        offenders = [f"tp rank {where['rank']}/{where['tp']}: {_where_differs(n, c, d)}" for n, c, d in bad]
        return {"rank": where["rank"], "tp": where["tp"], "tier": "bytes" if full else "fingerprints",
                "checked": len(pairs), "experts": sum(int(c.shape[0]) for n, c, _ in pairs if c.dim() == 3),
                "offenders": offenders, "not_checked": skipped, "seconds": time.perf_counter() - t0}

    # -- per-rank check ---------------------------------------------------------------------------------
    def fp8rl_tp_rank(self) -> dict:
        """This worker's tensor-parallel rank and size (vLLM's), and whether experts are expert-parallel."""
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        parallel = getattr(getattr(self, "vllm_config", None), "parallel_config", None)
        return {"rank": int(get_tensor_model_parallel_rank()), "tp": int(get_tensor_model_parallel_world_size()),
                "expert_parallel": bool(getattr(parallel, "enable_expert_parallel", False))}

    @torch.no_grad()
    def fp8rl_check_rank(self, fingerprints_by_rank: dict[str, dict[str, str]] | None = None,
                         manifest_path: str | None = None) -> dict:
        """Check this rank's live shards against its slice of the sync.
        ``fingerprints_by_rank`` (cheap tier): str(rank) → sync name → the fingerprint that rank's tensor
        must have; ``manifest_path`` (full tier): the full expected tensors as a sync
        (:func:`fp8rl_core.sync.transport.write_sync`), cut here for this rank and compared byte for byte.
        Exactly one of the two. Returns :meth:`RankCheck.as_dict` (tensors do not travel as RPC results).

        With tensor parallelism each worker is one rank and holds
        shards. The worker asks vLLM for its rank and size, reads its own live tensors (the same read-back, which
        yields the rank's shard layout: vLLM's loaders cut them) and compares them with its slice of the sync
        (:func:`fp8rl_core.sync.ranks.slice_for_rank`) — by fingerprint (the caller sends every rank's slice
        fingerprints: digests only) or byte for byte (the caller writes the full expected tensors as a sync; each
        rank cuts its own slice). Only the verdict crosses back (:class:`~fp8rl_core.sync.ranks.RankCheck` as a
        dict), one per rank.
        """
        where = self.fp8rl_tp_rank()
        layout = ModelLayout.from_hf_config(self.model_runner.model_config.hf_config)
        return check_rank_tensors(self._fp8rl_tensors(), layout, where["rank"], where["tp"],
                                  fingerprints_by_rank=fingerprints_by_rank, manifest=manifest_path,
                                  expert_parallel=where["expert_parallel"]).as_dict()
