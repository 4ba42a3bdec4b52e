"""The fixed-weights matching experiment: the same learner weights in one engine per sampler configuration,
exact full-vocabulary KL against the learner on one paired probe set.

Rule: the paper's matching protocol ("in one engine at fixed weights"): one checkpoint, the sampler's linear
layers switched between BF16, half and all on the learner's grid, train–rollout KL compared on the same
sequences. Each configuration (:class:`Variant`: a preset, and for the ablation the engine's compute dtype,
the learner side's forward and the sampler's activation rule) gets each checkpoint through the normal sync
path (export → :meth:`Sampler.sync` → W1–W7 at the full tier); then its KL on held-out sequences (common to
every variant) and on its own rollouts (each variant draws one completion per probe prompt with one sampling
seed, so completions are paired by prompt). The checkpoints: the run's warm start (or ``model_path``) and RL
steps from it, or the section's named ones (HF directories, a verl run's saved checkpoints:
:mod:`fp8rl_core.learner.checkpoints`, the task's probes spelled in their vocabulary). A run with a dataset
draws its probes from ``data.val`` instead (:func:`dataset_probe_set`). The statistics: :mod:`fp8rl_core.metrics.matching`; the protocol and
what each ablation switch removes: docs/fixed-weights.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from fp8rl_core.checks.runner import CheckPolicy, CheckRunner
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sweep import CheckpointRef, MatchingSection
from fp8rl_core.learner.checkpoints import FP8RL_TOKENS, ProbeTokens, probe_tokens
from fp8rl_core.learner.vocab_tail import restrict
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.dataset import DatasetTask
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.task import EOS, PAD, AdditionTask
from fp8rl_core.learner.warmstart import load_policy
from fp8rl_core.loop import Pipeline, Task, run_rl, start_pipeline
from fp8rl_core.metrics.mismatch import full_vocab_divergence
from fp8rl_core.sampler.config import SAMPLER_ENGINES, SamplerConfig
from fp8rl_core.sampler.pool import acquire
from fp8rl_core.sampler.presets import PRESETS, Variant
from fp8rl_core.sampler.seam import prompt_rows
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.hooks import SyncHooks

__all__ = ["Checkpoint", "MatchingMeasurement", "ProbeSet", "dataset_probe_set", "measure", "named_checkpoints", "probe_set", "rl_checkpoints",
           "run_matching", "warm_checkpoint"]

@dataclass(frozen=True)
class Checkpoint:
    """Learner weights to measure at: ``state`` (the fp32 master weights, by parameter name) after ``step``
    RL steps from the warm start (0: the warm start itself), or the HF checkpoint directory ``path`` (read
    when measured, as float32; ``step``: its verl global step, 0 for a plain HF directory)."""

    name: str
    seed: int
    step: int
    state: Mapping[str, torch.Tensor] | None = field(default=None, repr=False)
    path: str | None = None

    def weights(self) -> Mapping[str, torch.Tensor]:
        """The learner's state dict of this checkpoint."""
        if self.state is not None:
            return self.state
        if self.path is None:
            raise ValueError(f"checkpoint {self.name} has neither weights nor a path")
        return load_policy(self.path).state_dict()


@dataclass(frozen=True)
class ProbeSet:
    """What every variant is measured on: ``held_out`` [N, T] task sequences (prompt and answer, every next-
    token position counted) and ``prompts`` [M, P], for which each variant's engine draws one completion at
    ``temperature`` with sampling seed ``seed`` (its completion positions counted, up to and including EOS).
    Sequences of different lengths: ``held_lengths`` (each held-out row's tokens, the row right-padded after
    them: only positions inside it counted) and ``prompt_mask`` (the prompts left-padded, as the loop's)."""

    held_out: torch.Tensor
    prompts: torch.Tensor
    max_new_tokens: int
    seed: int
    temperature: float = 1.0
    eos_id: int = EOS
    pad_id: int = PAD
    held_lengths: tuple[int, ...] | None = None
    prompt_mask: torch.Tensor | None = None

    def held_mask(self) -> torch.Tensor:
        """[N, T-1]: the next-token positions counted on the held-out sequences."""
        n, t = self.held_out.shape
        if self.held_lengths is None:
            return torch.ones(n, t - 1, dtype=torch.bool)
        return torch.arange(t - 1).unsqueeze(0) < (torch.tensor(self.held_lengths) - 1).unsqueeze(1)


