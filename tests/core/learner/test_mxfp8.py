"""The MXFP8 emulation of Transformer Engine's MXFP8BlockScaling recipe.

What is proven here: the operands each of the three GEMMs consumes are byte-equal to
``grids.quantize`` of the same tensors (rowwise/columnwise, E4M3/E5M2, RCEIL/FLOOR, zero-padded tokens);
the products are the fp32 products of those operands; the gradients stay within a bound derived from
the formats; the weight cache is reused within a step and dropped after an optimizer step; module swap
keeps parameter names and objects; the experts emulation computes HF's Qwen3MoeExperts math exactly
when every operand is already on the grid; forward weights are the very fprop operands.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts, Qwen3MoeTopKRouter

from fp8rl_core.grids import QuantizedTensor, quantize
from fp8rl_core.learner.config import Recipe
from fp8rl_core.learner.mxfp8 import (
    MXFP8Experts,
    MXFP8Linear,
    MXFP8Router,
    apply_recipe,
    bf16_autocast,
    capture_operands,
    clear_weight_cache,
    forward_weights,
    linear,
    on_grid_layers,
    weight_cache_info,
)
from fp8rl_core.learner.patterns import gemm_layers, resolve_layers
from fp8rl_core.learner.timers import Timers

E4M3_RCEIL = Recipe()
HYBRID = Recipe.hybrid()
FLOOR = Recipe(rule="floor")
RECIPES = {"e4m3-rceil": E4M3_RCEIL, "hybrid-rceil": HYBRID, "e4m3-floor": FLOOR, "hybrid-floor": Recipe.hybrid("floor")}

COMMON = dict(
    vocab_size=1024, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, attn_implementation="eager",
)
MOE = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[])


def dense(layers: int = 2, **kw) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=layers, **{**COMMON, **kw}))


def moe(layers: int = 2, **kw) -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=layers, **{**COMMON, **MOE, **kw}))


def rand(*shape: int, seed: int, spread: int = 6) -> torch.Tensor:
    """Normal values whose magnitudes vary by up to 2^±spread between elements (many block scales)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2.0 ** torch.randint(-spread, spread + 1, shape, generator=g)


