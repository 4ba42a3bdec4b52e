"""The vLLM engine behind the sampler seam: vLLM's offline engine on the learner's checkpoint.

Rule: weights cross as files (:mod:`fp8rl_core.sync.transport`) and control as ``collective_rpc`` calls
into the worker extension (:mod:`.worker`), so what the engine computes with is what vLLM's own loaders
read from the learner's bytes; the engine runs spawned (default) or in-process (:class:`VllmSampler`).
:class:`VllmWorkers` holds the seam operations any vLLM engine with fp8rl's worker extension shares
(verl's server too: :class:`fp8rl_core.verl.checking.ServerSampler`). Engine reuse: :mod:`.pool`; vLLM
0.32 workarounds: :mod:`.compat`. Described in docs/library.md (The sampler and the weight sync) and
docs/design.md (Engines).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from fp8rl_core.sampler.config import MX_GRID, SamplerConfig, cpu_fp8_kv_support, engine_key
from fp8rl_core.sampler.vllm.quiet import SHUTDOWN_S
from fp8rl_core.sampler.seam import (
    Rollout, Sampler, SamplerDeadError, SamplerError, SyncTiming, engine_config, file_sync, prompt_rows, stop_ids,
)
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks
from fp8rl_core.sync.layout import ModelLayout, to_checkpoint
from fp8rl_core.sync.ranks import RankCheck, slice_for_rank
from fp8rl_core.sync.transport import default_root, write_sync

from .compat import (
    EngineCoreDied, call_utility, collected_once, engine_core_alive, in_process_engine, model_classes_here,
    watched_call,
)

__all__ = ["VllmChannel", "VllmSampler", "VllmWorkers", "prepare_engine_dir", "prompt_logprob_tensor"]

WORKER_EXTENSION = "fp8rl_core.sampler.vllm.worker.Fp8rlWorkerExtension"
#: the live in-process engine of this process, if any (at most one: compat, 3)
_IN_PROCESS: weakref.WeakSet = weakref.WeakSet()


def prepare_engine_dir(cfg: Mapping, initial: Mapping[str, torch.Tensor], root: str | Path) -> Path:
    """A fresh HF directory under ``root`` with ``cfg`` and the initial sync tensors in checkpoint format.

    vLLM reads a Hugging Face directory: :func:`prepare_engine_dir` writes one per engine — the warm-start
    checkpoint's ``config.json`` with ``quantization_config = {"quant_method": "fp8rl", "layers": {vLLM prefix:
    scheme}}`` (:func:`fp8rl_core.sampler.seam.engine_config`, read by :mod:`.plugin`) and the initial sync
    tensors in checkpoint format, so the first load goes through vLLM's own loaders exactly like every later sync.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="fp8rl-engine-", dir=root))
    (folder / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))
    layout = ModelLayout.from_hf_config(cfg)
    shards = {n: t.contiguous() for name, tensor in initial.items() for n, t in to_checkpoint(name, tensor, layout)}
    save_file(shards, str(folder / "model.safetensors"))
    return folder


# ----------------------------------------------------------------------------------------------------
# What every vLLM engine with fp8rl's worker extension answers
# ----------------------------------------------------------------------------------------------------
class VllmChannel(Protocol):
    """The four calls into one vLLM engine that :class:`VllmWorkers` is built on."""

    def rpc(self, method: str, *args) -> list:
        """``collective_rpc`` of a worker-extension method: one answer per worker (rank)."""

    def utility(self, method: str, *args) -> Any:
        """An engine-core utility (:func:`.compat.patch_engine_core`'s, or vLLM's own)."""

    def outputs(self, what: str, prompts: list, params: Any) -> list:
        """vLLM's final ``RequestOutput`` per prompt (one request each) under ``params`` (one, or one per prompt)."""

    def reset_prefix_cache(self) -> bool:
        """vLLM's prefix-cache reset."""