def probe_set(task: AdditionTask, held_out: int, sampled: int, *, seed: int,
              tokens: ProbeTokens = FP8RL_TOKENS) -> ProbeSet:
    """``held_out`` eval-split sequences and ``sampled`` eval-split prompts (other draws than the held-out
    ones), both from ``seed``, spelled by ``tokens`` (a named checkpoint's vocabulary; default the task's own
    ids); completions up to the answer and its EOS."""
    return ProbeSet(tokens.sequences(task.prompts(held_out, seed=seed + 50_021, split="eval")),
                    tokens.prompts(task.prompts(sampled, seed=seed + 60_013, split="eval").prompt_ids),
                    task.answer_len + 1, seed + 7, eos_id=tokens.eos, pad_id=tokens.pad)


def dataset_probe_set(task: DatasetTask, held_out: int, sampled: int, *, seed: int) -> ProbeSet:
    """The probes of a run with a dataset, from its validation file in the checkpoint's tokenizer (the loop's
    prompts: :class:`~fp8rl_core.learner.dataset.DatasetTask`): ``held_out`` prompts (every next-token position
    counted; right-padded to the longest) and ``sampled`` other prompts (left-padded) completed up to the run's
    response length — rows drawn by a permutation from ``seed`` (the file's rows again once it runs out)."""
    rows = task.draw(held_out + sampled, seed + 50_021, "eval")
    held = [task.prompt_ids(r, "eval") for r in rows[:held_out]]
    width = max(map(len, held))
    held_ids = torch.tensor([r + [task.pad_id] * (width - len(r)) for r in held], dtype=torch.long)
    prompts = task.make(rows[held_out:], "eval")
    return ProbeSet(held_ids, prompts.prompt_ids, task.max_new_tokens, seed + 7, eos_id=task.eos_id,
                    pad_id=task.pad_id, held_lengths=tuple(map(len, held)), prompt_mask=prompts.prompt_mask)


def warm_checkpoint(checkpoint: str | Path, seed: int) -> Checkpoint:
    """The warm start itself as a checkpoint (step 0)."""
    state = {k: v.detach().clone() for k, v in load_policy(checkpoint).state_dict().items()}
    return Checkpoint(f"seed{seed}/step0", seed, 0, state)


def rl_checkpoints(checkpoint: str | Path, cfg: RunConfig, steps: Sequence[int],
                   on_step: Callable[[dict], None] | None = None, task: Task | None = None) -> list[Checkpoint]:
    """The checkpoints of ``steps`` (RL steps from the warm start ``checkpoint``; 0: the warm start): one RL
    run of the run's preset and ``loop`` settings (:func:`fp8rl_core.loop.run_rl` — rollouts on the live
    engine, GRPO, a sync after each step) on ``task`` (None: the addition task), the learner's masters taken
    after each listed step."""
    out = [warm_checkpoint(checkpoint, cfg.seed)] if 0 in steps else []
    wanted = sorted(s for s in steps if s > 0)
    if not wanted:
        return out
    pipe = start_pipeline(checkpoint, cfg.preset, learner=cfg.learner_config(), sampler_cfg=cfg.sampler,
                          emittable=cfg.emittable())

    def taken(row: dict) -> None:
        if int(row["step"]) in wanted:
            state = {k: v.detach().clone() for k, v in pipe.learner.model.state_dict().items()}
            out.append(Checkpoint(f"seed{cfg.seed}/step{row['step']}", cfg.seed, int(row["step"]), state))
        if on_step is not None:
            on_step(row)

    run_rl(pipe, task or cfg.warmstart.task, wanted[-1], prompts_per_step=cfg.loop.prompts_per_step, seed=cfg.seed,
           on_step=taken)
    return out


def named_checkpoints(refs: Sequence[CheckpointRef], seed: int) -> list[Checkpoint]:
    """The section's named checkpoints (read when measured), in the order named."""
    return [Checkpoint(ref.name, seed, ref.step or 0, path=ref.path) for ref in refs]


