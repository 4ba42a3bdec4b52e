"""The fp8rl vLLM method's arithmetic, without an engine: it is the learner's forward GEMM."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import quantize
from fp8rl_core.learner.config import Recipe
from fp8rl_core.learner.mxfp8 import linear
from fp8rl_core.grids.schemes import BLOCK_GRID, REQUANT_GRID, SCHEMES
from fp8rl_core.sampler.vllm.plugin import _Scheme


@pytest.mark.parametrize("rule", ["rceil", "floor"])
@pytest.mark.parametrize("m, n, k", [(1, 32, 32), (7, 96, 64), (33, 64, 128)])
def test_mxfp8_layer_equals_the_learners_fprop_bitwise(rule, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=g) * 3
    w = torch.randn(n, k, generator=g) * 0.05
    recipe = Recipe(rule=rule)
    wq = quantize(w, recipe.fwd_grid)
    # what the sampler holds after a sync: the uint8 views of the learner's forward operand
    layer = _Scheme("mxfp8", recipe.fwd_grid, BLOCK_GRID)
    ours = layer.gemm(x, layer.process(wq.data.view(torch.uint8), wq.scale)["fp8rl_w"])
    with torch.no_grad():
        theirs = linear(x, w, None, recipe)
    assert ours.dtype == torch.float32 and torch.equal(ours, theirs)


def test_block128_layer_matches_a_hand_written_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 256, generator=g)
    w = torch.randn(160, 256, generator=g) * 0.02
    wq = quantize(w, "fp8-block128-e4m3", role="weight")
    held = _Scheme("block128", "mxfp8-e4m3-floor", BLOCK_GRID).process(w, None)  # the run's MX grid plays no part
    assert torch.equal(held["fp8rl_data"].view(torch.uint8), wq.data.view(torch.uint8))
    assert torch.equal(held["fp8rl_scale"], wq.scale) and torch.equal(held["fp8rl_w"], wq.dequantize())
    ours = _Scheme("block128", "mxfp8-e4m3-floor", BLOCK_GRID).gemm(x, wq.dequantize())
    # vLLM's per-token-group rule by hand: s = max(amax, eps) / 448 per 1x128 group, q = sat(x / s)
    xg = x.reshape(5, 2, 128)
    s = xg.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0
    xq = (xg / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    ref = xq.reshape(5, 256) @ wq.dequantize().t()
    assert torch.equal(ours, ref)


def test_unknown_scheme_is_refused():
    from fp8rl_core.sampler.vllm.plugin import Fp8rlConfig

    assert tuple(SCHEMES) == ("bf16", "mxfp8", "requant", "block128")
    with pytest.raises(ValueError, match="unknown scheme"):
        Fp8rlConfig({"model.layers.0.self_attn.qkv_proj": "fp4"})
    cfg = Fp8rlConfig.from_config({"quant_method": "fp8rl", "layers": {"a": "mxfp8"}, "mx_grid": "mxfp8-e4m3-floor"})
    assert cfg.layers == {"a": "mxfp8"} and cfg.mx_grid == "mxfp8-e4m3-floor" and cfg.get_name() == "fp8rl"


def _vllm_online_mxfp8(x: torch.Tensor):
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import _mxfp8_e4m3_quantize_torch

    data, scale = _mxfp8_e4m3_quantize_torch(x)
    return data.view(torch.uint8), scale


def test_requant_is_vllms_online_mxfp8_quantization_bit_for_bit():
    """The requant scheme's post-load processing against vLLM 0.32's own online MXFP8 reference on the
    same BF16 input: every finite BF16 value as a block's amax (65280 blocks of 32), a normal(0, 0.02)
    2048×512 matrix, an all-zero block, experts-shaped [E, N, K]."""
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    finite = bits[torch.isfinite(bits.float())]
    g = torch.Generator().manual_seed(0)
    blocks = (finite.float()[:, None] * (torch.rand(finite.numel(), 32, generator=g) * 2 - 1)).to(torch.bfloat16)
    blocks[:, 0] = finite
    normal = (torch.randn(2048, 512, generator=g) * 0.02).to(torch.bfloat16)
    experts = (torch.randn(4, 64, 128, generator=g) * 0.05).to(torch.bfloat16)
    scheme = _Scheme("requant", "mxfp8-e4m3-floor", "fp8-block128-e4m3")  # the run's grid plays no part
    for w in (blocks, normal, torch.zeros(3, 64, dtype=torch.bfloat16), experts):
        held = scheme.process(w.float(), None)  # the received BF16 view, in a float32 engine
        data, scale = _vllm_online_mxfp8(w)
        assert torch.equal(held["fp8rl_data"].view(torch.uint8), data)
        assert torch.equal(held["fp8rl_scale"], scale)
        assert torch.equal(held["fp8rl_w"], quantize(w.float(), REQUANT_GRID, axis=-1).dequantize(torch.float32))


def test_requant_of_the_bf16_view_differs_from_the_learners_bytes():
    """Double rounding: the learner quantizes its fp32 master, a requant sampler bf16(master) — on a
    normal(0, 0.02) 2048×2048 matrix 3.4% of the E4M3 bytes and 0.30% of the E8M0 scales differ."""
    w = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(0)) * 0.02
    own = quantize(w, REQUANT_GRID, axis=-1)
    held = _Scheme("requant", REQUANT_GRID, "fp8-block128-e4m3").process(w.to(torch.bfloat16).float(), None)
    data = (held["fp8rl_data"].view(torch.uint8) != own.data.view(torch.uint8)).float().mean().item()
    scale = (held["fp8rl_scale"] != own.scale).float().mean().item()
    assert data == pytest.approx(0.0341, abs=0.001) and scale == pytest.approx(0.0030, abs=0.0003)
