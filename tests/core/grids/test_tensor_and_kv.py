"""Per-tensor current scaling (TE) and FP8 KV-cache writes (vLLM, SGLang) against the reference."""

import math

import pytest
import torch

from fp8rl_core.grids import quantize

from . import reference as ref
from .helpers import all_bf16, canon, fp8_codes

TENSORS = {
    "normal": lambda: torch.randn(16, 48, generator=torch.Generator().manual_seed(0)) * 3,
    "every bf16 finite value": lambda: all_bf16().float()[torch.isfinite(all_bf16().float())],
    "with NaN and Inf": lambda: torch.tensor([1.5, math.nan, -2.0, math.inf, 0.25]),
    "all zero": lambda: torch.zeros(5),
    "tiny subnormal amax": lambda: torch.tensor([1e-44, -3e-45]),
}


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", list(TENSORS))
def test_current_scaling_matches_te(case, elem, pow2):
    x = TENSORS[case]()
    qt = quantize(x, f"fp8-tensor-{elem}" + ("-pow2" if pow2 else ""))
    inv, codes = ref.tensor_current(x.flatten().tolist(), elem, pow2)
    assert qt.scale.shape == () and qt.scale.dtype == torch.float32
    assert qt.scale.item() == inv
    assert fp8_codes(qt.data) == canon(codes, elem)


def test_current_scaling_named_values():
    qt = quantize(torch.tensor([448.0, 1.0]), "fp8-tensor-e4m3")
    assert qt.scale.item() == 1.0 and qt.data.float().tolist() == [448.0, 1.0]
    qt = quantize(torch.tensor([100.0]), "fp8-tensor-e4m3-pow2")
    assert qt.scale.item() == 0.25  # 448/100 = 4.48 -> 4 -> scale_inv 1/4
    assert quantize(torch.zeros(3), "fp8-tensor-e4m3").scale.item() == 1.0
    assert quantize(torch.tensor([math.inf, 2.0]), "fp8-tensor-e4m3").scale.item() == 1.0


KV = {
    "bf16 keys": (lambda g: (torch.randn(4, 2, 64, generator=g) * 4).to(torch.bfloat16), 0.05),
    "fp32 values": (lambda g: torch.randn(3, 128, generator=g) * 40, 0.5),
    "every bf16 value": (lambda g: all_bf16(), 0.01),
}


@pytest.mark.parametrize("writer", ["vllm", "sglang"])
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("case", list(KV))
def test_kv_cache_write_matches_engine(case, elem, writer):
    make, scale = KV[case]
    x = make(torch.Generator().manual_seed(1))
    qt = quantize(x, f"fp8-kv-{elem}-{writer}", scale=scale)
    want = ref.kv_write(x.float().flatten().tolist(), elem, writer, scale, in_bf16=x.dtype == torch.bfloat16)
    assert qt.scale.item() == torch.tensor(scale, dtype=torch.float32).item()
    assert fp8_codes(qt.data) == canon(want, elem)


def test_sglang_double_rounding_and_overflow_differ_from_vllm():
    # 1.0/3 is a tie after bf16 rounding: SGLang's bf16 division rounds twice, vLLM's fp32 division once
    x = all_bf16()
    x = x[torch.isfinite(x.float())]
    v = quantize(x, "fp8-kv-e4m3-vllm", scale=0.3)
    s = quantize(x, "fp8-kv-e4m3-sglang", scale=0.3)
    differ = (v.data.view(torch.uint8) != s.data.view(torch.uint8)).sum().item()
    assert differ > 0  # double rounding is visible on real inputs
    big = torch.tensor([61440.0, -1e6], dtype=torch.bfloat16)  # 61440: the tie between 57344 and 2^16 -> Inf
    assert quantize(big, "fp8-kv-e5m2-sglang", scale=1.0).data.float().isinf().all()  # torch's cast: no clamp
    assert quantize(big, "fp8-kv-e5m2-vllm", scale=1.0).data.float().abs().tolist() == [57344.0, 57344.0]


def test_kv_default_scale_and_bad_scale():
    x = torch.tensor([896.0, -1.0])
    qt = quantize(x, "fp8-kv-e4m3-vllm")
    assert qt.scale.item() == 2.0 and qt.dequantize().tolist() == [896.0, -1.0]
    with pytest.raises(ValueError, match="positive finite"):
        quantize(x, "fp8-kv-e4m3-vllm", scale=0.0)
