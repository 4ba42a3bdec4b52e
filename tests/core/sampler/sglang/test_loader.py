"""The SGLang loader on a module tree with SGLang's parameter names, dtypes and per-rank shapes, in this
environment (SGLang's own model classes are checked in .venv-sglang: tests/core/sampler/sglang/test_models.py): every
parameter ends equal to the sent bytes, in place, each quantized layer re-derives its kernel layout once;
wrong names, shapes, value classes and gaps fail clearly; tensor-parallel sizes up to 4 and bucketed updates.

The tree follows sglang 0.5.12 (the pinned version):
- ``python/sglang/srt/layers/quantization/fp8.py`` ``Fp8LinearMethod.create_weights`` (MXFP8):
  ``weight`` [N_rank, K_rank] float8_e4m3fn, ``weight_scale_inv`` [N_rank, K_rank/32] uint8;
  ``Fp8MoEMethod.create_weights``: ``w13_weight`` [E, 2·I_rank, H], ``w13_weight_scale_inv``
  [E, 2·I_rank, H/32], ``w2_weight`` [E, H, I_rank], ``w2_weight_scale_inv`` [E, H, I_rank/32];
- per-rank sizes from SGLang's ``layers/linear.py`` (``QKVParallelLinear``: heads/tp q heads,
  max(1, kv_heads/tp) kv heads; ``MergedColumnParallelLinear``; ``RowParallelLinear``) and
  ``layers/vocab_parallel_embedding.py`` (vocabulary padded to 64, then cut);
- names of ``models/qwen3.py`` / ``qwen3_moe.py`` (``qkv_proj``, ``gate_up_proj``, ``experts``, ``mlp.gate``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fp8rl_core.grids import swizzle_mx_scales
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.spec import load_model_spec
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import slice_for_rank
from fp8rl_core.sampler.sglang.loader import LOADER, UPDATE_REQUEST, SglangLoadError, load_into, sglang_name

CONFIGS = Path(__file__).resolve().parents[4] / "configs" / "models"
DENSE = load_model_spec(CONFIGS / "qwen3-dense-tiny.yaml")
MOE = load_model_spec(CONFIGS / "qwen3-moe-tiny.yaml")


class CutlassMxfp8:
    """Stands in for what ``Fp8LinearMethod.process_weights_after_loading`` does for MXFP8 on the FlashInfer
    CUTLASS backend (``_process_mxfp8_linear_weight_scale``, which needs a GPU): a 128×4-swizzled copy of ``weight_scale_inv``
    in a separate attribute (``block_scale_interleave``; here fp8rl's own swizzle), ``weight`` and
    ``weight_scale_inv`` untouched. Counts its calls."""

    def __init__(self):
        self.calls = 0

    def process_weights_after_loading(self, layer):
        self.calls += 1
        if hasattr(layer, "weight_scale_inv"):
            layer.weight_scale_inv_swizzled = swizzle_mx_scales(layer.weight_scale_inv.data)


def _p(*shape, dtype):
    return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)


def _put(root: nn.Module, path: str, **params) -> nn.Module:
    m = root
    for part in path.split("."):
        if not hasattr(m, part):
            m.add_module(part, nn.Module())
        m = getattr(m, part)
    for k, v in params.items():
        m.register_parameter(k, v)
    return m


def sglang_model(spec, tp: int) -> nn.Module:
    """One TP rank of SGLang's Qwen3 / Qwen3-MoE with every GEMM layer on MXFP8 (shapes: module docstring)."""
    fp8, u8, bf16 = torch.float8_e4m3fn, torch.uint8, torch.bfloat16
    hd, h, heads, kv = spec.head_dim, spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads
    q_rows, kv_rows = heads // tp * hd, max(1, kv // tp) * hd
    vocab_rows = -(-spec.vocab_size // 64) * 64 // tp

    def mx(path, n, k):
        m = _put(root, path, weight=_p(n, k, dtype=fp8), weight_scale_inv=_p(n, k // 32, dtype=u8))
        m.quant_method = CutlassMxfp8()

    root = nn.Module()
    _put(root, "model.embed_tokens", weight=_p(vocab_rows, h, dtype=bf16))
    _put(root, "lm_head", weight=_p(vocab_rows, h, dtype=bf16))
    _put(root, "model.norm", weight=_p(h, dtype=bf16))
    for i in range(spec.num_hidden_layers):
        L = f"model.layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            _put(root, f"{L}.{norm}", weight=_p(h, dtype=bf16))
        for norm in ("q_norm", "k_norm"):
            _put(root, f"{L}.self_attn.{norm}", weight=_p(hd, dtype=bf16))
        mx(f"{L}.self_attn.qkv_proj", q_rows + 2 * kv_rows, h)
        mx(f"{L}.self_attn.o_proj", h, heads * hd // tp)
        if spec.kind == "moe":
            e, i_rank = spec.num_experts, spec.moe_intermediate_size // tp
            _put(root, f"{L}.mlp.gate", weight=_p(e, h, dtype=bf16))
            m = _put(root, f"{L}.mlp.experts", w13_weight=_p(e, 2 * i_rank, h, dtype=fp8),
                     w13_weight_scale_inv=_p(e, 2 * i_rank, h // 32, dtype=u8),
                     w2_weight=_p(e, h, i_rank, dtype=fp8), w2_weight_scale_inv=_p(e, h, i_rank // 32, dtype=u8))
            m.quant_method = CutlassMxfp8()
        else:
            mx(f"{L}.mlp.gate_up_proj", 2 * spec.intermediate_size // tp, h)
            mx(f"{L}.mlp.down_proj", h, spec.intermediate_size // tp)
    return root


@pytest.fixture(scope="module", params=[DENSE, MOE], ids=["dense", "moe"])
def sync(request):
    spec = request.param
    learner = Learner(build_model(spec, 0), LearnerConfig(precision="mxfp8", layers="all"))
    full = export_weights(learner.model, learner.forward_weights(), sampler_schemes(gemm_layers(learner.model), "all"))
    return spec, full, ModelLayout.from_hf_config(spec.hf_config().to_dict())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t


def _quantized_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(getattr(m, "quant_method", None), CutlassMxfp8)}


@pytest.mark.parametrize("tp, rank, presliced", [(1, 0, False), (2, 1, False), (2, 1, True), (4, 2, False)])
def test_every_parameter_equals_the_sent_bytes_in_place(sync, tp, rank, presliced):
    spec, full, layout = sync
    model = sglang_model(spec, tp)
    before = {n: (id(p), p.data_ptr()) for n, p in model.named_parameters()}
    want = slice_for_rank(full, layout, rank, tp).tensors
    sent = want if presliced else full  # the sender cut it, or the loader cuts the full tensor
    report = load_into(model, sent.items(), layout=layout, rank=rank, tp=tp, complete=True)
    params = dict(model.named_parameters())
    assert set(report.loaded) == set(params) == {sglang_name(n) for n in full}
    for name, t in want.items():
        p = params[sglang_name(name)]
        assert torch.equal(_bytes(p.data), _bytes(t)), name
    assert {n: (id(p), p.data_ptr()) for n, p in model.named_parameters()} == before  # copy_, never rebound
    assert params["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.float8_e4m3fn
    # each quantized layer derived its kernel layout once, from the new scales
    quantized = _quantized_modules(model)
    assert sorted(report.processed) == sorted(quantized)
    assert all(m.quant_method.calls == 1 for m in quantized.values())
    o = quantized["model.layers.1.self_attn.o_proj"]
    assert torch.equal(o.weight_scale_inv_swizzled,
                       swizzle_mx_scales(want["model.layers.1.self_attn.o_proj.weight_scale"]))


def test_a_layer_is_processed_once_both_halves_arrived(sync):
    """SGLang calls the loader once per bucket; a layer whose data and scales come in different buckets is
    re-derived after the second, exactly once."""
    spec, full, layout = sync
    model = sglang_model(spec, 1)
    names = list(full)
    first = [n for n in names if not n.endswith("weight_scale")]
    second = [n for n in names if n.endswith("weight_scale")]
    r1 = load_into(model, [(n, full[n]) for n in first])
    assert r1.processed == ()
    r2 = load_into(model, [(n, full[n]) for n in second])
    assert sorted(r2.processed) == sorted(_quantized_modules(model))
    assert all(m.quant_method.calls == 1 for m in _quantized_modules(model).values())


def _untouched(model) -> bool:
    return all(not p.data.view(torch.uint8).any() if p.element_size() == 1 else not p.data.any()
               for p in model.parameters())


@pytest.mark.parametrize("case, error", [
    ("unknown", r"model.layers.0.self_attn.qkv_proj.weight_scal: SGLang's model has no parameter "
                r"'model.layers.0.self_attn.qkv_proj.weight_scal'; that layer has "
                r"\['model.layers.0.self_attn.qkv_proj.weight', "
                r"'model.layers.0.self_attn.qkv_proj.weight_scale_inv'\]"),
    ("extra", r"model.layers.9.mlp.down_proj.weight: SGLang's model has no parameter"),
    ("shape", r"model.layers.1.self_attn.o_proj.weight: SGLang's parameter is \[256, 256\], "
              r"the sync sends \[256, 128\]"),
    ("class", r"model.layers.1.self_attn.o_proj.weight: SGLang holds float8_e4m3fn, the sync sends bfloat16"),
    ("missing", r"the sync lacks 1 of SGLang's parameters, e.g. \['lm_head.weight'\]"),
    ("twice", r"model.norm.weight: sent twice in one update"),
])
def test_a_bad_sync_fails_clearly_and_loads_nothing(sync, case, error):
    spec, full, layout = sync
    model = sglang_model(spec, 1)
    sent = list(full.items())
    o = "model.layers.1.self_attn.o_proj.weight"
    if case == "unknown":
        sent.append(("model.layers.0.self_attn.qkv_proj.weight_scal", torch.zeros(1)))
    elif case == "extra":
        sent.append(("model.layers.9.mlp.down_proj.weight", full[o]))
    elif case == "shape":
        sent = [(n, t[:, :128] if n == o else t) for n, t in sent]
    elif case == "class":
        sent = [(n, torch.zeros(t.shape, dtype=torch.bfloat16) if n == o else t) for n, t in sent]
    elif case == "missing":
        sent = [(n, t) for n, t in sent if n != "lm_head.weight"]
    else:
        sent.append(("model.norm.weight", full["model.norm.weight"]))
    with pytest.raises(SglangLoadError, match=error):
        load_into(model, sent, complete=True)
    assert _untouched(model)


def test_a_full_tensor_that_does_not_cut_into_the_ranks_shape_names_the_rank(sync):
    spec, full, layout = sync
    model = sglang_model(spec, 2)  # o_proj on a rank of 2: [256, 128]
    o = "model.layers.1.self_attn.o_proj"
    wide = torch.cat([full[f"{o}.weight"], full[f"{o}.weight"][:, :128]], 1)  # [256, 384]: 192 per rank
    with pytest.raises(SglangLoadError, match=rf"{o}.weight: SGLang's parameter is \[256, 128\], the sync sends "
                                              r"\[256, 384\], cut for tp rank 1/2 to \[256, 192\]"):
        load_into(model, [(f"{o}.weight", wide)], layout=layout, rank=1, tp=2)
    # on the grid a cut must keep 32-element blocks whole: K = 256 over 16 ranks cannot
    with pytest.raises(SglangLoadError, match=rf"{o}.weight: cannot cut the full tensor for tp rank 1/16: .*not a "
                                              r"multiple of the 32-element MXFP8 block"):
        load_into(model, [(f"{o}.weight", full[f"{o}.weight"]), (f"{o}.weight_scale", full[f"{o}.weight_scale"])],
                  layout=layout, rank=1, tp=16)
    assert _untouched(model)


def test_the_request_names_this_loader_and_flushes():
    assert UPDATE_REQUEST == {"load_format": "fp8rl_core.sampler.sglang.loader.load_weights", "flush_cache": True}
    import importlib

    module, _, fn = LOADER.rpartition(".")
    assert callable(getattr(importlib.import_module(module), fn))
