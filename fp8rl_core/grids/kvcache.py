"""FP8 KV-cache writes with a per-tensor scale, the way each serving engine performs them.

The scale ``s`` is the dequantization multiplier (``k_scale``/``v_scale``): the cache holds ``q`` and
attention reads ``fp32(q) · s``. Engines differ in how they *write* ``q``:

``vllm`` — vLLM's CUDA ``reshape_and_cache_flash`` → ``fp8::scaled_convert``
    (``csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh``): ``q = sat_rne(fp32(x) / s)``, the
    division in fp32, then ``__nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...)``.
``sglang`` — SGLang's ``MHATokenToKVPool.set_kv_buffer`` (``mem_cache/memory_pool.py``):
    ``cache_k.div_(k_scale); cache_k.to(fp8)`` — the division happens *in the model dtype* (for a
    bf16 model: fp32 quotient rounded to bf16, a double rounding), then a plain torch cast with no
    clamp: on torch 2.13 that saturates for E4M3 but overflows to ±Inf for E5M2.

When no scale is given, ``s = amax / max_fp8`` (the smallest per-tensor scale that does not clip;
NaN skipped; 1.0 for an all-zero tensor), computed in fp32.
"""

from __future__ import annotations

import torch

from .formats import FP8Format, saturating_cast

__all__ = ["KV_WRITERS", "quantize_kv", "default_kv_scale"]


def default_kv_scale(x: torch.Tensor, fmt: FP8Format) -> torch.Tensor:
    a = x.to(torch.float32).abs()
    amax = torch.where(a == a, a, 0.0).amax()
    s = amax / fmt.max
    return torch.where((s > 0) & torch.isfinite(s), s, torch.ones_like(s))


def quantize_kv(
    x: torch.Tensor, fmt: FP8Format, writer: str, scale: float | torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``x`` into an FP8 cache as ``writer`` does → (fp8 data like ``x``, fp32 0-d scale)."""
    s = default_kv_scale(x, fmt) if scale is None else torch.as_tensor(scale, dtype=torch.float32).reshape(())
    if not bool(torch.isfinite(s)) or float(s) <= 0:
        raise ValueError(f"KV-cache scale must be a positive finite number, got {float(s)!r}")
    if writer not in KV_WRITERS:
        raise ValueError(f"unknown KV-cache writer {writer!r}; expected {' or '.join(KV_WRITERS)}")
    return KV_WRITERS[writer](x, s, fmt), s


#: the engine whose cache write is modelled → its rule (module docstring)
KV_WRITERS = {
    "vllm": lambda x, s, fmt: saturating_cast(x.to(torch.float32) / s, fmt),
    "sglang": lambda x, s, fmt: x.div(s).to(fmt.dtype),  # division in x's dtype; torch's own cast, no clamp
}
