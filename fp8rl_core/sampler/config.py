"""How the sampler's engine is built and samples (:class:`SamplerConfig`), in a light module: pydantic only —
the experiment config (:mod:`fp8rl_core.config.schema`, :class:`~fp8rl_core.config.schema.RunConfig`) validates it without importing vLLM or SGLang.
``engine`` names the engine (:mod:`fp8rl_core.sampler.engines`: vLLM's
:class:`~fp8rl_core.sampler.vllm.engine.VllmSampler` by default, or SGLang's
:class:`~fp8rl_core.sampler.sglang.engine.SglangSampler`); :func:`engine_key` says which of these fields make an
engine's identity (the pool, :mod:`fp8rl_core.sampler.pool`, reuses engines by it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fp8rl_core.grids.schemes import MX_GRID, REQUANT_GRID  # defined with the schemes (fp8rl_core.grids.schemes)
from fp8rl_core.identity import content_hash
from fp8rl_core.sampler.capabilities import CAPABILITIES, DEFAULT_ENGINE, EngineName

__all__ = ["ENGINE_PROCESSES", "ENGINE_SECTIONS", "KV_CACHE_DTYPES", "SAMPLER_ENGINES", "MX_GRID", "REQUANT_GRID", "SamplerConfig",
           "VllmSettings", "cpu_fp8_kv_support", "engine_key"]

KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
#: the engines registered when this module was imported (:data:`fp8rl_core.sampler.capabilities.CAPABILITIES`), the
#: default first; a config's engine field validates against the table itself (:data:`~fp8rl_core.sampler.capabilities.EngineName`)
SAMPLER_ENGINES = tuple(CAPABILITIES)
#: where vLLM's engine core and its worker run (see :class:`VllmSettings`.process)
ENGINE_PROCESSES = ("spawn", "in-process")


class VllmSettings(BaseModel):
    """What only vLLM's engine takes (``sampler.vllm``). A run config may write them flat in ``sampler`` as well
    (``sampler.process: in-process``): :class:`SamplerConfig` reads them into this section once, and a run's
    identity hashes them where they were (flat: :meth:`SamplerConfig.flat`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_size: int = Field(32, ge=16, description="KV block size; CPU attention needs a multiple of 32")
    process: Literal[ENGINE_PROCESSES] = Field(
        "spawn", description="spawn: vLLM's engine core and its worker each in a process of their own (what a "
        "deployment runs; the engine can die alone and the run fails with its last good version); in-process: both in "
        "the calling process (vLLM's in-process client and single-process executor: no process starts, about "
        "20 s less per engine start on 2 cores; an engine crash takes the calling process with it)")

    @field_validator("block_size")
    @classmethod
    def _block_multiple_of_32(cls, v: int) -> int:
        if v % 32:
            raise ValueError(f"block_size must be a multiple of 32 (vLLM's CPU attention), got {v}")
        return v


#: the engine subsections of :class:`SamplerConfig`: section name → its fields (which may be written flat)
ENGINE_SECTIONS: dict[str, tuple[str, ...]] = {"vllm": tuple(VllmSettings.model_fields)}


class SamplerConfig(BaseModel):
    """Which engine, how it is built (engine identity) and how it samples; what only one engine takes in its
    own subsection (``vllm``: :class:`VllmSettings`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: EngineName = Field(
        DEFAULT_ENGINE, description="vllm: vLLM (every preset); sglang: SGLang's HTTP server in .venv-sglang (native runs "
        "whose sampler holds BF16 layers: bf16-e2e, bf16-sampler; docs/configs.md, The sampler engine)")

    dtype: Literal["bfloat16", "float32"] = Field(
        "bfloat16", description="engine compute dtype; float32 is the exact probe mode (W7)")
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = Field(
        "auto", description="auto = the model dtype (BF16); fp8_* = FP8 KV cache with per-tensor scales")
    max_model_len: int = Field(128, ge=16, description="prompt + completion tokens per sequence")
    max_num_seqs: int = Field(256, ge=1, description="sequences the scheduler runs at once")
    kv_cache_gib: float = Field(1.0, gt=0, description="GiB of RAM for the KV cache on CPU (vLLM's kv_cache_memory_bytes; "
                                "allocated and zeroed at every engine start, freed at its close); on a GPU "
                                "memory_fraction sizes it")
    memory_fraction: float = Field(0.1, gt=0, le=1, description="gpu_memory_utilization (a fraction of RAM on CPU)")
    enable_prefix_caching: bool = True
    temperature: float = Field(1.0, gt=0)
    bucket_mb: float = Field(64.0, gt=0, description="sync bucket size in MiB")
    threads: int | None = Field(None, ge=1, description="OMP threads of the worker (None: the engine's default)")
    vllm: VllmSettings = Field(VllmSettings(), description="what only vLLM's engine takes: block_size, process")

    @model_validator(mode="before")
    @classmethod
    def _engine_fields_written_flat(cls, data):
        """``sampler.process`` → ``sampler.vllm.process`` (each :data:`ENGINE_SECTIONS` field written flat); the
        same field in both places is refused, naming both."""
        if not isinstance(data, dict):
            return data
        for section, fields in ENGINE_SECTIONS.items():
            flat = {k: data[k] for k in fields if k in data}
            if not flat:
                continue
            nested = data.get(section) or {}
            nested = nested.model_dump() if isinstance(nested, BaseModel) else dict(nested)
            both = sorted(set(flat) & set(nested))
            if both:
                raise ValueError(f"sampler.{both[0]} and sampler.{section}.{both[0]} are both set; keep one")
            data = {k: v for k, v in data.items() if k not in flat} | {section: nested | flat}
        return data

    def flat(self) -> dict:
        """The config as a dict with the engine subsections' fields in the section itself (where they were before
        the subsections: what run ids and engine keys hash)."""
        out = self.model_dump()
        for section in ENGINE_SECTIONS:
            out |= out.pop(section)
        return out

    def with_engine(self, section: str, **fields) -> "SamplerConfig":
        """This config with ``fields`` of engine subsection ``section`` changed (``with_engine("vllm", process="spawn")``)."""
        return self.model_copy(update={section: getattr(self, section).model_copy(update=fields)})

    def engine_settings(self) -> dict:
        """The settings the engine is built with at its start: all but ``temperature`` (per request) and
        ``bucket_mb`` (per sync) — two engines with equal settings (and model) are interchangeable. ``engine``
        is among them unless it is the default (vLLM engines keep the keys they had before the field); the
        engine subsections' fields flat (:meth:`flat`)."""
        exclude = {"temperature", "bucket_mb"} | ({"engine"} if self.engine == DEFAULT_ENGINE else set())
        return {k: v for k, v in self.flat().items() if k not in exclude}

def cpu_fp8_kv_support(cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether this CPU can run vLLM's FP8 KV cache (its CPU attention needs AVX-512 or AMX); the
    flags are read from ``/proc/cpuinfo`` unless its text is given."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    has = sorted(f for f in flags if f.startswith(("avx512f", "amx_")))
    if has:
        return True, f"CPU flags {', '.join(has)}"
    return False, "this CPU has neither AVX-512 (avx512f) nor AMX, which vLLM's CPU attention needs for an FP8 KV cache"


def engine_key(model: Mapping, cfg: SamplerConfig) -> str:
    """The one identity of an engine — what makes two engines interchangeable: what it serves (``model``: the
    engine's model config with its schemes; before the checkpoint exists, what that is made from — the
    scheduler's :func:`fp8rl_core.schedule.engine_group`) and the settings it is built with at start
    (:meth:`SamplerConfig.engine_settings`)."""
    return content_hash({"model": model, "engine": cfg.engine_settings()}, 16, compact=False)
