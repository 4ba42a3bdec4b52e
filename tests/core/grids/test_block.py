"""128x128 block FP8 (DeepGEMM weights, vLLM 1x128 activations) against the reference."""

import math

import pytest
import torch

from fp8rl_core.grids import quantize

from . import reference as ref
from .helpers import canon, fp8_codes


def _ref_weight(w: torch.Tensor, ue8m0: bool):
    n, k = w.shape
    scales = torch.zeros(-(-n // 128), -(-k // 128), dtype=torch.float64)
    codes = [[0] * k for _ in range(n)]
    for bi in range(scales.shape[0]):
        for bj in range(scales.shape[1]):
            tile = w[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128]
            s, c = ref.block_weight_tile(tile.flatten().tolist(), ue8m0)
            scales[bi, bj] = s
            cols = tile.shape[1]
            for i, code in enumerate(c):
                codes[bi * 128 + i // cols][bj * 128 + i % cols] = code
    return scales, canon([c for row in codes for c in row], "e4m3")


WEIGHT_CASES = {
    "ragged 200x300": lambda g: torch.randn(200, 300, generator=g) * 0.02,
    "wide dynamic range": lambda g: torch.randn(130, 260, generator=g) * torch.logspace(-6, 4, 260),
    "zero and tiny tiles": lambda g: torch.cat([torch.zeros(128, 128), torch.full((128, 128), 3e-7)], 1),
    "specials": lambda g: torch.tensor([[math.inf, -1.0, 3e38, -0.0] * 32] * 2 + [[1.0] * 128] * 126),
}


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("case", list(WEIGHT_CASES))
def test_weight_tiles_match_deepgemm_rule(case, ue8m0):
    w = WEIGHT_CASES[case](torch.Generator().manual_seed(0)).to(torch.bfloat16)
    qt = quantize(w, "fp8-block128-e4m3" + ("-ue8m0" if ue8m0 else ""))
    scales, codes = _ref_weight(w.float(), ue8m0)
    assert qt.data.shape == w.shape and qt.scale.dtype == torch.float32
    assert qt.scale.shape == scales.shape
    assert qt.scale.double().tolist() == scales.tolist()
    assert fp8_codes(qt.data) == codes
    if ue8m0:  # powers of two
        m, _ = torch.frexp(qt.scale)
        assert torch.all(m == 0.5)


def test_weight_named_cases():
    # all-zero tile: amax clamps to 1e-4, scale 1e-4/448; NaN tile: NaN scale and NaN data
    w = torch.zeros(128, 256)
    w[0, 128] = float("nan")
    qt = quantize(w, "fp8-block128-e4m3")
    assert qt.scale[0, 0].item() == pytest.approx(1e-4 / 448, rel=1e-6)
    assert math.isnan(qt.scale[0, 1].item()) and qt.data[:, 128:].float().isnan().all()
    assert (qt.data[:, :128].float() == 0).all()


def test_expert_weights_tile_each_expert():
    w = torch.randn(3, 256, 128, generator=torch.Generator().manual_seed(1))
    qt = quantize(w, "fp8-block128-e4m3")
    assert qt.scale.shape == (3, 2, 1)
    for e in range(3):
        one = quantize(w[e], "fp8-block128-e4m3")
        assert torch.equal(one.scale, qt.scale[e]) and torch.equal(one.data.view(torch.uint8), qt.data[e].view(torch.uint8))
    # half an E4M3 ulp relative, or half the smallest subnormal step (2^-10 · scale) absolute
    assert torch.allclose(qt.dequantize(), w, rtol=2**-4, atol=2**-10 * qt.scale.max().item())


def test_weight_needs_last_axis():
    with pytest.raises(ValueError, match="tile the last two dims"):
        quantize(torch.ones(128, 128), "fp8-block128-e4m3", axis=0)
    with pytest.raises(ValueError, match="at least 2 dims"):
        quantize(torch.ones(128), "fp8-block128-e4m3")


ACT_CASES = {
    "tokens x 320": lambda g: torch.randn(7, 320, generator=g) * 5,
    "wide range": lambda g: torch.randn(4, 256, generator=g) * torch.logspace(-12, 12, 256),
    "zeros and specials": lambda g: torch.tensor([[0.0] * 128, [math.nan, 2.0] + [0.0] * 126, [math.inf, 1.0] + [0.5] * 126]),
}


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("case", list(ACT_CASES))
def test_activation_groups_match_vllm_rule(case, ue8m0):
    x = ACT_CASES[case](torch.Generator().manual_seed(2))
    qt = quantize(x, "fp8-block128-e4m3" + ("-ue8m0" if ue8m0 else ""), role="activation")
    rows, k = x.shape
    want_s, want_c = [], []
    for r in range(rows):
        row = x[r].tolist()
        for j in range(0, k, 128):
            s, c = ref.block_act_group(row[j:j + 128], ue8m0)
            want_s.append(s)
            want_c.extend(c)
    assert qt.scale.shape == (rows, -(-k // 128))
    assert qt.scale.flatten().double().tolist() == want_s
    assert fp8_codes(qt.data) == canon(want_c, "e4m3")


def test_activation_zero_group_uses_eps_and_dequantizes_to_zero():
    qt = quantize(torch.zeros(2, 128), "fp8-block128-e4m3", role="activation")
    assert qt.scale[0, 0].item() == pytest.approx(1e-10 / 448, rel=1e-6)
    assert (qt.dequantize() == 0).all()
    qt = quantize(torch.zeros(2, 128), "fp8-block128-e4m3-ue8m0", role="activation")
    assert qt.scale[0, 0].item() == 2.0**-33  # 1e-10 rounded up to a power of two


def test_activation_columnwise_axis():
    x = torch.randn(256, 3)
    qt = quantize(x, "fp8-block128-e4m3", role="activation", axis=0)
    t = quantize(x.t().contiguous(), "fp8-block128-e4m3", role="activation")
    assert qt.scale.shape == (2, 3)
    assert torch.equal(qt.data.view(torch.uint8), t.data.t().view(torch.uint8))
    assert torch.equal(qt.dequantize(), t.dequantize().t())
