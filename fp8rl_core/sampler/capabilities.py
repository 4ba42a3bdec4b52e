"""What each sampler engine can do, one row per engine: :data:`CAPABILITIES`, beside the engine registry
(:data:`fp8rl_core.sampler.engines.ENGINES`, which holds the same names).

Rule: every refusal of an engine — a config's validators, the ablation's engine field, an engine's own start —
asks this table (:func:`capabilities`, :func:`refusal`) and never compares an engine's name. Light: no engine is
imported. The first row is the default engine. Adding an engine: its package under ``fp8rl_core/sampler/``, one
entry in ``ENGINES`` and one row here. Described in docs/configs.md (The sampler engine).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fp8rl_core.grids.schemes import SCHEMES, scheme

__all__ = ["CAPABILITIES", "DEFAULT_ENGINE", "EngineCapabilities", "capabilities", "refusal"]


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
    (``verl.hardware: cpu``); ``venv``: the project folder of the venv its server runs in (None: this one)."""

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
    venv: str | None

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
                       kv_why="", verl_native=True, fp8rl_method=True, verl_cpu=True, venv=None),
    EngineCapabilities("sglang", "SGLang", frozenset(), frozenset(),
                       "SGLang 0.5.12's MXFP8 methods (Fp8LinearMethod, Fp8MoEMethod) need AMX; " + _BF16_HINT,
                       "they are not wired to SGLang's quantized methods yet; " + _BF16_HINT,
                       frozenset({"mxfp8", "block128"}),
                       "fp8rl loads SGLang's MXFP8 method with the learner's bytes and has no SGLang layer that "
                       "requantizes BF16 itself; use verl.rollout: vllm (fp8rl's vLLM method requantizes), or preset 'all'",
                       planted_faults=False, checksums=False, tensor_parallel=True,
                       kv_cache_dtypes=("auto",), kv_why="the SGLang engine keeps its KV cache in sampler.dtype",
                       verl_native=False, fp8rl_method=False, verl_cpu=False, venv=".venv-sglang"),
)}
#: the engine a run samples on unless it names another
DEFAULT_ENGINE = next(iter(CAPABILITIES))


def capabilities(engine: str) -> EngineCapabilities:
    """The row of ``engine``; an unknown name fails naming the known ones."""
    if engine not in CAPABILITIES:
        raise ValueError(f"unknown sampler engine {engine!r}; known engines: {', '.join(sorted(CAPABILITIES))}")
    return CAPABILITIES[engine]


def refusal(engine: str, schemes: Iterable[str], *, gpu: bool = False) -> str | None:
    """:meth:`EngineCapabilities.refusal` of ``engine``."""
    return capabilities(engine).refusal(schemes, gpu=gpu)
