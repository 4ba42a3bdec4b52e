"""The sampler engines, one row per engine: :data:`CAPABILITIES`, the one registry of engines.

Rule: an engine is one frozen row (:class:`EngineCapabilities`) in this table — the class path of its seam
implementation (:class:`fp8rl_core.sampler.seam.Sampler`, imported when it is first started:
:mod:`fp8rl_core.sampler.engines`), what it can do, whether it masks the vocabulary tail
(:mod:`fp8rl_core.learner.vocab_tail`), the variable naming the interpreter of its own venv, and the function that
writes verl's CPU rollout overrides for it (:mod:`fp8rl_core.verl.overrides`, resolved there, lazily). Every user —
the config's validators (an engine field takes any name in this table when it is validated), the engine start, the
ablation's engine field, verl's overrides and pre-flight, the flows' interpreters — asks this table
(:func:`capabilities`, :func:`refusal`) and never compares an engine's name. Light: no engine is imported, no verl.
The first row is the default engine. Adding an engine: its package under ``fp8rl_core/sampler/`` and one row here
(tests/core/sampler/test_capabilities.py registers a fake engine and shows nothing else needs an edit).
Described in docs/design.md (Engines) and docs/configs.md (The sampler engine).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from fp8rl_core.grids.schemes import SCHEMES, scheme

__all__ = ["CAPABILITIES", "DEFAULT_ENGINE", "EngineCapabilities", "EngineName", "Interpreter", "capabilities",
           "known_engine", "refusal", "resolve"]


def resolve(path: str) -> Any:
    """The object a class path names: ``"package.module:attribute"`` (the module imported now)."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"class path {path!r} is not 'module:attribute'")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Interpreter:
    """The interpreter an engine's server runs in when it is not this venv's: ``env``, the environment variable
    naming it; ``venv``, the project folder of the venv it defaults to (``venv/bin/python``); ``setup``, the
    command that builds that venv; ``wants``, what the variable must name (in messages)."""

    env: str
    venv: str
    setup: str
    wants: str


@dataclass(frozen=True)
class EngineCapabilities:
    """One engine: ``name`` (``sampler.engine``, ``verl.rollout``), ``label`` (in messages), the quantized
    schemes its native engine serves on CPU (``cpu_schemes``) and on a GPU (``gpu_schemes``) with why the others
    are not (``cpu_why``, ``gpu_why``); the quantized schemes verl's rollout on it serves (``verl_schemes``, why not the others: ``verl_why``);
    ``planted_faults``: the correctness stage's faults can be planted in its engine and workers;
    ``checksums``: it answers its own weight checksums on this machine kind (CPU); ``tensor_parallel``: it runs
    more than one tensor-parallel rank; ``kv_cache_dtypes``: the ``sampler.kv_cache_dtype`` values it takes
    (with why not the others: ``kv_why``); ``verl_native``: a ``backend: verl`` run may name it as
    ``sampler.engine`` (else the run's verl rollout is ``verl.rollout``); ``fp8rl_method``: it loads fp8rl's quantization method
    (:mod:`fp8rl_core.sampler.vllm.plugin`), which serves every scheme; ``verl_cpu``: verl's rollout on it runs on CPU
    (``verl.hardware: cpu``). What it is: ``sampler``, the class path (``module:Class``) of its seam implementation;
    ``masks_tail``: it — fp8rl's engine by ``sampler.engine``, verl's rollout by ``verl.rollout`` — masks the ids at and
    beyond ``len(tokenizer)`` (:mod:`fp8rl_core.learner.vocab_tail`); ``interpreter``: the interpreter its server runs
    in (None: this venv's); ``verl_cpu_overrides``: the path (``module:function``) of what writes verl's overrides
    for its rollout on ``verl.hardware: cpu`` (``function(run, env) -> list[Override]``, :mod:`fp8rl_core.verl.overrides`)."""

    name: str
    label: str
    cpu_schemes: frozenset[str]
    gpu_schemes: frozenset[str]
    cpu_why: str
    gpu_why: str
    verl_schemes: frozenset[str]
    verl_why: str
    planted_faults: bool
    checksums: bool
    tensor_parallel: bool
    kv_cache_dtypes: tuple[str, ...]
    kv_why: str
    verl_native: bool
    fp8rl_method: bool
    verl_cpu: bool
    sampler: str
    masks_tail: bool
    interpreter: Interpreter | None
    verl_cpu_overrides: str

    def sampler_class(self) -> type:
        """The class implementing the seam for this engine (its module imported now)."""
        return resolve(self.sampler)

    def verl_refusal(self, name: str) -> str | None:
        """Why verl's rollout on this engine cannot serve a sampler on scheme ``name`` (one line), or None."""
        return None if not scheme(name).quantized or name in self.verl_schemes else self.verl_why

    def serves(self, schemes: Iterable[str], *, gpu: bool = False) -> bool:
        return self.refusal(schemes, gpu=gpu) is None

    def refusal(self, schemes: Iterable[str], *, gpu: bool = False) -> str | None:
        """Why this engine cannot serve layers on ``schemes`` (one line), or None (BF16 layers are always served)."""
        quantized = sorted({s for s in schemes if scheme(s).quantized})
        served = self.gpu_schemes if gpu else self.cpu_schemes
        bad = [s for s in quantized if s not in served]
        if not bad:
            return None
        where = "on a GPU" if gpu else "on CPU"
        return f"the {self.label} engine cannot run schemes {bad} {where}: {self.gpu_why if gpu else self.cpu_why}"