def same_bytes(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    return (
        str(a.grid) == str(b.grid)
        and a.data.dtype == b.data.dtype
        and a.data.shape == b.data.shape
        and torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
        and torch.equal(a.scale, b.scale)
    )


def run_linear(recipe, x_shape=(2, 21, 64), n=96, dtype=torch.float32, bias=True, seed=0):
    """One linear forward + backward with a given upstream gradient; returns tensors and captured operands."""
    k = x_shape[-1]
    x = rand(*x_shape, seed=seed).to(dtype).requires_grad_()
    w = nn.Parameter(rand(n, k, seed=seed + 1) * 0.05)
    b = nn.Parameter(rand(n, seed=seed + 2)) if bias else None
    with capture_operands() as rec:
        y = linear(x, w, b, recipe, layer="L")
        g = rand(*y.shape, seed=seed + 3).to(y.dtype)
        y.backward(g)
    return x, w, b, y, g, rec


# --------------------------------------------------------------------------------------------------
# 1. operands are grids.quantize of the same tensors, and products are their fp32 products
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("x_shape", [(2, 21, 64), (64, 64)], ids=["M=42-padded", "M=64"])
def test_three_gemms_consume_the_grid_quantization_of_their_operands(recipe, dtype, x_shape):
    x, w, b, y, g, rec = run_linear(recipe, x_shape, dtype=dtype)
    assert [r.gemm for r in rec] == ["fprop", "dgrad", "wgrad"]
    fprop, dgrad, wgrad = rec
    assert all(r.layer == "L" and r.expert is None for r in rec)
    x2d, dy = x.detach().reshape(-1, 64), g.reshape(-1, 96)
    m = x2d.shape[0]
    fwd, grad = recipe.fwd_grid, recipe.grad_grid
    # fprop: X rowwise (1x32 along K), W rowwise (1x32 along K)
    assert same_bytes(fprop.a, quantize(x2d, fwd, axis=-1))
    assert same_bytes(fprop.b, quantize(w.detach(), fwd, axis=-1))
    # dgrad: dY rowwise (1x32 along N), W columnwise (32x1 along N), from the high-precision W
    assert same_bytes(dgrad.a, quantize(dy, grad, axis=-1))
    assert same_bytes(dgrad.b, quantize(w.detach(), fwd, axis=0))
    # wgrad: dY and X columnwise (32x1 along the token dim M, zero-padded to a multiple of 32)
    assert same_bytes(wgrad.a, quantize(dy, grad, axis=0, pad=True))
    assert same_bytes(wgrad.b, quantize(x2d, fwd, axis=0, pad=True))
    assert wgrad.b.scale.shape == (-(-m // 32), 64)
    padded = quantize(F.pad(x2d, (0, 0, 0, (-m) % 32)), fwd, axis=0)  # explicit zero rows
    assert torch.equal(padded.data[:m].view(torch.uint8), wgrad.b.data.view(torch.uint8))
    assert torch.equal(padded.scale, wgrad.b.scale)
    # element formats: E4M3 everywhere except dY (E5M2 under HYBRID)
    grad_dtype = torch.float8_e5m2 if recipe.grad == "e5m2" else torch.float8_e4m3fn
    assert [r.a.data.dtype for r in rec] == [torch.float8_e4m3fn, grad_dtype, grad_dtype]
    assert {r.b.data.dtype for r in rec} == {torch.float8_e4m3fn}
    # products: fp32 on the dequantized operands, output in x's dtype, bias in fp32
    deq = lambda q: q.dequantize(torch.float32)  # noqa: E731
    assert y.dtype == dtype
    assert torch.equal(y.reshape(-1, 96), (deq(fprop.a) @ deq(fprop.b).T + b.detach()).to(dtype))
    assert torch.equal(x.grad.reshape(-1, 64), (deq(dgrad.a) @ deq(dgrad.b)).to(dtype))
    assert w.grad.dtype == torch.float32 and torch.equal(w.grad, deq(wgrad.a).T @ deq(wgrad.b))
    assert torch.equal(b.grad, dy.float().sum(0))


def test_columnwise_weight_is_not_the_rowwise_result_requantized():
    x, w, b, y, g, rec = run_linear(E4M3_RCEIL)
    dgrad_w = rec[1].b
    from_rowwise = quantize(rec[0].b.dequantize(), E4M3_RCEIL.fwd_grid, axis=0)
    assert same_bytes(dgrad_w, quantize(w.detach(), E4M3_RCEIL.fwd_grid, axis=0))
    assert not torch.equal(dgrad_w.dequantize(), from_rowwise.dequantize())  # double rounding would differ


# --------------------------------------------------------------------------------------------------
# 2. gradients vs an fp32 reference, within a bound derived from the formats
# --------------------------------------------------------------------------------------------------
# Per element, MXFP8 quantization of x with block scale s (a power of two) gives
#   |x̂ - x| <= u·|x| + h·s
# u: the relative error of a normal element: RNE with m mantissa bits gives 2^-(m+1) (E4M3 2^-4, E5M2
#    2^-3). Under FLOOR the block maximum can also saturate: x/s in [max, 2^(emax+1)) maps to max, a
#    relative error below (2^(emax+1) - max)/2^(emax+1) = 1/8 for both formats, so u = 2^-3.
#    RCEIL never saturates (x/s <= max by construction).
# h·s: elements below the smallest normal (2^-6 for E4M3, 2^-14 for E5M2) round to a fixed grid of
#    spacing 2^(emin-m): half of it is h = 2^-10 (E4M3) / 2^-17 (E5M2), times the block scale s.
# With E_A, E_B the elementwise bounds of two operands, for C = A·Bᵀ (each term x̂ŵ - xw =
# (x̂-x)ŵ + x(ŵ-w), |ŵ| <= |w| + E_w):
#   |Ĉ - C| <= E_A·|B|ᵀ + |A|·E_Bᵀ + E_A·E_Bᵀ + 2γ_K·|Â|·|B̂|ᵀ (+ 2^-8·|Ĉ| when the output is bf16)
# where γ_K = K·2^-24 bounds fp32 accumulation over K in each of Ĉ and the fp32 reference C. Without
# subnormals this is the familiar (2u + u²)·(|A|·|B|ᵀ), e.g. (2·2^-4 + 2^-8)·Σ|x||w| for E4M3.
FMT = {"e4m3": dict(m=3, emin=-6), "e5m2": dict(m=2, emin=-14)}


def elem_bound(q: QuantizedTensor, x: torch.Tensor, fmt: str, rule: str) -> torch.Tensor:
    m, emin = FMT[fmt]["m"], FMT[fmt]["emin"]
    u = 2.0 ** -3 if rule == "floor" else 2.0 ** -(m + 1)
    h = 2.0 ** (emin - m - 1)
    s = (2.0 ** (q.scale.to(torch.float64) - 127)).repeat_interleave(32, dim=q.axis).narrow(q.axis, 0, x.shape[q.axis])
    return u * x.abs().double() + h * s


def product_bound(a, ea, bt, eb, k, out_dtype, c_hat):
    """Bound on |Ĉ - C| for C = a @ bt (a: [M,K], bt: [K,N]), with elementwise bounds ea, eb."""
    a, bt = a.double().abs(), bt.double().abs()
    bound = ea @ bt + a @ eb + ea @ eb + 2 * k * 2.0 ** -24 * ((a + ea) @ (bt + eb))
    if out_dtype == torch.bfloat16:
        bound = bound + 2.0 ** -8 * c_hat.detach().double().abs()
    return bound


@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_outputs_and_gradients_within_the_format_bound_of_an_fp32_reference(recipe, dtype):
    """Y, dX, dW of the MXFP8 GEMMs vs plain fp32 autograd on the unquantized tensors (same upstream dY):
    every element within the bound derived above; the error is real (not fp32 noise)."""
    x, w, b, y, g, rec = run_linear(recipe, (2, 21, 64), dtype=dtype, bias=False, seed=10)
    fprop, dgrad, wgrad = rec
    xr = x.detach().float().reshape(-1, 64).requires_grad_()
    wr = w.detach().clone().requires_grad_()
    yr = xr @ wr.T
    dy = g.reshape(-1, 96).float()
    yr.backward(dy)
    f, gr, rule = recipe.fwd, recipe.grad, recipe.rule
    x2d, w32 = xr.detach(), wr.detach()
    checks = {
        "Y": (y.reshape(-1, 96), yr.detach(), product_bound(
            x2d, elem_bound(fprop.a, x2d, f, rule), w32.T, elem_bound(fprop.b, w32, f, rule).T, 64, dtype, y.reshape(-1, 96))),
        "dX": (x.grad.reshape(-1, 64), xr.grad, product_bound(
            dy, elem_bound(dgrad.a, dy, gr, rule), w32, elem_bound(dgrad.b, w32, f, rule), 96, dtype, x.grad.reshape(-1, 64))),
        "dW": (w.grad, wr.grad, product_bound(
            dy.T, elem_bound(wgrad.a, dy, gr, rule).T, x2d, elem_bound(wgrad.b, x2d, f, rule), 42, torch.float32, None)),
    }
    for name, (got, ref, bound) in checks.items():
        err = (got.double() - ref.double()).abs()
        assert (err <= bound).all(), f"{name}: max err/bound {(err / bound).max().item():.3f}"
        scale = {"Y": x2d.abs() @ w32.abs().T, "dX": dy.abs() @ w32.abs(), "dW": dy.abs().T @ x2d.abs()}[name]
        assert (err / scale.double()).max() > 1e-3, f"{name}: error is fp32 noise — was anything quantized?"


def test_hybrid_changes_only_the_gradient_operand():
    x4, w4, _, y4, _, rec4 = run_linear(E4M3_RCEIL, seed=20)
    x5, w5, _, y5, _, rec5 = run_linear(HYBRID, seed=20)
    assert torch.equal(y4, y5) and same_bytes(rec4[0].a, rec5[0].a) and same_bytes(rec4[0].b, rec5[0].b)
    assert same_bytes(rec4[1].b, rec5[1].b) and same_bytes(rec4[2].b, rec5[2].b)  # W col, X col: E4M3 both
    assert rec4[1].a.data.dtype == torch.float8_e4m3fn and rec5[1].a.data.dtype == torch.float8_e5m2
    # E5M2 has one mantissa bit less: the dgrad error vs the unquantized dY·W roughly doubles
    exact = rand(2, 21, 96, seed=23).reshape(-1, 96) @ w4.detach()  # run_linear's upstream gradient
    err4 = (x4.grad.reshape(-1, 64) - exact).abs().mean()
    err5 = (x5.grad.reshape(-1, 64) - exact).abs().mean()
    assert err5 > 1.3 * err4


def test_floor_and_rceil_give_different_bytes_when_a_block_max_has_a_large_mantissa():
    # amax = 1.9 * 2^k: RCEIL picks scale 2^(k-7) (1.9*2^k/448 rounded up), FLOOR 2^(k-8) -> saturates
    x = rand(32, 64, seed=30, spread=0) * 2.0**-12  # below every planted block maximum
    x[::2, 5] = 1.9 * 2.0 ** torch.arange(16).float().sub(8)
    w = nn.Parameter(rand(64, 64, seed=31) * 0.1)
    got = {}
    for name, recipe in (("rceil", E4M3_RCEIL), ("floor", FLOOR)):
        with capture_operands() as rec:
            got[name] = linear(x, w, None, recipe)
        assert same_bytes(rec[0].a, quantize(x, f"mxfp8-e4m3-{name}"))
        got[name + "-op"] = rec[0].a
    r, f = got["rceil-op"], got["floor-op"]
    assert torch.equal(r.scale[::2, 0].int() - f.scale[::2, 0].int(), torch.ones(16, dtype=torch.int32))
    assert (f.data[::2, 5].float() == 448).all()  # FLOOR saturates 1.9·2^k to 448·2^(k-8)
    assert not torch.equal(got["rceil"], got["floor"])


# --------------------------------------------------------------------------------------------------
# 3. errors, recipe validation, autocast, timers, empty inputs
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "k,n,message", [(40, 64, "K=40"), (64, 40, "N=40"), (64, 4, "N=4"), (16, 16, "K=16")]
)
def test_dims_not_a_multiple_of_32_are_rejected(k, n, message):
    with pytest.raises(ValueError, match=f"{message} .*not a multiple of 32"):
        linear(torch.randn(3, k), torch.randn(n, k), layer="x")
    with pytest.raises(ValueError, match=f"{message} .*not a multiple of 32"):
        MXFP8Linear(nn.Linear(k, n), Recipe(), "x")


def test_shape_mismatch_and_dtype_errors():
    with pytest.raises(ValueError, match="in_features K=64"):
        linear(torch.randn(3, 32), torch.randn(64, 64))
    with pytest.raises(TypeError, match="float32/bfloat16/float16 tensor, got torch.int64"):
        linear(torch.ones(3, 64, dtype=torch.long), torch.randn(64, 64))
    with pytest.raises(TypeError, match="mxfp8.Recipe"):
        linear(torch.randn(3, 64), torch.randn(64, 64), None, "mxfp8-e4m3-rceil")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(fwd="e5m2"), "Recipe.fwd='e5m2' is not supported.*valid: e4m3"),
        (dict(grad="e3m4"), "Recipe.grad='e3m4' is not valid; valid: e4m3, e5m2"),
        (dict(rule="ceil"), "Recipe.rule='ceil' is not valid; valid: rceil, floor"),
        (dict(cache_weights="yes"), "Recipe.cache_weights must be a bool, got 'yes'"),
    ],
)
def test_recipe_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Recipe(**kwargs)