class VllmWorkers:
    """The seam operations of a vLLM engine running fp8rl's worker extension (:mod:`.worker`), through a
    :class:`VllmChannel`: weight sync as files plus ``fp8rl_load``, snapshot, read-back, per-rank checks,
    generation and prompt log-probs. ``model_cfg``: :func:`~fp8rl_core.sampler.seam.engine_config` of the
    engine's model; ``work_root``: where syncs and read-backs are written (a folder every rank can read)."""

    def __init__(self, channel: VllmChannel, model_cfg: Mapping, work_root: str | Path) -> None:
        self.channel = channel
        self.model_cfg = dict(model_cfg)
        self.vocab_size = int(model_cfg["vocab_size"])
        self.work_root = Path(work_root)

    def engine_version(self) -> list[int]:
        return [int(v) for v in self.channel.rpc("fp8rl_version")]

    def layers(self) -> dict[str, dict]:
        return self.channel.rpc("fp8rl_layers")[0]

    def prefix_cache_blocks(self) -> int:
        return int(self.channel.utility("fp8rl_prefix_cache_blocks"))

    def sync(self, tensors: Mapping[str, torch.Tensor], version: int, bucket_mb: float, *, export_s: float = 0.0,
             hooks: SyncHooks = NO_HOOKS) -> SyncTiming:
        """Write ``tensors`` as buckets of ``bucket_mb`` (or the hooks' size), load them in place on every
        worker, reset the prefix cache (unless the hooks skip it)."""
        def reset() -> None:
            if not self.channel.reset_prefix_cache():
                raise SamplerError("the prefix cache could not be reset after a sync (requests still running?)")

        return file_sync(tensors, version, bucket_mb, self.work_root / "sync", hooks,
                         lambda manifest: self.channel.rpc("fp8rl_load", manifest, hooks.worker_hook()), reset,
                         export_s=export_s, who="workers")

    def state(self, instance: str, *, fingerprints: bool = True) -> dict:
        """The engine's cheap-tier snapshot (see ``fp8rl_state`` in :mod:`.worker`) per rank, plus the
        engine core's prefix-cache blocks and reset count."""
        snap = self.channel.utility("fp8rl_snapshot", fingerprints)  # one round trip (compat.patch_engine_core)
        return {"ranks": snap["ranks"], "cache_blocks": int(snap["cache_blocks"]),
                "cache_resets": int(snap["cache_resets"]), "instance": instance}

    def read_back(self, names: Sequence[str] | None = None, *, effective: bool = False) -> dict[str, torch.Tensor]:
        """What the live engine computes with, by sync-tensor name (see :mod:`.worker`)."""
        self.work_root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="fp8rl-readback-", dir=self.work_root))
        try:
            path = folder / "readback.safetensors"
            self.channel.rpc("fp8rl_read", str(path), None if names is None else list(names), effective)
            return load_file(str(path))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def compute_check(self, *, full: bool = False) -> list[dict]:
        """Every rank's ``fp8rl_compute_check`` (:mod:`.worker`): the compute copy against the dequantized held
        bytes, by fingerprint or (``full``) bit for bit; only the verdicts cross."""
        return list(self.channel.rpc("fp8rl_compute_check", bool(full)))

    def engine_checksums(self) -> dict[str, str]:
        """vLLM's weight checker on every worker (``Worker.compute_weight_checksums``: vLLM's own
        ``compute_tensor_digests``, SHA-256 of each parameter's raw bytes, keyed ``dp:pp:pcp:tp:name``), through
        the engine's ``collective_rpc`` — the function ``POST /weight_checker`` of vLLM's server calls; only the
        digests cross. Duplicate keys across workers are refused."""
        out: dict[str, str] = {}
        for worker in self.channel.rpc("compute_weight_checksums"):
            if dup := out.keys() & worker.keys():
                raise SamplerError(f"vLLM's weight checksums: duplicate keys across workers {sorted(dup)[:3]}")
            out |= worker
        return out

    def check_ranks(self, expected: Mapping[str, torch.Tensor], version: int, *, full: bool = False) -> list[RankCheck]:
        """Every engine rank checks its own live shards against its slice of the full ``expected`` tensors
        (sync names; ``fp8rl_check_rank`` in :mod:`.worker`): by fingerprint (each rank's slice
        fingerprints are cut here and sent), or with ``full`` byte for byte (``expected`` is written as a
        sync of ``version`` that every rank reads and cuts). One :class:`~fp8rl_core.sync.ranks.RankCheck` per rank."""
        if full:
            handle = write_sync(expected, max(version, 0), root=self.work_root / "sync")
            try:
                results = self.channel.rpc("fp8rl_check_rank", None, str(handle.manifest))
            finally:
                handle.remove()
        else:
            layout = ModelLayout.from_hf_config(self.model_cfg)
            fps = {str(w["rank"]): slice_for_rank(expected, layout, w["rank"], w["tp"],
                                                  expert_parallel=w["expert_parallel"]).fingerprints
                   for w in self.channel.rpc("fp8rl_tp_rank")}
            results = self.channel.rpc("fp8rl_check_rank", fps, None)
        return [RankCheck.from_dict(r) for r in results]

    def generate(self, prompt_ids: torch.Tensor, n: int, max_tokens: int, *, seed: int, eos_id: int | Sequence[int],
                 pad_id: int, temperature: float, version: int, prompt_mask: torch.Tensor | None = None) -> Rollout:
        """``n`` completions per prompt row (rows grouped per prompt), with per-token log-probs; tagged ``version``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=row) for row in prompt_rows(prompt_ids, prompt_mask)]
        params = [SamplingParams(n=n, max_tokens=max_tokens, temperature=temperature, seed=seed + i,
                                 logprobs=0, stop_token_ids=stop_ids(eos_id), detokenize=False,
                                 skip_special_tokens=False)
                  for i in range(len(prompts))]
        t0 = time.perf_counter()
        outs = self.channel.outputs("generate", prompts, params)
        seconds = time.perf_counter() - t0
        b = len(prompts) * n
        ids = torch.full((b, max_tokens), pad_id, dtype=torch.long)
        mask = torch.zeros((b, max_tokens), dtype=torch.long)
        logps = torch.zeros((b, max_tokens), dtype=torch.float32)
        cached = 0
        for i, out in enumerate(outs):
            cached += int(out.num_cached_tokens or 0)
            for j, comp in enumerate(sorted(out.outputs, key=lambda c: c.index)):
                row = i * n + j
                toks = list(comp.token_ids)
                ids[row, : len(toks)] = torch.tensor(toks, dtype=torch.long)
                mask[row, : len(toks)] = 1
                logps[row, : len(toks)] = torch.tensor([lp[t].logprob for lp, t in zip(comp.logprobs, toks)])
        return Rollout(prompt_ids.repeat_interleave(n, dim=0), ids, mask, logps, version, seconds, cached)

    def prompt_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        """Log-probs of each token of ``sequences`` [B, T] given its prefix: [B, T-1] (``full``: the whole
        vocabulary, [B, T-1, V], for exact KL). Prompt-logprob requests bypass the prefix cache.

        vLLM's flat container (``SamplingParams(flat_logprobs=True)``: a few flat lists per request instead
        of one ``Logprob`` object per position and token id) is read into the tensor in one step: a
        full-vocabulary probe of 16 sequences on a 1024-token vocabulary is ~160k entries, which as objects
        cost ~1 s per probe to build, collect and read back."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = sequences.tolist()
        k = -1 if full else 0
        params = SamplingParams(max_tokens=1, prompt_logprobs=k, detokenize=False, temperature=1.0,
                                flat_logprobs=True)
        outs = self.channel.outputs("prompt_logprobs",
                                    [TokensPrompt(prompt_token_ids=[int(t) for t in r]) for r in rows], params)
        return prompt_logprob_tensor(outs, rows, full, self.vocab_size)


