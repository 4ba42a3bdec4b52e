"""Per-tensor FP8 with current scaling: Transformer Engine's ``Float8CurrentScaling`` recipe.

The rule (``compute_scale_from_amax`` in TE's ``common/recipe/recipe_common.cuh``; amax from
``fmaxf`` over |x|, so NaN elements are skipped)::

    amax  = max |x| over the whole tensor, in fp32 (NaN skipped)
    scale = 1                      if amax is 0 or Inf (an amax_epsilon of 0, TE's default)
    scale = fp32(max_fp8 / amax)   otherwise (fp32 division); an Inf quotient becomes FLT_MAX
    scale = 2^floor(log2 scale)    with -pow2 (TE's force_pow_2_scales: keep sign and exponent bits)
    q     = sat_rne(x · scale)
    scale_inv = fp32(1 / scale)    (``__frcp_rn``) — what is stored, and what dequantization multiplies by
"""

from __future__ import annotations

import torch

from .formats import FP8Format, saturating_cast

__all__ = ["quantize_tensor", "tensor_scale_from_amax"]

_FLT_MAX = torch.finfo(torch.float32).max


def tensor_scale_from_amax(amax: torch.Tensor, fmt: FP8Format, pow2: bool) -> torch.Tensor:
    """TE's ``compute_scale_from_amax`` (epsilon 0) on an fp32 amax tensor."""
    amax = amax.to(torch.float32)
    scale = torch.tensor(fmt.max, dtype=torch.float32) / amax
    scale = torch.where(torch.isinf(scale), _FLT_MAX, scale)
    scale = torch.where((amax == 0) | torch.isinf(amax) | torch.isnan(amax), 1.0, scale)
    if pow2:
        scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)
    return scale


def quantize_tensor(x: torch.Tensor, fmt: FP8Format, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize with one current-scaling fp32 scale → (fp8 data like ``x``, fp32 0-d ``scale_inv``)."""
    xf = x.to(torch.float32)
    a = xf.abs()
    amax = torch.where(a == a, a, 0.0).amax()
    scale = tensor_scale_from_amax(amax, fmt, pow2)
    return saturating_cast(xf * scale, fmt), torch.reciprocal(scale)
