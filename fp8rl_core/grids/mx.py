"""MXFP8: OCP Microscaling blocks of 32 FP8 elements sharing one E8M0 scale byte.

The format (OCP Microscaling Formats (MX) v1.0, sections 5.1–5.3 and 6.3)
------------------------------------------------------------------------
A block is 32 consecutive elements along the GEMM's reduction dimension K (rowwise = 1×32 blocks
along the last dim, the forward-GEMM operands; columnwise = 32×1, computed from the high-precision
tensor, never from the rowwise result). Each block stores one scale byte ``b`` in E8M0 — an unsigned
power of two ``2^(b-127)``; 0xFF is NaN; there is no zero and no Inf — and 32 FP8 elements (E4M3 or
E5M2). A block decodes as ``fp32(q) · 2^(b-127)``.

The scale byte, from the block's amax = max |x| in fp32 (``emax`` = 8 for E4M3, 15 for E5M2)
------------------------------------------------------------------------------------------
``rceil`` — Transformer Engine's rule (``float_to_e8m0`` in TE's ``ptx_arch_spec.cuh``; the same as
    cuBLAS's "scaling factor" recipe and Blackwell's ``cvt.rp.satfinite.ue8m0x2.f32``):
    ``d = fp32(amax · fp32(1/max_elem))`` (the reciprocal is TE's ``max_norm_rcp``, a double
    ``1.0/max`` rounded to float); the byte is ``d``'s biased fp32 exponent, plus one when ``d``'s
    mantissa is non-zero (round up), except: ``d`` = NaN → 0xFF; ``d`` = Inf → 0xFE; exponent field
    0xFE is never bumped (satfinite); a subnormal ``d ≤ 2^-127`` (mantissa ≤ 0x400000) → 0, a larger
    subnormal → 1. All from the fp32 bits: no ``log2``.
``floor`` — the OCP spec's rule (section 6.3): ``floor(log2 amax) − emax``, with ``floor(log2 amax)``
    read from amax's fp32 exponent field (a subnormal amax reads as −127), clamped to [−127, 128],
    biased by 127. Large blocks can overflow the element range and saturate.
``ceil`` — torchao's ``ScaleCalculationMode.CEIL``: like ``floor`` but the exponent is rounded up when
    amax's mantissa is non-zero.
``even`` — torchao's ``ScaleCalculationMode.EVEN``: amax's fp32 bits are first rounded to the element's
    mantissa width (add ``1 << (23 − mbits − 1)``, keep sign and exponent), then ``floor``.

Elements (TE's ``exp2f_rcp`` + ``cvt.rn.satfinite``)
---------------------------------------------------
``q = sat_rne(fp32(x · 2^(127−b)))``: the multiplier is an exact power of two — ``2^127`` for byte 0,
``2^-127`` (an fp32 subnormal) for byte 0xFE, NaN for 0xFF — so the product is exact unless it lands
in fp32's subnormal range. Saturation maps overflow and ±Inf to ±max; NaN stays NaN.

Special blocks, as these rules give them (documented so nobody has to rediscover them)
-------------------------------------------------------------------------------------
* all-zero block: RCEIL byte 0 (``d`` = 0); FLOOR/CEIL/EVEN byte 0 (exponent field 0 → clamped);
  elements 0 (sign kept: −0.0 stays 0x80).
* NaN, policy ``ignore`` (TE's ``fmaxf`` amax): amax skips NaN, the NaN element stays NaN, the rest of
  the block is quantized normally; an all-NaN block has amax 0. Policy ``propagate`` (torchao's
  ``torch.amax``): amax is NaN → byte 0xFF → the whole block decodes to NaN.
* Inf in a block: RCEIL byte 0xFE (multiplier 2^-127: ±Inf saturates to ±max, finite elements
  underflow to zero); FLOOR/CEIL/EVEN read Inf's exponent field (255) → byte 247 for E4M3,
  240 for E5M2, same element treatment.

Three implementations, one set of bytes (tested byte for byte against each other and against the
independent bit-level reference in the tests):

``eager``     the readable path below: plain PyTorch on ``[blocks, 32]`` views — the reference.
``native``    :mod:`.native`: the same steps in one C pass (``mx_kernel.c``, built with the system C
              compiler on first use or by ``make setup``), bf16/fp32 CPU input — the default when it
              builds; one read of the input, one write of data and scales.
``compiled``  the eager function through ``torch.compile`` (one fused C++ kernel on CPU, a Triton
              kernel on CUDA) — used for large tensors where ``native`` is unavailable (no compiler,
              CUDA tensors, fp16 input); falls back to eager, with a warning, when compilation fails.

``FP8RL_QUANT_NATIVE=never`` disables ``native``; ``FP8RL_QUANT_COMPILE`` = ``never``/``always``/``auto``
(default: compile from 4M elements) chooses between ``compiled`` and ``eager`` after that.
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


def dequantize_mx(data: torch.Tensor, scale: torch.Tensor, axis: int) -> torch.Tensor:
    """``fp32(q) · 2^(byte − 127)`` broadcast over each block of 32 along ``axis`` (fp32 result)."""
    k = data.shape[axis]
    s = e8m0_to_scale(scale)
    if k % BLOCK == 0 and axis == data.dim() - 1:  # rowwise: broadcast over [..., blocks, 32], no expanded copy
        return (data.to(torch.float32).unflatten(-1, (-1, BLOCK)) * s.unsqueeze(-1)).flatten(-2)
    return data.to(torch.float32) * s.repeat_interleave(BLOCK, dim=axis).narrow(axis, 0, k)
