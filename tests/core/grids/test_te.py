"""Transformer Engine's MXFP8 semantics from TE's own code, restated as data: the padded scale layout the GPU
export cuts (fp8rl_core/grids/te.py, used by fp8rl_core/verl/rollout.py ``_te_rowwise``) and the scale byte
and elements of zero, tiny and ordinary blocks (fp8rl_core/grids/mx.py). TE's Python package does not import
without its CUDA extension, so its Python layout helper and its C++ reference are restated; each case names
the TE file and the tag/commit it was read at (NVIDIA/TransformerEngine).

Where TE's versions disagree — ``exp2f_rcp`` of scale byte 0 is 1 in the kernel and the C++ test helper up to
v2.12 and 2^127 from v2.13 on, byte 254 is 0 in v2.6–v2.12 and 2^-127 from v2.13 on (v2.13 made the kernel's
and the helper's the same bit construction) — fp8rl follows v2.13+: the GPU set pins TE 2.16.1 (verl's uv.lock, constraints-gpu.txt), and only then is a tiny block
(amax/448 an fp32 subnormal) kept instead of flushed to zero. An all-zero block is byte 0, elements 0, in
every version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from fp8rl_core.grids import quantize
from fp8rl_core.grids.mx import e8m0_multiplier
from fp8rl_core.grids.te import compact_rowwise_scales, scale_shape

TE_2_16_1 = "v2.16.1 (c9877beb87ad7e711e1869dd0b5062167ede447a)"
TE_2_12 = "v2.12 (5671fd3675906cda1ade26c24a65d3dedd88eb89)"
TE_2_13 = "v2.13 (287770466f0f4433052260a765db5ff7b8be1320)"
LAYOUT_PY = "transformer_engine/pytorch/tensor/mxfp8_tensor.py MXFP8Quantizer.get_scale_shape"
LAYOUT_CPP = "tests/cpp/test_common.h scale_tensor_alignment_{Y,X}_{rowwise,colwise} = 128, 4 / 4, 128"
KERNEL = "transformer_engine/common/util/ptx.cuh exp2f_rcp<float>"
HELPER = "tests/cpp/test_common.h float_to_e8m0 / exp2f_rcp"
CAST_REF = "tests/cpp/operator/test_cast_mxfp8.cu scale_block (float_to_e8m0(amax·max_reciprocal), x·exp2f_rcp)"
GRID = "mxfp8-e4m3-rceil"


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    rowwise: tuple[int, int]
    columnwise: tuple[int, int]
    source: str = f"{LAYOUT_PY}; {LAYOUT_CPP} @ {TE_2_16_1}"


LAYOUTS = (
    Layout((4096, 4096), (4096, 128), (128, 4096)),           # Qwen3-8B q_proj: no padding
    Layout((151936, 2048), (151936, 64), (4748, 2048)),       # Qwen3-30B-A3B lm_head: 151936 = 1187·128
    Layout((768, 2048), (768, 64), (24, 2048)),               # one Qwen3-30B-A3B expert's gate
    Layout((100, 64), (128, 4), (4, 128)),                    # rows to 128, K/32 = 2 to 4; columnwise 3 to 4
    Layout((2, 48, 96), (128, 4), (4, 128)),                  # rows = prod(shape[:-1]) = 96; K/32 = 3 to 4
    Layout((32, 4128), (128, 132), (4, 4224)),                # K/32 = 129 to 132; K to 33·128
)


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: "x".join(map(str, c.shape)))
def test_te_pads_the_scale_buffers_as_its_layout_helper_says(case):
    assert scale_shape(case.shape) == case.rowwise, case.source
    assert scale_shape(case.shape, columnwise=True) == case.columnwise, case.source


@pytest.mark.parametrize("shape", [(100, 64), (2, 48, 96), (32, 4128)], ids=str)
def test_the_export_cuts_the_tensors_scales_out_of_tes_padded_buffer(shape):
    """TE's C++ reference writes row i, block j's byte at ``i * scales_stride_rowwise + j`` of the padded
    buffer (test_cast_mxfp8.cu @ v2.16.1); the padding never reaches the export."""
    torch.manual_seed(0)
    w = torch.randn(shape) * torch.logspace(-3, 3, shape[-1])
    want = quantize(w, GRID, axis=-1).scale.view(torch.uint8)
    rows, k = math.prod(shape[:-1]), shape[-1]
    padded = torch.full(scale_shape(shape), 0xAB, dtype=torch.uint8)
    padded.view(-1)[(torch.arange(rows)[:, None] * padded.shape[1] + torch.arange(k // 32)).reshape(-1)] = \
        want.reshape(-1)
    got = compact_rowwise_scales(padded, shape)
    assert got.shape == (*shape[:-1], k // 32) and got.is_contiguous()
    assert torch.equal(got, want.reshape(got.shape)) and not (got == 0xAB).any()


def test_a_buffer_not_padded_as_te_pads_is_refused_naming_both_shapes():
    with pytest.raises(ValueError, match=r"scale_inv of shape \(100, 2\) for a tensor of shape \(100, 64\); "
                                         r"TE pads it to \(128, 4\)"):
        compact_rowwise_scales(torch.zeros(100, 2, dtype=torch.uint8), (100, 64))


#: scale byte → the fp32 factor elements are multiplied by (exp2f_rcp), per TE version
MULTIPLIER_2_16 = {0: 2.0**127, 1: 2.0**126, 119: 2.0**8, 127: 1.0, 253: 2.0**-126, 254: 2.0**-127}
#: byte 254 gives 0.0 there ((254 - 254) << 23), v2.13 made it 2^-127 (0x00400000) as the kernel now does
MULTIPLIER_2_12 = {0: 1.0, 1: 2.0**126, 127: 1.0, 253: 2.0**-126, 254: 0.0}


def test_the_element_multiplier_is_te_2_13_and_later_exp2f_rcp():
    got = e8m0_multiplier(torch.tensor(list(MULTIPLIER_2_16) + [255]))
    assert got[:-1].tolist() == list(MULTIPLIER_2_16.values()), f"{KERNEL}; {HELPER} @ {TE_2_16_1} (same since {TE_2_13})"
    assert math.isnan(got[-1])  # 0xFF → NaN (0x7fffffff)
    # TE ≤ v2.12 (kernel and helper): byte 0 → 1; fp8rl follows the version the GPU set installs
    assert all(e8m0_multiplier(torch.tensor([b])).item() == m for b, m in MULTIPLIER_2_12.items() if b in (1, 127, 253))
    assert [e8m0_multiplier(torch.tensor([b])).item() == MULTIPLIER_2_12[b] for b in (0, 254)] == [False, False]


@dataclass(frozen=True)
class Block:
    """One 1×32 block, all elements ``value`` (one element ``first`` when given), cast by TE's reference."""

    name: str
    value: float
    scale: int           # the E8M0 byte
    data: int            # every element's E4M3 byte (the first one's when ``first`` is set)
    data_te_2_12: int    # what TE ≤ v2.12 writes (exp2f_rcp(0) = 1); == data where the versions agree
    first: float | None = None
    source: str = f"{CAST_REF}; {HELPER} @ {TE_2_16_1}"


