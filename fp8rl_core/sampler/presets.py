"""The paper's pipeline presets and the resolution of a sampler's layer selection into vLLM schemes.

Rule: six presets — ``bf16-e2e``, ``bf16-sampler``, ``half``, ``all``, ``requant``, ``other-grid`` — each a
learner precision and a sampler layer selection and grid (the table: docs/library.md, The sampler and the weight
sync). Selections use the learner's GEMM layer names and pattern language (:mod:`fp8rl_core.learner.patterns`);
a fused vLLM layer (q/k/v, gate/up, an expert pair) must be selected whole, else it is an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from fp8rl_core.grids.schemes import DEFAULT_SCHEME, SCHEMES, Scheme, scheme
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.patterns import resolve_names
from fp8rl_core.sampler.capabilities import DEFAULT_ENGINE, refusal
from fp8rl_core.sync.layout import sampler_layer

__all__ = ["ENGINE_DTYPES", "LEARNER_FORWARDS", "PRESETS", "Preset", "Variant", "sampler_schemes"]


@dataclass(frozen=True)
class Preset:
    name: str
    learner_precision: Literal["bf16", "mxfp8"]
    learner_layers: str
    sampler_layers: str
    sampler_scheme: str
    what: str

    def __post_init__(self) -> None:
        quantized = scheme(self.sampler_scheme).quantized
        if quantized == (self.sampler_layers == "none"):
            raise ValueError(f"preset {self.name!r}: sampler layers {self.sampler_layers!r} on scheme "
                             f"{self.sampler_scheme!r}; a BF16 sampler selects no layer, an FP8 one some")

    @property
    def scheme(self) -> Scheme:
        """What the sampler's selected GEMM layers hold after a sync (:data:`~fp8rl_core.grids.schemes.SCHEMES`):
        ``bf16`` when no layer is selected (BF16 views only)."""
        return SCHEMES[self.sampler_scheme]

    def schemes(self, gemm_names: Sequence[str]) -> dict[str, str]:
        """vLLM layer prefix → scheme of this preset's sampler over the learner's ``gemm_names``
        (:func:`sampler_schemes`)."""
        return sampler_schemes(gemm_names, self.sampler_layers, self.sampler_scheme)

    def learner_config(self, **settings) -> LearnerConfig:
        """The learner's config under this preset: its precision and layers; recipe, lr, GRPO … as given
        (else :class:`~fp8rl_core.learner.config.LearnerConfig`'s defaults)."""
        return LearnerConfig(precision=self.learner_precision, layers=self.learner_layers, **settings)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("bf16-e2e", "bf16", "none", "none", "bf16", "BF16 learner and BF16 sampler"),
    Preset("bf16-sampler", "mxfp8", "all", "none", "bf16", "MXFP8 learner, BF16 sampler"),
    Preset("half", "mxfp8", "all", "half", "mxfp8", "MXFP8 learner, half the sampler's layers on its grid"),
    Preset("all", "mxfp8", "all", "all", "mxfp8", "MXFP8 learner, every sampler layer on its grid"),
    Preset("requant", "mxfp8", "all", "all", "requant",
           "MXFP8 learner, sampler requantizes the BF16 view with vLLM's online MXFP8 rule"),
    Preset("other-grid", "mxfp8", "all", "all", "block128", "MXFP8 learner, sampler on 128x128 block FP8"),
)}

ENGINE_DTYPES = ("bfloat16", "float32")
LEARNER_FORWARDS = ("training", "fp32")


@dataclass(frozen=True)
class Variant:
    """One sampler configuration measured at fixed weights.

    ``preset``: the sampler's layers and grid and the learner's precision (:data:`PRESETS`). The ablation's
    switches, each removing one difference between the two sides: ``engine_dtype`` (the engine's compute
    dtype: BF16 activations, attention, norms and KV cache, or float32), ``learner_forward`` (``training``:
    the learner's training forward under BF16 autocast, what RL's log-probs come from; ``fp32``: the learner's
    function of exactly the synced weights in fp32, :meth:`Learner.probe_logprobs`), ``activation_rule``
    (the E8M0 rule the sampler's on-grid layers quantize activations with; None: the learner's), ``engine``
    (the engine that serves the sampler, a row of :data:`~fp8rl_core.sampler.capabilities.CAPABILITIES`: vLLM, or SGLang
    for the presets whose sampler layers are all BF16). A variant with every switch at its default is the preset
    as a run configures it."""

    preset: str
    engine_dtype: Literal[ENGINE_DTYPES] = "bfloat16"
    learner_forward: Literal[LEARNER_FORWARDS] = "training"
    activation_rule: str | None = None
    engine: str = DEFAULT_ENGINE

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; valid presets: {', '.join(PRESETS)}")
        if self.engine_dtype not in ENGINE_DTYPES:
            raise ValueError(f"engine_dtype must be one of {ENGINE_DTYPES}, got {self.engine_dtype!r}")
        if self.learner_forward not in LEARNER_FORWARDS:
            raise ValueError(f"learner_forward must be one of {LEARNER_FORWARDS}, got {self.learner_forward!r}")
        why = refusal(self.engine, [PRESETS[self.preset].sampler_scheme])  # an unknown engine fails here, naming the known
        if why is not None:
            raise ValueError(f"preset {self.preset!r} on engine {self.engine}: {why}")

    @property
    def ablation(self) -> bool:
        return (self.engine_dtype, self.learner_forward, self.activation_rule, self.engine) != (
            "bfloat16", "training", None, DEFAULT_ENGINE)

    @property
    def name(self) -> str:
        """The preset's name, with the switches that differ from a run's: ``all@engine=float32,learner=fp32``;
        an engine other than vLLM first, by its name: ``bf16-sampler@sglang``, ``bf16-sampler@sglang,engine=float32``."""
        parts = [self.engine] if self.engine != DEFAULT_ENGINE else []
        parts += [f"engine={self.engine_dtype}"] if self.engine_dtype != "bfloat16" else []
        parts += [f"learner={self.learner_forward}"] if self.learner_forward != "training" else []
        parts += [f"activations={self.activation_rule}"] if self.activation_rule else []
        return f"{self.preset}@{','.join(parts)}" if parts else self.preset


def sampler_schemes(gemm_names: Sequence[str], selection: str | Iterable[str], scheme_name: str = DEFAULT_SCHEME) -> dict[str, str]:
    """vLLM layer prefix → scheme ``scheme_name`` (:data:`~fp8rl_core.grids.schemes.SCHEMES`: ``mxfp8`` for the
    learner's grid and bytes, ``requant``, ``block128``) for the selected learner GEMM layers; layers not
    selected stay ``bf16`` (absent from the mapping, as every layer of a scheme that quantizes nothing)."""
    if not scheme(scheme_name).quantized:
        return {}
    chosen = set(resolve_names(gemm_names, selection))
    groups: dict[str, list[str]] = {}
    for name in gemm_names:
        groups.setdefault(sampler_layer(name), []).append(name)
    out: dict[str, str] = {}
    for prefix, members in groups.items():
        picked = [m for m in members if m in chosen]
        if not picked:
            continue
        if len(picked) != len(members):
            missing = [m for m in members if m not in chosen]
            raise ValueError(
                f"sampler layer {prefix!r} fuses {members}; the selection puts {picked} on the grid but not "
                f"{missing} — select all of them or none (vLLM computes them as one layer)"
            )
        if prefix.endswith("lm_head"):
            raise ValueError("the sampler keeps lm_head in BF16 (vLLM's LM head takes no fp8rl scheme); deselect it")
        out[prefix] = scheme_name
    return out
