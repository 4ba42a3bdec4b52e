"""The cuBLAS 128x4 scale layout: index formula, inverse, and torchao's to_blocked as a second opinion."""

import pytest
import torch

from fp8rl_core.grids import quantize, swizzle_mx_scales, swizzled_size, unswizzle_mx_scales

from . import reference as ref

SHAPES = [(1, 1), (128, 4), (200, 7), (256, 12), (300, 65), (129, 3)]


def _scales(shape, seed=0):
    return torch.randint(1, 255, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_offsets_follow_the_cublas_formula(shape):
    rows, cols = shape
    s = _scales(shape)
    buf = swizzle_mx_scales(s)
    assert buf.shape == (swizzled_size(rows, cols),)
    want = torch.zeros(swizzled_size(rows, cols), dtype=torch.uint8)  # padding is 0
    for r in range(rows):
        for c in range(cols):
            want[ref.swizzle_offset(r, c, cols)] = s[r, c]
    assert torch.equal(buf, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_inverse_and_torchao(shape):
    from torchao.prototype.mx_formats.utils import to_blocked

    s = _scales(shape, seed=1)
    buf = swizzle_mx_scales(s)
    assert torch.equal(unswizzle_mx_scales(buf, *shape), s)
    assert torch.equal(to_blocked(s), buf)


def test_experts_are_swizzled_independently_and_real_scales_round_trip():
    w = torch.randn(3, 160, 96)
    qt = quantize(w, "mxfp8-e4m3-rceil")
    buf = swizzle_mx_scales(qt.scale)
    assert buf.shape == (3, swizzled_size(160, 3))
    for e in range(3):
        assert torch.equal(buf[e], swizzle_mx_scales(qt.scale[e]))
    assert torch.equal(unswizzle_mx_scales(buf, 160, 3), qt.scale)


def test_wrong_buffer_size_is_named():
    with pytest.raises(ValueError, match=r"a swizzled buffer for a \[200, 7\] scale matrix has 2048 bytes, got 100"):
        unswizzle_mx_scales(torch.zeros(100, dtype=torch.uint8), 200, 7)
    with pytest.raises(ValueError, match="scale matrix"):
        swizzle_mx_scales(torch.zeros(5, dtype=torch.uint8))
