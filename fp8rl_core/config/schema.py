"""The run config's schema: :class:`RunConfig`, one run — model, preset, seed and one section per stage
(:mod:`fp8rl_core.config.sections`) — a frozen pydantic model (``extra="forbid"``) validated once, with the
checks across sections (engine and preset, model and task lengths, dataset and backend). The sweep file's
schema: :mod:`fp8rl_core.config.sweep`; reading a file and its overrides: :mod:`fp8rl_core.config.loading`;
expanding a sweep into its runs and their ids: :mod:`fp8rl_core.config.runs`. Every field: docs/configs.md.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fp8rl_core.checks.policy import CheckPolicy
from fp8rl_core.config.sections import (DataSection, LearnerSection, LoopSection, MetricsSection,
                                        VerlSection, known_preset)
from fp8rl_core.learner.config import LearnerConfig, WarmStartConfig
from fp8rl_core.learner.dataset import DatasetTask
from fp8rl_core.learner.spec import ModelSpec, load_model_spec
from fp8rl_core.sampler.capabilities import capabilities
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.presets import PRESETS

__all__ = ["RunConfig"]


class RunConfig(BaseModel):
    """One experiment: a model, a pipeline preset, a seed and the settings of every stage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field("qwen3-dense-tiny", description="a model spec in models_dir (or a .yaml path); with a "
                       "model_path directory optional: unset, the model is read from its config.json (named after "
                       "the directory), set, its spec must agree with it field by field")
    model_path: str | None = Field(None, description="the checkpoint the run trains from: a Hugging Face directory "
                                   "(config.json, weights, its tokenizer) or hub id (then `model` names its spec); "
                                   "None: the run's own warm start of `model` on the addition task")
    preset: str = "all"
    seed: int = Field(0, ge=0)
    warmstart: WarmStartConfig = WarmStartConfig()
    learner: LearnerSection = LearnerSection()
    sampler: SamplerConfig = SamplerConfig()
    loop: LoopSection = LoopSection()
    checks: CheckPolicy = CheckPolicy()
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
        """The run's check policy: the ``checks`` section with W7's bound for its engine dtype and preset."""
        return self.checks.for_engine(self.sampler.dtype, self.preset)

    def check_prompts(self):
        """The W7 probe batch's problems: ``checks.probe_sequences`` held-out task prompts with their answers."""
        return self.warmstart.task.prompts(self.checks.probe_sequences, seed=self.seed + 90_001, split="eval")

    def check_probe(self, n: int | None = None):
        """The W7 probe batch, a [B, T] tensor of token ids: a dataset run's validation prompts tokenized by its
        checkpoint's tokenizer where that is on this machine (:func:`.dataset.probe_batch`; ``n`` of them, None:
        ``checks.probe_sequences``), otherwise :meth:`check_prompts` as sequences (the task's ids);
        :meth:`probe_source` says which."""
        import torch

        from fp8rl_core.config.dataset import probe_batch

        tok = self._probe_tokenizer()
        if tok is None:
            return self.check_prompts().sequences
        return torch.tensor(probe_batch(self.data.val, self.data.prompt_key, str(tok), n or self.checks.probe_sequences,
                                        self.sampler.max_model_len), dtype=torch.long)

    def dataset_task(self, score) -> DatasetTask:
        """The native loop's task of a dataset run (``data.train``): its files, the checkpoint's tokenizer
        (``model_path``), its lengths, scored by ``score`` (verl's reward signature)."""
        d = self.data
        if d.is_task:
            raise ValueError("the run trains the addition task (warmstart.task), not a dataset")
        return DatasetTask(d.train, d.val, d.prompt_key, self.model_path, d.prompt_length(self.sampler.max_model_len, 0),
                           d.max_response_length, score, d.apply_chat_template_kwargs)

    def emittable(self) -> int | None:
        """How many ids the run's sampler can emit (the vocabulary tail's rule, :mod:`fp8rl_core.learner.vocab_tail`):
        ``len(tokenizer)`` of ``model_path``'s tokenizer where the engine masks (its row's ``masks_tail``: fp8rl's vLLM
        engine, verl's vLLM rollout) and it is shorter than the vocabulary; None: every id."""
        from fp8rl_core.learner.vocab_tail import emittable_ids

        engine = self.verl.rollout if self.verl is not None else self.sampler.engine
        if self.model_path is None or not capabilities(engine).masks_tail:
            return None
        return emittable_ids(self.model_path, self.spec().vocab_size)

    def probe_source(self) -> str:
        """Where :meth:`check_probe` draws from: ``data.val`` or ``task``."""
        return "task" if self._probe_tokenizer() is None else "data.val"

    def _probe_tokenizer(self) -> Path | None:
        from fp8rl_core.config.dataset import tokenizer_file

        if self.data.val is None or self.model_path is None:
            return None
        return tokenizer_file(self.model_path)

    def spec_path(self) -> Path:
        p = Path(self.model)
        if p.suffix in (".yaml", ".yml"):
            return p
        return Path(self.models_dir) / f"{self.model}.yaml"

    def spec(self, specs: MutableMapping[Path, ModelSpec] | None = None) -> ModelSpec:
        """The run's model spec, read from its file — once per file across the runs that share ``specs``
        (a sweep's expansion: the specs read so far, by resolved path). With a ``model_path`` directory: the
        spec file checked against its ``config.json`` field by field, or without one (``model`` unset: the
        directory's name) the model read from it (:mod:`fp8rl_core.learner.checkpoint_spec`)."""
        from fp8rl_core.learner.checkpoint_spec import checkpoint_name, checkpoint_spec, is_checkpoint_dir, spec_disagreement

        path = self.spec_path()
        local = is_checkpoint_dir(self.model_path)
        from_checkpoint = local and not path.is_file() and self.model == checkpoint_name(self.model_path)
        # a spec file checked against a checkpoint is read once per (file, checkpoint)
        key = (path.resolve(), Path(self.model_path).expanduser().resolve() if local else None)
        if specs is not None and key in specs:
            return specs[key]
        if from_checkpoint:
            spec = checkpoint_spec(self.model_path, self.model)
        elif not path.is_file():
            names = sorted(q.stem for q in Path(self.models_dir).glob("*.yaml"))
            raise ValueError(f"model {self.model!r}: no spec file {path}; known models: {', '.join(names) or 'none'}")
        else:
            spec = load_model_spec(path)
            if local and (problem := spec_disagreement(spec, path, self.model_path)):
                raise ValueError(problem)
        if specs is not None:
            specs[key] = spec
        return spec

    @model_validator(mode="after")
    def _combination(self, info: ValidationInfo) -> "RunConfig":
        from fp8rl_core.learner.checkpoint_spec import checkpoint_name, is_checkpoint_dir

        if "model" not in self.model_fields_set and is_checkpoint_dir(self.model_path):
            object.__setattr__(self, "model", checkpoint_name(self.model_path))  # the model read from it (spec())
        if (self.backend == "verl") != (self.verl is not None):
            raise ValueError(f"backend = {self.backend!r} {'needs a' if self.verl is None else 'takes no'} 'verl' section "
                             "(hardware, gpus_per_node, tensor_parallel, ...; fields: fp8rl_core/config/sections.py VerlSection)")
        if self.model_path is None and self.verl is not None and self.verl.hardware != "cpu":
            raise ValueError(f"model_path is required on verl.hardware {self.verl.hardware!r} (a hub id or a directory "
                             "with config.json); only hardware: cpu trains the run's own warm start")
        self._engine_fits()
        if self.checks.engine_checksums and self.backend == "native":
            raise ValueError("checks.engine_checksums with backend: native: the native experiment does not ask the "
                             "engine's checksums (the native correctness stage always does; a verl run does with this "
                             "switch); remove it or use backend: verl")
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
        if self.verl is not None:
            why = capabilities(self.verl.rollout).verl_refusal(PRESETS[self.preset].sampler_scheme)
            if why is not None:
                raise ValueError(f"preset {self.preset!r} with verl.rollout = {self.verl.rollout!r}: {why}")
        return self

    def _engine_fits(self) -> None:
        """``sampler.engine`` can serve the run (its row of :data:`fp8rl_core.sampler.capabilities.CAPABILITIES`;
        docs/configs.md, "The sampler engine"): the preset's scheme, the KV cache dtype, and a verl run only on an
        engine verl's rollout is (``verl.rollout`` names verl's)."""
        caps, s = capabilities(self.sampler.engine), self.sampler
        if self.backend == "verl" and not caps.verl_native:
            raise ValueError(f"sampler.engine: {s.engine} with backend: verl: verl's rollout engine is verl.rollout "
                             f"(sampler.engine is the native loop's); set verl.rollout: {s.engine} and leave sampler.engine")
        why = caps.refusal([PRESETS[self.preset].sampler_scheme])
        if why is not None:
            raise ValueError(why)
        if s.kv_cache_dtype not in caps.kv_cache_dtypes:
            raise ValueError(f"sampler.kv_cache_dtype = {s.kv_cache_dtype!r} with sampler.engine: {s.engine}: "
                             f"{caps.kv_why}; use kv_cache_dtype: {' or '.join(caps.kv_cache_dtypes)}")
        if self.model_path is not None:
            from fp8rl_core.learner.vocab_tail import emittable_ids

            n = emittable_ids(self.model_path, self.spec().vocab_size)
            if n is not None and not caps.masks_tail:
                raise ValueError(f"sampler.engine: {s.engine} with model_path {self.model_path}: its tokenizer has {n} "
                                 f"ids, fewer than the model's vocab_size {self.spec().vocab_size}, and fp8rl's "
                                 f"{caps.label} engine does not mask the ids beyond the tokenizer "
                                 "(fp8rl_core.learner.vocab_tail); use an engine that does (sampler.engine: vllm), as "
                                 "verl's vLLM rollout does")

    def _data_fits(self) -> None:
        """A dataset (``data.train``): trained from ``model_path``, a checkpoint with its own tokenizer, its
        lengths within ``sampler.max_model_len``, its longest prompt within ``data.max_prompt_length`` where the
        checkpoint's ``tokenizer.json`` is on this machine; a native run from ``model_path`` trains a dataset
        (docs/configs.md, "The data")."""
        d = self.data
        if d.is_task:
            if self.backend == "native" and self.model_path is not None:
                raise ValueError("model_path with backend: native needs data.train and data.val: the native loop "
                                 "trains a checkpoint on a dataset scored by its data_source (the addition task "
                                 "runs on the run's own warm start: leave model_path unset)")
            if self.backend == "native" and d.reward is not None:
                raise ValueError("data.reward with the addition task and backend: native: the native loop scores "
                                 "the task with its own reward; set data.train and data.val, or leave data.reward unset")
            return
        if self.model_path is None:
            raise ValueError("data.train needs model_path (a checkpoint directory or hub id with its tokenizer): "
                             "the run's own warm start has the addition task's 16-token vocabulary")
        if self.backend == "native" and not (Path(self.model_path).expanduser() / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path!r}: no checkpoint directory (config.json) here; the native "
                             "loop trains a local directory (a hub id: download it first, e.g. `hf download "
                             f"{self.model_path} --local-dir <dir>`, and give the directory)")
        total = d.prompt_length(self.sampler.max_model_len, 0) + d.max_response_length
        if total > self.sampler.max_model_len or total <= d.max_response_length:
            raise ValueError(f"data.max_prompt_length + data.max_response_length = {total} tokens does not fit "
                             f"sampler.max_model_len = {self.sampler.max_model_len}; raise sampler.max_model_len or "
                             "lower them")
        from fp8rl_core.config.dataset import longest_prompt, tokenizer_file

        tok = tokenizer_file(self.model_path)
        if tok is not None:
            limit = d.prompt_length(self.sampler.max_model_len, 0)
            for field in ("train", "val"):
                n, row = longest_prompt(getattr(d, field), d.prompt_key, str(tok))
                if n > limit:
                    raise ValueError(f"data.{field}: {getattr(d, field)}: column {d.prompt_key!r}, row {row}: the prompt "
                                     f"has at least {n} tokens ({tok}, without the chat template), more than "
                                     f"data.max_prompt_length = {limit}; raise data.max_prompt_length (and "
                                     "sampler.max_model_len) or drop the row")
