"""torchao 0.18's ``to_mx`` as a second, external reference for all four scale modes.

torchao and fp8rl agree byte for byte except in places where torchao's CPU path knowingly departs from
the rule fp8rl follows. Each such place is a *named expected difference* with a predicate saying which
blocks it may touch; every mismatch must be explained by one of them, and each one that the crafted
input is built to trigger must actually show up (so the list stays true as torchao changes):

``rceil-log2-near-pow2``   torchao computes the RCEIL byte as ``ceil(log2(amax / max))`` with a float
                           ``log2``; for an fp32 amax a few ulps above ``max·2^k`` the log2 rounds to the
                           integer k and the byte comes out one lower than TE's bit rule (which rounds up
                           whenever the mantissa of d is non-zero). Elements then follow the lower byte.
``rceil-byte0-multiplier`` for scale byte 0 torchao multiplies elements by 1.0; TE's ``exp2f_rcp``
                           gives 2^127 — tiny non-zero blocks come out as zeros in torchao.
``min-normal-scale-clamp`` FLOOR/CEIL/EVEN: torchao clamps the fp32 scale to 2^-126, so byte-0 blocks are
                           divided by 2^-126 instead of 2^-127 (elements half as large).
``nan-propagation``        torchao's amax is ``torch.amax`` (NaN propagates: the block becomes NaN); with
                           fp8rl's default ``ignore`` policy (TE's fmaxf) only the NaN element is NaN.
                           With ``-nan-propagate`` the scale bytes agree (0xFF) and:
``nan-scale-zero-data``    FLOOR/CEIL/EVEN: for a block whose scale is 0xFF torchao divides by the fp32
                           reading of byte 255 << 23, which is +Inf, so non-NaN elements become 0; fp8rl
                           writes NaN. Both decode to an all-NaN block (the scale is NaN).
"""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import FORMATS, quantize
from fp8rl_core.grids.mx import e8m0_from_amax

from . import reference as ref
from .helpers import fp8_codes

to_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor").to_mx
Mode = pytest.importorskip("torchao.prototype.mx_formats.config").ScaleCalculationMode

ELEMS = ("e4m3", "e5m2")
RULES = ("rceil", "floor", "ceil", "even")


N_ORDINARY = 61 * 4  # the first rows of crafted_blocks: plain random blocks, which must agree exactly


def crafted_blocks(elem: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    mx = FORMATS[elem].max
    rows = []
    # ordinary blocks over a wide range of magnitudes
    for mag in torch.logspace(-30, 30, 61).tolist():
        rows += list(torch.randn(4, 32, generator=g) * mag)
    # fp32 amax a few ulps above max·2^k (RCEIL's round-up boundary)
    for k in range(-20, 20, 3):
        for ulps in range(1, 6):
            amax = torch.tensor(mx * 2.0**k, dtype=torch.float32).view(torch.int32) + ulps
            b = torch.randn(32, generator=g).clamp(-1, 1) * mx * 2.0**k * 0.9
            b[5] = amax.view(torch.float32)
            rows.append(b)
    # tiny blocks (scale byte 0) and all-zero blocks
    for mag in (1e-37, 3e-38, 2e-39, 1e-41):
        rows += list(torch.randn(2, 32, generator=g) * mag)
    rows.append(torch.zeros(32))
    # NaN and Inf
    b = torch.randn(32, generator=g)
    b[3] = float("nan")
    rows.append(b)
    b = torch.randn(32, generator=g)
    b[7] = float("inf")
    rows.append(b)
    return torch.stack(rows).to(dtype)


def classify(x32: torch.Tensor, ours, theirs, elem: str, rule: str, nan: str) -> dict[str, torch.Tensor]:
    """Which blocks each named difference may touch (boolean masks over blocks)."""
    byte = ours.scale.flatten().to(torch.int32)
    has_nan = torch.isnan(x32).any(-1)
    a = torch.where(torch.isnan(x32), 0.0, x32.abs()).amax(-1)
    d = (a * ref.bits_f32(ref.f32_bits(1.0 / FORMATS[elem].max))).view(torch.int32)
    near_pow2 = ((d & 0x7FFFFF) > 0) & ((d & 0x7FFFFF) <= 16)
    masks = {
        "nan-propagation": has_nan if nan == "ignore" else torch.zeros_like(has_nan),
    }
    if rule != "rceil":
        nan_scale = (ours.scale.flatten() == 0xFF) & (theirs[0] == 0xFF)
        masks["nan-scale-zero-data"] = nan_scale & torch.isnan(ours.dequantize().reshape(-1, 32)).all(-1)
    if rule == "rceil":
        masks["rceil-log2-near-pow2"] = near_pow2 & (theirs[0].to(torch.int32) == byte - 1)
        masks["rceil-byte0-multiplier"] = byte == 0
    else:
        masks["min-normal-scale-clamp"] = byte == 0
    return masks


EXPECTED = {  # which named differences the crafted input must show, per (rule, input dtype)
    ("rceil", torch.float32): {"rceil-log2-near-pow2", "rceil-byte0-multiplier"},
    ("rceil", torch.bfloat16): {"rceil-byte0-multiplier"},
}


@pytest.mark.parametrize("nan", ["ignore", "propagate"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("elem", ELEMS)
@pytest.mark.parametrize("rule", RULES)
def test_matches_torchao_up_to_named_differences(rule, elem, dtype, nan):
    x = crafted_blocks(elem, dtype)
    ours = quantize(x, f"mxfp8-{elem}-{rule}-nan-{nan}")
    s_ao, d_ao = to_mx(x, FORMATS[elem].dtype, 32, Mode(rule))
    theirs = (s_ao.view(torch.uint8).flatten(), d_ao)
    scale_diff = ours.scale.flatten() != theirs[0]
    data_diff = torch.tensor(fp8_codes(ours.data)).reshape(-1, 32) != torch.tensor(fp8_codes(d_ao)).reshape(-1, 32)
    differs = scale_diff | data_diff.any(-1)

    masks = classify(x.float(), ours, theirs, elem, rule, nan)
    explained = torch.zeros_like(differs)
    for m in masks.values():
        explained |= m
    unexplained = (differs & ~explained).nonzero().flatten().tolist()
    assert not unexplained, f"unexplained differences from torchao in blocks {unexplained[:10]}"

    seen = {name for name, m in masks.items() if (m & differs).any()}
    want = set(EXPECTED.get((rule, dtype), {"min-normal-scale-clamp"} if rule != "rceil" else set()))
    if nan == "ignore":
        want.add("nan-propagation")
    elif rule != "rceil":
        want.add("nan-scale-zero-data")
    assert want <= seen, f"expected differences {sorted(want - seen)} did not occur"
    assert not differs[:N_ORDINARY].any()  # ordinary blocks agree byte for byte


@pytest.mark.parametrize("elem", ELEMS)
def test_rceil_bytes_equal_torchao_away_from_powers_of_two(elem):
    """On bf16 amaxes (8 significant bits) torchao's log2 is exact: every byte ≥ 1 matches."""
    from .helpers import bf16_from_bits

    amax = bf16_from_bits(list(range(0x0080, 0x7F80))).float()  # every finite normal bf16
    x = torch.zeros(amax.numel(), 32)
    x[:, 0] = amax
    s_ao, _ = to_mx(x, FORMATS[elem].dtype, 32, Mode.RCEIL)
    ours = e8m0_from_amax(amax, FORMATS[elem], "rceil")
    assert torch.equal(ours.to(torch.uint8), s_ao.view(torch.uint8).flatten())
