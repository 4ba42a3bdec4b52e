"""Transformer Engine's MXFP8 tensor layout as fp8rl reads it: the padded scale buffers TE allocates, and
the compact ``[…, K/32]`` rowwise scales fp8rl cuts from them for the GPU export.

TE allocates an MXFP8 tensor's ``scale_inv`` padded (``MXFP8Quantizer.get_scale_shape`` in
``transformer_engine/pytorch/tensor/mxfp8_tensor.py``; the same alignments in ``tests/cpp/test_common.h``,
``scale_tensor_alignment_{X,Y}_{rowwise,colwise}``), with ``rows = prod(shape[:-1])``: rowwise
``[round_up(rows, 128), round_up(K/32, 4)]``, columnwise ``[round_up(rows/32, 4), round_up(K, 128)]``. With
the quantizer's ``optimize_for_gemm`` off (TE's default; the tensor's ``_with_gemm_swizzled_scales`` is then
False) the scale of row ``i``, block ``j`` sits at ``[i, j]`` (the C++ reference writes
``i * scales_stride_rowwise + j``): the tensor's scales are the top-left ``[rows, K/32]`` corner, the rest
is padding. The scale byte and element rules are :mod:`.mx`'s ``rceil`` (TE's ``float_to_e8m0`` and
``exp2f_rcp``). Checked against TE 2.16.1 (the GPU set's pin, constraints-gpu.txt; verl's uv.lock) and TE's main branch:
tests/core/grids/test_te.py, whose cases name the TE file and commit each comes from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["BLOCK", "compact_rowwise_scales", "scale_shape"]

BLOCK = 32
#: TE's alignment of the padded scale buffers: (rows, columns) of the rowwise and the columnwise buffer
_ALIGN = {False: (128, 4), True: (4, 128)}


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def scale_shape(shape: Sequence[int], columnwise: bool = False) -> tuple[int, int]:
    """The padded shape TE allocates for the scales of an MXFP8 tensor of ``shape`` (see the module)."""
    rows, k = math.prod(shape[:-1]), shape[-1]
    ay, ax = _ALIGN[columnwise]
    if columnwise:
        return _round_up(rows // BLOCK, ay), _round_up(k, ax)
    return _round_up(rows, ay), _round_up(k // BLOCK, ax)


def compact_rowwise_scales(scale_inv: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The rowwise scale bytes of a tensor of ``shape`` as ``[*shape[:-1], K/32]`` uint8, cut from TE's
    padded, unswizzled ``_rowwise_scale_inv``; a buffer of another shape is refused naming both shapes."""
    rows, k = math.prod(shape[:-1]), shape[-1]
    if k % BLOCK:
        raise ValueError(f"MXFP8 rowwise scales: the last dim {k} of shape {tuple(shape)} is not a multiple of {BLOCK}")
    want = scale_shape(shape)
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"TE rowwise scale_inv of shape {tuple(scale_inv.shape)} for a tensor of shape "
                         f"{tuple(shape)}; TE pads it to {want}")
    return scale_inv.view(torch.uint8)[:rows, : k // BLOCK].reshape(*shape[:-1], k // BLOCK).contiguous()
