"""The sampler seam on verl's vLLM server: :class:`ServerSampler`, what the checks after each sync of a verl run
(:mod:`fp8rl_core.verl.checking`) call instead of an engine fp8rl started.

The same vLLM operations as the native engine (:class:`~fp8rl_core.sampler.vllm.engine.VllmWorkers`: snapshot,
read-back, per-rank checks, probe generation), with verl's ``Fp8rlHttpServer`` (:mod:`fp8rl_core.verl.rollout`)
as their channel, reached through Ray (imported inside the calls: importing this module loads no Ray).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.seam import Rollout, Sampler, SamplerError, SyncTiming, engine_config
from fp8rl_core.sampler.vllm.engine import VllmWorkers
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks
from fp8rl_core.sync.ranks import RankCheck

__all__ = ["ServerSampler"]


class ServerSampler(Sampler):
    """The sampler seam on verl's vLLM server (``server``: its Ray actor handle, a
    :class:`fp8rl_core.verl.rollout.Fp8rlHttpServer`): the same vLLM operations as the native engine
    (:class:`~fp8rl_core.sampler.vllm.engine.VllmWorkers`), with itself as their channel — worker RPCs
    through the server's ``collective_rpc`` (every rank answers), engine-core utilities and generation
    through its ``fp8rl_utility`` / ``fp8rl_generate``. Starts and stops nothing: the engine is verl's
    (``startup_s`` 0, ``close`` a no-op, ``alive`` while verl runs it)."""

    def __init__(self, server: Any, model_dir: str | Path, schemes: dict[str, str], mx_grid: str,
                 work_root: str | Path, instance: str, cfg: SamplerConfig = SamplerConfig()) -> None:
        self.server = server
        self.cfg, self.schemes, self.mx_grid = cfg, dict(schemes), mx_grid
        self.workers = VllmWorkers(self, engine_config(model_dir, schemes, mx_grid), work_root)
        self.workers.work_root.mkdir(parents=True, exist_ok=True)
        self.in_process, self.key, self.startup_s = False, "verl", 0.0
        self.version, self.syncs, self.instance = 0, 0, instance

    # -- the channel VllmWorkers calls through (VllmChannel) ----------------------------------------------
    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)

    def rpc(self, method: str, *args) -> list:
        return self._get(self.server.collective_rpc.remote(method, args=args))

    def utility(self, method: str, *args):
        return self._get(self.server.fp8rl_utility.remote(method, *args))

    def outputs(self, what: str, prompts: list, params) -> list:
        """One ``fp8rl_generate`` for one ``params``; one per prompt, all in flight at once, for a list."""
        if isinstance(params, list):
            return [out for outs in self._get([self.server.fp8rl_generate.remote([p], q)
                                               for p, q in zip(prompts, params)]) for out in outs]
        return self._get(self.server.fp8rl_generate.remote(prompts, params))

    def reset_prefix_cache(self) -> bool:
        return bool(self.utility("reset_prefix_cache"))

    # -- the seam -----------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return True

    def engine_version(self) -> list[int]:
        return self.workers.engine_version()

    def layers(self) -> dict[str, dict]:
        return self.workers.layers()

    def prefix_cache_blocks(self) -> int:
        return self.workers.prefix_cache_blocks()

    def sync(self, tensors: Mapping[str, torch.Tensor], version: int, *, export_s: float = 0.0,
             hooks: SyncHooks = NO_HOOKS) -> SyncTiming:
        """fp8rl's own sync into verl's engine (files plus ``fp8rl_load``); verl's trainer syncs through
        :class:`~fp8rl_core.verl.rollout.Fp8rlServerAdapter` instead."""
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
        if emittable is not None:  # verl's server set its own at its start: len(tokenizer) (vocab_tail)
            raise SamplerError("verl's rollout server masks the ids from len(tokenizer) on itself; fp8rl sets nothing")

    def prompt_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        return self.workers.prompt_logprobs(sequences, full=full)

    def close(self) -> None:
        pass
