"""128×128 block FP8 (DeepSeek-V3 style): the "other grid" that vLLM/SGLang FP8 rollouts use.

Weights — DeepGEMM's ``per_block_cast_to_fp8`` (``deep_gemm/utils/math.py``; vLLM's copy in
``vllm/utils/deep_gemm.py``), the layout of checkpoints with ``weight_block_size: [128, 128]``
-----------------------------------------------------------------------------------------------
A weight ``[N, K]`` (leading dims allowed, e.g. experts ``[E, N, K]``) is cut into 128×128 tiles;
ragged edges (N or K not multiples of 128) form smaller tiles (zero padding does not change amax).
Per tile, in fp32::

    amax      = max |x|, clamped below at 1e-4        (a NaN in the tile propagates: torch.amax)
    sf        = amax / 448                            (fp32 division)
    sf        = 2^(exp(sf) + (mantissa(sf) != 0))     only for -ue8m0, exponent clamped to [1, 254]
    q         = sat_rne(x · fp32(1 / sf))             (reciprocal multiply, not division)
    weight_scale_inv = sf                             (the dequant multiplier, fp32 [ceil(N/128), ceil(K/128)])

Activations — vLLM's ``per_token_group_quant_fp8`` (``fp8_utils.py`` / ``per_token_group_quant.cu``)
---------------------------------------------------------------------------------------------------
Groups of 128 consecutive elements along K (1×128 per token)::

    absmax = max(1e-10, fmaxf-reduction of |x|)        (NaN elements are skipped)
    s      = absmax / 448                              (fp32 division)
    s      = 2^ceil(log2(max(s, 1e-10)))               only for -ue8m0 (computed from bits, exact)
    q      = sat_rne(x / s)                            (division, as vLLM's kernel)

Named deviation: vLLM's CUDA kernel clamps with ``fminf(fmaxf(x/s, -448), 448)``, which turns a NaN
element into −448; here a NaN element stays NaN (the Triton path's and PyTorch's clamp semantics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .formats import E4M3, saturating_cast

__all__ = ["TILE", "quantize_block_weight", "quantize_block_activation", "dequantize_block_weight",
           "dequantize_block_activation", "ceil_pow2"]

TILE = 128
_WEIGHT_AMAX_FLOOR = 1e-4
_ACT_EPS = 1e-10


def ceil_pow2(s: torch.Tensor, lo: int = 1, hi: int = 254) -> torch.Tensor:
    """Round positive fp32 values up to a power of two via their bits (DeepGEMM ``ceil_to_ue8m0``).

    The biased exponent is incremented when the mantissa is non-zero and clamped to [lo, hi]; NaN
    stays NaN.
    """
    bits = s.to(torch.float32).view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    out = (exp.clamp(lo, hi) << 23).view(torch.float32)
    return torch.where(torch.isnan(s), s, out)


def _pad_to(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    pads: list[int] = []
    for d in range(x.dim() - 1, -1, -1):
        size = x.shape[d]
        pads += [0, (-size) % TILE if d in dims else 0]
    return F.pad(x, pads)


def quantize_block_weight(w: torch.Tensor, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM-style 128×128 weight quantization → (e4m3 data like ``w``, fp32 scale_inv tiles)."""
    if w.dim() < 2:
        raise ValueError(f"128x128 block weights need at least 2 dims [N, K], got shape {tuple(w.shape)}")
    *lead, n, k = w.shape
    nb, kb = -(-n // TILE), -(-k // TILE)
    xp = _pad_to(w.to(torch.float32), (w.dim() - 2, w.dim() - 1))
    view = xp.reshape(*lead, nb, TILE, kb, TILE)
    amax = view.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=_WEIGHT_AMAX_FLOOR)
    sf = amax / E4M3.max
    if ue8m0:
        sf = ceil_pow2(sf)
    q = saturating_cast(view * (1.0 / sf), E4M3)
    data = q.reshape(*lead, nb * TILE, kb * TILE)[..., :n, :k].contiguous()
    return data, sf.reshape(*lead, nb, kb).contiguous()


def dequantize_block_weight(data: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """``fp32(q) · scale_inv`` tile by tile (vLLM's ``w_q.float() * repeat_interleave(s)``)."""
    n, k = data.shape[-2:]
    s = scale_inv.repeat_interleave(TILE, dim=-2).repeat_interleave(TILE, dim=-1)[..., :n, :k]
    return data.to(torch.float32) * s


def quantize_block_activation(x: torch.Tensor, ue8m0: bool, axis: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM per-token-group (1×128) quantization along ``axis`` → (e4m3 data, fp32 scales)."""
    axis = axis % x.dim()
    xm = torch.movedim(x.to(torch.float32), axis, -1)
    k = xm.shape[-1]
    kb = -(-k // TILE)
    g = F.pad(xm, (0, kb * TILE - k)).reshape(*xm.shape[:-1], kb, TILE)
    a = g.abs()
    absmax = torch.where(a == a, a, 0.0).amax(dim=-1, keepdim=True).clamp(min=_ACT_EPS)
    s = absmax / E4M3.max
    if ue8m0:
        s = ceil_pow2(s.clamp(min=_ACT_EPS), lo=0, hi=255)  # Inf stays Inf, as exp2f(ceilf(log2f(Inf)))
    q = saturating_cast(g / s, E4M3).reshape(*xm.shape[:-1], kb * TILE)[..., :k]
    return torch.movedim(q, -1, axis).contiguous(), torch.movedim(s.squeeze(-1), -1, axis).contiguous()


def dequantize_block_activation(data: torch.Tensor, scale: torch.Tensor, axis: int) -> torch.Tensor:
    k = data.shape[axis]
    s = scale.repeat_interleave(TILE, dim=axis).narrow(axis, 0, k)
    return data.to(torch.float32) * s