_ALL_QUANTIZED = frozenset(s.name for s in SCHEMES.values() if s.quantized)
_BF16_HINT = "use sampler.engine: vllm or a BF16-sampler preset (bf16-e2e, bf16-sampler)"

CAPABILITIES: dict[str, EngineCapabilities] = {c.name: c for c in (
    EngineCapabilities("vllm", "vLLM", _ALL_QUANTIZED, _ALL_QUANTIZED, "", "", _ALL_QUANTIZED, "", planted_faults=True,
                       checksums=True, tensor_parallel=True, kv_cache_dtypes=("auto", "fp8_e4m3", "fp8_e5m2"),
                       kv_why="", verl_native=True, fp8rl_method=True, verl_cpu=True,
                       sampler="fp8rl_core.sampler.vllm.engine:VllmSampler", masks_tail=True, interpreter=None,
                       verl_cpu_overrides="fp8rl_core.verl.overrides:vllm_cpu"),
    EngineCapabilities("sglang", "SGLang", frozenset(), frozenset(),
                       "SGLang 0.5.12's MXFP8 methods (Fp8LinearMethod, Fp8MoEMethod) need AMX; " + _BF16_HINT,
                       "they are not wired to SGLang's quantized methods yet; " + _BF16_HINT,
                       frozenset({"mxfp8", "block128"}),
                       "fp8rl loads SGLang's MXFP8 method with the learner's bytes and has no SGLang layer that "
                       "requantizes BF16 itself; use verl.rollout: vllm (fp8rl's vLLM method requantizes), or preset 'all'",
                       planted_faults=False, checksums=False, tensor_parallel=True,
                       kv_cache_dtypes=("auto",), kv_why="the SGLang engine keeps its KV cache in sampler.dtype",
                       verl_native=False, fp8rl_method=False, verl_cpu=False,
                       sampler="fp8rl_core.sampler.sglang.engine:SglangSampler", masks_tail=False,
                       interpreter=Interpreter("FP8RL_SGLANG_PYTHON", ".venv-sglang", "make setup-sglang",
                                               "an SGLang 0.5.12 interpreter"),
                       verl_cpu_overrides="fp8rl_core.verl.overrides:sglang_cpu"),
)}
#: the engine a run samples on unless it names another
DEFAULT_ENGINE = next(iter(CAPABILITIES))


def capabilities(engine: str) -> EngineCapabilities:
    """The row of ``engine``; an unknown name fails naming the known ones."""
    if engine not in CAPABILITIES:
        raise ValueError(f"unknown sampler engine {engine!r}; known engines: {', '.join(sorted(CAPABILITIES))}")
    return CAPABILITIES[engine]


def known_engine(name: str) -> str:
    """``name`` when it names a row (what an engine field of a config validates with); else the ValueError of
    :func:`capabilities`."""
    capabilities(name)
    return name


#: a config field that names an engine: validated against this table when the config is (a row added since counts)
EngineName = Annotated[str, AfterValidator(known_engine)]


def refusal(engine: str, schemes: Iterable[str], *, gpu: bool = False) -> str | None:
    """:meth:`EngineCapabilities.refusal` of ``engine``."""
    return capabilities(engine).refusal(schemes, gpu=gpu)
