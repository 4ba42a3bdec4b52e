"""Property tests (hypothesis): error bounds of dequantize∘quantize, columnwise = rowwise of the
transpose, and when re-quantizing a grid-exact tensor reproduces its bytes (and where it does not)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp8rl_core.grids import FORMATS, quantize

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def blocks(draw, rows=st.integers(1, 4), nblk=st.integers(1, 3)):
    """A [rows, 32·k] fp32 tensor whose blocks mix magnitudes (one exponent per block, plus outliers)."""
    r, k = draw(rows), draw(nblk)
    vals = []
    for _ in range(r * k):
        e = draw(st.integers(-140, 120))
        mant = draw(st.lists(st.floats(-2, 2, width=32), min_size=32, max_size=32))
        outliers = draw(st.lists(st.tuples(st.integers(0, 31), finite32), max_size=2))
        blk = [m * 2.0**e for m in mant]
        for i, v in outliers:
            blk[i] = v
        vals.append([min(max(v, -3.4e38), 3.4e38) for v in blk])
    return torch.tensor(vals, dtype=torch.float32).reshape(r, k * 32)


def _elementwise_bound(x: torch.Tensor, qt, saturating: bool) -> torch.Tensor:
    fmt = qt.grid.format
    s = torch.pow(2.0, qt.scale.double() - 127).repeat_interleave(32, dim=-1)
    xa = x.double().abs()
    half_ulp_rel = xa * 2.0 ** -(fmt.mbits + 1)
    half_sub = s * 2.0 ** (fmt.min_normal_exp - fmt.mbits - 1)  # half the smallest subnormal step
    sat = (xa - fmt.max * s).clamp(min=0) if saturating else 0.0
    return torch.maximum(half_ulp_rel, half_sub) + sat + 2.0**-149


@pytest.mark.parametrize("rule", ["rceil", "floor", "ceil", "even"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@SETTINGS
@given(x=blocks())
def test_mx_round_trip_error_bound(x, elem, rule):
    qt = quantize(x, f"mxfp8-{elem}-{rule}")
    # decode in float64: near fp32's max, FP8 rounding can step past it (see test_dequantize_can_overflow_fp32)
    deq = qt.data.double() * torch.pow(2.0, qt.scale.double() - 127).repeat_interleave(32, dim=-1)
    err = (deq - x.double()).abs()
    saturating = rule in ("floor", "even")  # RCEIL and CEIL scales never overflow the element range
    assert torch.all(err <= _elementwise_bound(x, qt, saturating))
    if not saturating:
        assert torch.all(qt.data.float().abs() <= FORMATS[elem].max)


@st.composite
def seeded_matrix(draw):
    """A [32·r, c] fp32 matrix from a drawn seed, with a drawn exponent per row and a few specials."""
    r, c, seed = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(0, 2**31 - 1))
    lo = draw(st.integers(-140, 100))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32 * r, c, generator=g) * torch.pow(2.0, torch.randint(lo, lo + 30, (32 * r, 1), generator=g).float())
    if draw(st.booleans()):
        x[draw(st.integers(0, 32 * r - 1)), draw(st.integers(0, c - 1))] = draw(st.sampled_from([math.nan, math.inf, -0.0]))
    return x


@pytest.mark.parametrize("grid", ["mxfp8-e4m3-rceil", "mxfp8-e5m2-floor", "mxfp8-e4m3-even-nan-propagate"])
@SETTINGS
@given(x=seeded_matrix())
def test_columnwise_equals_rowwise_of_transpose(x, grid):
    col = quantize(x, grid, axis=0)
    row = quantize(x.t().contiguous(), grid)
    assert torch.equal(col.data.view(torch.uint8), row.data.t().view(torch.uint8))
    assert torch.equal(col.scale, row.scale.t())


def _block_qmax(qt) -> torch.Tensor:
    return qt.data.float().abs().reshape(*qt.scale.shape, 32).amax(-1)


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@SETTINGS
@given(x=blocks())
def test_rceil_requantize_reproduces_bytes_exactly_when_the_top_element_is_above_half_max(x, elem):
    """RCEIL puts a block's largest element in [max/2, max]; re-quantizing the dequantized block gives
    the same bytes unless rounding landed it exactly on max/2 (then the scale drops by one)."""
    grid = f"mxfp8-{elem}-rceil"
    qt = quantize(x, grid)
    again = quantize(qt.dequantize(), grid)
    qmax = _block_qmax(qt)
    assert torch.all(qmax >= FORMATS[elem].max / 2) or torch.any(qt.scale == 0)
    # blocks whose fp32 dequantization overflows (test_dequantize_can_overflow_fp32...) are out of scope
    finite = torch.isfinite(qt.dequantize()).reshape(*qt.scale.shape, 32).all(-1)
    guaranteed = (qmax > FORMATS[elem].max / 2) | (qt.scale == 0)
    assert torch.equal((again.scale == qt.scale)[finite], guaranteed[finite])
    same = (again.data.view(torch.uint8) == qt.data.view(torch.uint8)).reshape(*qt.scale.shape, 32).all(-1)
    assert torch.all(same[guaranteed & finite])
    blockwise = lambda t: t.reshape(*qt.scale.shape, 32)[finite]  # noqa: E731
    assert torch.equal(blockwise(again.dequantize()), blockwise(qt.dequantize()))  # grid-exact values either way


@SETTINGS
@given(x=blocks())
def test_floor_requantize_always_reproduces_bytes(x):
    """FLOOR puts the top element in [256, 448] (saturated) for E4M3: the exponent never moves."""
    qt = quantize(x, "mxfp8-e4m3-floor")
    again = quantize(qt.dequantize(), "mxfp8-e4m3-floor")
    nonzero = _block_qmax(qt) > 0
    assert torch.isfinite(qt.dequantize()).all()  # FLOOR saturates: never past fp32's max
    assert torch.equal(again.scale[nonzero], qt.scale[nonzero])
    assert torch.equal(again.data.view(torch.uint8), qt.data.view(torch.uint8))


def test_where_requantization_does_not_reproduce_the_bytes():
    # 224.01/448 = 0.50002 -> RCEIL scale 2^0 (byte 127); the element rounds to exactly 224 = max/2,
    # so the dequantized block has amax 224, d = 0.5 exactly, and the scale becomes 2^-1 (byte 126).
    x = torch.zeros(1, 32)
    x[0, 0] = 224.01
    qt = quantize(x, "mxfp8-e4m3-rceil")
    again = quantize(qt.dequantize(), "mxfp8-e4m3-rceil")
    assert (qt.scale.item(), again.scale.item()) == (127, 126)
    assert (qt.data[0, 0].item(), again.data[0, 0].item()) == (224.0, 448.0)
    assert torch.equal(qt.dequantize(), again.dequantize())


@SETTINGS
@given(w=st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, 300))), seed=st.integers(0, 2**16))
def test_block_weight_round_trip_error_bound(w, seed):
    n, k = w
    x = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 10 ** (seed % 7 - 3)
    qt = quantize(x, "fp8-block128-e4m3")
    s = qt.scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k].double()
    err = (qt.dequantize().double() - x.double()).abs()
    # x·(1/s) may be one rounding above the exact quotient, hence a little slack on the relative part
    assert torch.all(err <= torch.maximum(x.double().abs() * (2.0**-4 + 2.0**-20), s * 2.0**-10) + 1e-30)


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@SETTINGS
@given(x=st.lists(finite32.filter(lambda v: abs(v) < 1e30), min_size=1, max_size=64))
def test_tensor_round_trip_error_bound(x, elem):
    t = torch.tensor(x, dtype=torch.float32)
    qt = quantize(t, f"fp8-tensor-{elem}")
    fmt = FORMATS[elem]
    s = qt.scale.double()
    err = (qt.dequantize().double() - t.double()).abs()
    bound = torch.maximum(t.double().abs() * 2.0 ** -(fmt.mbits + 1) * (1 + 2.0**-20),
                          s * 2.0 ** (fmt.min_normal_exp - fmt.mbits - 1) * (1 + 2.0**-20))
    assert torch.all(err <= bound + 2.0**-149), (err - bound).max()
    assert math.isfinite(qt.scale.item())


@pytest.mark.parametrize("rule", ["rceil", "floor", "ceil", "even"])
def test_dequantize_can_overflow_fp32_at_the_top_of_the_range(rule):
    """3.2965e38 (within 3% of fp32's max) rounds to FP8 256 · 2^120 = 2^128 under every rule but FLOOR:
    the value is on the grid, but an fp32 dequantization reads it as +Inf. FLOOR saturates instead."""
    x = torch.zeros(1, 32)
    x[0, 0] = 3.2965e38
    qt = quantize(x, f"mxfp8-e4m3-{rule}")
    if rule == "floor":
        assert (qt.scale.item(), qt.data[0, 0].item()) == (246, 448.0)
        assert math.isfinite(qt.dequantize()[0, 0].item())
    else:
        assert (qt.scale.item(), qt.data[0, 0].item()) == (247, 256.0)
        assert qt.dequantize()[0, 0].item() == math.inf