def test_recipe_grids():
    assert (Recipe().fwd_grid, Recipe().grad_grid) == ("mxfp8-e4m3-rceil", "mxfp8-e4m3-rceil")
    assert (HYBRID.fwd_grid, HYBRID.grad_grid) == ("mxfp8-e4m3-rceil", "mxfp8-e5m2-rceil")
    assert Recipe.hybrid("floor", cache_weights=True) == Recipe("e4m3", "e5m2", "floor", True)


def test_inside_bf16_autocast_activations_are_bf16_weights_fp32_and_products_fp32():
    x = rand(40, 64, seed=40).requires_grad_()
    w = nn.Parameter(rand(96, 64, seed=41) * 0.05)
    with bf16_autocast(), capture_operands() as rec:
        y = linear(x, w)
        off_grid = F.linear(x, w)  # an off-grid layer computes in BF16
        y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and off_grid.dtype == torch.bfloat16
    fprop, dgrad, wgrad = rec
    assert same_bytes(fprop.a, quantize(x.detach().bfloat16(), "mxfp8-e4m3-rceil"))  # TE casts the input first
    assert same_bytes(fprop.b, quantize(w.detach(), "mxfp8-e4m3-rceil"))  # the fp32 master, not bf16(W)
    assert torch.equal(y, (fprop.a.dequantize() @ fprop.b.dequantize().T).bfloat16())  # fp32 product, one rounding
    assert w.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    assert torch.equal(w.grad, wgrad.a.dequantize().T @ wgrad.b.dequantize())
    with capture_operands() as rec2:  # the same call on bf16 activations outside autocast: same bytes
        y2 = linear(x.detach().bfloat16(), w)
    assert torch.equal(y, y2) and same_bytes(rec2[0].a, fprop.a)


