"""The ``fp8rl`` vLLM quantization method: a sampler that computes on the learner's grid, per layer.

Rule: registered in every vLLM process through the ``vllm.general_plugins`` entry point and selected by
``quant_method = "fp8rl"``; each layer prefix gets a scheme — ``bf16`` (vLLM's own method), ``mxfp8``
(holds the learner's synced bytes and scales, never requantized; fp32 products of dequantized operands
like the learner's fprop), ``requant`` (receives the BF16 view and quantizes it itself in the load path,
post-load processing, with vLLM's online MXFP8 rule: :data:`~fp8rl_core.grids.schemes.REQUANT_GRID`,
byte-equal to vLLM's ``_mxfp8_e4m3_quantize_torch``) or ``block128`` (requantizes the BF16 view to 128×128
block FP8, as verl's FP8 rollout) — the schemes of :data:`fp8rl_core.grids.schemes.SCHEMES`, whose fields say
what a layer receives (``sent``), which rule it quantizes with itself (``rule``) and its blocks (``block``);
post-load processing runs once per sync and is counted (W6). Specified in docs/library.md (The fp8rl
quantization method).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from fp8rl_core.sampler.vllm import quiet
from fp8rl_core.grids.schemes import BF16, BLOCK_GRID, MX_GRID, SCHEMES, scheme
from fp8rl_core.sampler.vllm.compat import eager_on_cpu, patch_engine_core
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.parameter import GroupQuantScaleParameter, ModelWeightParameter
from vllm.model_executor.utils import set_weight_attrs

__all__ = ["QUANT_METHOD", "register", "native_mxfp8_available"]

QUANT_METHOD = "fp8rl"
MX_BLOCK = 32
_REGISTERED = False


def native_mxfp8_available() -> bool:
    """True on a CUDA device with MXFP8 tensor cores (compute capability ≥ 10.0, Blackwell)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 10


