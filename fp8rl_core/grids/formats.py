"""FP8 element formats and the saturating round-to-nearest-even cast every grid ends with.

Two FP8 element encodings appear in every grid of this package (OCP "OFP8" formats, the same ones
the OCP Microscaling spec v1.0, section 5.3, uses for MX elements):

========  ====  ====  ======  ===========  ==========================================
format    ebits mbits bias    max finite   specials
========  ====  ====  ======  ===========  ==========================================
E4M3      4     3     7       448          no Inf; S.1111.111 is NaN (``float8_e4m3fn``)
E5M2      5     2     15      57344        IEEE-like: Inf and NaN (``float8_e5m2``)
========  ====  ====  ======  ===========  ==========================================

``emax`` (the exponent of the largest power of two the format holds) is 8 for E4M3 and 15 for
E5M2; the MX scale rules subtract it from the block's exponent.

The cast. Hardware quantizers (``cvt.rn.satfinite.e4m3x2.f32`` in Transformer Engine and cuBLAS)
round to nearest, ties to even, and *saturate*: finite values beyond the largest finite value and
±Inf become ±max, NaN stays NaN. On torch 2.13 CPU, ``tensor.to(torch.float8_e4m3fn)`` already does
exactly that, but ``.to(torch.float8_e5m2)`` does not saturate (overflow becomes Inf). So
:func:`saturating_cast` clamps first — ``torch.clamp`` keeps NaN and maps ±Inf to ±max — and then
casts; clamping before an RNE cast gives the same bytes as a saturating RNE cast because every
value above max rounds to max or beyond anyway. A NaN keeps its sign bit (byte 0x7F or 0xFF for
E4M3, as torch's cast produces).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

__all__ = ["FP8Format", "E4M3", "E5M2", "FORMATS", "saturating_cast", "bf16_view"]


@dataclass(frozen=True)
class FP8Format:
    """Constants of one FP8 element encoding."""

    name: str
    dtype: torch.dtype
    ebits: int
    mbits: int
    bias: int
    max: float
    emax: int

    @property
    def min_normal_exp(self) -> int:
        """Exponent of the smallest normal value (1 - bias)."""
        return 1 - self.bias

    @property
    def max_norm_rcp(self) -> float:
        """Transformer Engine's ``Quantized_Limits<T>::max_norm_rcp``: the double ``1.0 / max`` rounded
        to the nearest fp32 value (RNE, as a C ``(float)`` cast) — the reciprocal of the MX ``rceil``
        scale rule."""
        return struct.unpack("<f", struct.pack("<f", 1.0 / self.max))[0]


E4M3 = FP8Format("e4m3", torch.float8_e4m3fn, ebits=4, mbits=3, bias=7, max=448.0, emax=8)
E5M2 = FP8Format("e5m2", torch.float8_e5m2, ebits=5, mbits=2, bias=15, max=57344.0, emax=15)
FORMATS: dict[str, FP8Format] = {"e4m3": E4M3, "e5m2": E5M2}


def saturating_cast(v: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    """Round fp32 ``v`` to ``fmt`` with RNE and saturation (±Inf and overflow → ±max, NaN stays NaN)."""
    return torch.clamp(v, min=-fmt.max, max=fmt.max).to(fmt.dtype)


def bf16_view(x: torch.Tensor) -> torch.Tensor:
    """The learner's BF16 view of a tensor: round-to-nearest-even of its fp32 value.

    This is the "off-grid" precision of docs/design.md (condition W4): fp32 master weights reach the
    sampler as ``bf16(x)``, RNE, NaN and Inf preserved. Inputs of other dtypes are widened to fp32
    first (exact for fp16/bf16/fp8), so the result depends only on the value.
    """
    if x.dtype == torch.bfloat16:
        return x.clone()
    return x.to(torch.float32).to(torch.bfloat16)