def test_timers_see_quantize_and_gemm():
    timers = Timers()
    with timers.active():
        run_linear(E4M3_RCEIL)
    assert timers.totals()["quantize"] > 0 and timers.totals()["gemm"] > 0
    assert timers.counts["gemm"] == 3  # fprop, dgrad, wgrad


def test_no_tokens_gives_an_empty_output_and_zero_grads():
    w = nn.Parameter(torch.randn(64, 32))
    x = torch.zeros(0, 32, requires_grad=True)
    y = linear(x, w)
    y.sum().backward()
    assert y.shape == (0, 64) and torch.equal(w.grad, torch.zeros(64, 32))


# --------------------------------------------------------------------------------------------------
# 4. the forward-weight cache
# --------------------------------------------------------------------------------------------------
def micro_batches(module, opt, steps=2, micro=3, mutate=None):
    """steps × micro-batches of forward/backward, then ``mutate()`` (default: ``opt.step()``);
    returns outputs, captured operands per step, accumulated grads and the weights each step saw."""
    outs, records, grads, weights = [], [], [], []
    for s in range(steps):
        opt.zero_grad()
        weights.append(module.weight.detach().clone())
        step_records = []
        for mb in range(micro):
            x = rand(2, 20, 64, seed=100 + 10 * s + mb).requires_grad_()
            with capture_operands() as rec:
                y = module(x)
                y.pow(2).mean().backward()
            outs.append(y.detach())
            step_records.append(rec)
        grads.append(module.weight.grad.clone())
        records.append(step_records)
        (mutate or (lambda: opt.step()))()
    return outs, records, grads, weights


