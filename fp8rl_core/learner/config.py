"""The learner layer's configs, in one light module (no torch model code, no transformers): what the
experiment config (:mod:`fp8rl_core.config.sections`) builds, and the single home of their defaults.

* :class:`Recipe` — TE's MXFP8 recipe the MXFP8 layers run (:mod:`.mxfp8`; defined in :mod:`.recipe`, which
  imports no pydantic),
* :class:`GRPOConfig` — one GRPO update (:mod:`.grpo`),
* :class:`LearnerConfig` — the learner: precision, layers, recipe, optimizer, GRPO (:mod:`.learner`),
* :class:`WarmStartConfig` — the supervised warm start (:mod:`.warmstart`).

Defaults are declared here once; the experiment config's ``learner`` section takes its defaults from
these classes (see :class:`fp8rl_core.config.sections.LearnerSection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .recipe import FWD_FORMATS, GRAD_FORMATS, RULES, Recipe
from .task import AdditionTask

__all__ = ["FWD_FORMATS", "GRAD_FORMATS", "RULES", "GRPOConfig", "LearnerConfig", "Recipe", "WarmStartConfig"]

_CLIP_EPS = 0.2  # the PPO clip range, both sides by default


@dataclass(frozen=True)
class GRPOConfig:
    """Settings of one GRPO update (validated on construction)."""

    group_size: int = 4
    clip_eps_low: float = _CLIP_EPS
    clip_eps_high: float = _CLIP_EPS
    scale_rewards: bool = True
    old_logprobs: Literal["learner", "sampler"] = "learner"
    tokens_per_microbatch: int = 4096
    max_grad_norm: float = 1.0
    adv_eps: float = 1e-6
    #: dual-clip PPO's bound on a negative advantage's ratio (Ye et al. 2020): verl's ``actor.clip_ratio_c``, its default
    clip_ratio_c: float = 3.0

    def __post_init__(self) -> None:
        problems = []
        if self.group_size < 2:
            problems.append(f"group_size must be at least 2 (advantages are relative to the group), got {self.group_size}")
        if not (0 < self.clip_eps_low < 1) or not (0 < self.clip_eps_high):
            problems.append(f"clip_eps_low must be in (0, 1) and clip_eps_high > 0, got {self.clip_eps_low}, {self.clip_eps_high}")
        if self.old_logprobs not in ("learner", "sampler"):
            problems.append(f"old_logprobs must be 'learner' or 'sampler', got {self.old_logprobs!r}")
        if self.tokens_per_microbatch < 1:
            problems.append(f"tokens_per_microbatch must be positive, got {self.tokens_per_microbatch}")
        if not self.clip_ratio_c > 1:
            problems.append(f"clip_ratio_c must be greater than 1 (dual-clip bound), got {self.clip_ratio_c}")
        if self.max_grad_norm <= 0:
            problems.append(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if problems:
            raise ValueError("invalid GRPO settings: " + "; ".join(problems))


@dataclass(frozen=True)
class LearnerConfig:
    """The learner (:class:`fp8rl_core.learner.learner.Learner`): precision and on-grid layers (a run takes
    both from its preset), the MXFP8 recipe, AdamW's settings and the GRPO update. ``lr`` 1e-4 is a
    placeholder for the tiny CPU models (the shipped configs set their own: 1e-3 on the minis, 1e-6 for
    8B-class models on GPU). ``device``: where the model, its optimizer state and every micro-batch
    live (``cpu``, ``cuda``, ``cuda:N``): the same code runs on both; MXFP8 stays an emulation on either."""

    precision: Literal["bf16", "mxfp8"] = "mxfp8"
    layers: str | tuple[str, ...] = "all"
    recipe: Recipe = field(default_factory=Recipe)
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    device: str = "cpu"

    def __post_init__(self) -> None:
        try:
            torch_device = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"learner device {self.device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1')") from exc
        if torch_device.type not in ("cpu", "cuda"):
            raise ValueError(f"learner device must be cpu or cuda, got {self.device!r}")
        if self.precision not in ("bf16", "mxfp8"):
            raise ValueError(f"learner precision must be 'bf16' or 'mxfp8', got {self.precision!r}")
        if self.lr <= 0:
            raise ValueError(f"learner lr must be positive, got {self.lr}")


class WarmStartConfig(BaseModel):
    """Settings of the supervised warm start (see :mod:`fp8rl_core.learner.warmstart` for how each is used).

    Measured with these defaults (3-digit addition, little-endian operands and answer; 2 shared cores):
    ``qwen3-dense-tiny`` seeds 0, 1, 2 reach held-out exact match 1.0 / 1.0 / 1.0 with mean answer
    entropy 0.0006 / 0.0004 / 0.0007 nats in 170–260 s; ``qwen3-moe-tiny`` seeds 0, 1 reach 1.0 / 1.0
    (entropy 0.0014 / 0.0016 nats) in 120–500 s (the spread is load on the shared machine). With
    written-order operands the same settings left dense seed 1 and MoE seed 0 near 0.1 (see
    :mod:`fp8rl_core.learner.task`). Still check ``WarmStartResult.accuracy`` before using a checkpoint.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=1200, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=2e-3, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    warmup: int = Field(default=50, ge=0)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    eval_prompts: int = Field(default=512, ge=1)
    decay_fraction: float = Field(default=0.3, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    task: AdditionTask = AdditionTask()

    @property
    def decay_steps(self) -> int:
        """Number of final steps over which the learning rate falls linearly to 0."""
        return round(self.decay_fraction * self.steps)

    @model_validator(mode="after")
    def _phases_fit(self) -> "WarmStartConfig":
        if self.warmup + self.decay_steps > self.steps:
            raise ValueError(
                f"warmup ({self.warmup}) plus the decay phase (decay_fraction {self.decay_fraction} of {self.steps} = "
                f"{self.decay_steps} steps) exceeds steps ({self.steps}); lower warmup to at most "
                f"{self.steps - self.decay_steps} or decay_fraction"
            )
        return self
