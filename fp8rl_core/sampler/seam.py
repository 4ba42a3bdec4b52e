"""The sampler engine seam: what the loop, the weight sync and the checks call on a live sampler engine.

Rule: the loop, the sync, the checks and the experiments type their engine as :class:`Sampler` and call
only its operations; each engine implements all of them (vLLM in this process's control:
:class:`fp8rl_core.sampler.vllm.engine.VllmSampler`; verl's vLLM server:
:class:`fp8rl_core.verl.checking.ServerSampler`; SGLang's server: :class:`fp8rl_core.sampler.sglang.engine.SglangSampler`)
and :mod:`.engines` starts the one a config names. The pieces every
engine shares (results, sync timing, errors, the model config an engine is identified by) live here.
Described in docs/design.md (Engines) and docs/library.md (The sampler and the weight sync).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fp8rl_core.model_kind import is_moe
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks
from fp8rl_core.sync.ranks import RankCheck
from fp8rl_core.sync.transport import write_sync

__all__ = ["Rollout", "Sampler", "SamplerDeadError", "SamplerError", "SyncTiming", "engine_config", "file_sync",
           "prompt_rows"]


def prompt_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None) -> list[list[int]]:
    """The prompts an engine is given: each row of ``prompt_ids`` [B, P] without its left padding
    (``prompt_mask`` [B, P]: 1 on a prompt's tokens, which end each row; None: every token is the prompt's)."""
    rows = prompt_ids.tolist()
    if prompt_mask is None:
        return [[int(t) for t in r] for r in rows]
    if tuple(prompt_mask.shape) != tuple(prompt_ids.shape):
        raise ValueError(f"prompt_mask has shape {tuple(prompt_mask.shape)}, prompt_ids {tuple(prompt_ids.shape)}")
    real = prompt_mask.sum(-1).tolist()
    return [[int(t) for t in r[len(r) - int(k):]] for r, k in zip(rows, real)]


def stop_ids(eos_id: int | Sequence[int]) -> list[int]:
    """A generate call's ``eos_id`` (one id, or every id that ends a completion) as a list of stop ids."""
    return [int(eos_id)] if isinstance(eos_id, int) else [int(i) for i in eos_id]


class SamplerError(RuntimeError):
    """The sampler cannot be created or used as configured (the message says what to change)."""


class SamplerDeadError(SamplerError):
    """The engine's process exited (killed, crashed, out of memory): its weights and cache are gone."""


def _architecture(cfg: Mapping) -> str:
    return "Qwen3MoeForCausalLM" if is_moe(cfg) else "Qwen3ForCausalLM"


