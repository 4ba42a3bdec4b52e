"""The BF16 view and the saturating FP8 cast, bit for bit against the reference."""

import pytest
import torch

from fp8rl_core.grids import E4M3, E5M2, bf16_view, quantize, saturating_cast

from . import reference as ref
from .helpers import all_bf16, f32_from_bits, fp8_codes

MANT = [0, 1, 0x7FFF, 0x8000, 0x8001, 0x17FFF, 0x18000, 0x18001, 0x7F7FFF, 0x7F8000, 0x7F8001, 0x7FFFFF]


def edge_f32() -> tuple[list[int], torch.Tensor]:
    """Every fp32 exponent × mantissas at and around the bf16 rounding boundaries, both signs."""
    bits = [(s << 31) | (e << 23) | m for s in (0, 1) for e in range(256) for m in MANT]
    return bits, f32_from_bits(bits)


def test_bf16_view_every_exponent_and_tie():
    bits, x = edge_f32()
    got = bf16_view(x).view(torch.int16).tolist()
    want = [ref.bf16_bits(v) for v in x.tolist()]
    got = [g & 0xFFFF for g in got]
    nan = lambda b: (b & 0x7F80) == 0x7F80 and (b & 0x7F)  # noqa: E731
    assert [0x7FC0 if nan(g) else g for g in got] == [0x7FC0 if nan(w) else w for w in want]


def test_bf16_view_is_the_bf16_grid():
    x = torch.randn(4, 33)
    qt = quantize(x, "bf16")
    assert qt.scale is None and qt.data.dtype == torch.bfloat16
    assert torch.equal(qt.data, x.to(torch.bfloat16))
    assert torch.equal(qt.dequantize(), x.to(torch.bfloat16).float())
    b = x.to(torch.bfloat16)
    assert torch.equal(bf16_view(b), b) and bf16_view(b) is not b


@pytest.mark.parametrize("fmt, rfmt", [(E4M3, ref.E4M3), (E5M2, ref.E5M2)])
def test_saturating_cast_of_every_bf16_value(fmt, rfmt):
    x = all_bf16().float()
    got = fp8_codes(saturating_cast(x, fmt))
    want = [ref.encode(ref.from_float(v), rfmt, saturate=True) for v in x.tolist()]
    want = fp8_codes(torch.tensor(want, dtype=torch.uint8).view(fmt.dtype))
    assert got == want


@pytest.mark.parametrize("fmt, rfmt", [(E4M3, ref.E4M3), (E5M2, ref.E5M2)])
def test_saturating_cast_of_fp32_edges(fmt, rfmt):
    _, x = edge_f32()
    got = fp8_codes(saturating_cast(x, fmt))
    want = [ref.encode(ref.from_float(v), rfmt, saturate=True) for v in x.tolist()]
    assert got == fp8_codes(torch.tensor(want, dtype=torch.uint8).view(fmt.dtype))


def test_saturation_named_cases():
    x = torch.tensor([float("inf"), -float("inf"), 1e30, 464.0, 463.99, 448.0, float("nan")])
    assert saturating_cast(x, E4M3).float().tolist()[:6] == [448, -448, 448, 448, 448, 448]
    y = torch.tensor([float("inf"), -float("inf"), 61440.0, 1e30])
    assert saturating_cast(y, E5M2).float().tolist() == [57344, -57344, 57344, 57344]
    assert saturating_cast(torch.tensor([float("nan")]), E5M2).float().isnan().all()


@pytest.mark.parametrize("fmt, bits", [(E4M3, 0x3B124925), (E5M2, 0x37924925)])
def test_max_norm_rcp_is_the_fp32_rounded_reciprocal(fmt, bits):
    """TE's max_norm_rcp: the double 1/max rounded to fp32 (not the double itself); the MX rceil rule and
    the native kernel both read it from the format."""
    rcp = fmt.max_norm_rcp
    assert torch.tensor(rcp, dtype=torch.float32).view(torch.int32).item() == bits
    assert rcp != 1.0 / fmt.max
