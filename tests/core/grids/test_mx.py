"""MXFP8 bytes against the independent bit-level reference: exhaustive scale rules, every bf16 value
as an element, named golden cases, padding, layouts and the compiled kernel."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl_core.grids import E4M3, E5M2, FORMATS, quantize
from fp8rl_core.grids.mx import e8m0_from_amax, e8m0_multiplier, e8m0_to_scale, mx_quantize_blocks

from . import reference as ref
from .helpers import all_bf16, bf16_from_bits, f32_from_bits, fp8_codes, ref_mx

ELEMS = ("e4m3", "e5m2")
RULES = ("rceil", "floor", "ceil", "even")
NANS = ("ignore", "propagate")
ALL_MODES = [(e, r) for e in ELEMS for r in RULES]


# ------------------------------------------------------------------ scale bytes, exhaustively


@pytest.mark.parametrize("elem, rule", ALL_MODES)
def test_scale_byte_for_every_bf16_amax(elem, rule):
    """Every non-negative bf16 bit pattern (0, subnormals, normals, Inf, NaNs) as a block amax."""
    amax = bf16_from_bits(list(range(0x8000))).to(torch.float32)
    got = e8m0_from_amax(amax, FORMATS[elem], rule).tolist()
    want = [ref.e8m0_byte(ref.from_float(a), elem, rule) for a in amax.tolist()]
    bad = [(hex(i), g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{len(bad)} mismatches, first: {bad[:5]}"


MANTISSA_EDGES = [0, 1, 2, 3, 0x1FFFFF, 0x200000, 0x3FFFFF, 0x400000, 0x400001, 0x5FFFFF, 0x600000,
                  0x700000, 0x7FFFFE, 0x7FFFFF, 0x123457, 0x6DB6DB]


@pytest.mark.parametrize("elem, rule", ALL_MODES)
def test_scale_byte_for_every_fp32_exponent_with_mantissa_edges(elem, rule):
    bits = [(e << 23) | m for e in range(256) for m in MANTISSA_EDGES]
    amax = f32_from_bits(bits)
    got = e8m0_from_amax(amax, FORMATS[elem], rule).tolist()
    want = [ref.e8m0_byte(ref.decode(b, ref.F32), elem, rule) for b in bits]
    bad = [(hex(b), g, w) for b, g, w in zip(bits, got, want) if g != w]
    assert not bad, f"{len(bad)} mismatches, first: {bad[:5]}"


@pytest.mark.parametrize("elem", ELEMS)
def test_rceil_amax_at_and_around_max_times_powers_of_two(elem):
    """d = amax·(1/max) lands exactly on 2^k (no round-up) or one ulp either side of it."""
    mx, ks = FORMATS[elem].max, range(-133, 127 - FORMATS[elem].emax)  # every finite max·2^k
    amax = torch.tensor([mx * 2.0**k for k in ks], dtype=torch.float32)
    around = torch.cat([amax, torch.nextafter(amax, torch.tensor(0.0)), torch.nextafter(amax, torch.tensor(math.inf))])
    got = e8m0_from_amax(around, FORMATS[elem], "rceil").tolist()
    want = [ref.e8m0_byte(ref.from_float(a), elem, "rceil") for a in around.tolist()]
    assert got == want
    exact = got[: len(amax)]
    # max·2^k quantizes with scale 2^k: byte 127 + k for every normal k, no round-up
    normal = [(k, b) for k, b in zip(ks, exact) if k >= -126]
    assert all(b == 127 + k for k, b in normal)


def test_e8m0_multiplier_and_scale_are_exact_powers_of_two():
    b = torch.arange(256, dtype=torch.int32)
    mult, scale = e8m0_multiplier(b), e8m0_to_scale(b)
    for byte in range(255):
        assert mult[byte].item() == 2.0 ** (127 - byte)
        assert scale[byte].item() == 2.0 ** (byte - 127)
    assert math.isnan(mult[255].item()) and math.isnan(scale[255].item())


# ------------------------------------------------------------------ every bf16 value as an element


@pytest.mark.parametrize("nan", NANS)
@pytest.mark.parametrize("elem, rule", ALL_MODES)
def test_every_bf16_value_quantizes_as_the_reference(elem, rule, nan):
    x = all_bf16().reshape(-1, 32)  # consecutive patterns: tiny, subnormal, huge, Inf and NaN blocks
    qt = quantize(x, f"mxfp8-{elem}-{rule}-nan-{nan}")
    scales, codes = ref_mx(x, elem, rule, nan)
    assert qt.scale.flatten().tolist() == scales
    assert fp8_codes(qt.data) == codes


@pytest.mark.parametrize("elem, rule", [("e4m3", "rceil"), ("e5m2", "rceil"), ("e4m3", "floor"), ("e4m3", "even")])
def test_every_bf16_value_in_mixed_blocks(elem, rule):
    g = torch.Generator().manual_seed(7)
    x = all_bf16()[torch.randperm(1 << 16, generator=g)].reshape(256, 256)
    qt = quantize(x, f"mxfp8-{elem}-{rule}")
    scales, codes = ref_mx(x, elem, rule, "ignore")
    assert qt.scale.flatten().tolist() == scales
    assert fp8_codes(qt.data) == codes


# ------------------------------------------------------------------ named golden cases


def _block(*vals: float, fill: float = 0.0) -> torch.Tensor:
    return torch.tensor(list(vals) + [fill] * (32 - len(vals)), dtype=torch.float32).reshape(1, 32)


def UP(x: float) -> float:
    """The next fp32 value above x."""
    return ref.bits_f32(ref.f32_bits(x) + 1)


GOLDEN = {
    # name: (block, grid, expected scale byte, {element index: expected byte})
    "all-zero block (rceil)": (_block(0.0, -0.0), "mxfp8-e4m3-rceil", 0, {0: 0x00, 1: 0x80}),
    "all-zero block (floor)": (_block(0.0, -0.0), "mxfp8-e4m3-floor", 0, {0: 0x00, 1: 0x80}),
    "amax 448 (rceil)": (_block(448.0, 1.0), "mxfp8-e4m3-rceil", 127, {0: 0x7E, 1: 0x38}),
    "amax 448 (floor)": (_block(448.0), "mxfp8-e4m3-floor", 127, {0: 0x7E}),
    "amax 448 (ceil)": (_block(448.0), "mxfp8-e4m3-ceil", 128, {0: 0x76}),
    "amax 448 (even)": (_block(448.0), "mxfp8-e4m3-even", 127, {0: 0x7E}),
    "amax one ulp above 448 (rceil)": (_block(UP(448.0)), "mxfp8-e4m3-rceil", 128, {0: 0x76}),
    "amax 480 saturates (floor)": (_block(480.0), "mxfp8-e4m3-floor", 127, {0: 0x7E}),
    "amax 480 fits (rceil)": (_block(480.0), "mxfp8-e4m3-rceil", 128, {0: 0x77}),
    "amax a power of two (rceil)": (_block(256.0), "mxfp8-e4m3-rceil", 127, {0: 0x78}),
    "amax one ulp above a power of two (ceil)": (_block(UP(256.0)), "mxfp8-e4m3-ceil", 128, {0: 0x70}),
    "amax 1.9375 rounds up (even)": (_block(1.9375), "mxfp8-e4m3-even", 120, {0: 0x78}),
    "amax 1.875 stays, then saturates (even)": (_block(1.875), "mxfp8-e4m3-even", 119, {0: 0x7E}),
    "e5m2 amax 57344 (rceil)": (_block(57344.0), "mxfp8-e5m2-rceil", 127, {0: 0x7B}),
    "e5m2 amax 57344 (floor)": (_block(57344.0), "mxfp8-e5m2-floor", 127, {0: 0x7B}),
    "tie to even down: 1.0625 -> 1.0": (_block(448.0, 1.0625), "mxfp8-e4m3-rceil", 127, {1: 0x38}),
    "tie to even up: 1.1875 -> 1.25": (_block(448.0, 1.1875), "mxfp8-e4m3-rceil", 127, {1: 0x3A}),
    "tie at the top: 432 -> 448": (_block(448.0, 432.0), "mxfp8-e4m3-rceil", 127, {1: 0x7E}),
    "tie in subnormals: 2^-10 -> 0": (_block(448.0, 2.0**-10), "mxfp8-e4m3-rceil", 127, {1: 0x00}),
    "tie in subnormals: 3*2^-10 -> 2^-8": (_block(448.0, 3 * 2.0**-10), "mxfp8-e4m3-rceil", 127, {1: 0x02}),
    "mixed signs, negative amax": (_block(-448.0, 2.0, -0.5), "mxfp8-e4m3-rceil", 127, {0: 0xFE, 1: 0x40, 2: 0xB0}),
    "largest finite fp32 (rceil)": (_block(3.4028234663852886e38), "mxfp8-e4m3-rceil", 247, {0: 0x78}),
    "largest finite fp32 (floor)": (_block(3.4028234663852886e38), "mxfp8-e4m3-floor", 246, {0: 0x7E}),
    "Inf (rceil): 0xFE, Inf->max, rest->0": (_block(math.inf, 3.0, -math.inf), "mxfp8-e4m3-rceil", 254, {0: 0x7E, 1: 0x00, 2: 0xFE}),
    "Inf (floor): exponent field 255": (_block(math.inf, 3.0), "mxfp8-e4m3-floor", 247, {0: 0x7E, 1: 0x00}),
    "NaN ignored (TE)": (_block(math.nan, 1.0), "mxfp8-e4m3-rceil", 119, {0: 0x7F, 1: 0x78}),
    "NaN propagates (torchao)": (_block(math.nan, 1.0), "mxfp8-e4m3-rceil-nan-propagate", 255, {0: 0x7F, 1: 0x7F}),
    "all-NaN block, ignored": (_block(math.nan, fill=math.nan), "mxfp8-e4m3-rceil", 0, {0: 0x7F, 31: 0x7F}),
    "fp32 subnormal block (rceil: byte 0, x*2^127 < min)": (_block(2.0**-140), "mxfp8-e4m3-rceil", 0, {0: 0x00}),
    "subnormal d just above 2^-127 (rceil: byte 1)": (_block(448.0 * 2.0**-126 * 0.75), "mxfp8-e4m3-rceil", 1, {0: 0x7A}),
    "fp32 subnormal block (floor)": (_block(2.0**-140), "mxfp8-e4m3-floor", 0, {0: 0x00}),
    "tiny normal block (floor: byte 0, multiplier 2^127)": (_block(2.0**-125), "mxfp8-e4m3-floor", 0, {0: 0x48}),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden(name):
    x, grid, byte, elems = GOLDEN[name]
    qt = quantize(x, grid)
    codes = fp8_codes(qt.data)
    assert qt.scale.item() == byte
    for i, b in elems.items():
        assert codes[i] == b, f"element {i}: {codes[i]:#04x} != {b:#04x}"
    g = qt.grid
    scales, want = ref_mx(x, g.elem, g.rule, g.nan)
    assert (scales, want) == ([byte], codes)  # and the independent reference agrees


# ------------------------------------------------------------------ shapes, axes, padding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rowwise_shapes_and_dtypes(dtype):
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    qt = quantize(x, "mxfp8-e4m3-rceil")
    assert qt.data.shape == x.shape and qt.data.dtype == torch.float8_e4m3fn
    assert qt.scale.shape == (3, 5, 2) and qt.scale.dtype == torch.uint8
    scales, codes = ref_mx(x.to(torch.float32), "e4m3", "rceil", "ignore")
    assert qt.scale.flatten().tolist() == scales and fp8_codes(qt.data) == codes


@pytest.mark.parametrize("grid", ["mxfp8-e4m3-rceil", "mxfp8-e5m2-floor"])
def test_columnwise_is_computed_from_the_high_precision_tensor(grid):
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)) * 10
    col = quantize(x, grid, axis=0)
    row_t = quantize(x.t().contiguous(), grid, axis=-1)
    assert col.scale.shape == (2, 96)
    assert torch.equal(col.data.view(torch.uint8), row_t.data.t().view(torch.uint8))
    assert torch.equal(col.scale, row_t.scale.t())
    # and it is not the rowwise result re-quantized
    row = quantize(x, grid)
    requant = quantize(row.dequantize(), grid, axis=0)
    assert not torch.equal(requant.data.view(torch.uint8), col.data.view(torch.uint8))


def test_middle_axis_of_a_3d_tensor():
    x = torch.randn(2, 64, 3, generator=torch.Generator().manual_seed(2))
    qt = quantize(x, "mxfp8-e4m3-rceil", axis=1)
    assert qt.scale.shape == (2, 2, 3)
    ref_qt = quantize(x.permute(0, 2, 1).contiguous(), "mxfp8-e4m3-rceil")
    assert torch.equal(qt.data.view(torch.uint8), ref_qt.data.permute(0, 2, 1).view(torch.uint8))
    assert torch.equal(qt.dequantize(), ref_qt.dequantize().permute(0, 2, 1))


def test_k_not_multiple_of_32_is_a_clear_error_unless_padded():
    x = torch.randn(4, 40)
    with pytest.raises(ValueError, match=r"has 40 elements \(not a multiple of 32\); pass pad=True"):
        quantize(x, "mxfp8-e4m3-rceil")
    qt = quantize(x, "mxfp8-e4m3-rceil", pad=True)
    assert qt.data.shape == (4, 40) and qt.scale.shape == (4, 2)
    padded = quantize(torch.nn.functional.pad(x, (0, 24)), "mxfp8-e4m3-rceil")
    assert torch.equal(qt.data.view(torch.uint8), padded.data[:, :40].view(torch.uint8))
    assert torch.equal(qt.scale, padded.scale)
    assert qt.dequantize().shape == (4, 40)


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="float32/bfloat16/float16/float64 tensor, got torch.int32"):
        quantize(torch.ones(32, dtype=torch.int32), "mxfp8-e4m3-rceil")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        quantize(torch.ones(2, 32), "mxfp8-e4m3-rceil", axis=2)
    with pytest.raises(ValueError, match="scale= is only accepted by fp8-kv grids"):
        quantize(torch.ones(2, 32), "mxfp8-e4m3-rceil", scale=1.0)
    with pytest.raises(ValueError, match="empty"):
        quantize(torch.ones(0, 32), "mxfp8-e4m3-rceil")


@pytest.mark.parametrize("elem", ELEMS)
def test_dequantize_is_data_times_power_of_two(elem):
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 3
    qt = quantize(x, f"mxfp8-{elem}-rceil")
    fmt = ref.FMT[elem]
    want = []
    for r in range(8):
        for c in range(64):
            v = ref.decode(qt.data[r, c].view(torch.uint8).item(), fmt)
            want.append(float(v.frac()) * 2.0 ** (qt.scale[r, c // 32].item() - 127))
    got = qt.dequantize()
    assert got.flatten().tolist() == want
    assert torch.equal(qt.dequantize(torch.bfloat16), got.to(torch.bfloat16))


# ------------------------------------------------------------------ the compiled kernel


@pytest.mark.parametrize("elem, rule, nan", [("e4m3", "rceil", "ignore"), ("e5m2", "floor", "propagate"),
                                             ("e4m3", "even", "ignore"), ("e5m2", "ceil", "ignore")])
def test_compiled_kernel_gives_the_eager_bytes(elem, rule, nan):
    g = torch.Generator().manual_seed(4)
    specials = all_bf16().reshape(-1, 32)
    normal = (torch.randn(4096, 32, generator=g) * torch.logspace(-30, 30, 4096).unsqueeze(1)).to(torch.bfloat16)
    xb = torch.cat([specials, normal])
    fmt = FORMATS[elem]
    d_c, s_c = mx_quantize_blocks(xb, fmt, rule, nan, backend="compiled")
    d_e, s_e = mx_quantize_blocks(xb, fmt, rule, nan, backend="eager")
    assert torch.equal(s_c, s_e)
    assert fp8_codes(d_c) == fp8_codes(d_e)
    # fp32 input too (a second specialisation of the same kernel)
    d_c32, s_c32 = mx_quantize_blocks(normal.float() * 1.001, fmt, rule, nan, backend="compiled")
    d_e32, s_e32 = mx_quantize_blocks(normal.float() * 1.001, fmt, rule, nan, backend="eager")
    assert torch.equal(s_c32, s_e32) and fp8_codes(d_c32) == fp8_codes(d_e32)


def test_formats_constants():
    assert (E4M3.max, E4M3.emax, E5M2.max, E5M2.emax) == (448.0, 8, 57344.0, 15)
    assert torch.finfo(E4M3.dtype).max == E4M3.max and torch.finfo(E5M2.dtype).max == E5M2.max
