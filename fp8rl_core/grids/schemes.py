"""The sampler's per-layer schemes, each defined once: :data:`SCHEMES`.

Rule: a sampler layer holds one scheme after a sync — ``bf16`` (the learner's BF16 view, no FP8 grid),
``mxfp8`` (the learner's own MXFP8 data and scale bytes, never requantized), ``requant`` (the BF16 view,
quantized by the engine itself with vLLM's online MXFP8 rule, :data:`REQUANT_GRID`) or ``block128`` (the BF16
view, quantized by the engine to 128×128 block FP8, :data:`BLOCK_GRID`, as verl's FP8 rollout). Each
:class:`Scheme` says declaratively what is sent, what the engine holds, how it is checked, reported and
passed to verl; the modules that export, check, report and configure read these fields and never compare a
scheme's name. Specified in docs/library.md (The sampler and the weight sync; The fp8rl quantization method).
A scheme also yields its grid (:meth:`Scheme.grid`) and reads its held bytes (:meth:`Scheme.dequantize_held`,
:meth:`Scheme.quantize_view`, :meth:`Scheme.quantize_activation`): the block family of a scheme is this module's
business, and no module outside ``grids/`` switches on it. Adding a scheme: one entry here (and its arithmetic
in the engine's own package).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reading and quantizing methods import the grids' arithmetic (and torch) when called
    import torch

    from fp8rl_core.grids.api import QuantizedTensor

__all__ = ["BF16", "BLOCK_GRID", "DEFAULT_SCHEME", "MX_GRID", "REQUANT_GRID", "SCHEMES", "Scheme", "Sent", "VerlRollout",
           "layer_scheme", "scheme"]

#: the MXFP8 grid of the sampler's on-grid layers unless the run names another (the learner's default rule)
MX_GRID = "mxfp8-e4m3-rceil"
#: the rule a ``requant`` layer quantizes its received BF16 view with: vLLM's online MXFP8 quantization
#: (``_mxfp8_e4m3_quantize_torch`` in vLLM 0.32: E8M0 scale ``ceil(log2(amax/448))``, 1×32 blocks along K),
#: which is fp8rl's ``mxfp8-e4m3-rceil`` applied to BF16 input, byte for byte
REQUANT_GRID = "mxfp8-e4m3-rceil"
#: the grid a ``block128`` layer quantizes its received BF16 view to (DeepGEMM / vLLM 128×128 block FP8)
BLOCK_GRID = "fp8-block128-e4m3"
#: rows × columns of an MX scale block (one E8M0 byte per 32 elements along K)
_MX_BLOCK = (1, 32)


class Sent(Enum):
    """What a sync sends for a layer."""

    BYTES = "the learner's FP8 data and E8M0 scale bytes (uint8 views)"
    VIEW = "the learner's BF16 view (round-to-nearest-even of the fp32 master)"


class VerlRollout(Enum):
    """How a verl run's GPU rollout is told to serve the layer (on CPU fp8rl's vLLM method serves every scheme)."""

    DEFAULT = "verl's own BF16 rollout: nothing to configure"
    FP8RL = "fp8rl's vLLM quantization method (on SGLang: its MXFP8 method, loaded with fp8rl's bytes)"
    VERL_FP8 = "verl's own FP8 rollout (rollout.quantization=fp8: BF16 sent, 128×128 requantized in the worker)"


@dataclass(frozen=True)
class Scheme:
    """One per-layer scheme of the sampler.

    ``name``: what a run's quantization config says for the layer (``quantization_config.layers``);
    ``label``: the report's group of the syncs of a preset whose sampler holds it; ``sent``: what a sync sends;
    ``rule``: the grid the engine quantizes the received view with itself (None: it quantizes nothing — the
    learner's bytes, or BF16); ``held``: the read-back names (suffixes) of the data and scale bytes the engine
    holds (None: no FP8 bytes); ``block``: rows × columns of one scale block of those bytes;
    ``rule_checked``: W2 compares the engine's own bytes with ``rule`` applied to the learner's BF16 view;
    ``evidence``: the conditions that carry the group's evidence, ``shows``: what they show there;
    ``probe_exact``: the learner's probe models the engine's rounding (W7's tight bound holds on a float32
    engine); ``verl``: how verl's GPU rollout serves it."""

    name: str
    label: str
    sent: Sent
    rule: str | None
    held: tuple[str, str] | None
    block: tuple[int, int]
    rule_checked: bool
    evidence: tuple[str, ...]
    shows: str
    probe_exact: bool
    verl: VerlRollout

    @property
    def quantized(self) -> bool:
        """The engine computes this layer on an FP8 grid."""
        return self.held is not None

    @property
    def on_learner_grid(self) -> bool:
        """The engine holds the learner's own FP8 bytes (what claim (c) is about)."""
        return self.sent is Sent.BYTES

    @property
    def _mx(self) -> bool:
        """The held bytes are MX: 1×32 scale blocks along K (this module's own business: no other asks it)."""
        return self.quantized and self.block == _MX_BLOCK

    @property
    def k_multiple(self) -> int:
        """What a layer's K (input features) must be a multiple of to hold this scheme's bytes: 32 for MX blocks
        (1×32 along K, never padded), 1 otherwise (128×128 blocks pad the last tile; BF16 holds no blocks)."""
        return self.block[1] if self._mx else 1

    @property
    def probe_reads_held(self) -> bool:
        """A probe forward of the identity reads back exactly the dequantized held bytes: the activations' grid
        holds 1.0 exactly (MX: an E8M0 scale of 2^0); 1×128 block-FP8 activations scale by amax/448, which does
        not (W6's held-vs-effective comparison applies only where this is true)."""
        return self._mx

    def grid(self, mx_grid: str = MX_GRID, block_grid: str = BLOCK_GRID) -> str | None:
        """The grid of the FP8 bytes the engine holds for a layer on this scheme (None: BF16, no bytes): its own
        ``rule``, else the run's ``mx_grid`` (the learner's, whose bytes it holds) for MX blocks and ``block_grid``
        for 128×128 blocks."""
        if not self.quantized:
            return None
        return self.rule or (mx_grid if self._mx else block_grid)

    def quantize_view(self, view: torch.Tensor, grid: str) -> QuantizedTensor:
        """A [.., N, K] BF16 view (fp32 values) put on ``grid`` (:meth:`grid`) as this scheme's engine holds it:
        1×32 blocks along K, or 128×128 tiles over the last two dims (role ``weight``)."""
        from fp8rl_core.grids.api import quantize

        return quantize(view.float(), grid, axis=-1, role="weight")

    def quantize_activation(self, x: torch.Tensor, grid: str) -> torch.Tensor:
        """Activations [.., K] on this scheme's activation grid and back, fp32: rowwise 1×32 MX blocks on an MX
        ``grid``, 1×128 per-token groups (vLLM's rule) on a block grid."""
        import torch

        from fp8rl_core.grids.api import quantize

        return quantize(x, grid, axis=-1, role="activation").dequantize(torch.float32)

    def dequantize_held(self, data: torch.Tensor, scale: torch.Tensor, grid: str) -> torch.Tensor:
        """The fp32 weight [.., N, K] that held bytes stand for: ``data`` (uint8 or FP8 view of the elements)
        with ``scale`` (E8M0 bytes [.., N, K/32] for MX blocks; fp32 ``weight_scale_inv`` [.., ⌈N/128⌉, ⌈K/128⌉]
        for 128×128 blocks) on ``grid`` (:meth:`grid`). The one reading of held bytes: every module that reads
        them back (the checks, the vLLM plugin and worker) calls this."""
        import torch

        from fp8rl_core.grids.api import QuantizedTensor
        from fp8rl_core.grids.spec import parse_grid

        g = parse_grid(grid)
        data = data.view(g.format.dtype)
        if g.family == "mxfp8":
            return QuantizedTensor(data, scale, g, axis=data.dim() - 1).dequantize(torch.float32)
        return QuantizedTensor(data, scale.float(), g, axis=data.dim() - 1, role="weight").dequantize(torch.float32)


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("bf16", "BF16 sampler", Sent.VIEW, None, None, (1, 32), False, ("W4",),
           "every tensor the sampler holds equals the learner's BF16 view (no layer on an FP8 grid, so W2 "
           "compares no tensor)", True, VerlRollout.DEFAULT),
    Scheme("mxfp8", "on the learner's grid", Sent.BYTES, None, ("weight", "weight_scale"), (1, 32), False, ("W2",),
           "the sampler's FP8 data and scale bytes read back equal the learner's rowwise quantization of its "
           "master weights", True, VerlRollout.FP8RL),
    Scheme("requant", "sampler requantizes", Sent.VIEW, REQUANT_GRID, ("mx_data", "mx_scale"), (1, 32), True,
           ("W2", "W4"), "W2: its FP8 bytes equal vLLM's online MXFP8 rule applied to the learner's BF16 view (the "
           "sampler's own rule, not the learner's bytes); W4: its BF16 tensors equal the learner's BF16 view",
           False, VerlRollout.FP8RL),
    Scheme("block128", "another grid (128×128 block FP8)", Sent.VIEW, BLOCK_GRID, ("fp8_data", "fp8_scale_inv"),
           (128, 128), False, ("W4",), "the BF16 view it is sent equals the learner's; the block-FP8 bytes it makes "
           "of that view itself are checked for layout (W3) and compute copy (W6), not against a rule (W2 compares "
           "no tensor)", False, VerlRollout.VERL_FP8),
)}
#: the scheme of a layer a sampler's quantization config does not name
BF16 = SCHEMES["bf16"]
#: the scheme a layer selection is put on unless another is named (the learner's grid and bytes)
DEFAULT_SCHEME = "mxfp8"


def scheme(name: str) -> Scheme:
    """The scheme called ``name``; an unknown name fails naming the valid ones."""
    if name not in SCHEMES:
        raise ValueError(f"unknown sampler scheme {name!r}; valid: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def layer_scheme(schemes: Mapping[str, str], prefix: str) -> Scheme:
    """The scheme of sampler layer ``prefix`` under a quantization config's ``schemes`` (prefix → name; a layer
    it does not name is :data:`BF16`)."""
    return scheme(schemes.get(prefix, BF16.name))
