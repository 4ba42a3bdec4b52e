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

from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.patterns import resolve_names
from fp8rl_core.sync.layout import sampler_layer

__all__ = ["PRESETS", "Preset", "sampler_schemes"]


@dataclass(frozen=True)
class Preset:
    name: str
    learner_precision: Literal["bf16", "mxfp8"]
    learner_layers: str
    sampler_layers: str
    sampler_grid: Literal["learner", "requant", "block128"]
    what: str

    def learner_config(self, **settings) -> LearnerConfig:
        """The learner's config under this preset: its precision and layers; recipe, lr, GRPO … as given
        (else :class:`~fp8rl_core.learner.config.LearnerConfig`'s defaults)."""
        return LearnerConfig(precision=self.learner_precision, layers=self.learner_layers, **settings)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("bf16-e2e", "bf16", "none", "none", "learner", "BF16 learner and BF16 sampler"),
    Preset("bf16-sampler", "mxfp8", "all", "none", "learner", "MXFP8 learner, BF16 sampler"),
    Preset("half", "mxfp8", "all", "half", "learner", "MXFP8 learner, half the sampler's layers on its grid"),
    Preset("all", "mxfp8", "all", "all", "learner", "MXFP8 learner, every sampler layer on its grid"),
    Preset("requant", "mxfp8", "all", "all", "requant",
           "MXFP8 learner, sampler requantizes the BF16 view with vLLM's online MXFP8 rule"),
    Preset("other-grid", "mxfp8", "all", "all", "block128", "MXFP8 learner, sampler on 128x128 block FP8"),
)}


def sampler_schemes(
    gemm_names: Sequence[str], selection: str | Iterable[str],
    grid: Literal["learner", "requant", "block128"] = "learner",
) -> dict[str, str]:
    """vLLM layer prefix → scheme (``mxfp8`` for the learner's grid and bytes, ``requant`` for that grid
    requantized by the sampler from BF16, ``block128``) for the selected learner GEMM layers; layers not
    selected stay ``bf16`` (absent from the mapping)."""
    if grid not in ("learner", "requant", "block128"):
        raise ValueError(f"sampler grid must be 'learner', 'requant' or 'block128', got {grid!r}")
    chosen = set(resolve_names(gemm_names, selection))
    groups: dict[str, list[str]] = {}
    for name in gemm_names:
        groups.setdefault(sampler_layer(name), []).append(name)
    scheme = {"learner": "mxfp8", "requant": "requant", "block128": "block128"}[grid]
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
        out[prefix] = scheme
    return out