def test_weight_cache_lasts_the_micro_batches_of_one_step_and_matches_no_cache():
    clear_weight_cache()
    lin = nn.Linear(64, 96)
    mods = {c: MXFP8Linear(copy.deepcopy(lin), Recipe(cache_weights=c), "L") for c in (True, False)}
    runs = {c: micro_batches(m, torch.optim.AdamW(m.parameters(), lr=1e-2)) for c, m in mods.items()}
    outs, records, grads, _ = runs[True]
    for step_records in records:  # within a step: the very same quantized objects every micro-batch
        fw = [r[0].b for r in step_records]
        dg = [r[1].b for r in step_records]
        assert all(q is fw[0] for q in fw) and all(q is dg[0] for q in dg)
    a, b = records[0][0][0].b, records[1][0][0].b  # across the optimizer step: new weights, new bytes
    assert a is not b and not torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
    assert weight_cache_info()["misses"] == 2 and weight_cache_info()["hits"] == 4
    # identical results with and without the cache (outputs, accumulated fp32 grads, final weights)
    assert all(torch.equal(p, q) for p, q in zip(runs[True][0], runs[False][0]))
    assert all(torch.equal(p, q) for p, q in zip(runs[True][2], runs[False][2]))
    assert torch.equal(mods[True].weight, mods[False].weight)
    # the three micro-batches' wgrads accumulated in fp32 into the master weight's .grad
    assert grads[0].dtype == torch.float32
    assert torch.equal(grads[0], sum(r[2].a.dequantize().T @ r[2].b.dequantize() for r in records[0]))