def run_matching(checkpoint: str | Path | None, cfg: RunConfig, section: MatchingSection, *,
                 on_step: Callable[[dict], None] | None = None,
                 on_sync: Callable[[dict], None] | None = None, task: Task | None = None) -> MatchingMeasurement:
    """One fixed-weights run: the checkpoints of ``section.steps`` from the warm start ``checkpoint``
    (:func:`rl_checkpoints`) or the section's named ``checkpoints`` (:func:`named_checkpoints`; ``checkpoint``
    unused: None), then every variant of the section measured at each (:func:`measure`) on the run's probe set
    (:func:`probe_set`, drawn from its seed, spelled in the checkpoints' vocabulary; a run with a dataset:
    ``task``, its :class:`~fp8rl_core.learner.dataset.DatasetTask`, and :func:`dataset_probe_set`) with the run's
    engine settings and checks. Engines and learners are built from the first checkpoint's directory."""
    if not cfg.data.is_task and not isinstance(task, DatasetTask):
        raise ValueError("run_matching of a run with a dataset needs its task (RunConfig.dataset_task)")
    tokens = FP8RL_TOKENS
    if section.checkpoints is not None:
        cks = named_checkpoints(section.checkpoints, cfg.seed)
        checkpoint = section.checkpoints[0].path
        tokens = probe_tokens(checkpoint) if cfg.data.is_task else FP8RL_TOKENS
    elif checkpoint is None:
        raise ValueError("run_matching needs the warm start's checkpoint when the section names no checkpoints")
    else:
        cks = rl_checkpoints(checkpoint, cfg, section.steps, on_step, task)
    if cfg.data.is_task:
        probe = probe_set(cfg.warmstart.task, section.held_out, section.sampled, seed=cfg.seed, tokens=tokens)
        w7 = tokens.sequences(cfg.check_prompts())
    else:
        probe, w7 = dataset_probe_set(task, section.held_out, section.sampled, seed=cfg.seed), cfg.check_probe()
    return measure(checkpoint, cks, section.variants(cfg.model), probe, learner=cfg.learner.build(PRESETS["all"]),
                   sampler_cfg=cfg.sampler, policy=cfg.checks.for_engine, w7_probe=w7, on_sync=on_sync,
                   emittable=cfg.emittable())


@dataclass(frozen=True)
class MatchingMeasurement:
    """Every variant at every checkpoint: ``rows`` one per (checkpoint, variant, probe sequence) with the
    sums over its counted positions of KL(sampler‖learner), KL(learner‖sampler) and JS (nats), and its
    position count — the (num, den) units the statistics pair by (checkpoint, source, sequence); ``checks``
    one per (checkpoint, variant) sync with W1–W7's verdicts; ``engines`` the engine starts it took;
    ``engine_rows`` one per (checkpoint, variant on another engine, probe sequence) where its twin on vLLM
    (the same variant, ``engine`` vllm) was measured too: the sums of KL(variant‖twin), KL(twin‖variant) and
    JS between the two engines' distributions on the same sequences (:func:`measure`)."""

    rows: list[dict]
    checks: list[dict]
    engines: int
    engine_rows: list[dict] = field(default_factory=list)


class _Learners:
    """The measuring learners (MXFP8 with every layer on its grid, and BF16), built once and loaded with each
    checkpoint's masters; their held-out log-probs cached per (checkpoint, precision, forward)."""

    def __init__(self, checkpoint: str | Path, mxfp8: LearnerConfig) -> None:
        self.path = checkpoint
        self._cfg = {"mxfp8": mxfp8, "bf16": PRESETS["bf16-e2e"].learner_config(device=mxfp8.device)}
        self._built: dict[str, Learner] = {}
        self._loaded: dict[str, str] = {}
        self._held: dict[tuple[str, str, str], torch.Tensor] = {}

    def get(self, precision: str, ck: Checkpoint, version: int) -> Learner:
        if precision not in self._built:
            self._built[precision] = Learner(load_policy(self.path), self._cfg[precision])
            if ck.path is not None and Path(ck.path) == Path(self.path):  # built from this checkpoint's files
                self._loaded[precision] = ck.name
        lrn = self._built[precision]
        if self._loaded.get(precision) != ck.name:
            lrn.model.load_state_dict(ck.weights())
            self._loaded[precision] = ck.name
        lrn.version = version
        return lrn

    def logprobs(self, lrn: Learner, forward: str, sequences: torch.Tensor) -> torch.Tensor:
        return lrn.full_logprobs(sequences) if forward == "training" else lrn.probe_logprobs(sequences, full=True)

    def held_out(self, lrn: Learner, precision: str, forward: str, ck: Checkpoint, seqs: torch.Tensor) -> torch.Tensor:
        key = (ck.name, precision, forward)
        if key not in self._held:
            self._held[key] = self.logprobs(lrn, forward, seqs)
        return self._held[key]


