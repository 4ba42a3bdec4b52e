"""The RL loop end to end: rollout on the sampler engine → GRPO step on the learner → weight sync → next.

:func:`start_pipeline` builds the two sides of one run from a warm-start checkpoint and a preset
(:mod:`fp8rl_core.sampler.presets`): the learner (BF16 or MXFP8 layers) and a live sampler engine
loaded with the learner's current weights in the sampler's layout (reusing a running engine with
the same identity, see :func:`fp8rl_core.sampler.pool.acquire`). :func:`run_rl` then runs N steps::

    for step in 1..N:
        rollout  = sampler.generate(prompts, n=G)                 # tagged with the engine's version v
        result   = learner.step(rollout)                          # learner log-probs at v, same tokens
        tensors  = export_weights(learner …)                      # version v+1, sampler layout
        sampler.sync(tensors, v+1)                                # transport, in-place load, cache reset

and returns a per-step table (tokens, rewards, loss, timings: generate, learner, export, transport,
load, reset, total — ``total_s`` as :class:`RLStep` measures it, the one definition; the version) and a
per-token table (sampler and learner log-probs of every sampled token, same tokens, same weight version).
Before every rollout the sampler's version must equal the learner's — a rollout on other weights than the
learner believes is refused (W5).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.grpo import RolloutBatch
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.dataset import DatasetTask
from fp8rl_core.learner.task import AdditionTask
from fp8rl_core.learner.warmstart import load_policy
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.engines import start_sampler
from fp8rl_core.sampler.pool import acquire
from fp8rl_core.sampler.presets import PRESETS, Preset
from fp8rl_core.sampler.seam import Sampler
from fp8rl_core.sync.export import SyncError, export_weights
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks

#: what the loop trains on: fp8rl's addition task or a user's dataset (prompts, reward, EOS and pad ids)
Task = AdditionTask | DatasetTask
T = TypeVar("T")

__all__ = ["LoopResult", "Pipeline", "RLStep", "rollout_and_learn", "run_rl", "start_pipeline", "sync_weights"]


@dataclass
class Pipeline:
    preset: Preset
    learner: Learner
    sampler: Sampler
    schemes: dict[str, str]  # the sampler's per-layer schemes (what the engine was built with, what is exported)
    reused: bool = False  # the engine was already running (no startup paid by this pipeline)
    configured: dict[str, str] | None = None  # what the run configures (the checks' expectation); None: = schemes
    replicas: list[Sampler] = field(default_factory=list)  # further engine replicas, synced alike
    #: the ids every engine may emit (the vocabulary tail's rule, :mod:`fp8rl_core.learner.vocab_tail`; None: all)
    emittable: int | None = None

    def __post_init__(self) -> None:
        if self.configured is None:
            self.configured = dict(self.schemes)

    @property
    def samplers(self) -> list[Sampler]:
        return [self.sampler, *self.replicas]

    def export(self) -> dict[str, torch.Tensor]:
        """The learner's current weights in the sampler's names, layout and grid."""
        return export_weights(self.learner.model, self.learner.forward_weights(), self.schemes)

    def close_replicas(self) -> None:
        for r in self.replicas:
            r.close()
        self.replicas = []


def start_pipeline(
    checkpoint: str | Path,
    preset: str | Preset,
    *,
    learner: LearnerConfig | None = None,
    sampler_cfg: SamplerConfig = SamplerConfig(),
    work_root: str | Path | None = None,
    replicas: int = 1,
    hooks: SyncHooks = NO_HOOKS,
    emittable: int | None = None,
) -> Pipeline:
    """Learner + live sampler for ``preset`` on the warm-start ``checkpoint`` (both at version 0).

    ``learner``: the learner's config, built for this preset (:meth:`Preset.learner_config`, or a run's
    :meth:`fp8rl_core.config.schema.RunConfig.learner_config`); None: the preset's with the defaults.
    ``replicas`` > 1 starts further engine replicas, always spawned (not shared through :func:`acquire`; close them with
    :meth:`Pipeline.close_replicas`); every sync lands in all of them. ``hooks``
    (:class:`~fp8rl_core.sync.hooks.SyncHooks`) may map the configured per-layer schemes to the ones the
    engine and the exporter use instead (only fault injection does, to model a sampler configured off
    the run's grid); the checks keep expecting the configured schemes. The engine is ``sampler_cfg.engine``
    (:mod:`fp8rl_core.sampler.engines`). ``emittable``: the ids every engine may emit (the vocabulary tail's rule,
    :mod:`fp8rl_core.learner.vocab_tail`; None: all)."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    cfg = learner if learner is not None else preset.learner_config()
    if (cfg.precision, cfg.layers) != (preset.learner_precision, preset.learner_layers):
        raise ValueError(f"the learner config runs {cfg.precision} on layers {cfg.layers!r}, preset {preset.name!r} "
                         f"{preset.learner_precision} on {preset.learner_layers!r}; build it with "
                         f"PRESETS[{preset.name!r}].learner_config(...)")
    model = load_policy(checkpoint)
    policy = Learner(model, cfg)
    configured = preset.schemes(gemm_layers(model))
    schemes = dict(hooks.schemes_for_engine(configured))
    tensors = export_weights(model, policy.forward_weights(), schemes)
    grid = cfg.recipe.fwd_grid
    sampler, resync = acquire(checkpoint, schemes, tensors, sampler_cfg, version=policy.version, mx_grid=grid,
                              work_root=work_root)
    # further replicas are further engines: spawned, since a process holds one in-process engine (fp8rl_core.sampler.vllm.compat, 3)
    replica_cfg = sampler_cfg.with_engine("vllm", process="spawn")
    extra = [start_sampler(checkpoint, schemes, tensors, replica_cfg, version=policy.version, mx_grid=grid,
                           work_root=work_root) for _ in range(replicas - 1)]
    for s in (sampler, *extra):  # a pooled engine too: it carries the previous run's limit
        s.limit_vocabulary(emittable)
    return Pipeline(preset, policy, sampler, schemes, reused=resync is not None, configured=configured,
                    replicas=extra, emittable=emittable)


@dataclass
class LoopResult:
    steps: list[dict] = field(default_factory=list)
    tokens: list[dict] = field(default_factory=list)


def rollout_and_learn(pipe: Pipeline, task: Task, step: int, *, prompts_per_step: int, seed: int = 0,
                      max_new_tokens: int | None = None, microbatches: list | None = None) -> tuple[dict, list[dict]]:
    """One rollout on the sampler and one learner step on it: (the step's row so far, its token rows).
    ``microbatches``: when given, the step's per-micro-batch timings
    (:class:`fp8rl_core.learner.grpo.MicroBatchTiming`) are appended to it."""
    learner, sampler = pipe.learner, pipe.sampler
    if sampler.version != learner.version:
        raise RuntimeError(
            f"step {step}: the sampler holds weight version {sampler.version}, the learner is at "
            f"{learner.version}; a rollout must run on the learner's current weights (W5)"
        )
    g = learner.cfg.grpo.group_size
    max_new = max_new_tokens or task.max_new_tokens
    prompts = task.prompts(prompts_per_step, seed=seed * 1_000_003 + step, split="train")
    roll = sampler.generate(prompts.prompt_ids, g, max_new, seed=seed * 7919 + step * 104729, eos_id=task.eos_ids,
                            pad_id=task.pad_id, prompt_mask=prompts.prompt_mask)
    group = prompts.repeat_interleave(g)
    rewards = task.reward(group, torch.where(roll.completion_mask.bool(), roll.completion_ids, task.pad_id))
    batch = RolloutBatch(roll.prompt_ids, roll.completion_ids, roll.completion_mask, rewards,
                         roll.sampler_logprobs, version=roll.version, prompt_mask=group.prompt_mask)
    t0 = time.perf_counter()
    res = learner.step(batch, emittable=pipe.emittable)
    learner_s = time.perf_counter() - t0
    if microbatches is not None:
        microbatches.extend(res.microbatches)
    mask = roll.completion_mask.bool()
    # like with like: the learner restricted to the ids the sampler can emit (its own distribution where there is
    # no tail); the mass it puts on the tail is the step's own number, ``rollout_tail_mass``
    learner_lp = res.learner_logprobs if res.head_logmass is None else res.learner_logprobs - res.head_logmass
    d = (roll.sampler_logprobs - learner_lp)[mask]
    log_r = -d.double()  # log(learner / sampler) per sampled token
    row = {
        "step": step, "version": roll.version, "new_version": learner.version,
        "sequences": int(mask.shape[0]), "tokens": int(mask.sum()), "cached_tokens": roll.cached_tokens,
        "mean_reward": float(rewards.mean()), "loss": res.loss, "grad_norm": res.grad_norm,
        "clip_fraction": res.clip_fraction, "mean_abs_logprob_diff": float(d.abs().mean()),
        "max_abs_logprob_diff": float(d.abs().max()), "k3": float((torch.expm1(log_r) - log_r).mean()),
        "generate_s": roll.seconds, "learner_s": learner_s,
        "microbatches": len(res.microbatches),
        "rollout_tail_mass": 0.0 if res.head_logmass is None else float((-torch.expm1(res.head_logmass))[mask].mean()),
    }
    tokens = []
    rows, cols = torch.nonzero(mask, as_tuple=True)
    for r, c in zip(rows.tolist(), cols.tolist()):
        tokens.append({
            "step": step, "version": roll.version, "sequence": r, "position": c,
            "token": int(roll.completion_ids[r, c]),
            "sampler_logprob": float(roll.sampler_logprobs[r, c]),
            "learner_logprob": float(learner_lp[r, c]),
        })
    return row, tokens


def sync_weights(pipe: Pipeline, hooks: SyncHooks = NO_HOOKS) -> dict:
    """Export the learner's current weights and sync them into every sampler replica: the timing
    columns. ``hooks`` (:mod:`fp8rl_core.sync.hooks`; only fault injection passes any) may perturb one
    step of the path."""
    t0 = time.perf_counter()
    bad = pipe.learner.nonfinite_parameters()
    if bad:
        raise SyncError(f"refusing to export version {pipe.learner.version}: non-finite values (NaN/Inf) in "
                        f"{len(bad)} learner tensors, e.g. {bad[:5]}")
    tensors = hooks.on_export(pipe, pipe.export())
    export_s = time.perf_counter() - t0
    timings = [sampler.sync(tensors, pipe.learner.version, export_s=export_s, hooks=hooks)
               for i, sampler in enumerate(pipe.samplers) if not hooks.skips_replica(i)]
    sync = timings[0]
    return {"export_s": export_s, "transport_s": sum(t.transport_s for t in timings),
            "load_s": sum(t.load_s for t in timings), "reset_s": sum(t.reset_s for t in timings),
            "sync_bytes": sync.bytes, "sync_buckets": sync.buckets}


class RLStep:
    """One RL step on ``pipe``, assembled once for every caller: :meth:`learn` (rollout on the sampler → GRPO
    step), :meth:`sync` (export → every replica), then :meth:`timed` for what runs after the sync (the checks,
    a layer above this one, passed in as a call). :attr:`row` is the step's row; its ``total_s`` is the one
    definition of an RL step's seconds: the wall time of these stages as this object measured them — the same
    whether :func:`run_rl` drives them in one call, the ``experiment`` flow stage by stage in three tasks (the
    time between its tasks is Prefect's, not the step's) or the correctness stage's step
    (:func:`fp8rl_core.correctness.step`). A stage that raised still adds its seconds (a retried sync is paid
    twice)."""

    def __init__(self, pipe: Pipeline, task: Task, index: int, *, prompts_per_step: int, seed: int = 0,
                 max_new_tokens: int | None = None) -> None:
        self.pipe, self.task, self.index = pipe, task, index
        self.prompts_per_step, self.seed, self.max_new_tokens = prompts_per_step, seed, max_new_tokens
        self.row: dict = {}
        self.tokens: list[dict] = []
        self.seconds = 0.0

    def timed(self, call: Callable[[], T]) -> T:
        """``call()``, its wall time added to the step's (``row["total_s"]``)."""
        t0 = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds += time.perf_counter() - t0
            self.row["total_s"] = self.seconds

    def learn(self, microbatches: list | None = None) -> dict:
        """The rollout and the learner step (:func:`rollout_and_learn`): the step's row so far."""
        row, self.tokens = self.timed(lambda: rollout_and_learn(
            self.pipe, self.task, self.index, prompts_per_step=self.prompts_per_step, seed=self.seed,
            max_new_tokens=self.max_new_tokens, microbatches=microbatches))
        self.row = row | self.row
        return self.row

    def sync(self, hooks: SyncHooks = NO_HOOKS) -> dict:
        """The sync of the step's new weights (:func:`sync_weights`): its timing columns."""
        out = self.timed(lambda: sync_weights(self.pipe, hooks))
        self.row |= out
        return out


def run_rl(
    pipe: Pipeline,
    task: Task,
    steps: int,
    *,
    prompts_per_step: int,
    seed: int = 0,
    max_new_tokens: int | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> LoopResult:
    """Run ``steps`` RL steps (see the module docstring; each an :class:`RLStep`: learn, then sync); ``on_step``
    sees each step's row as it lands."""
    result = LoopResult()
    first = pipe.learner.version + 1
    for index in range(first, first + steps):
        step = RLStep(pipe, task, index, prompts_per_step=prompts_per_step, seed=seed, max_new_tokens=max_new_tokens)
        step.learn()
        step.sync()
        result.steps.append(step.row)
        result.tokens.extend(step.tokens)
        if on_step is not None:
            on_step(step.row)
    return result