# ----------------------------------------------------------------------------------------------------
# The engine fp8rl starts
# ----------------------------------------------------------------------------------------------------
class VllmSampler(Sampler):
    """One live vLLM engine for one model and one set of per-layer schemes.

    ``VllmSampler`` implements the seam (:class:`~fp8rl_core.sampler.seam.Sampler`) on ``vllm.LLM``, its
    operations through :class:`VllmWorkers` with itself as the channel. By default (``SamplerConfig.process =
    "spawn"``) vLLM runs the model in processes of its own (an engine-core process and a worker process,
    spawned), so the learner and the sampler never share a Python heap. Either way weights cross as files (:mod:`fp8rl_core.sync.transport`)
    and control as ``collective_rpc`` calls into the worker extension (:mod:`.worker`), so what the engine
    computes with is what vLLM's own loaders read from the learner's bytes. Create samplers from a script
    guarded by ``if __name__ == "__main__":`` (vLLM spawns processes that re-import the main module).

    In-process engines (``process = "in-process"``): vLLM's in-process client and single-process executor run
    the engine core and the worker in the calling process. A spawned engine's start is mostly two interpreters
    importing vLLM (``bench/engine.py`` measures it); an in-process start skips both and its close tears no
    process down. What it gives up: the engine cannot die alone (a crash ends the caller, which the flow
    records as a killed run), and its start-up changes process-wide state that
    :func:`.compat.in_process_engine` puts back around every start and call. One tensor-parallel rank
    only.

    Tensor parallelism (``tensor_parallel`` > 1, spawned engines only): vLLM's multiprocess executor runs
    one worker per rank, each loading its shard of every sync through vLLM's own loaders; on CPU the
    workers' threads are not pinned (``VLLM_CPU_OMP_THREADS_BIND=nobind``: vLLM-CPU refuses tp > 1 on a
    one-node host otherwise). :meth:`state` then has one entry per rank, :meth:`read_back` returns rank 0's
    shards and :meth:`check_ranks` checks every rank's (what :class:`~fp8rl_core.checks.CheckRunner` does).

    Log-probs. Generation returns, per sampled token, the log-probability vLLM's sampler reports
    (``logprobs_mode="raw_logprobs"``: log-softmax of the model's logits, before temperature — what the
    learner computes). The probe path returns prompt log-probs (``prompt_logprobs``; such requests bypass the
    prefix cache) and, for exact KL, the full-vocabulary log-probs of a probe batch (``-1``).
    """

    def __init__(
        self,
        checkpoint: str | Path,
        schemes: Mapping[str, str],
        initial: Mapping[str, torch.Tensor],
        cfg: SamplerConfig = SamplerConfig(),
        *,
        version: int = 0,
        mx_grid: str = MX_GRID,
        work_root: str | Path | None = None,
        seed: int = 0,
        tensor_parallel: int = 1,
    ) -> None:
        self.cfg = cfg
        self.schemes = dict(schemes)
        self.mx_grid = mx_grid
        if cfg.kv_cache_dtype != "auto":
            ok, why = cpu_fp8_kv_support()
            if not ok and not torch.cuda.is_available():
                raise SamplerError(f"kv_cache_dtype={cfg.kv_cache_dtype!r} is not available here: {why}; use kv_cache_dtype='auto'")
        self.in_process = cfg.vllm.process == "in-process"
        if tensor_parallel < 1 or (self.in_process and tensor_parallel > 1):
            raise SamplerError(f"tensor_parallel must be at least 1, and 1 for an in-process engine (vLLM's "
                               f"single-process executor runs one rank): got {tensor_parallel} with process="
                               f"{cfg.vllm.process!r}")
        self.tensor_parallel = tensor_parallel
        if self.in_process and (live := [s for s in _IN_PROCESS if s.llm is not None]):
            raise SamplerError(f"an in-process engine ({live[0].key}) is already live in this process, and vLLM keeps its "
                               "parallel groups and worker extension process-wide: close it first (the engine pool "
                               "does), or start this one with process='spawn'")
        self.model_cfg = engine_config(checkpoint, schemes, mx_grid)
        self.key = engine_key(self.model_cfg, cfg) + (f"-tp{tensor_parallel}" if tensor_parallel > 1 else "")
        self.work_root = Path(work_root) if work_root is not None else default_root() / "fp8rl"
        self.dir = prepare_engine_dir(self.model_cfg, initial, self.work_root)
        self.vocab_size = int(self.model_cfg["vocab_size"])
        env = {}
        if cfg.threads is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            env["OMP_NUM_THREADS"] = str(cfg.threads)
        if tensor_parallel > 1 and not torch.cuda.is_available():  # one NUMA node: the OS schedules the ranks
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        if self.in_process:  # no thread pinning of the caller; in-process client (compat, 3)
            env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_ENABLE_V1_MULTIPROCESSING="0")
        old_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        t0 = time.perf_counter()
        try:
            from vllm import LLM

            with self._process_guard(starting=True):
                if self.in_process:  # no inspection subprocess (compat.model_classes_here)
                    model_classes_here(self.model_cfg["architectures"])
                self.llm = LLM(
                    model=str(self.dir),
                    skip_tokenizer_init=True,
                    dtype=cfg.dtype,
                    kv_cache_dtype=cfg.kv_cache_dtype,
                    seed=seed,
                    max_model_len=cfg.max_model_len,
                    max_num_seqs=cfg.max_num_seqs,
                    enable_prefix_caching=cfg.enable_prefix_caching,
                    gpu_memory_utilization=cfg.memory_fraction,
                    # the CPU's KV cache; on a GPU memory_fraction sizes it (vLLM: explicit bytes override it)
                    **({} if torch.cuda.is_available() else {"kv_cache_memory_bytes": int(cfg.kv_cache_gib * 2**30)}),
                    block_size=cfg.vllm.block_size,
                    enforce_eager=True,
                    worker_extension_cls=WORKER_EXTENSION,
                    max_logprobs=-1,
                    logprobs_mode="raw_logprobs",
                    use_tqdm_on_load=False,  # no progress bar per start and reload (see .quiet)
                    **({"tensor_parallel_size": tensor_parallel} if tensor_parallel > 1 else {}),
                    **({"distributed_executor_backend": "uni"} if self.in_process else {}),
                )
        except Exception as e:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise SamplerError(f"vLLM could not start the sampler engine for {checkpoint}: {e}") from e
        finally:
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.startup_s = time.perf_counter() - t0
        if self.in_process:
            _IN_PROCESS.add(self)
        self.workers = VllmWorkers(self, self.model_cfg, self.work_root)
        self.version = self.rpc("fp8rl_set_version", version, sorted(initial))[0]
        self.syncs = 0
        #: identifies this engine process among restarts (the checks start a new engine with a full check)
        self.instance = f"{self.key}-{os.getpid()}-{id(self):x}-{time.monotonic_ns()}"

    # -- control ------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """False once the engine was closed or its engine-core process exited."""
        return engine_core_alive(self.llm)

    def _process_guard(self, *, starting: bool = False):
        """For an in-process engine, :func:`.compat.in_process_engine` (what its start or call changes in this
        process is put back afterwards; the caller's heap frozen while it starts); nothing for a spawned one."""
        if not getattr(self, "in_process", False):
            return contextlib.nullcontext()
        return in_process_engine(self.cfg.threads, freeze_caller=starting)

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        """Run one call into the engine, failing fast with :class:`SamplerDeadError` if the engine core
        dies meanwhile (vLLM 0.32 would wait forever: :func:`.compat.watched_call`)."""
        if not self.alive:
            raise SamplerDeadError(f"the vLLM engine core is not running (it exited or was closed; {what} refused); "
                                   "its weights are lost — start a new engine")
        if self.in_process:  # no process to die alone: call directly
            with self._process_guard():
                return fn(*args, **kwargs)
        try:
            return watched_call(self.llm, what, fn, *args, **kwargs)
        except EngineCoreDied as e:
            if e.__cause__ is not None:
                raise SamplerDeadError(f"the vLLM engine core died during {what}: {e.__cause__}") from e.__cause__
            raise SamplerDeadError(f"the vLLM engine core died during {what} (engine {self.key}, last synced "
                                   f"version {self.version}); its weights are lost — the run's last good version is "
                                   "the last one whose checks passed") from None

    # -- the channel VllmWorkers calls through (VllmChannel) ----------------------------------------------
    def rpc(self, method: str, *args) -> list:
        """``collective_rpc`` of a worker-extension method: one answer per worker (rank)."""
        return self._call(method, self.llm.collective_rpc, method, args=args)

    def utility(self, method: str, *args):
        """An engine-core utility (:func:`.compat.call_utility`)."""
        return self._call(method, call_utility, self.llm, method, *args)

    def outputs(self, what: str, prompts: list, params) -> list:
        """vLLM's outputs for ``prompts`` (one request each) under ``params``."""
        return self._call(what, self.llm.generate, prompts, params, use_tqdm=False)

    def reset_prefix_cache(self) -> bool:
        return bool(self._call("reset_prefix_cache", self.llm.reset_prefix_cache))

    # -- the seam -----------------------------------------------------------------------------------
    def engine_version(self) -> list[int]:
        return self.workers.engine_version()

    def layers(self) -> dict[str, dict]:
        return self.workers.layers()

    def prefix_cache_blocks(self) -> int:
        return self.workers.prefix_cache_blocks()

    def sync(self, tensors: Mapping[str, torch.Tensor], version: int, *, export_s: float = 0.0,
             hooks: SyncHooks = NO_HOOKS) -> SyncTiming:
        """Write ``tensors`` (sync names, see :mod:`.layout`) as buckets of ``cfg.bucket_mb``, load them in
        place, reset the prefix cache (:meth:`VllmWorkers.sync`)."""
        timing = self.workers.sync(tensors, version, self.cfg.bucket_mb, export_s=export_s, hooks=hooks)
        self.version = version
        self.syncs += 1
        return timing

    def state(self, *, fingerprints: bool = True) -> dict:
        return self.workers.state(self.instance, fingerprints=fingerprints)

    def read_back(self, names: Sequence[str] | None = None, *, effective: bool = False) -> dict[str, torch.Tensor]:
        return self.workers.read_back(names, effective=effective)

    def compute_check(self, *, full: bool = False) -> list[dict]:
        return self.workers.compute_check(full=full)

    def engine_checksums(self) -> dict[str, str] | None:
        return self.workers.engine_checksums()

    def check_ranks(self, expected: Mapping[str, torch.Tensor], *, full: bool = False) -> list[RankCheck]:
        return self.workers.check_ranks(expected, self.version, full=full)

    def generate(self, prompt_ids: torch.Tensor, n: int, max_tokens: int, *, seed: int, eos_id: int | Sequence[int],
                 pad_id: int = 0, temperature: float | None = None, prompt_mask: torch.Tensor | None = None) -> Rollout:
        return self.workers.generate(prompt_ids, n, max_tokens, seed=seed, eos_id=eos_id, pad_id=pad_id,
                                     temperature=self.cfg.temperature if temperature is None else temperature,
                                     version=self.version, prompt_mask=prompt_mask)

    def limit_vocabulary(self, emittable: int | None) -> None:
        self.rpc("fp8rl_limit_vocabulary", emittable)

    def prompt_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        return self.workers.prompt_logprobs(sequences, full=full)

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            _IN_PROCESS.discard(self)
            once = collected_once() if getattr(self, "in_process", False) else contextlib.nullcontext()
            with once:  # in-process: vLLM's two collections of the whole heap become one, after the engine is dropped
                try:
                    with self._process_guard():
                        llm.llm_engine.engine_core.shutdown(timeout=SHUTDOWN_S)  # see .quiet: a forced kill leaks shm
                except Exception:  # noqa: BLE001 — best effort at teardown
                    pass
                del llm
                self.llm = None  # in-process: vLLM's shutdown freed the KV cache; this drops the model
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)


