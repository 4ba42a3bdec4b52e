"""Real FP8 GEMMs beside the emulation: ``torch._scaled_mm`` on operands from :mod:`fp8rl_core.grids`.

Rule: the same FP8 bytes and scales :func:`fp8rl_core.grids.quantize` produces go to the hardware's
scaled GEMM, ``out = (A · scale_a) @ (B · scale_b)ᵀ`` with fp32 accumulation — tensorwise and rowwise
on CPU, 1×128 × 128×128 blockwise on Hopper, MXFP8 on Blackwell (the table on :func:`scaled_mm`);
:func:`block_fp8_linear` runs a linear layer's three GEMMs on TE's blockwise recipe. Used by
``bench/gpu.py``; docs/library.md (Quantization grids).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8rl_core.grids import QuantizedTensor, quantize, swizzle_mx_scales

__all__ = ["SCALINGS", "block_fp8_linear", "scaled_mm", "scaling_of", "supported"]

SCALINGS = ("tensorwise", "rowwise", "blockwise", "mx")
BLOCK_GRID = "fp8-block128-e4m3"
_TILE = 128


def scaling_of(a: QuantizedTensor, b: QuantizedTensor) -> str:
    """The ``_scaled_mm`` scaling of an operand pair (A [M, K], B [N, K], quantized along K)."""
    fa, fb = a.grid.family, b.grid.family
    if a.data.dim() != 2 or b.data.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"scaled_mm takes A [M, K] and B [N, K], got {tuple(a.shape)} and {tuple(b.shape)}")
    if fa == fb == "tensor":
        return "tensorwise"
    if fa == fb == "block128" and a.role == b.role == "activation" and a.scale.shape[1] == b.scale.shape[1] == 1:
        return "rowwise"
    if fa == fb == "block128" and a.role == "activation":
        return "blockwise"  # × a 128×128 weight (fprop, dgrad) or × 1×128 groups (wgrad)
    if fa == fb == "mxfp8" and a.axis == b.axis == 1:
        return "mx"
    raise ValueError(
        f"no scaled GEMM for {a.grid} ({a.role}) × {b.grid} ({b.role}); valid pairs: fp8-tensor × fp8-tensor, "
        f"fp8-block128 activation × activation with K = 128, activation × weight, mxfp8 rowwise × rowwise")


def supported(scaling: str, device: torch.device | str) -> bool:
    """Whether ``torch._scaled_mm`` runs ``scaling`` on ``device`` (see the module table)."""
    device = torch.device(device)
    if device.type == "cpu":
        return scaling in ("tensorwise", "rowwise")
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    cap = torch.cuda.get_device_capability(device)
    return {"tensorwise": cap >= (8, 9), "rowwise": cap >= (8, 9), "blockwise": cap[0] == 9,
            "mx": cap[0] >= 10}[scaling]


def _emulated(a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype) -> torch.Tensor:
    return (a.dequantize(torch.float32) @ b.dequantize(torch.float32).T).to(out_dtype)


def scaled_mm(a: QuantizedTensor, b: QuantizedTensor, out_dtype: torch.dtype = torch.bfloat16,
              *, fallback: bool = False) -> torch.Tensor:
    """``A · Bᵀ`` [M, N] on the FP8 operands ``a`` [M, K] and ``b`` [N, K] through ``torch._scaled_mm``.

    ``fallback``: where the scaling does not run on this device, return the emulated product
    (dequantized fp32 operands) instead of raising — so the code around it (operand layouts, padding,
    autograd) runs and is tested on CPU. Which scalings run where (:func:`scaling_of` names them,
    :func:`supported` says where each runs):

        ===========  ==========================================  ==================================================
    scaling      operands (A [M, K], B [N, K], both along K)  runs on
    ===========  ==========================================  ==================================================
    tensorwise   ``fp8-tensor-*`` × ``fp8-tensor-*``          CPU (torch 2.13) and CUDA with FP8 (sm89+)
    rowwise      ``fp8-block128-e4m3`` activations with K =   CPU and CUDA sm89+ (one 1×128 group per row is a
                 128 (scales [M, 1] and [N, 1])               per-row scale)
    blockwise    1×128 activation × 128×128 weight, or        CUDA sm90 (Hopper, CUDA ≥ 12.9): Transformer
                 1×128 × 1×128 (``fp8-block128-e4m3``, role   Engine's blockwise recipe, cuBLAS's 1×128 /
                 activation / weight)                         128×128 block scaling
    mx           ``mxfp8-e4m3-*`` rowwise × rowwise           CUDA sm100 (Blackwell): E8M0 scales in cuBLAS's
                                                              128×4 swizzled layout (:mod:`fp8rl_core.grids.swizzle`)
    ===========  ==========================================  ==================================================
    """
    kind = scaling_of(a, b)
    if not supported(kind, a.data.device):
        if fallback:
            return _emulated(a, b, out_dtype)
        raise RuntimeError(f"torch._scaled_mm has no {kind} scaling on {a.data.device} (see fp8rl_core.learner.fp8gemm)")
    mat_b = b.data.T  # [K, N] column-major, as _scaled_mm wants its second operand
    if kind == "tensorwise":
        sa, sb = a.scale.reshape(()).float(), b.scale.reshape(()).float()
    elif kind == "rowwise":
        sa, sb = a.scale.float().contiguous(), b.scale.float().reshape(1, -1).contiguous()
    elif kind == "blockwise":  # the layouts of PyTorch's test_scaled_mm_vs_emulated_block_wise
        sa = a.scale.float().T.contiguous().T  # [M, K/128], outer-dim-major (cuBLAS 1×128 scales)
        if b.role == "weight":
            sb = b.scale.float().T  # [K/128, N/128]: a view of W's contiguous [N/128, K/128]
        else:
            sb = b.scale.float().T.contiguous()  # [K/128, N]: B's outer-dim-major [N, K/128], transposed
    else:  # mx: E8M0 bytes in the 128×4 swizzled layout, as cuBLAS reads them
        sa = swizzle_mx_scales(a.scale).view(torch.float8_e8m0fnu)
        sb = swizzle_mx_scales(b.scale).view(torch.float8_e8m0fnu)
    return torch._scaled_mm(a.data, mat_b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def _pad_rows(x: torch.Tensor, multiple: int = _TILE) -> torch.Tensor:
    return F.pad(x, (0, 0, 0, (-x.shape[0]) % multiple))


def _act(x: torch.Tensor) -> QuantizedTensor:
    return quantize(x, BLOCK_GRID, axis=-1, role="activation")


class _BlockFP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d: torch.Tensor, weight: torch.Tensor, fallback: bool) -> torch.Tensor:
        m = x2d.shape[0]
        xp = _pad_rows(x2d)
        w_q = quantize(weight.detach(), BLOCK_GRID, axis=-1, role="weight")
        y = scaled_mm(_act(xp), w_q, torch.bfloat16, fallback=fallback)[:m]
        ctx.save_for_backward(xp, weight)
        ctx.w_q, ctx.m, ctx.fallback, ctx.x_dtype = w_q, m, fallback, x2d.dtype
        return y.to(x2d.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xp, weight = ctx.saved_tensors
        dyp = _pad_rows(dy)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            w_t = QuantizedTensor(ctx.w_q.data.T.contiguous(), ctx.w_q.scale.T.contiguous(), ctx.w_q.grid,
                                  axis=1, role="weight")  # Wᵀ's 128×128 tiles: W's, transposed
            dx = scaled_mm(_act(dyp), w_t, torch.bfloat16, fallback=ctx.fallback)[:ctx.m].to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            # dW [N, K] = dYᵀ [N, M] · X [M, K]: both operands 1×128 groups along M (the reduction dim)
            dw = scaled_mm(_act(dyp.T.contiguous()), _act(xp.T.contiguous()), torch.float32,
                           fallback=ctx.fallback).to(weight.dtype)
        return dx, dw, None


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, *, fallback: bool = False) -> torch.Tensor:
    """``x · Wᵀ`` with the three GEMMs in block FP8: a linear layer's three GEMMs on the Hopper recipe
    (TE's ``Float8BlockScaling``): fprop ``X(1×128 along K) · W(128×128)ᵀ``, dgrad ``dY(1×128 along N) ·
    W(128×128)`` — W's transposed tiles are W's tiles, so its bytes are W's transposed and its scales
    W's scales transposed — and wgrad ``dYᵀ(1×128 along M) · X(1×128 along M)``. The token dim M is zero-padded to a
    multiple of 128 (zero rows raise no amax and add nothing).

    x: [..., K]; weight: [N, K] (fp32 master; dW comes back in its dtype); K and N multiples of 128.
    On a device without blockwise ``_scaled_mm`` it raises, unless ``fallback`` (emulated products).
    """
    n, k = weight.shape
    if k % _TILE or n % _TILE:
        raise ValueError(f"block FP8 GEMMs need K and N multiples of {_TILE}, got weight [N={n}, K={k}]")
    lead = x.shape[:-1]
    return _BlockFP8Linear.apply(x.reshape(-1, k), weight, fallback).reshape(*lead, n)