def _sums(s: torch.Tensor, lrn: torch.Tensor, mask: torch.Tensor) -> list[tuple[int, float, float, float]]:
    d = full_vocab_divergence(s, lrn, mask, chunk_rows=1024)
    m = mask.to(torch.float64)
    kl, kl_rev, js = ((d[k] * m).sum(-1) for k in ("kl_sampler_learner", "kl_learner_sampler", "js"))
    pos = mask.sum(-1)
    return [(int(pos[i]), float(kl[i]), float(kl_rev[i]), float(js[i])) for i in range(mask.shape[0])]


def _sampled_sequences(prompts: torch.Tensor, completions: torch.Tensor, cmask: torch.Tensor, pad: int = PAD,
                       prompt_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + completion rows (``pad`` after the completion) and the mask of the next-token positions that
    predict a completion token. Left-padded prompts (``prompt_mask``): each row's own prompt and completion,
    right-padded (a causal model's log-probs of a row's tokens do not see what follows them)."""
    if prompt_mask is not None:
        rows = [p + c for p, c in zip(prompt_rows(prompts, prompt_mask), (r[: int(n)] for r, n in
                                                                             zip(completions.tolist(), cmask.sum(-1))))]
        starts = prompt_mask.sum(-1).tolist()
        width = max(map(len, rows))
        seqs = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        mask = torch.zeros(len(rows), width - 1, dtype=torch.bool)
        for i, (p, r) in enumerate(zip(starts, rows)):
            mask[i, int(p) - 1 : len(r) - 1] = True
        return seqs, mask
    seqs = torch.cat([prompts, torch.where(cmask.bool(), completions, torch.full_like(completions, pad))], dim=1)
    mask = torch.zeros(seqs.shape[0], seqs.shape[1] - 1, dtype=torch.bool)
    p = prompts.shape[1]
    mask[:, p - 1:] = cmask.bool()
    return seqs, mask


def _twins(variants: Sequence[Variant]) -> dict[str, str]:
    """Variant name → its partner's, for each variant on an engine other than vLLM whose twin on vLLM (the
    same variant, ``engine`` vllm) is measured too, both ways."""
    names = {v.name for v in variants}
    out: dict[str, str] = {}
    for v in variants:
        twin = replace(v, engine=SAMPLER_ENGINES[0]).name
        if v.engine != SAMPLER_ENGINES[0] and twin in names:
            out[v.name], out[twin] = twin, v.name
    return out


@dataclass(frozen=True)
class _EngineSide:
    """What one engine of a twin pair gave at a checkpoint: its full log-probs on the held-out sequences and on
    its own rollouts (``seqs``, ``mask``), kept until its partner is measured there."""

    variant: Variant
    held: torch.Tensor
    seqs: torch.Tensor
    mask: torch.Tensor
    sampled: torch.Tensor


def _engine_rows(ck: Checkpoint, first: _EngineSide, second: _EngineSide, on_first_rollouts: torch.Tensor,
                 held_mask: torch.Tensor) -> list[dict]:
    """The engine-vs-engine rows of a twin pair at ``ck``: ``second``'s engine measured after ``first``'s, its
    log-probs on ``first``'s rollouts ``on_first_rollouts``; KL(other engine ‖ vLLM) on the held-out sequences
    and on the rollouts of the one measured first."""
    other, ref = (first, second) if first.variant.engine != SAMPLER_ENGINES[0] else (second, first)
    on_other = first.sampled if other is first else on_first_rollouts
    on_ref = on_first_rollouts if other is first else first.sampled
    meta = {"checkpoint": ck.name, "seed": ck.seed, "step": ck.step, "variant": other.variant.name,
            "reference": ref.variant.name, "preset": other.variant.preset, "engine": other.variant.engine,
            "reference_engine": ref.variant.engine, "rollouts": first.variant.name}
    out = []
    for source, sums in (("held-out", _sums(other.held, ref.held, held_mask)),
                         ("sampled", _sums(on_other, on_ref, first.mask))):
        for i, (pos, kl, kl_rev, js) in enumerate(sums):
            if not math.isfinite(kl):
                raise RuntimeError(f"{other.variant.name} vs {ref.variant.name} at {ck.name}: infinite KL on {source} "
                                   f"sequence {i} (one engine puts mass on a token the other cannot emit)")
            out.append(meta | {"source": source, "sequence": i, "positions": pos, "kl": kl, "kl_rev": kl_rev, "js": js})
    return out


def measure(checkpoint: str | Path, checkpoints: Sequence[Checkpoint], variants: Sequence[Variant],
            probe: ProbeSet, *, learner: LearnerConfig, sampler_cfg: SamplerConfig,
            policy: Callable[[str, str], CheckPolicy], w7_probe: torch.Tensor,
            on_sync: Callable[[dict], None] | None = None, hooks: Mapping[str, SyncHooks] | None = None,
            on_failure: Literal["raise", "record"] = "raise", emittable: int | None = None) -> MatchingMeasurement:
    """Every ``variant`` at every checkpoint (see the module docstring). ``checkpoint``: the HF directory the
    engines and learners are built from (the warm start, or the first named checkpoint; its weights are
    replaced at the first sync); ``learner``: the MXFP8 learner's config (every layer on its grid; BF16-learner presets use
    the BF16 learner); ``policy(engine_dtype, preset)``: the checks' policy (W7's bounds depend on both);
    ``w7_probe``: W7's probe batch; ``emittable``: the ids the engines may emit (the vocabulary tail's rule,
    :mod:`fp8rl_core.learner.vocab_tail`: engines masked, every KL and W7 on both sides restricted to them; None:
    all). Variants run in the given order, each engine started once and synced
    with every checkpoint in turn; a failed check of a non-ablation variant raises (its KL would be of
    weights the learner does not hold) unless ``on_failure`` is ``record``. ``hooks``: variant name →
    :class:`~fp8rl_core.sync.hooks.SyncHooks` whose ``on_export`` may perturb what that variant's engine is
    sent (a planted mismatch: what the experiment's own test measures a known KL with).

    Each variant runs on its ``engine`` (``sampler_cfg``'s other settings kept). A variant on another engine
    than vLLM whose twin on vLLM is measured too is also compared with it at each checkpoint
    (:attr:`MatchingMeasurement.engine_rows`): on the held-out sequences, and on the rollouts of the one of the
    two measured first (the other engine scores them too); the first one's full log-probs are kept in memory
    (host, [N, T, V] per source) until its partner is measured at that checkpoint."""
    if not checkpoints or not variants:
        raise ValueError("measure needs at least one checkpoint and one variant")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variants repeat: {names}")
    if learner.precision != "mxfp8" or learner.layers != "all":
        raise ValueError(f"the measuring learner must be MXFP8 on every layer (the presets' learner), got "
                         f"{learner.precision} on {learner.layers!r}")
    learners = _Learners(checkpoint, learner)
    twins = _twins(variants)
    kept: dict[tuple[str, str], _EngineSide] = {}
    engine_rows: list[dict] = []
    rows: list[dict] = []
    checks: list[dict] = []
    version = 0
    engines = 0
    held_mask = probe.held_mask()
    for variant in variants:
        preset = PRESETS[variant.preset]
        precision = preset.learner_precision
        cfg = sampler_cfg.model_copy(update={"dtype": variant.engine_dtype, "engine": variant.engine})
        grid = learner.recipe.fwd_grid
        if variant.activation_rule:
            fmt, _ = grid.rsplit("-", 1)
            grid = f"{fmt}-{variant.activation_rule}"
        sampler = runner = None
        for ck in checkpoints:
            version += 1
            lrn = learners.get(precision, ck, version)
            schemes = preset.schemes(gemm_layers(lrn.model))
            tensors = export_weights(lrn.model, lrn.forward_weights(), schemes)
            hook = (hooks or {}).get(variant.name)
            if hook is not None:
                tensors = hook.on_export(Pipeline(preset, lrn, sampler, schemes), tensors)
            if sampler is None:
                sampler, resync = acquire(checkpoint, schemes, tensors, cfg, version=version, mx_grid=grid)
                sampler.limit_vocabulary(emittable)
                engines += resync is None
                runner = CheckRunner(policy(variant.engine_dtype, variant.preset), w7_probe, emittable)
                runner.start([sampler])
                version += 1
                lrn.version = version
            sampler.sync(tensors, version)  # the normal sync path: transport, in-place load, cache reset
            pipe = Pipeline(preset, lrn, sampler, schemes)
            runner.request_full("fixed-weights measurement")
            report = runner.check(pipe)
            checks.append({"checkpoint": ck.name, "seed": ck.seed, "step": ck.step, "variant": variant.name,
                           "preset": variant.preset, "ablation": variant.ablation, "version": version,
                           "passed": not report.failed, "failed": ",".join(r.condition for r in report.failed),
                           "detail": report.message()} | {k: v for k, v in report.metrics().items()})
            if report.failed and not variant.ablation and on_failure == "raise":
                raise RuntimeError(f"fixed-weights matching: {variant.name} at {ck.name}: the sync to version "
                                   f"{version} failed its checks ({report.message()}); no KL is measured on "
                                   "weights the learner does not hold")
            held_s = restrict(sampler.prompt_logprobs(probe.held_out, full=True), emittable)
            held_l = restrict(learners.held_out(lrn, precision, variant.learner_forward, ck, probe.held_out), emittable)
            roll = sampler.generate(probe.prompts, 1, probe.max_new_tokens, seed=probe.seed, eos_id=probe.eos_id,
                                    pad_id=probe.pad_id, temperature=probe.temperature, prompt_mask=probe.prompt_mask)
            seqs, mask = _sampled_sequences(probe.prompts, roll.completion_ids, roll.completion_mask, probe.pad_id,
                                            probe.prompt_mask)
            samp_s = restrict(sampler.prompt_logprobs(seqs, full=True), emittable)
            samp_l = restrict(learners.logprobs(lrn, variant.learner_forward, seqs), emittable)
            meta = {"checkpoint": ck.name, "seed": ck.seed, "step": ck.step, "variant": variant.name,
                    "preset": variant.preset, "ablation": variant.ablation, "engine_dtype": variant.engine_dtype,
                    "learner_forward": variant.learner_forward, "activation_rule": variant.activation_rule or ""}
            for source, sums in (("held-out", _sums(held_s, held_l, held_mask)), ("sampled", _sums(samp_s, samp_l, mask))):
                for i, (pos, kl, kl_rev, js) in enumerate(sums):
                    if not math.isfinite(kl):
                        raise RuntimeError(f"{variant.name} at {ck.name}: infinite KL on {source} sequence {i} "
                                           "(one side puts mass on a token the other cannot emit)")
                    rows.append(meta | {"source": source, "sequence": i, "positions": pos, "kl": kl,
                                        "kl_rev": kl_rev, "js": js})
            partner = twins.get(variant.name)
            if partner is not None:
                mine = _EngineSide(variant, held_s, seqs, mask, samp_s)
                first = kept.pop((ck.name, partner), None)
                if first is None:
                    kept[(ck.name, variant.name)] = mine
                else:
                    engine_rows += _engine_rows(ck, first, mine, restrict(sampler.prompt_logprobs(first.seqs, full=True),
                                                                          emittable),
                                                held_mask)
            if on_sync is not None:
                on_sync(checks[-1])
    return MatchingMeasurement(rows, checks, engines, engine_rows)