def engine_config(checkpoint: str | Path, schemes: Mapping[str, str], mx_grid: str) -> dict:
    """The warm-start checkpoint's config.json plus fp8rl's ``quantization_config`` (per-layer schemes, MX
    grid): the model an engine serves, what identifies it (:func:`fp8rl_core.sampler.config.engine_key`)."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise SamplerError(f"{path}: no config.json; the sampler needs the learner's warm-start checkpoint directory")
    cfg = json.loads(path.read_text())
    cfg["architectures"] = cfg.get("architectures") or [_architecture(cfg)]
    cfg["quantization_config"] = {"quant_method": "fp8rl", "layers": dict(sorted(schemes.items())), "mx_grid": mx_grid}
    return cfg


@dataclass
class Rollout:
    """Completions of a batch of prompts (``n`` samples each, rows grouped per prompt)."""

    prompt_ids: torch.Tensor  # [B, P] (each prompt repeated n times)
    completion_ids: torch.Tensor  # [B, T] padded with pad_id
    completion_mask: torch.Tensor  # [B, T] 1 on sampled tokens (EOS included)
    sampler_logprobs: torch.Tensor  # [B, T] 0 where the mask is 0
    version: int  # the weight version every token was generated with
    seconds: float
    cached_tokens: int  # prompt tokens served from the prefix cache

    @property
    def tokens(self) -> int:
        return int(self.completion_mask.sum())


@dataclass
class SyncTiming:
    version: int
    export_s: float = 0.0
    transport_s: float = 0.0
    load_s: float = 0.0
    reset_s: float = 0.0
    bytes: int = 0
    buckets: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.export_s + self.transport_s + self.load_s + self.reset_s


def file_sync(tensors: Mapping[str, torch.Tensor], version: int, bucket_mb: float, root: Path, hooks: SyncHooks,
              load: Callable[[str], list[dict]], reset: Callable[[], None], *, export_s: float = 0.0,
              who: str = "ranks") -> SyncTiming:
    """A sync through files, as every engine under fp8rl's control does it: write ``tensors`` as buckets of
    ``bucket_mb`` (or the hooks' size) under ``root``, ``load(manifest)`` them on every rank (each returns its
    ``version``), remove the files, then ``reset()`` the engine's prefix cache unless the hooks skip it; a rank
    at another version is a :class:`SamplerError` naming the versions ``who`` reported."""
    timing = SyncTiming(version=version, export_s=export_s)
    t0 = time.perf_counter()
    handle = write_sync(tensors, version, bucket_bytes=int(hooks.sync_bucket_mb(bucket_mb) * 2**20), root=root)
    timing.transport_s = time.perf_counter() - t0
    timing.bytes, timing.buckets = handle.total_bytes, handle.buckets
    try:
        hooks.on_transport(handle)
        t0 = time.perf_counter()
        results = load(str(handle.manifest))
        timing.load_s = time.perf_counter() - t0
    finally:
        handle.remove()
    versions = {int(r["version"]) for r in results}
    if versions != {version}:
        raise SamplerError(f"sync to version {version}: {who} report versions {sorted(versions)}")
    if hooks.resets_prefix_cache():
        t0 = time.perf_counter()
        reset()
        timing.reset_s = time.perf_counter() - t0
    return timing


class Sampler(ABC):
    """One live sampler engine for one model and one set of per-layer schemes (module docstring).

    Attributes every engine sets: ``cfg`` (its :class:`~fp8rl_core.sampler.config.SamplerConfig`),
    ``schemes`` (vLLM layer prefix → scheme), ``mx_grid``, ``key`` (its identity), ``instance`` (this
    engine process among restarts: the checks run the full tier on a new one), ``version`` (the weight
    version it holds), ``syncs``, ``startup_s`` (seconds its start took; 0 for an engine fp8rl did not
    start) and ``in_process`` (it computes in the caller's process: closing it is quick, and it cannot
    die alone).
    """

    cfg: SamplerConfig
    schemes: dict[str, str]
    mx_grid: str
    key: str
    instance: str
    version: int
    syncs: int
    startup_s: float
    in_process: bool

    # -- control ------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def alive(self) -> bool:
        """False once the engine was closed or its process exited."""

    @abstractmethod
    def engine_version(self) -> list[int]:
        """The weight version every rank of the engine reports."""

    @abstractmethod
    def layers(self) -> dict[str, dict]:
        """Per engine layer: scheme, post-load processing count, module type."""

    @abstractmethod
    def prefix_cache_blocks(self) -> int:
        """Blocks the engine's prefix cache can currently hit (0 right after a reset)."""

    @abstractmethod
    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (the KV of the previous weights); False if the engine refused."""

    # -- weights ------------------------------------------------------------------------------------
    @abstractmethod
    def sync(self, tensors: Mapping[str, torch.Tensor], version: int, *, export_s: float = 0.0,
             hooks: SyncHooks = NO_HOOKS) -> SyncTiming:
        """Load ``tensors`` (sync names, :mod:`fp8rl_core.sync.layout`) in place as weight ``version`` on
        every rank, then reset the prefix cache. ``hooks`` (:mod:`fp8rl_core.sync.hooks`; only fault injection
        passes any) may change the bucket size, the written sync, the ranks' load, or skip the reset."""

    @abstractmethod
    def state(self, *, fingerprints: bool = True) -> dict:
        """The cheap-tier snapshot: ``{"ranks": [per rank: version, layers, fingerprints …], "cache_blocks",
        "cache_resets", "instance"}`` (docs/correctness.md, Tiers and cadence)."""

    @abstractmethod
    def read_back(self, names: Sequence[str] | None = None, *, effective: bool = False) -> dict[str, torch.Tensor]:
        """What the live engine computes with, by sync-tensor name (rank 0's shards under tensor
        parallelism); ``effective`` adds each layer's dequantized effective weight (``….effective``)."""

    @abstractmethod
    def compute_check(self, *, full: bool = False) -> list[dict]:
        """Every rank's compute-copy check: what each quantized tensor computes with against the dequantization
        of the bytes that rank holds, by fingerprint or (``full``) bit for bit. One dict per rank (the fields of
        :func:`fp8rl_core.checks.basic.check_compute_copies`)."""

    @abstractmethod
    def engine_checksums(self) -> dict[str, str] | None:
        """The engine's own per-parameter digests, computed by the engine's code (vLLM: its weight checker's
        SHA-256 of each parameter's raw bytes, keyed ``dp:pp:pcp:tp:name``, every rank); ``None`` where the
        engine has no such checker or it cannot run here (SGLang 0.5.12's ``/weights_checker`` checksum is
        CUDA-only): the check is then not run, never passed."""

    @abstractmethod
    def check_ranks(self, expected: Mapping[str, torch.Tensor], *, full: bool = False) -> list[RankCheck]:
        """Every rank checks its own live shards against its slice of the full ``expected`` tensors (sync
        names): by fingerprint, or with ``full`` byte for byte. One result per rank."""

    # -- generation ---------------------------------------------------------------------------------
    @abstractmethod
    def generate(self, prompt_ids: torch.Tensor, n: int, max_tokens: int, *, seed: int, eos_id: int | Sequence[int],
                 pad_id: int = 0, temperature: float | None = None, prompt_mask: torch.Tensor | None = None) -> Rollout:
        """``n`` completions per prompt row (rows grouped per prompt), with each sampled token's log-prob
        (log-softmax of the logits before temperature: what the learner computes), each ending at the first of
        ``eos_id`` (one id or several: a checkpoint's EOS ids) it samples. Prompts of different lengths
        come left-padded, ``prompt_mask`` marking their tokens (:func:`prompt_rows`)."""

    @abstractmethod
    def prompt_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        """Log-probs of each token of ``sequences`` [B, T] given its prefix: [B, T-1] (``full``: the whole
        vocabulary, [B, T-1, V], for exact KL)."""

    @abstractmethod
    def limit_vocabulary(self, emittable: int | None) -> None:
        """Emit only ids below ``emittable`` from now on (None: every id): the vocabulary tail's rule
        (:mod:`fp8rl_core.learner.vocab_tail`). An engine that cannot mask refuses a limit (:class:`SamplerError`)."""

    # -- lifetime -----------------------------------------------------------------------------------
    @abstractmethod
    def close(self) -> None:
        """Stop the engine (if this object started it) and remove its files; idempotent."""