# ----------------------------------------------------------------------------------------------------
# Arithmetic shared by linear and MoE layers (the scheme's own: fp8rl_core/grids/schemes.py)
# ----------------------------------------------------------------------------------------------------
class _Scheme:
    """What a scheme (:data:`~fp8rl_core.grids.schemes.SCHEMES`) does to a [.., N, K] weight after loading and to
    activations in the forward, on its grid (:meth:`~fp8rl_core.grids.schemes.Scheme.grid`: its own rule, else the
    run's ``mx_grid`` for the learner's MX bytes, ``block_grid`` for 128×128 blocks). Every reading and quantizing
    of its bytes is the scheme's own (``grids/schemes.py``): this class switches on no block family."""

    def __init__(self, name: str, mx_grid: str, block_grid: str) -> None:
        self.name, self.mx_grid, self.block_grid = name, mx_grid, block_grid
        self.spec = scheme(name)
        self.grid = self.spec.grid(mx_grid, block_grid) or block_grid

    @property
    def receives_bytes(self) -> bool:
        """The layer is loaded with the learner's FP8 bytes and scales (else with the BF16 view)."""
        return self.spec.on_learner_grid

    def process(self, weight: torch.Tensor, scale: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if self.receives_bytes:
            return {"fp8rl_w": self.spec.dequantize_held(weight, scale, self.grid)}
        # requant, block128: quantize the received BF16 view with the scheme's rule itself (block128: what verl's
        # FP8 rollout does); the held bytes are fp8rl_data and fp8rl_scale whatever the blocks
        qt = self.spec.quantize_view(weight, self.grid)
        return {"fp8rl_data": qt.data, "fp8rl_scale": qt.scale, "fp8rl_w": qt.dequantize(torch.float32)}

    def gemm(self, x: torch.Tensor, w_deq: torch.Tensor) -> torch.Tensor:
        """fp32 product of the activations on the scheme's grid (MX: 1×32 along K; block: 1×128 per-token groups)
        and a dequantized weight."""
        return self.spec.quantize_activation(x, self.grid) @ w_deq.t()


def _count(layer: torch.nn.Module) -> None:
    layer.fp8rl_processed = getattr(layer, "fp8rl_processed", 0) + 1

class CountingLinearMethod(UnquantizedLinearMethod):
    """vLLM's unquantized linear method; counts post-load processing."""

    fp8rl_scheme = BF16.name

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        _count(layer)
        super().process_weights_after_loading(layer)

class CountingMoEMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized fused-MoE method; counts post-load processing."""

    fp8rl_scheme = BF16.name
    #: Redo the experts kernel's own post-load step (CPU: pad + prepack) on a weight update. vLLM
    #: 0.32's unquantized method runs it only on the first load; on an in-place reload the fresh,
    #: unpacked weights are copied over the packed ones and the CPU kernel reads them as packed —
    #: measured here: re-syncing *identical* weights moved prompt log-probs by 0.11 (W6).
    repack_on_update = True

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        _count(layer)
        update = self.moe_kernel is not None
        super().process_weights_after_loading(layer)
        if update and self.repack_on_update and self.moe_kernel is not None:
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)


class Fp8rlLinearMethod(LinearMethodBase):
    def __init__(self, scheme: _Scheme) -> None:
        self.scheme = scheme
        self.fp8rl_scheme = scheme.name

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, **extra_weight_attrs):
        weight_loader = extra_weight_attrs.pop("weight_loader")
        n, k = sum(output_partition_sizes), input_size_per_partition
        if k % self.scheme.spec.k_multiple:
            raise ValueError(f"fp8rl {self.scheme.name} layer: K = {k} is not a multiple of {self.scheme.spec.k_multiple}")
        if self.scheme.receives_bytes:
            weight = ModelWeightParameter(data=torch.empty(n, k, dtype=torch.uint8), input_dim=1,
                                          output_dim=0, weight_loader=weight_loader)
            scale = GroupQuantScaleParameter(data=torch.empty(n, k // MX_BLOCK, dtype=torch.uint8),
                                             input_dim=1, output_dim=0, weight_loader=weight_loader)
            layer.register_parameter("weight", weight)
            layer.register_parameter("weight_scale", scale)
        else:  # requant and block128 receive the BF16 view in the engine dtype
            weight = ModelWeightParameter(data=torch.empty(n, k, dtype=params_dtype), input_dim=1,
                                          output_dim=0, weight_loader=weight_loader)
            layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)
        layer.fp8rl_scheme = self.scheme.name

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        _count(layer)
        scale = getattr(layer, "weight_scale", None)
        for key, value in self.scheme.process(layer.weight.data, None if scale is None else scale.data).items():
            setattr(layer, key, value)

    def apply(self, layer, x, bias=None):
        shape = x.shape
        y = self.scheme.gemm(x.reshape(-1, shape[-1]), layer.fp8rl_w)
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], y.shape[-1])

class NativeMxfp8LinearMethod(Fp8rlLinearMethod):
    """The ``mxfp8`` scheme on a GPU with MXFP8 tensor cores: the same synced bytes, vLLM's own kernel.

    Parameters are created and loaded exactly as on CPU (uint8 ``weight`` [N, K] and ``weight_scale``
    [N, K/32], so a sync is byte-for-byte the same); post-load processing reinterprets ``weight`` as
    ``float8_e4m3fn`` (a view, no conversion) and hands the layer to the kernel vLLM selects for MXFP8
    (``init_mxfp8_linear_kernel``: cuBLAS/CUTLASS block-scaled GEMM on Blackwell — it may swizzle the
    scales into the 128×4 tile layout, :mod:`fp8rl_core.grids.swizzle`), whose forward quantizes
    activations to MXFP8 itself. Selected when :func:`native_mxfp8_available` and
    ``FP8RL_NATIVE_MXFP8`` is not ``0``. Not exercised on CPU; run where a Blackwell GPU is lent.
    """

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, **extra_weight_attrs):
        from vllm.model_executor.kernels.linear import init_mxfp8_linear_kernel

        super().create_weights(layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                               params_dtype, **extra_weight_attrs)
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = sum(output_partition_sizes)
        layer.params_dtype = params_dtype
        self.kernel = init_mxfp8_linear_kernel(weight_shape=tuple(layer.weight.shape))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        _count(layer)
        layer.weight.data = layer.weight.data.view(torch.float8_e4m3fn)
        self.kernel.process_weights_after_loading(layer)

    def apply(self, layer, x, bias=None):
        return self.kernel.apply_weights(layer, x, bias)


def _use_native() -> bool:
    return native_mxfp8_available() and os.environ.get("FP8RL_NATIVE_MXFP8", "1") != "0"


class Fp8rlMoEMethod(FusedMoEMethodBase):
    """Experts on a grid: per-expert MXFP8 (synced bytes, or requantized from BF16 by ``requant``) or
    128×128 block FP8 (requantized)."""

    def __init__(self, moe, scheme: _Scheme) -> None:
        super().__init__(moe)
        self.scheme = scheme
        self.fp8rl_scheme = scheme.name

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                       params_dtype, **extra_weight_attrs):
        e, h, i = num_experts, hidden_size, intermediate_size_per_partition
        mx = self.scheme.receives_bytes
        dtype = torch.uint8 if mx else params_dtype
        shapes = {"w13_weight": (e, 2 * i, h), "w2_weight": (e, h, i)}
        for name, shp in shapes.items():
            if shp[-1] % self.scheme.spec.k_multiple:
                raise ValueError(f"fp8rl {self.scheme.name} experts: K = {shp[-1]} is not a multiple of "
                                 f"{self.scheme.spec.k_multiple}")
            p = torch.nn.Parameter(torch.empty(*shp, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, p)
            set_weight_attrs(p, extra_weight_attrs)
            if mx:
                s = torch.nn.Parameter(torch.empty(*shp[:-1], shp[-1] // MX_BLOCK, dtype=torch.uint8),
                                       requires_grad=False)
                layer.register_parameter(f"{name}_scale", s)
                set_weight_attrs(s, {**extra_weight_attrs, "quant_method": FusedMoeWeightScaleSupported.GROUP.value})
        layer.fp8rl_scheme = self.scheme.name

    def get_fused_moe_quant_config(self, layer):
        return FusedMoEQuantConfig.make()

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        _count(layer)
        for w in ("w13", "w2"):
            scale = getattr(layer, f"{w}_weight_scale", None)
            out = self.scheme.process(getattr(layer, f"{w}_weight").data, None if scale is None else scale.data)
            for key, value in out.items():
                setattr(layer, f"{key}_{w}", value)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        w13, w2 = layer.fp8rl_w_w13, layer.fp8rl_w_w2
        for e in torch.unique(topk_ids).tolist():
            tok, pos = torch.where(topk_ids == e)
            gu = self.scheme.gemm(x[tok], w13[e]).to(x.dtype)
            gate, up = gu.chunk(2, dim=-1)
            act = F.silu(gate) * up
            y = self.scheme.gemm(act, w2[e]).to(x.dtype)
            out.index_add_(0, tok, y.float() * topk_weights[tok, pos, None].float())
        return out.to(x.dtype)

class Fp8rlConfig(QuantizationConfig):
    """Per-layer sampler grids for fp8rl (the schemes: docs/library.md, The fp8rl quantization method)."""

    def __init__(self, layers: dict[str, str], mx_grid: str = MX_GRID,
                 block_grid: str = BLOCK_GRID) -> None:
        super().__init__()
        bad = {p: s for p, s in layers.items() if s not in SCHEMES}
        if bad:
            raise ValueError(f"fp8rl quantization_config.layers: unknown scheme(s) {bad}; valid: {tuple(SCHEMES)}")
        self.layers = dict(layers)
        self.mx_grid = mx_grid
        self.block_grid = block_grid
        self.seen: set[str] = set()

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8rlConfig":
        return cls(config.get("layers", {}), config.get("mx_grid", MX_GRID),
                   config.get("block_grid", BLOCK_GRID))

    def _scheme(self, prefix: str) -> _Scheme:
        self.seen.add(prefix)
        return _Scheme(self.layers.get(prefix, BF16.name), self.mx_grid, self.block_grid)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            scheme = self._scheme(prefix)
            if not scheme.spec.quantized:
                return CountingLinearMethod()
            if scheme.receives_bytes and _use_native():
                return NativeMxfp8LinearMethod(scheme)
            return Fp8rlLinearMethod(scheme)
        if isinstance(layer, RoutedExperts):
            scheme = self._scheme(prefix.removesuffix(".routed_experts"))
            if not scheme.spec.quantized:
                return CountingMoEMethod(layer.moe_config)
            return Fp8rlMoEMethod(layer.moe_config, scheme)
        return None


def register() -> None:
    """vLLM general-plugin entry point: register the ``fp8rl`` quantization method (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    quiet.install()  # this vLLM process's known-harmless lines (fp8rl_core.sampler.vllm.quiet)
    register_quantization_config(QUANT_METHOD)(Fp8rlConfig)
    patch_engine_core()  # the checks' engine-core utilities (a vLLM 0.32 workaround)
    eager_on_cpu()  # no inductor compile of two integer functions in each CPU engine process (a workaround)
    _REGISTERED = True