def prompt_logprob_tensor(outs: Sequence, rows: list[list[int]], full: bool, vocab_size: int) -> torch.Tensor:
    """vLLM's prompt log-probs (``flat_logprobs``) of ``rows`` as a tensor: [B, T-1], or with ``full`` the
    whole vocabulary [B, T-1, V] (-inf where vLLM reports nothing)."""
    t = len(rows[0]) - 1
    if full:
        res = torch.full((len(rows), t, vocab_size), -math.inf, dtype=torch.float32)
    else:
        res = torch.zeros((len(rows), t), dtype=torch.float32)
    for i, out in enumerate(outs):
        flat = out.prompt_logprobs  # position 0 has no prefix: an empty range
        starts = torch.tensor(flat.start_indices[1:], dtype=torch.long)
        ends = torch.tensor(flat.end_indices[1:], dtype=torch.long)
        ids = torch.tensor(flat.token_ids, dtype=torch.long)
        lps = torch.tensor(flat.logprobs, dtype=torch.float32)
        if full:  # each position: the prompt token's entry first, then every id (ranks 1..V)
            pos = torch.repeat_interleave(torch.arange(t), ends - starts)
            sel = torch.cat([torch.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist())])
            res[i, pos, ids[sel]] = lps[sel]
        else:  # the prompt token's own entry leads each position's range
            if not torch.equal(ids[starts], torch.tensor(rows[i][1:], dtype=torch.long)):
                raise RuntimeError("vLLM's prompt logprobs do not lead with the prompt's tokens")
            res[i] = lps[starts]
    return res
