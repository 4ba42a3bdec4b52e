"""The C MXFP8 kernel (fp8rl_core.grids.native) against the PyTorch reference path, byte for byte
(NaN signs included): every mode, bf16 and fp32 input, every bf16 bit pattern, the element rounding
at every fp32 exponent with the mantissa patterns that decide round-to-nearest-even, and the
multi-threaded split. The PyTorch path is itself checked against the bit-level reference in test_mx."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import FORMATS, native, quantize
from fp8rl_core.grids.mx import mx_quantize_blocks

from .helpers import all_bf16, f32_from_bits

MODES = [(e, r, n) for e in ("e4m3", "e5m2") for r in ("rceil", "floor", "ceil", "even") for n in ("ignore", "propagate")]

pytestmark = pytest.mark.skipif(native.load() is None, reason="no C compiler: the native kernel is not built")


def _same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[1], b[1]) and torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))


def _rounding_patterns() -> torch.Tensor:
    """fp32 values at every exponent and sign, each FP8 mantissa (3 kept bits), and the dropped bits that
    decide RNE: 0, 1 ulp, just below / at / just above half, all ones."""
    low = [0, 1, 0x7FFFF, 0x80000, 0x80001, 0xFFFFF, 0x3FFFF, 0x40000, 0x40001, 0x1FFFFF]
    bits = [(s << 31) | (e << 23) | (m << 20) | lo
            for s in (0, 1) for e in range(256) for m in range(8) for lo in low]
    x = f32_from_bits([b & 0xFFFFFFFF for b in bits])
    pad = (-x.numel()) % 32
    return torch.cat([x, torch.zeros(pad)]).reshape(-1, 32)


@pytest.mark.parametrize("elem, rule, nan", MODES)
def test_native_gives_the_reference_bytes(elem, rule, nan):
    g = torch.Generator().manual_seed(7)
    specials = all_bf16()
    xb16 = torch.cat([specials.reshape(-1, 32), specials[torch.randperm(specials.numel(), generator=g)].reshape(-1, 32),
                      (torch.randn(2048, 32, generator=g) * torch.logspace(-40, 40, 2048).unsqueeze(1)).to(torch.bfloat16)])
    fmt = FORMATS[elem]
    for xb in (xb16, xb16.float() * 1.0009765625, _rounding_patterns(), torch.randn(512, 32, generator=g) * 1e-41):
        got = mx_quantize_blocks(xb, fmt, rule, nan, backend="native")
        assert _same(got, mx_quantize_blocks(xb, fmt, rule, nan, backend="eager")), (elem, rule, nan, xb.dtype)


def test_element_rounding_at_every_scale_matches_torch_cast():
    """Scale byte 127 (multiplier 1): the kernel's integer RNE equals torch's saturating cast for every
    pattern, E4M3 and E5M2 (blocks forced to byte 127 by a 2^emax element)."""
    x = _rounding_patterns()
    for elem in ("e4m3", "e5m2"):
        fmt = FORMATS[elem]
        xb = x.clone()
        xb[:, 0] = 2.0 ** fmt.emax  # floor rule → byte 127 unless a larger element is present
        got = mx_quantize_blocks(xb, fmt, "floor", "ignore", backend="native")
        assert _same(got, mx_quantize_blocks(xb, fmt, "floor", "ignore", backend="eager"))


def test_threads_split_the_blocks_without_changing_bytes():
    x = (torch.randn(3 * native.MIN_BLOCKS_PER_THREAD + 17, 32) * 5).to(torch.bfloat16)
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mx_quantize_blocks(x, FORMATS["e4m3"], "rceil", backend="native")
        torch.set_num_threads(3)
        three = mx_quantize_blocks(x, FORMATS["e4m3"], "rceil", backend="native")
    finally:
        torch.set_num_threads(prev)
    assert _same(one, three)


def test_quantize_uses_native_and_falls_back_for_other_inputs():
    x = torch.randn(64, 96)
    assert native.mx_quantize_native(x.reshape(-1, 32), FORMATS["e4m3"], "rceil", "ignore") is not None
    assert native.mx_quantize_native(x.half().reshape(-1, 32), FORMATS["e4m3"], "rceil", "ignore") is None
    assert native.mx_quantize_native(x.t().reshape(-1, 32)[:, :].t().t()[::2], FORMATS["e4m3"], "rceil", "ignore") is None
    # fp16 goes through the PyTorch path; the bytes are the bf16/fp32 path's for the same values
    qh = quantize(x.half(), "mxfp8-e4m3-rceil")
    qf = quantize(x.half().float(), "mxfp8-e4m3-rceil")
    assert torch.equal(qh.data.view(torch.uint8), qf.data.view(torch.uint8)) and torch.equal(qh.scale, qf.scale)


def test_the_built_kernel_is_cached_by_source_and_cpu():
    path = native.kernel_path()
    assert path.exists() and path.suffix == ".so"
    assert native.build() == path  # a second build is a no-op


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_native_dequantization_gives_the_reference_bits(elem):
    """Every element byte under every scale byte (0 → 2^-127, 0xFF → NaN), and a random [N, K] weight as a
    CPU engine's compute copy: the C kernel's fp32 bits are the PyTorch path's, NaNs included; threads split."""
    from fp8rl_core.grids.mx import dequantize_mx

    fmt = FORMATS[elem]
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256).reshape(-1, 32).view(fmt.dtype)
    s = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat_interleave(8).reshape(-1, 1)  # 8 blocks each
    native_out, eager = dequantize_mx(q, s, 1), dequantize_mx(q, s, 1, backend="eager")
    assert native_out.dtype == torch.float32 and torch.equal(native_out.view(torch.int32), eager.view(torch.int32))
    assert native_out.isnan().any() and (native_out == 0).any() and (native_out.abs() > 1e38).any()
    w = quantize(torch.randn(1536, 2048, generator=torch.Generator().manual_seed(3)), "mxfp8-e4m3-rceil")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            got = dequantize_mx(w.data, w.scale, 1)
            assert torch.equal(got.view(torch.int32), dequantize_mx(w.data, w.scale, 1, backend="eager").view(torch.int32))
    finally:
        torch.set_num_threads(before)
    # columnwise blocks and a tail that is not a whole block stay on the PyTorch path
    assert native.mx_dequantize_native(w.data[:, :48], torch.ones(1536, 2)) is None
