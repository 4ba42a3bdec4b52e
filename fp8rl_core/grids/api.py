"""The public entry point: ``quantize(x, grid, axis)`` → :class:`QuantizedTensor`.

``qt.data`` has the shape of ``x`` (FP8, or bfloat16 for the ``bf16`` grid). ``qt.scale`` is always the
*dequantization* side of the scale, so ``qt.dequantize()`` is ``fp32(data) · scale`` broadcast over
each block:

==========  ===========================================================================
family      ``scale``
==========  ===========================================================================
bf16        ``None``
mxfp8       uint8 E8M0 bytes, ``x.shape`` with ``axis`` cut into ceil(K/32) blocks
block128    fp32 ``weight_scale_inv`` [..., ceil(N/128), ceil(K/128)] (role ``weight``) or
            fp32 per-token-group scales, ``axis`` cut into ceil(K/128) groups (role ``activation``)
tensor      fp32 0-d ``scale_inv``
kv          fp32 0-d ``k_scale``/``v_scale``
==========  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from . import block, kvcache, mx, tensor
from .formats import bf16_view
from .spec import Grid, parse_grid

__all__ = ["QuantizedTensor", "quantize"]

Role = Literal["weight", "activation"]
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A tensor on a grid: its element data, its scales, and how to read them back."""

    data: torch.Tensor
    scale: torch.Tensor | None
    grid: Grid
    axis: int | None = None
    role: Role = "weight"

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values this tensor stands for, computed in fp32 and cast to ``dtype``."""
        g = self.grid
        if g.family == "bf16":
            return self.data.to(dtype)
        if g.family == "mxfp8":
            out = mx.dequantize_mx(self.data, self.scale, self.axis)
        elif g.family == "block128" and self.role == "weight":
            out = block.dequantize_block_weight(self.data, self.scale)
        elif g.family == "block128":
            out = block.dequantize_block_activation(self.data, self.scale, self.axis)
        else:  # tensor, kv: one fp32 multiplier
            out = self.data.to(torch.float32) * self.scale
        return out.to(dtype)


def quantize(
    x: torch.Tensor,
    grid: str | Grid,
    axis: int = -1,
    *,
    pad: bool = False,
    role: Role = "weight",
    scale: float | torch.Tensor | None = None,
) -> QuantizedTensor:
    """Put ``x`` on ``grid`` (a spec string or :class:`Grid`).

    axis:  the dimension blocks run along (MXFP8 and block-FP8 activations): -1 = rowwise (1×32 along
           the last dim, the forward operands), 0 = columnwise for a 2-D tensor.
    pad:   MXFP8 only — allow a quantized axis that is not a multiple of 32 (the last block is
           zero-padded, as Transformer Engine pads).
    role:  block128 only — ``weight`` (128×128 tiles over the last two dims) or ``activation``
           (1×128 groups along ``axis``).
    scale: kv only — the per-tensor cache scale; computed from amax when omitted.
    """
    g = parse_grid(grid)
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_DTYPES:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"quantize expects a float32/bfloat16/float16/float64 tensor, got {what}")
    if x.dim() == 0:
        raise ValueError("quantize expects a tensor with at least one dimension, got a scalar")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a tensor of shape {tuple(x.shape)}")
    if role not in ("weight", "activation"):
        raise ValueError(f"role must be 'weight' or 'activation', got {role!r}")
    if scale is not None and g.family != "kv":
        raise ValueError(f"scale= is only accepted by fp8-kv grids, not {g}")
    if x.dtype == torch.float64:
        x = x.to(torch.float32)  # engines never see fp64; round once, RNE
    ax = axis % x.dim()
    if g.family == "bf16":
        return QuantizedTensor(bf16_view(x), None, g)
    if g.family == "mxfp8":
        data, s = mx.quantize_mx(x, g.format, g.rule, g.nan, ax, pad)
        return QuantizedTensor(data, s, g, axis=ax)
    if g.family == "block128":
        if role == "weight":
            if ax != x.dim() - 1:
                raise ValueError("128x128 block weights tile the last two dims [N, K]; use axis=-1 with role='weight'")
            data, s = block.quantize_block_weight(x, g.ue8m0)
            return QuantizedTensor(data, s, g, axis=ax, role="weight")
        data, s = block.quantize_block_activation(x, g.ue8m0, ax)
        return QuantizedTensor(data, s, g, axis=ax, role="activation")
    if g.family == "tensor":
        data, s = tensor.quantize_tensor(x, g.format, g.pow2)
        return QuantizedTensor(data, s, g)
    data, s = kvcache.quantize_kv(x, g.format, g.writer, scale)
    return QuantizedTensor(data, s, g)
