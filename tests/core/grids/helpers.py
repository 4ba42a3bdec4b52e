"""Shared helpers for the grid tests: bit views and NaN-canonical byte comparison."""

from __future__ import annotations

import torch

from . import reference as ref

NAN_CODES = {torch.float8_e4m3fn: {0x7F, 0xFF}, torch.float8_e5m2: {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}}


def fp8_codes(t: torch.Tensor) -> list[int]:
    """FP8 tensor → list of byte values with every NaN mapped to 0x7F (a NaN's sign means nothing)."""
    nan = NAN_CODES[t.dtype]
    return [0x7F if b in nan else b for b in t.view(torch.uint8).flatten().tolist()]


def canon(codes: list[int], elem: str) -> list[int]:
    nan = NAN_CODES[torch.float8_e4m3fn if elem == "e4m3" else torch.float8_e5m2]
    return [0x7F if b in nan else b for b in codes]


def f32_from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)


def bf16_from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor([b - (1 << 16) if b >= 1 << 15 else b for b in bits], dtype=torch.int16).view(torch.bfloat16)


def all_bf16() -> torch.Tensor:
    """Every bfloat16 bit pattern (65536 values: ±0, subnormals, normals, ±Inf, NaNs)."""
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def ref_mx(x: torch.Tensor, elem: str, rule: str, nan: str) -> tuple[list[int], list[int]]:
    """Reference rowwise MX quantization of a [n, 32·k] tensor → (scale bytes, canonical codes)."""
    rows = x.to(torch.float32).reshape(-1, 32).tolist()
    scales, codes = [], []
    for blk in rows:
        b, c = ref.mx_block(blk, elem, rule, nan)
        scales.append(b)
        codes.extend(c)
    return scales, canon(codes, elem)
