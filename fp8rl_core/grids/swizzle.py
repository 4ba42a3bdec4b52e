"""The cuBLAS "128×4" swizzled layout of MXFP8 scale bytes, and its inverse.

Blackwell block-scaled GEMMs (cuBLAS ``CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0``, CUTLASS, TE's
``swizzle.cuh``) do not read the rowwise scale matrix ``S[M, C]`` (C = K/32 blocks) in row-major
order. The matrix is zero-padded to ``M' = 128·ceil(M/128)`` rows and ``C' = 4·ceil(C/4)`` columns and
cut into 128×4 tiles; tiles are laid out row-major over (row tile, column tile), 512 bytes each, and
inside a tile row ``r`` and column ``c`` go to ``(r mod 32)·16 + (r div 32)·4 + c`` — four 32-row
groups interleaved so that one 16-byte load fetches the scales of rows r, r+32, r+64, r+96.
For row ``r`` and scale column ``c`` of the whole matrix::

    offset = ((r // 128) · (C' / 4) + c // 4) · 512 + (r % 32) · 16 + ((r % 128) // 32) · 4 + c % 4

(cuBLAS documentation, "1D Block Scaling Factors Layout"; TE ``gemm_swizzled_scale_idx``). The
padding bytes are 0 (E8M0 2^-127). Leading dims (experts) are swizzled independently.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["swizzle_mx_scales", "unswizzle_mx_scales", "swizzled_size"]


def swizzled_size(rows: int, cols: int) -> int:
    """Bytes of the swizzled buffer for a ``[rows, cols]`` scale matrix (padding included)."""
    return (-(-rows // 128) * 128) * (-(-cols // 4) * 4)


def swizzle_mx_scales(scale: torch.Tensor) -> torch.Tensor:
    """``[..., M, C]`` uint8 scale bytes → ``[..., swizzled_size(M, C)]`` in the cuBLAS 128×4 layout."""
    if scale.dim() < 2:
        raise ValueError(f"expected a scale matrix [..., rows, cols], got shape {tuple(scale.shape)}")
    *lead, m, c = scale.shape
    rt, ct = -(-m // 128), -(-c // 4)
    padded = F.pad(scale, (0, ct * 4 - c, 0, rt * 128 - m))
    # [.., rt, 4(r//32 within tile), 32(r%32), ct, 4(c%4)] → [.., rt, ct, r%32, r//32, c%4]
    tiles = padded.reshape(*lead, rt, 4, 32, ct, 4)
    n = len(lead)
    perm = list(range(n)) + [n + 0, n + 3, n + 2, n + 1, n + 4]
    return tiles.permute(perm).reshape(*lead, rt * ct * 512).contiguous()


def unswizzle_mx_scales(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_mx_scales`: ``[..., swizzled_size]`` → ``[..., rows, cols]``."""
    *lead, size = buf.shape
    if size != swizzled_size(rows, cols):
        raise ValueError(
            f"a swizzled buffer for a [{rows}, {cols}] scale matrix has {swizzled_size(rows, cols)} bytes, got {size}"
        )
    rt, ct = -(-rows // 128), -(-cols // 4)
    tiles = buf.reshape(*lead, rt, ct, 32, 4, 4)
    n = len(lead)
    perm = list(range(n)) + [n + 0, n + 3, n + 2, n + 1, n + 4]
    return tiles.permute(perm).reshape(*lead, rt * 128, ct * 4)[..., :rows, :cols].contiguous()
