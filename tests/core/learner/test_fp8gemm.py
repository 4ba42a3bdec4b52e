"""Real FP8 GEMMs (fp8rl_core.learner.fp8gemm) on what CPU torch._scaled_mm runs — per-tensor and row-wise
FP8 — with operands from fp8rl_core.grids, against the emulated product of the same operands; the
block-FP8 linear's operand layouts and gradients through its CPU fallback."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import quantize
from fp8rl_core.learner.fp8gemm import block_fp8_linear, scaled_mm, scaling_of, supported


def _emulated(a, b):
    return a.dequantize(torch.float32) @ b.dequantize(torch.float32).T


def _assert_same_product(got, a, b):
    """``got`` equals the emulated product up to fp32 accumulation order: a K-term fp32 dot product in any
    order is within K·u·Σ|aᵢbᵢ| of the exact one (u = 2⁻²⁴), so two orders differ by at most twice that
    (the kernel CPU torch picks — oneDNN's, by the machine's instruction set — fixes the order)."""
    da, db = a.dequantize(torch.float32), b.dequantize(torch.float32)
    bound = 2 * da.shape[1] * 2.0**-24 * (da.abs() @ db.abs().T)
    diff = (got.float() - _emulated(a, b)).abs()
    assert bool((diff <= bound).all()), f"max excess {float((diff - bound).max()):.3g} over the fp32 order bound"


@pytest.mark.parametrize("grid", ["fp8-tensor-e4m3", "fp8-tensor-e5m2", "fp8-tensor-e4m3-pow2"])
def test_tensorwise_scaled_mm_on_cpu_equals_the_emulated_product(grid):
    g = torch.Generator().manual_seed(0)
    a = quantize(torch.randn(64, 256, generator=g), grid)
    b = quantize(torch.randn(96, 256, generator=g) * 3, grid)
    assert scaling_of(a, b) == "tensorwise" and supported("tensorwise", "cpu")
    _assert_same_product(scaled_mm(a, b, torch.float32), a, b)


def test_rowwise_scaled_mm_on_cpu_equals_the_emulated_product():
    """1×128 groups with K = 128: one scale per row of A and of B, CPU's row-wise _scaled_mm."""
    g = torch.Generator().manual_seed(1)
    a = quantize(torch.randn(64, 128, generator=g) * torch.logspace(-3, 3, 64).unsqueeze(1),
                 "fp8-block128-e4m3", role="activation")
    b = quantize(torch.randn(32, 128, generator=g), "fp8-block128-e4m3", role="activation")
    assert a.scale.shape == (64, 1) and scaling_of(a, b) == "rowwise" and supported("rowwise", "cpu")
    _assert_same_product(scaled_mm(a, b, torch.float32), a, b)
    assert scaled_mm(a, b).dtype == torch.bfloat16


def test_blockwise_and_mx_do_not_run_on_cpu_unless_falling_back():
    x, w = torch.randn(128, 256), torch.randn(128, 256)
    a = quantize(x, "fp8-block128-e4m3", role="activation")
    b = quantize(w, "fp8-block128-e4m3", role="weight")
    assert scaling_of(a, b) == "blockwise" and not supported("blockwise", "cpu")
    with pytest.raises(RuntimeError, match="no blockwise scaling on cpu"):
        scaled_mm(a, b)
    torch.testing.assert_close(scaled_mm(a, b, torch.float32, fallback=True), _emulated(a, b))
    ma, mb = quantize(x, "mxfp8-e4m3-rceil"), quantize(w, "mxfp8-e4m3-rceil")
    assert scaling_of(ma, mb) == "mx" and not supported("mx", "cpu")
    with pytest.raises(ValueError, match="no scaled GEMM"):
        scaling_of(ma, b)


def test_transposed_weight_tiles_are_the_weights_tiles_transposed():
    """dgrad's operand: quantizing Wᵀ gives W's bytes transposed and W's tile scales transposed."""
    w = torch.randn(256, 384) * torch.logspace(-2, 2, 384)
    q, qt = quantize(w, "fp8-block128-e4m3"), quantize(w.T.contiguous(), "fp8-block128-e4m3")
    assert torch.equal(qt.data.view(torch.uint8), q.data.T.contiguous().view(torch.uint8))
    assert torch.equal(qt.scale, q.scale.T.contiguous())


def test_block_fp8_linear_matches_bf16_within_fp8_error():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(200, 256, generator=g, requires_grad=True)  # 200 tokens: padded to 256 inside
    w = (torch.randn(384, 256, generator=g) / 16).requires_grad_()
    y = block_fp8_linear(x, w, fallback=True)
    (y.float() ** 2).mean().backward()
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y_ref = x_ref @ w_ref.T
    (y_ref ** 2).mean().backward()
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()  # noqa: E731
    assert y.shape == (200, 384) and rel(y, y_ref) < 0.05
    assert rel(x.grad, x_ref.grad) < 0.08 and rel(w.grad, w_ref.grad) < 0.08
    assert w.grad.dtype == torch.float32
    with pytest.raises(ValueError, match="multiples of 128"):
        block_fp8_linear(x, torch.randn(100, 256))