@pytest.mark.parametrize("how", ["optimizer-step", "load_state_dict", "no_grad-copy_", "replace-data"])
def test_weight_cache_is_invalidated_by_every_weight_write(how):
    clear_weight_cache()
    m = MXFP8Linear(nn.Linear(64, 64, bias=False), Recipe(cache_weights=True), "L")
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    new = torch.randn(64, 64)

    def write():
        if how == "optimizer-step":
            opt.step()
        elif how == "load_state_dict":
            m.load_state_dict({"weight": new})
        elif how == "no_grad-copy_":
            with torch.no_grad():
                m.weight.copy_(new)
        else:
            m.weight.data = new.clone()

    _, records, _, weights = micro_batches(m, opt, steps=2, micro=2, mutate=write)
    assert not torch.equal(weights[0], weights[1])
    assert records[1][0][0].b is not records[0][0][0].b
    for s in range(2):
        for rec in records[s]:  # every micro-batch's fprop and dgrad weight: the weight of its step
            assert same_bytes(rec[0].b, quantize(weights[s], "mxfp8-e4m3-rceil"))
            assert same_bytes(rec[1].b, quantize(weights[s], "mxfp8-e4m3-rceil", axis=0))
    assert weight_cache_info() == {"hits": 2, "misses": 2, "entries": 1}


# --------------------------------------------------------------------------------------------------
# 5. swap: names, objects, errors
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [lambda: dense(2), lambda: dense(2, tie_word_embeddings=True), lambda: moe(2)],
                         ids=["dense", "dense-tied", "moe"])
def test_swap_keeps_parameter_names_and_objects(build):
    model = build()
    keys = list(model.state_dict().keys())
    params = dict(model.named_parameters())
    layers = gemm_layers(model)
    names = resolve_layers(model, "all") + ["lm_head"]
    assert apply_recipe(model, names, Recipe()) == names
    assert list(model.state_dict().keys()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    assert gemm_layers(model) == layers and on_grid_layers(model) == names
    assert isinstance(model.lm_head, MXFP8Linear)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_swapped_model_saves_the_same_tensors(tmp_path):
    ref, model = moe(2), moe(2)
    apply_recipe(model, resolve_layers(model, "all"), Recipe())
    ref.save_pretrained(tmp_path / "ref")
    model.save_pretrained(tmp_path / "swapped")
    with safe_open(tmp_path / "ref/model.safetensors", "pt") as a, safe_open(tmp_path / "swapped/model.safetensors", "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())


def test_per_projection_selection_and_explicit_router():
    model = moe(2, num_experts=32)  # 32 experts: the router's N is a multiple of 32
    names = ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.gate"]
    assert apply_recipe(model, names, Recipe()) == names
    ex = model.model.layers[0].mlp.experts
    assert isinstance(ex, MXFP8Experts) and ex.on_grid == {"gate_up_proj"}
    assert isinstance(model.model.layers[1].mlp.gate, MXFP8Router)
    assert type(model.model.layers[1].mlp.experts) is Qwen3MoeExperts  # untouched
    assert on_grid_layers(model) == names


@pytest.mark.parametrize(
    "names,error,message",
    [
        (["model.layers.0.mlp.gate_proj"], ValueError, r"not GEMM layers of this model: \['model.layers.0.mlp.gate_proj'\]"),
        (["model.embed_tokens"], ValueError, "not GEMM layers"),
        (["model.layers.0.mlp.gate"], ValueError, r"model.layers.0.mlp.gate.*N=4 .*not a multiple of 32"),
        ("all", TypeError, "resolve presets and patterns first"),
    ],
)
def test_apply_recipe_errors(names, error, message):
    with pytest.raises(error, match=message):
        apply_recipe(moe(2), names, Recipe())


def test_apply_recipe_twice_is_an_error():
    model = dense(2)
    apply_recipe(model, ["lm_head"], Recipe())
    with pytest.raises(ValueError, match="'lm_head' is already on the grid"):
        apply_recipe(model, ["lm_head"], Recipe())


# --------------------------------------------------------------------------------------------------
# 6. experts: HF's math exactly when every operand is on the grid
# --------------------------------------------------------------------------------------------------
def exact_experts(seed: int):
    """Qwen3MoeExperts (ReLU) whose every GEMM operand is on the MXFP8 grid, forward and backward.

    gate_up_proj[e] [64, 64] and down_proj[e] [64, 32] are signed partial permutations (one ±1 per
    row and per column), x has integer entries in [-2, 2], routing weights are 1 or 1/2 and the
    upstream gradient is in {-1, 0, 1}. Then gate/up = ±x entries, h = relu(gate)·up ∈ [-4, 4],
    dh and d(gate_up) are multiples of 1/2 with |·| <= 2: every operand value needs at most 3
    significant bits (E5M2 and E4M3 both hold it), no block maximum has a mantissa >= 1.75 (FLOOR
    does not saturate), and no element is subnormal — so MXFP8 quantization is the identity and
    every product is exact in fp32, whatever the summation order.
    """
    g = torch.Generator().manual_seed(seed)
    cfg = Qwen3MoeConfig(**{**COMMON, **MOE}, num_hidden_layers=1, hidden_act="relu")
    hf = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        for e in range(4):
            perm = torch.randperm(64, generator=g)
            sign = torch.randint(0, 2, (64,), generator=g).float() * 2 - 1
            hf.gate_up_proj[e] = torch.zeros(64, 64).index_put((torch.arange(64), perm), sign)
            rows = torch.randperm(64, generator=g)[:32]
            sign = torch.randint(0, 2, (32,), generator=g).float() * 2 - 1
            hf.down_proj[e] = torch.zeros(64, 32).index_put((rows, torch.arange(32)), sign)
    t = 40
    x = torch.randint(-2, 3, (t, 64), generator=g).float()
    idx = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(t)])
    w = 2.0 ** -torch.randint(0, 2, (t, 2), generator=g).float()
    up = torch.randint(-1, 2, (t, 64), generator=g).float()
    return cfg, hf, x, idx, w, up