BLOCKS = (
    # amax 0 → float_to_e8m0(0) = 0; 0·anything = 0: every version
    Block("all-zero", 0.0, scale=0x00, data=0x00, data_te_2_12=0x00),
    # amax/448 = 2^-128.8: an fp32 subnormal with mantissa ≤ 0x400000 → byte 0; 2^-120·2^127 = 128 = E4M3 0x70
    # (decodes to 128·2^-127 = 2^-120 exactly); TE ≤ v2.12 multiplies by 1 and the block flushes to 0
    Block("tiny, byte 0", 2.0**-120, scale=0x00, data=0x70, data_te_2_12=0x00),
    # amax/448 = 2^-126.8: subnormal with mantissa > 0x400000 → byte 1; 2^-118·2^126 = 256 = E4M3 0x78
    Block("tiny, byte 1", 2.0**-118, scale=0x01, data=0x78, data_te_2_12=0x78),
    # 1/448 = 1.14·2^-9: exponent field 118, mantissa ≠ 0 → 119; 1·2^8 = 256 → 0x78
    Block("ordinary", 1.0, scale=119, data=0x78, data_te_2_12=0x78),
    # 448 (E4M3 max) alone: 448/448 = 1 → byte 127, element 448 = 0x7E; the zeros stay 0
    Block("max element", 0.0, first=448.0, scale=127, data=0x7E, data_te_2_12=0x7E),
)


@pytest.mark.parametrize("case", BLOCKS, ids=lambda c: c.name)
def test_zero_tiny_and_ordinary_blocks_get_tes_bytes(case):
    x = torch.full((1, 32), case.value, dtype=torch.float32)
    if case.first is not None:
        x[0, 0] = case.first
    qt = quantize(x, GRID, axis=-1)
    scale = qt.scale.view(torch.uint8).reshape(-1)
    data = qt.data.view(torch.uint8).reshape(-1)
    assert scale.tolist() == [case.scale], case.source
    assert data[0].item() == case.data, case.source
    if case.first is None:
        assert (data == case.data).all(), case.source
    assert torch.equal(qt.dequantize(torch.float32), x), case.name  # every case is exact on TE 2.13+'s rule
