"""The sweep file's schema: :class:`SweepConfig` (``sweep``, ``base``, ``axes``, ``per_model``, ``resources``)
and the sections a sweep adds besides its runs — the nightly correctness stage (:class:`CorrectnessSection`)
and the fixed-weights experiment (:class:`MatchingSection`, its ablations and checkpoints) — frozen pydantic
models (``extra="forbid"``). Its runs: :class:`fp8rl_core.config.runs.Sweep`. docs/configs.md.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sections import known_preset
from fp8rl_core.grids.spec import MX_RULES
from fp8rl_core.identity import content_hash
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.sampler.capabilities import CAPABILITIES, DEFAULT_ENGINE, EngineName, capabilities, refusal
from fp8rl_core.sampler.presets import PRESETS, Variant

__all__ = [
    "AblationSpec",
    "CheckpointRef",
    "CorrectnessSection",
    "MatchingSection",
    "ResourcesSection",
    "SweepConfig",
]


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
        "of it (first in the series, at a sync of its own): left to W7, its probe there or the behavioural alarm "
        "at the next sync")
    cheap_faults: list[str] = Field(default_factory=list, description="backend verl: faults whose plant's sync is "
                                    "checked at the cheap tier (the cadence set aside there): the cheap tier must "
                                    "catch them on its own")

    @field_validator("faults", "blind_faults", "cheap_faults")
    @classmethod
    def _known_faults(cls, v: list[str] | dict | None) -> list[str] | dict | None:
        """Every fault named (the list's items, the mapping's keys) is in the catalogue."""
        if v:
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
            if not capabilities(out[kind].sampler.engine).planted_faults:
                host = next(c for c in CAPABILITIES.values() if c.planted_faults)
                raise ValueError(f"sampler.engine: {out[kind].sampler.engine} in the correctness stage: its faults are "
                                 f"planted in {host.label}'s engine and its workers; use sampler.engine: {host.name} there")
        return out

    def id(self) -> str:
        """The correctness stage's id: 12 hex digits of the content hash of this section (``fault_ranks``,
        ``blind_faults`` and ``cheap_faults`` counted only when set: a native section's id is that of its other
        settings)."""
        unset = {k for k in ("fault_ranks", "blind_faults", "cheap_faults") if not getattr(self, k)}
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
    engine: EngineName = Field(
        DEFAULT_ENGINE, description="the engine serving the sampler: vllm, or sglang (SGLang's server, .venv-sglang; the "
        "presets whose sampler layers are all BF16: bf16-e2e, bf16-sampler)")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        return known_preset(v)

    @model_validator(mode="after")
    def _engine_serves_it(self) -> "AblationSpec":
        why = refusal(self.engine, [PRESETS[self.preset].sampler_scheme])
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
        dump["ablations"] = [{k: v for k, v in a.items() if (k, v) != ("engine", DEFAULT_ENGINE)} for a in dump["ablations"]]
        return content_hash(dump, 12, compact=False)


class ResourcesSection(BaseModel):
    """What one run of the sweep asks of the Ray node it runs on (Ray's logical resources: a run is
    placed on a node with that much free, and a node runs as many runs at once as its resources allow).
    The defaults fit the CPU minis; ``configs/gpu/`` sweeps ask for GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_cpus: float = Field(1.0, gt=0, description="CPU cores per run (Ray also sets OMP_NUM_THREADS to it)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per run (fractions share a GPU)")
    memory_gb: float | None = Field(None, gt=0, description="RAM per run in GiB, reserved on the node (None: not reserved)")
    work_pool: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                  description="backend verl: the Prefect work pool whose verl-run deployment runs each "
                                              "run, one per free worker, each on a Ray of its own (None: this machine)")

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