def fwd_bwd(module, x, idx, w, up):
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    out = module(x, idx, w)
    out.backward(up)
    return out.detach(), x.grad, w.grad, module.gate_up_proj.grad, module.down_proj.grad


@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
def test_experts_on_grid_equal_hf_experts_when_operands_are_on_the_grid(recipe, impl):
    cfg, hf, x, idx, w, up = exact_experts(seed=7)
    cfg._experts_implementation = impl
    ours = MXFP8Experts(copy.deepcopy(hf), recipe, {"gate_up_proj", "down_proj"}, "experts")
    x_on_grid = quantize(x, recipe.fwd_grid).dequantize()
    assert torch.equal(x_on_grid, x)
    with capture_operands() as rec:
        got = fwd_bwd(ours, x, idx, w, up)
    want = fwd_bwd(hf, x, idx, w, up)
    for name, a, b in zip(["out", "dx", "dweights", "dgate_up", "ddown"], got, want):
        assert torch.equal(a, b), name
    hit = idx.unique().numel()
    assert sorted(r.gemm for r in rec) == sorted(["fprop", "dgrad", "wgrad"] * 2 * hit)  # quantization did run
    assert {(r.layer, r.expert) for r in rec} == {(f"experts.{p}", e) for p in ("gate_up_proj", "down_proj") for e in range(hit)}
    assert got[0].abs().max() > 0 and got[3].abs().max() > 0


