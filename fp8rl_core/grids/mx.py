"""MXFP8: OCP Microscaling blocks of 32 FP8 elements sharing one E8M0 scale byte.

Rule: a block is 32 consecutive elements along the GEMM's reduction dimension (rowwise 1×32 for the forward
operands; columnwise 32×1 computed from the high-precision tensor); its scale byte comes from the block's
amax by one of four rules — ``rceil`` (Transformer Engine's ``float_to_e8m0``, cuBLAS, Blackwell),
``floor`` (OCP MX v1.0 §6.3), ``ceil`` and ``even`` (torchao's ``ScaleCalculationMode``) — and each element
is ``sat_rne(fp32(x · 2^(127−b)))`` (TE's ``exp2f_rcp`` + ``cvt.rn.satfinite``). The rules bit by bit, the
special blocks (zeros, NaN under ``ignore``/``propagate``, Inf) and their sources: docs/library.md, "MXFP8
scale and element rules".

Three implementations give the same bytes (tested against each other and the bit-level reference in the
tests): ``eager`` (plain PyTorch below, the reference), ``native`` (:mod:`.native`, one C pass; the default
where it builds) and ``compiled`` (the eager function through ``torch.compile``, for large tensors where
``native`` is unavailable). ``FP8RL_QUANT_NATIVE=never`` disables ``native``; ``FP8RL_QUANT_COMPILE`` =
``never``/``always``/``auto`` (default: compile from 4M elements) chooses between the other two.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from . import native
from .formats import FP8Format, saturating_cast

__all__ = [
    "BLOCK",
    "e8m0_from_amax",
    "e8m0_multiplier",
    "e8m0_to_scale",
    "mx_quantize_blocks",
    "quantize_mx",
    "dequantize_mx",
]

BLOCK = 32
COMPILE_MIN_NUMEL = 1 << 22
_F32_EXP_MASK = 0xFF
_F32_MANT_MASK = 0x7FFFFF
_F32_INF_BITS = 0x7F800000
_F32_SIGN_EXP_MASK = -0x800000  # 0xFF800000 as int32


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).view(torch.int32)


def e8m0_from_amax(amax: torch.Tensor, fmt: FP8Format, rule: str) -> torch.Tensor:
    """E8M0 scale bytes (as int32 0..255) for block amaxes (fp32, ≥ 0 or NaN) under ``rule``."""
    if rule == "rceil":
        d = _bits(amax.to(torch.float32) * fmt.max_norm_rcp)
        exp = (d >> 23) & _F32_EXP_MASK
        mant = d & _F32_MANT_MASK
        bump = (mant > 0) & (exp != 0xFE) & ~((exp == 0) & (mant <= 0x400000))
        byte = exp + bump.to(torch.int32)
        byte = torch.where(d == _F32_INF_BITS, 0xFE, byte)
        return torch.where(d > _F32_INF_BITS, 0xFF, byte)
    bits = _bits(amax)
    nan = bits > _F32_INF_BITS
    if rule == "even":
        bits = (bits + (1 << (23 - fmt.mbits - 1))) & _F32_SIGN_EXP_MASK
    exp = ((bits >> 23) & _F32_EXP_MASK) - 127
    if rule == "ceil":
        exp = exp + ((bits & _F32_MANT_MASK) > 0).to(torch.int32)
    elif rule not in ("floor", "even"):
        raise ValueError(f"unknown MX scale rule {rule!r}; expected rceil, floor, ceil or even")
    byte = torch.clamp(exp - fmt.emax, min=-127, max=128) + 127
    return torch.where(nan, 0xFF, byte)


def e8m0_multiplier(byte: torch.Tensor) -> torch.Tensor:
    """The fp32 factor elements are multiplied by: ``2^(127 − byte)`` (TE's ``exp2f_rcp``).

    Byte 0 → 2^127, byte 0xFE → 2^-127 (subnormal), byte 0xFF → NaN. Built from bits, exact.
    """
    byte = byte.to(torch.int32)
    mult = ((254 - byte).clamp(min=0) << 23).view(torch.float32)
    mult = torch.where(byte == 0xFE, 2.0**-127, mult)
    return torch.where(byte == 0xFF, float("nan"), mult)


def e8m0_to_scale(byte: torch.Tensor) -> torch.Tensor:
    """Decode E8M0 bytes to their fp32 value ``2^(byte − 127)`` (byte 0 → 2^-127, 0xFF → NaN)."""
    byte = byte.to(torch.int32)
    scale = (byte << 23).view(torch.float32)
    scale = torch.where(byte == 0, 2.0**-127, scale)
    return torch.where(byte == 0xFF, float("nan"), scale)


def _mx_blocks_impl(xb: torch.Tensor, fmt: FP8Format, rule: str, nan: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``xb`` [n, 32] (any float dtype) → (fp8 data [n, 32], uint8 scale bytes [n])."""
    x = xb.to(torch.float32)
    a = x.abs()
    amax = torch.where(a == a, a, 0.0).amax(dim=-1, keepdim=True)  # NaN != NaN: skipped, as fmaxf does
    if nan == "propagate":  # torch.amax semantics, stated explicitly (compiled max reductions differ)
        amax = torch.where((a != a).any(dim=-1, keepdim=True), float("nan"), amax)
    byte = e8m0_from_amax(amax, fmt, rule)
    data = saturating_cast(x * e8m0_multiplier(byte), fmt)
    return data, byte.squeeze(-1).to(torch.uint8)


@functools.lru_cache(maxsize=None)
def _compiled(fmt: FP8Format, rule: str, nan: str) -> Callable:
    fn = functools.partial(_mx_blocks_impl, fmt=fmt, rule=rule, nan=nan)
    # static block width (32: full-vector inner loops); the block count is marked dynamic per call
    return torch.compile(fn, dynamic=False)


_compile_broken = False


def _use_compiled(numel: int, compiled: bool | None) -> bool:
    if compiled is not None:
        return compiled
    mode = os.environ.get("FP8RL_QUANT_COMPILE", "auto").lower()
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"FP8RL_QUANT_COMPILE={mode!r}: expected auto, always or never")
    if mode == "never" or _compile_broken:
        return False
    return mode == "always" or numel >= COMPILE_MIN_NUMEL


