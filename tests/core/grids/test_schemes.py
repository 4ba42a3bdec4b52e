"""The scheme registry: each sampler scheme defined once, its fields what the exporter, the checks, the report and
verl read (fp8rl_core.grids.schemes)."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.grids import parse_grid, quantize
from fp8rl_core.grids.schemes import (BF16, BLOCK_GRID, REQUANT_GRID, SCHEMES, Sent, VerlRollout, layer_scheme,
                                      scheme)
from fp8rl_core.sampler.presets import PRESETS


def test_each_scheme_says_what_is_sent_held_and_checked():
    got = {n: (s.sent, s.rule, s.held, s.block, s.quantized, s.on_learner_grid, s.rule_checked, s.probe_exact, s.verl)
           for n, s in SCHEMES.items()}
    assert got == {
        "bf16": (Sent.VIEW, None, None, (1, 32), False, False, False, True, VerlRollout.DEFAULT),
        "mxfp8": (Sent.BYTES, None, ("weight", "weight_scale"), (1, 32), True, True, False, True, VerlRollout.FP8RL),
        "requant": (Sent.VIEW, REQUANT_GRID, ("mx_data", "mx_scale"), (1, 32), True, False, True, False,
                    VerlRollout.FP8RL),
        "block128": (Sent.VIEW, BLOCK_GRID, ("fp8_data", "fp8_scale_inv"), (128, 128), True, False, False, False,
                     VerlRollout.VERL_FP8),
    }
    assert {n: (s.grid("mxfp8-e4m3-floor"), s.k_multiple, s.probe_reads_held) for n, s in SCHEMES.items()} == {
        "bf16": (None, 1, False), "mxfp8": ("mxfp8-e4m3-floor", 32, True), "requant": (REQUANT_GRID, 32, True),
        "block128": (BLOCK_GRID, 1, False)}
    assert {n: s.evidence for n, s in SCHEMES.items()} == {"bf16": ("W4",), "mxfp8": ("W2",), "requant": ("W2", "W4"),
                                                           "block128": ("W4",)}


def test_a_rule_is_a_grid_whose_blocks_are_the_schemes():
    for s in SCHEMES.values():
        if s.rule is None:
            continue
        w = torch.randn(256, 256)
        qt = s.quantize_view(w, s.grid())
        rows, cols = s.block
        assert qt.scale.shape == (256 // rows, 256 // cols), s.name
        assert qt.grid == parse_grid(s.rule)


def test_held_bytes_are_read_by_the_schemes_one_call_bit_for_bit():
    """Scheme.dequantize_held (uint8 or FP8 views of the data) equals the grids' own dequantization of the same
    bytes, bit for bit — the MX bytes along K (the learner's grid for ``mxfp8``), 128×128 tiles as block FP8 —
    and quantize_view puts a view on those same grids; activations on the scheme's grid are the grids' rule."""
    torch.manual_seed(0)
    w, x = torch.randn(2, 160, 96), torch.randn(5, 96)
    for s in (x for x in SCHEMES.values() if x.quantized):
        grid = s.grid("mxfp8-e4m3-floor")
        qt = s.quantize_view(w.to(torch.bfloat16).float(), grid)
        ref = (quantize(w.to(torch.bfloat16).float(), grid, axis=-1) if s.block == (1, 32)
               else quantize(w.to(torch.bfloat16).float(), grid, role="weight"))
        assert torch.equal(qt.data.view(torch.uint8), ref.data.view(torch.uint8)) and torch.equal(qt.scale, ref.scale)
        for data in (qt.data, qt.data.view(torch.uint8)):
            got = s.dequantize_held(data, qt.scale, grid)
            assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), ref.dequantize().view(torch.int32))
        act = s.quantize_activation(x, grid)
        want = quantize(x, grid, axis=-1, role="activation").dequantize(torch.float32)
        assert torch.equal(act.view(torch.int32), want.view(torch.int32)), s.name


def test_a_layer_not_named_is_bf16_and_an_unknown_name_is_refused():
    assert layer_scheme({"a": "mxfp8"}, "b") is BF16 and layer_scheme({"a": "mxfp8"}, "a") is SCHEMES["mxfp8"]
    with pytest.raises(ValueError, match="unknown sampler scheme 'fp4'; valid: bf16, mxfp8, requant, block128"):
        scheme("fp4")


def test_every_preset_names_a_scheme_and_selects_layers_only_on_a_quantized_one():
    assert {n: p.sampler_scheme for n, p in PRESETS.items()} == {
        "bf16-e2e": "bf16", "bf16-sampler": "bf16", "half": "mxfp8", "all": "mxfp8", "requant": "requant",
        "other-grid": "block128"}
    from fp8rl_core.sampler.presets import Preset

    with pytest.raises(ValueError, match="a BF16 sampler selects no layer"):
        Preset("x", "mxfp8", "all", "all", "bf16", "")