def test_only_the_selected_expert_projection_is_quantized():
    """gate_up_proj on the grid, down_proj not: equals HF experts run on x and gate_up_proj pre-rounded
    to the grid (rowwise along H) with down_proj untouched, to fp32 summation-order tolerance."""
    cfg = Qwen3MoeConfig(**{**COMMON, **MOE}, num_hidden_layers=1)
    torch.manual_seed(3)
    hf = Qwen3MoeExperts(cfg)
    nn.init.normal_(hf.gate_up_proj, std=0.1)
    nn.init.normal_(hf.down_proj, std=0.1)
    x = rand(48, 64, seed=50, spread=2)
    idx = torch.stack([torch.randperm(4)[:2] for _ in range(48)])
    w = torch.rand(48, 2)
    ours = MXFP8Experts(copy.deepcopy(hf), Recipe(), {"gate_up_proj"}, "experts")
    with capture_operands() as rec:
        got = ours(x, idx, w)
    assert {r.layer for r in rec} == {"experts.gate_up_proj"}
    rounded = copy.deepcopy(hf)
    with torch.no_grad():
        rounded.gate_up_proj.copy_(quantize(hf.gate_up_proj.detach(), "mxfp8-e4m3-rceil").dequantize())
    want = rounded(quantize(x, "mxfp8-e4m3-rceil").dequantize(), idx, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    both = MXFP8Experts(copy.deepcopy(hf), Recipe(), {"gate_up_proj", "down_proj"}, "experts")(x, idx, w)
    assert (both - want).abs().max() > 1e-4  # quantizing down_proj too would have shown


def test_explicit_router_on_the_grid_routes_like_hf_on_grid_operands():
    cfg = Qwen3MoeConfig(**{**COMMON, **MOE, "num_experts": 32}, num_hidden_layers=1)
    torch.manual_seed(4)
    hf = Qwen3MoeTopKRouter(cfg)
    nn.init.normal_(hf.weight, std=0.1)
    x = rand(2, 24, 64, seed=60, spread=1)
    ours = MXFP8Router(copy.deepcopy(hf), Recipe(), "router")
    logits, scores, indices = ours(x)
    rounded = copy.deepcopy(hf)
    with torch.no_grad():
        rounded.weight.copy_(quantize(hf.weight.detach(), "mxfp8-e4m3-rceil").dequantize())
    ref = rounded(quantize(x.reshape(-1, 64), "mxfp8-e4m3-rceil").dequantize())
    torch.testing.assert_close(logits, ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scores, ref[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(indices, ref[2])


# --------------------------------------------------------------------------------------------------
# 7. whole models: forward weights and gradients
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", [False, True], ids=["no-cache", "cache"])
def test_forward_weights_are_the_bytes_the_fprop_gemms_consumed(cache):
    clear_weight_cache()
    model = moe(2)
    names = apply_recipe(model, resolve_layers(model, "all") + ["lm_head"], Recipe(cache_weights=cache))
    ids = torch.randint(0, 1024, (2, 24), generator=torch.Generator().manual_seed(0))
    with capture_operands() as rec:
        model(input_ids=ids)
    fw = forward_weights(model)
    params = dict(model.named_parameters())
    assert list(fw) == names
    seen = set()
    for r in (r for r in rec if r.gemm == "fprop"):
        q = fw[r.layer]
        if r.expert is None:
            assert same_bytes(r.b, q) and (q is r.b) == cache
        else:
            part = QuantizedTensor(q.data[r.expert], q.scale[r.expert], q.grid, axis=q.axis - 1)
            assert same_bytes(r.b, part)
        seen.add(r.layer)
        assert q.data.shape == params[r.layer if r.expert is not None else r.layer + ".weight"].shape
    assert seen == set(names)
    for name, q in fw.items():
        assert q.data.dtype == torch.float8_e4m3fn and q.axis == q.data.dim() - 1  # rowwise, along K


@pytest.mark.parametrize("build", [lambda: dense(2), lambda: moe(2)], ids=["dense", "moe"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_model_with_all_layers_on_grid_trains(build, autocast):
    ref, model = build(), build()
    apply_recipe(model, resolve_layers(model, "all"), Recipe())
    ids = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(1))
    losses = {}
    for name, m in (("ref", ref), ("mxfp8", model)):
        with bf16_autocast() if autocast else torch.autocast("cpu", enabled=False):
            losses[name] = m(input_ids=ids, labels=ids).loss
        losses[name].backward()
    rel = abs(losses["mxfp8"].item() - losses["ref"].item()) / losses["ref"].item()
    assert 0 < rel < 1e-3  # quantized (not identical), and close at init (measured: ~1e-4)
    ref_grads = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), n
        cos = F.cosine_similarity(p.grad.flatten(), ref_grads[n].grad.flatten(), dim=0)
        assert cos > 0.95, (n, cos.item())  # measured >= 0.984