BACKENDS = ("native", "compiled", "eager")


def mx_quantize_blocks(
    xb: torch.Tensor, fmt: FP8Format, rule: str, nan: str = "ignore", *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a ``[n, 32]`` tensor of blocks → (fp8 data [n, 32], uint8 scale bytes [n]).

    ``backend`` forces ``native``, ``compiled`` or ``eager`` (see the module docstring); ``None``
    picks the first that applies: native, then compiled for large tensors, then eager.
    """
    global _compile_broken
    if xb.dim() != 2 or xb.shape[-1] != BLOCK:
        raise ValueError(f"expected blocks of shape [n, {BLOCK}], got {tuple(xb.shape)}")
    if backend not in (None, *BACKENDS):
        raise ValueError(f"unknown MXFP8 backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend in (None, "native"):
        out = native.mx_quantize_native(xb, fmt, rule, nan)
        if out is not None:
            return out
        if backend == "native":
            raise RuntimeError("the native MXFP8 kernel is unavailable for this input (CPU bf16/fp32 "
                               "contiguous only) or could not be built (no C compiler?)")
    compiled = {None: None, "compiled": True, "eager": False, "native": None}[backend]
    if _use_compiled(xb.numel(), compiled) and xb.shape[0] > 1:
        try:
            xb = xb.contiguous()
            torch._dynamo.mark_dynamic(xb, 0)  # one kernel for every number of blocks
            return _compiled(fmt, rule, nan)(xb)
        except Exception as exc:  # no C++ compiler, unsupported platform, ...
            if compiled:
                raise
            _compile_broken = True
            warnings.warn(f"torch.compile of the MXFP8 kernel failed ({exc!r}); using eager PyTorch", stacklevel=2)
    return _mx_blocks_impl(xb, fmt, rule, nan)


def _to_blocks(x: torch.Tensor, axis: int, pad: bool) -> tuple[torch.Tensor, int]:
    """Move ``axis`` last and cut into [n, 32] blocks; returns blocks and the (unpadded) K."""
    xm = torch.movedim(x, axis, -1)
    k = xm.shape[-1]
    if k % BLOCK:
        if not pad:
            raise ValueError(
                f"MXFP8 blocks are {BLOCK} elements along the quantized axis, but axis {axis} of shape "
                f"{tuple(x.shape)} has {k} elements (not a multiple of {BLOCK}); pass pad=True to "
                f"zero-pad the last block, as Transformer Engine pads to 32"
            )
        xm = F.pad(xm, (0, BLOCK - k % BLOCK))
    return xm.contiguous().reshape(-1, BLOCK), k


def quantize_mx(x: torch.Tensor, fmt: FP8Format, rule: str, nan: str, axis: int, pad: bool):
    """MXFP8-quantize ``x`` along ``axis``: (data like ``x``, scale bytes with ``axis`` cut to blocks)."""
    if x.numel() == 0:
        raise ValueError("cannot quantize an empty tensor")
    axis = axis % x.dim()
    blocks, k = _to_blocks(x, axis, pad)
    data, scale = mx_quantize_blocks(blocks, fmt, rule, nan)
    moved_shape = list(torch.movedim(x, axis, -1).shape)
    nblk = -(-k // BLOCK)
    data = data.reshape(*moved_shape[:-1], nblk * BLOCK)[..., :k]
    scale = scale.reshape(*moved_shape[:-1], nblk)
    return torch.movedim(data, -1, axis).contiguous(), torch.movedim(scale, -1, axis).contiguous()


def dequantize_mx(data: torch.Tensor, scale: torch.Tensor, axis: int, backend: str | None = None) -> torch.Tensor:
    """``fp32(q) · 2^(byte − 127)`` broadcast over each block of 32 along ``axis`` (fp32 result). Rowwise, the
    C kernel (:func:`.native.mx_dequantize_native`: the same products, bit-identical) unless ``backend`` is
    ``"eager"`` (this PyTorch path, the reference) or the kernel is unavailable."""
    k = data.shape[axis]
    s = e8m0_to_scale(scale)
    if k % BLOCK == 0 and axis == data.dim() - 1:  # rowwise: broadcast over [..., blocks, 32], no expanded copy
        out = native.mx_dequantize_native(data, s) if backend != "eager" else None
        if out is not None:  # the same products in C, bit-identical (tests/core/grids/test_native.py)
            return out
        return (data.to(torch.float32).unflatten(-1, (-1, BLOCK)) * s.unsqueeze(-1)).flatten(-2)
    return data.to(torch.float32) * s.repeat_interleave(BLOCK, dim=axis).narrow(axis, 0, k)
