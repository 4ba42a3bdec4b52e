"""The fp8rl vLLM method's arithmetic, without an engine: it is the learner's forward GEMM."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import quantize
from fp8rl_core.learner.config import Recipe
from fp8rl_core.learner.mxfp8 import linear
from fp8rl_core.sampler.plugin import SCHEMES, block_gemm, mx_gemm, mx_weight


@pytest.mark.parametrize("rule", ["rceil", "floor"])
@pytest.mark.parametrize("m, n, k", [(1, 32, 32), (7, 96, 64), (33, 64, 128)])
def test_mxfp8_layer_equals_the_learners_fprop_bitwise(rule, m, n, k):
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=g) * 3
    w = torch.randn(n, k, generator=g) * 0.05
    recipe = Recipe(rule=rule)
    wq = quantize(w, recipe.fwd_grid)
    # what the sampler holds after a sync: the uint8 views of the learner's forward operand
    ours = mx_gemm(x, mx_weight(wq.data.view(torch.uint8), wq.scale, recipe.fwd_grid), recipe.fwd_grid)
    with torch.no_grad():
        theirs = linear(x, w, None, recipe)
    assert ours.dtype == torch.float32 and torch.equal(ours, theirs)


def test_block128_layer_matches_a_hand_written_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 256, generator=g)
    w = torch.randn(160, 256, generator=g) * 0.02
    wq = quantize(w, "fp8-block128-e4m3", role="weight")
    ours = block_gemm(x, wq.dequantize(), "fp8-block128-e4m3")
    # vLLM's per-token-group rule by hand: s = max(amax, eps) / 448 per 1x128 group, q = sat(x / s)
    xg = x.reshape(5, 2, 128)
    s = xg.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0
    xq = (xg / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    ref = xq.reshape(5, 256) @ wq.dequantize().t()
    assert torch.equal(ours, ref)


def test_unknown_scheme_is_refused():
    from fp8rl_core.sampler.plugin import Fp8rlConfig

    assert SCHEMES == ("bf16", "mxfp8", "block128")
    with pytest.raises(ValueError, match="unknown scheme"):
        Fp8rlConfig({"model.layers.0.self_attn.qkv_proj": "fp4"})
    cfg = Fp8rlConfig.from_config({"quant_method": "fp8rl", "layers": {"a": "mxfp8"}, "mx_grid": "mxfp8-e4m3-floor"})
    assert cfg.layers == {"a": "mxfp8"} and cfg.mx_grid == "mxfp8-e4m3-floor" and cfg.get_name() == "fp8rl"
