"""A ``backend: verl`` run config → the Hydra overrides of verl's ``ppo_trainer`` (no verl import here).

verl is configured by composing its ``ppo_trainer`` Hydra config with ``key=value`` overrides (``+key``
appends a key verl's YAML does not declare, e.g. inside ``override_transformer_config`` or
``engine_kwargs``). :func:`verl_overrides` writes that list for one fp8rl run; every :class:`Override`
remembers the fp8rl field it comes from, so an error verl raises about a key can be shown as the fp8rl
field the user has to change (:mod:`fp8rl_core.verl.compose`).

What fp8rl sets for each field, and why: the table in docs/gpu.md ("The generated verl config").

Every override fp8rl sets carries ``why`` — the reason fp8rl owns the key (set from one of its fields, or one of
the rollout's quantization method, worker extension, ``external_lib``, checkpoint engine and rollout mode,
the MLflow logger and run, the payload and cluster variables) — or None for a default a ``verl.overrides`` entry
replaces (:func:`user_overrides`).

MXFP8 needs every packed sequence padded to a multiple of 32 tokens (:data:`MXFP8_SEQ_ALIGN`); verl
0.9.1 pads FP8 runs to 16 (``verl.models.mcore.util._compute_fp8_thd_align_size``) and has no key for it,
so that is fixed in fp8rl's extension module, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fp8rl_core.config.runs import Run
    from fp8rl_core.config.schema import RunConfig
    from fp8rl_core.verl.payload import VerlPayload

__all__ = ["CHECKPOINTS_DIR", "EXTENSION", "FIELD", "MAIN_PPO", "MXFP8_SEQ_ALIGN", "OWN_RAY", "Override", "REWARD_FUNCTION",
           "SGLANG_CPU_SERVER", "TE_RECIPES", "WORKER_EXTENSION", "hydra_value", "main_ppo_argv", "sglang_cpu", "user_overrides",
           "verl_overrides", "vllm_cpu"]

#: the module verl imports in every process (``actor_rollout_ref.model.external_lib``)
EXTENSION = "fp8rl_core.verl.extension"
#: vLLM worker extension class for the verl rollout (a ``vLLMColocateWorkerExtension`` subclass)
WORKER_EXTENSION = "fp8rl_core.verl.extension.Fp8rlVerlWorkerExtension"
#: verl's custom reward function: (``reward.custom_reward_function.path``, ``.name``)
REWARD_FUNCTION = ("pkg://fp8rl_core.verl.reward", "compute_score")
#: verl's trainer entry point
MAIN_PPO = "verl.trainer.main_ppo"
#: Transformer Engine FP8 recipe per GPU generation
TE_RECIPES = {"blackwell": "mxfp8", "hopper": "blockwise"}
#: SGLang's server arguments on CPU (as fp8rl's SGLang engine starts it; verl passes ``engine_kwargs.sglang`` last,
#: so they replace verl's own: flashinfer attention, ``enable_memory_saver=True``)
SGLANG_CPU_SERVER = {"device": "cpu", "attention_backend": "torch_native", "sampling_backend": "pytorch",
                     "grammar_backend": "none", "disable_overlap_schedule": True, "enable_memory_saver": False}
#: logical CPUs of the local Ray a ``hardware: cpu`` run starts (what verl's actors hold, not cores)
RAY_CPUS = 8
#: ``ray_kwargs.ray_init.address`` of a run without a cluster address: Ray starts a new local cluster for verl's
#: trainer, whatever ``RAY_ADDRESS`` or the latest ``ray start`` on the host say (Ray's ``ray.init(address="local")``)
OWN_RAY = "local"
#: tokens a packed sequence is padded to under MXFP8 (TE quantizes 1×32 blocks along the sequence too)
MXFP8_SEQ_ALIGN = 32
#: where a run's verl checkpoints go in its folder (``verl.save_checkpoints``: ``global_step_N/actor/…``)
CHECKPOINTS_DIR = "checkpoints"

_AR = "actor_rollout_ref"
_ACTOR, _ROLLOUT, _MODEL = f"{_AR}.actor", f"{_AR}.rollout", f"{_AR}.model"
_MEGATRON = f"{_ACTOR}.megatron"
_UNQUOTED = re.compile(r"^[A-Za-z_/~][A-Za-z0-9_./~-]*$")
_RESERVED = {"true", "false", "null", "none", "nan", "inf"}


#: ``why`` of an override set from an fp8rl config field: the key is that field's (:func:`user_overrides` refuses it)
FIELD = "field"
#: the fp8rl config's top-level fields (:class:`~fp8rl_core.config.schema.RunConfig`): a source under one of them
#: names the field a user sets instead of verl's key
_FIELDS = ("model", "model_path", "preset", "seed", "warmstart", "learner", "sampler", "loop", "checks", "metrics", "data",
           "verl")


@dataclass(frozen=True)
class Override:
    """One Hydra override of verl's config and the fp8rl field that produced it."""

    key: str      #: verl's dotted key
    value: Any    #: a Python value (bool, int, float, str, None, list, dict)
    source: str   #: the fp8rl run-config field (dotted) this override comes from
    append: bool = False  #: ``+key=value``: a key verl's YAML does not declare (inside an open dict)
    #: why fp8rl owns the key — a ``verl.overrides`` entry of it (or of a key above or below it) is refused
    #: with this reason; None: fp8rl's default, which a ``verl.overrides`` entry replaces
    why: str | None = None
    text: str | None = None  #: a ``verl.overrides`` entry as the user wrote it (passed to Hydra verbatim)

    def hydra(self) -> str:
        if self.text is not None:
            return self.text
        return f"{'+' if self.append else ''}{self.key}={hydra_value(self.value)}"


_WHY_METHOD = ("the rollout loads the learner's bytes through the quantization method the preset chooses "
               "(set preset)")
_WHY_EXTENSION = "fp8rl's worker extension receives the learner's bytes and runs the checks W1–W7 at every sync"
_WHY_LIB = "fp8rl's extension module registers its rollout adapter, learner engine and checks in every verl process"
_WHY_SYNC = "verl's naive checkpoint engine calls the rollout adapter that carries fp8rl's bytes at every sync"
_WHY_MODE = "fp8rl's rollout adapter is registered as verl's async vLLM rollout"
_WHY_MLFLOW = "verl's MLflow logger writes into fp8rl's MLflow run (experiment = the sweep, name = the run id)"
_WHY_PAYLOAD = "it names the payload fp8rl's pieces in verl's processes read"
_WHY_CLUSTER = ("verl joins the Ray cluster fp8rl checked (fp8rl run --ray-address), or starts a Ray of its own "
                "(local) without one")
_WHY_GRPO = "fp8rl's runs are GRPO: learner.group_size completions per prompt, no critic"
_WHY_LOGPROBS = "fp8rl's mismatch metrics read the rollout's log-probs"
_WHY_ORDER = "the addition task's rows are in the native loop's step order: verl's batch s is the native run's step s"


def _o(key: str, value: Any, source: str, append: bool = False, why: str | None = FIELD) -> Override:
    """An override fp8rl sets; ``why=FIELD``: owned as the value of ``source``, an fp8rl config field."""
    if why == FIELD:
        if source.split(".")[0] not in _FIELDS:
            raise ValueError(f"override {key}: source {source!r} is no fp8rl config field; give the reason fp8rl owns it")
        why = f"fp8rl sets it from its field {source}; set {source} in the fp8rl config"
    return Override(key, value, source, append, why)


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar (strings quoted unless plainly a name or path)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _UNQUOTED.match(value) and value.lower() not in _RESERVED:
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_dict_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Hydra form for {type(value).__name__} {value!r}")


def _dict_key(key: Any) -> str:
    key = str(key)
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]*$", key):
        raise ValueError(f"dict key {key!r} cannot be written in a Hydra override")
    return key


def sglang_cpu(run: "RunConfig", env: str) -> list[Override]:
    """``verl.rollout: sglang`` on ``verl.hardware: cpu`` (its engine row's ``verl_cpu_overrides``): the CPU server
    arguments of fp8rl's SGLang engine, through verl's engine_kwargs (verl's SGLang path stops on CPU before a step:
    fp8rl_core.verl.preflight.SGLANG_CPU_STOP)."""
    kw, sm = f"{_ROLLOUT}.engine_kwargs.sglang", run.sampler
    o = [_o(f"{kw}.{k}", val, "verl.hardware", append=True) for k, val in SGLANG_CPU_SERVER.items()]
    return o + [_o(f"{kw}.max_total_tokens", sm.max_model_len * sm.max_num_seqs, "sampler.max_num_seqs", append=True),
                _o(f"{env}.SGLANG_USE_CPU_ENGINE", "1", "verl.hardware", append=True)]


def vllm_cpu(run: "RunConfig", env: str) -> list[Override]:
    """``verl.rollout: vllm`` on ``verl.hardware: cpu`` (its engine row's ``verl_cpu_overrides``): vLLM-CPU binds each
    tensor-parallel worker's threads to a NUMA node of its own by default and refuses
    tp > 1 on a one-node host: the OS schedules them instead; its KV cache space from ``sampler.kv_cache_gib``."""
    return [_o(f"{env}.VLLM_CPU_OMP_THREADS_BIND", "nobind", "verl.rollout_tensor_parallel", append=True),
            _o(f"{env}.VLLM_CPU_KVCACHE_SPACE", str(max(1, round(run.sampler.kv_cache_gib or 1))),
               "sampler.kv_cache_gib", append=True)]


def _cpu_overrides(run: "RunConfig", ray_address: str | None) -> list[Override]:
    """``verl.hardware: cpu``: verl's FSDP engine (fsdp2) on fp32 master weights with fp8rl's MXFP8 layers for
    the preset's learner (:mod:`fp8rl_core.verl.engine`), vLLM-CPU as the rollout, a Ray node whose "GPU"
    slots are CPU workers (:mod:`fp8rl_core.verl.platform`); docs/gpu.md, verl on CPU."""
    from fp8rl_core.sampler.capabilities import capabilities, resolve
    from fp8rl_core.sampler.presets import PRESETS
    from fp8rl_core.verl.platform import PLATFORM

    v, preset = run.verl, PRESETS[run.preset]
    env = "ray_kwargs.ray_init.runtime_env.env_vars"
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    o = [
        _o("trainer.device", "cpu", "verl.hardware"),
        _o(f"{_ACTOR}.strategy", "fsdp2", "verl.hardware"),
        _o(f"{_ACTOR}.fsdp_config.strategy", "fsdp2", "verl.hardware"),
        _o(f"{_AR}.ref.strategy", "fsdp2", "verl.hardware"),
        _o(f"{_ACTOR}.fsdp_config.seed", run.seed, "seed"),
        # verl's FSDP engine compiles its entropy (logged at every step's old log-probs) with inductor: on a CPU,
        # 10–15 s of one core in every actor rank of every run where the eager function differs only in rounding
        _o(f"{_ACTOR}.fsdp_config.use_torch_compile", False, "verl.hardware"),
        _o(f"{_MODEL}.use_remove_padding", False, "verl.hardware"),
        _o(f"{_MODEL}.override_config.attn_implementation", "sdpa", "verl.hardware", append=True),
        _o(f"{_ROLLOUT}.enable_sleep_mode", False, "verl.hardware", append=True),
        _o(f"{_ROLLOUT}.free_cache_engine", False, "verl.hardware"),
        _o(f"{_ROLLOUT}.enforce_eager", True, "verl.hardware"),
        _o(f"{_ROLLOUT}.agent.num_workers", 1, "verl.hardware"),
        _o("reward.num_workers", 1, "verl.hardware"),
        _o("data.dataloader_num_workers", 0, "verl.hardware"),
        _o("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1, "verl.hardware"),
        _o(f"{env}.VERL_PLATFORM", PLATFORM, "verl.hardware", append=True),
    ]
    o += resolve(capabilities(v.rollout).verl_cpu_overrides)(run, env)  # what verl.rollout's engine row names
    if not ray_address or ray_address == OWN_RAY:  # verl's own local Ray: its "GPU" slots, logical CPUs (the trainer, TransferQueue's
        # controller and storage unit, the agent-loop and reward workers each hold one besides the workers'
        # bundles), no dashboard
        o += [_o("ray_kwargs.ray_init.num_gpus", v.nnodes * v.gpus_per_node, "verl.gpus_per_node", append=True),
              _o("ray_kwargs.ray_init.num_cpus", RAY_CPUS, "verl.hardware"),
              _o("ray_kwargs.ray_init.include_dashboard", False, "verl.hardware", append=True)]
    if preset.learner_precision == "mxfp8":  # the MXFP8 layers quantize the fp32 master, as the native learner
        o.append(_o(f"{_ACTOR}.fsdp_config.mixed_precision", fp32, "preset", append=True))
    return o


def verl_overrides(expanded: "Run", payload: "VerlPayload | None" = None, *, experiment: str = "fp8rl",
                   run_name: str | None = None, mlflow_run_id: str | None = None, tracking_uri: str | None = None,
                   data_dir: str | Path | None = None, ray_address: str | None = None,
                   model_path: str | Path | None = None) -> list[Override]:
    """verl's ``ppo_trainer`` overrides for the run ``expanded`` (``backend: verl``), in a stable order;
    ``payload``: the run's :class:`~fp8rl_core.verl.payload.VerlPayload` as the launcher writes it into
    ``data_dir`` (None: :meth:`~fp8rl_core.verl.payload.VerlPayload.of` the run, no hooks).

    ``experiment`` becomes verl's ``trainer.project_name`` (the MLflow experiment), ``run_name`` its
    ``experiment_name``; with ``mlflow_run_id`` every Ray worker gets ``MLFLOW_RUN_ID`` so verl's MLflow
    logger writes into that run, and with ``tracking_uri`` ``MLFLOW_TRACKING_URI`` (a Ray worker has the
    environment of its node's raylet, not the launcher's). ``data_dir``: where :func:`fp8rl_core.verl.data.write_dataset` puts the
    run's ``train.parquet``/``val.parquet`` (every node must read it there: the launcher passes an absolute
    path on the shared checkout; None: ``verl-data/<experiment>/<run_name>``). ``ray_address``: the Ray
    cluster verl's ``main_ppo`` joins (None: it starts a local Ray, as verl does by default).

    The run's ``verl.overrides`` come last, as written (source ``verl.overrides``): one of a key fp8rl owns
    (an override with a ``why``, for any of the launch arguments, or the rollout's quantization of any preset) is
    refused (:func:`user_overrides`); one of a key fp8rl sets as a default replaces fp8rl's."""
    from fp8rl_core.verl.payload import VerlPayload

    run = expanded.config
    if run.backend != "verl" or run.verl is None:
        raise ValueError(f"run has backend = {run.backend!r}; verl overrides need backend: verl and a verl section")
    run_name = run_name or f"{run.model}-{run.preset}-s{run.seed}"
    data_dir = Path(data_dir) if data_dir is not None else Path("verl-data") / experiment / run_name
    payload = VerlPayload.of(expanded, data_dir) if payload is None else payload
    args = dict(experiment=experiment, run_name=run_name, data_dir=data_dir, model_path=model_path)
    o = _fp8rl_overrides(expanded, payload, mlflow_run_id=mlflow_run_id, tracking_uri=tracking_uri,
                         ray_address=ray_address, **args)
    if not run.verl.overrides:
        return o
    # every key fp8rl owns, whatever the launch (with and without a cluster address and an MLflow run) and the
    # preset (a BF16 rollout's quantization keys are the quantizing presets')
    launched = _fp8rl_overrides(expanded, payload, mlflow_run_id="-", tracking_uri="-", ray_address="-", **args)
    launched += [x for p in ("all", "other-grid") for x in _rollout_quantization(run.model_copy(update={"preset": p}),
                                                                                 payload)]
    mine = user_overrides(run.verl.overrides, o + launched)
    replaced = {u.key for u in mine}
    return [x for x in o if x.key not in replaced] + mine


def _key(item: str) -> str:
    """The dotted key of a Hydra override ``[+|++|~]key[=value]``."""
    return item.split("=", 1)[0].lstrip("+~")


def user_overrides(items: list[str], fp8rl: list[Override]) -> list[Override]:
    """The ``verl.overrides`` entries ``items`` as overrides (written verbatim), after refusing any of a key an
    override of ``fp8rl`` owns (its ``why`` set), of a key above one (a section holding it) or below one (inside
    its value): a ``ValueError`` of one line naming the entry, the key and why."""
    owned = [x for x in fp8rl if x.why]
    out = []
    for item in items:
        key = _key(item)
        hit = next((x for x in owned if x.key == key or x.key.startswith(f"{key}.") or key.startswith(f"{x.key}.")), None)
        if hit is not None:
            raise ValueError(f"verl.overrides: {item!r} is refused: fp8rl owns {hit.key} — {hit.why}")
        out.append(Override(key, None, "verl.overrides", item.startswith("+"), text=item))
    return out


def _fp8rl_overrides(expanded: "Run", payload: "VerlPayload", *, experiment: str, run_name: str,
                     mlflow_run_id: str | None, tracking_uri: str | None, data_dir: Path, ray_address: str | None,
                     model_path: str | Path | None) -> list[Override]:
    """What fp8rl sets in verl's config for the run (:func:`verl_overrides`, less the user's)."""
    from fp8rl_core.config.dataset import reward_target
    from fp8rl_core.sampler.presets import PRESETS
    from fp8rl_core.verl.payload import PAYLOAD_ENV, PAYLOAD_FILE

    run = expanded.config
    v, lr, sm, preset = run.verl, run.learner, run.sampler, PRESETS[run.preset]
    task = run.warmstart.task
    o: list[Override] = []

    def put(key: str, value: Any, source: str, append: bool = False, why: str | None = FIELD) -> None:
        o.append(_o(key, value, source, append, why))

    cpu = v.hardware == "cpu"
    # the engine, the algorithm, the model and fp8rl's extension in every process
    put("model_engine", "dp" if cpu else "megatron", "verl.hardware")
    put("algorithm.adv_estimator", "grpo", "backend", why=_WHY_GRPO)
    put("critic.enable", False, "backend", why=_WHY_GRPO)
    # the checkpoint verl trains: model_path, else the run's warm start with the task tokenizer in the
    # run's folder (fp8rl_core.verl.data.write_model_dir)
    put(f"{_MODEL}.path", str(model_path or run.model_path or data_dir / "model"), "model_path")
    put(f"{_MODEL}.external_lib", EXTENSION, "backend", why=_WHY_LIB)
    # cluster and parallelism
    put("trainer.nnodes", v.nnodes, "verl.nnodes")
    put("trainer.n_gpus_per_node", v.gpus_per_node, "verl.gpus_per_node")
    if cpu:
        o.extend(_cpu_overrides(run, ray_address))
    else:
        put(f"{_MEGATRON}.tensor_model_parallel_size", v.tensor_parallel, "verl.tensor_parallel")
        put(f"{_MEGATRON}.expert_model_parallel_size", v.expert_parallel, "verl.expert_parallel")
        put(f"{_MEGATRON}.seed", run.seed, "seed")
    # Transformer Engine FP8 on the learner (Megatron-Bridge path: use_mbridge stays True)
    if preset.learner_precision == "mxfp8" and not cpu:
        if lr.rule != "rceil":
            raise ValueError(f"learner.rule = {lr.rule!r}: Transformer Engine rounds E8M0 scales up (rceil); "
                             "the verl backend needs learner.rule: rceil")
        recipe = TE_RECIPES[v.hardware]
        put(f"{_MEGATRON}.override_transformer_config.fp8", "e4m3" if lr.grad == "e4m3" else "hybrid",
            "learner.grad", append=True)
        put(f"{_MEGATRON}.override_transformer_config.fp8_recipe", recipe, "verl.hardware", append=True)
        put(f"{_ACTOR}.optim.override_optimizer_config.fp8_recipe", recipe, "verl.hardware", append=True)
    # GRPO step: one optimizer step per RL step over prompts_per_step × group_size sequences
    put("data.train_batch_size", run.loop.prompts_per_step, "loop.prompts_per_step")
    put(f"{_ACTOR}.ppo_mini_batch_size", run.loop.prompts_per_step, "loop.prompts_per_step", why=None)
    put(f"{_ROLLOUT}.n", lr.group_size, "learner.group_size")
    put("trainer.total_training_steps", run.loop.steps, "loop.steps")
    put("data.seed", run.seed, "seed")
    put(f"{_ACTOR}.optim.lr", lr.lr, "learner.lr")
    put(f"{_ACTOR}.optim.clip_grad", lr.max_grad_norm, "learner.max_grad_norm")
    for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        put(f"{_ACTOR}.{k}", lr.clip_eps, "learner.clip_eps")
    put(f"{_ACTOR}.use_kl_loss", False, "learner", why=None)
    data = run.data
    if data.is_task:  # the task: fp8rl's prompts in the native loop's order, its reward (fp8rl_core.verl.data, .reward)
        put("data.train_files", str(data_dir / "train.parquet"), "warmstart.task")
        put("data.val_files", str(data_dir / "val.parquet"), "warmstart.task")
        put("data.shuffle", False, "loop", why=_WHY_ORDER)
        put("data.max_response_length", task.answer_len + 1, "warmstart.task")  # as the native loop's max_new
        put("data.max_prompt_length", sm.max_model_len - task.answer_len - 1, "sampler.max_model_len")
        put("data.apply_chat_template_kwargs.enable_thinking", False, "warmstart.task", append=True,
            why=None)  # Qwen3: answer at once
    else:  # a dataset in verl's format: its files, as verl reads them (data.shuffle: verl's)
        put("data.train_files", str(Path(data.train).expanduser().resolve()), "data.train")
        put("data.val_files", str(Path(data.val).expanduser().resolve()), "data.val")
        put("data.prompt_key", data.prompt_key, "data.prompt_key")
        put("data.max_response_length", data.max_response_length, "data.max_response_length")
        put("data.max_prompt_length", data.prompt_length(sm.max_model_len, 0), "data.max_prompt_length")
        for name, value in data.apply_chat_template_kwargs.items():
            put(f"data.apply_chat_template_kwargs.{name}", value, "data.apply_chat_template_kwargs", append=True)
    if data.reward is not None:  # the user's function (verl loads it: a file path or pkg://module)
        path, name = reward_target(data.reward)
        put("reward.custom_reward_function.path", path, "data.reward")
        put("reward.custom_reward_function.name", name, "data.reward")
    elif data.is_task:
        put("reward.custom_reward_function.path", REWARD_FUNCTION[0], "warmstart.task")
        put("reward.custom_reward_function.name", REWARD_FUNCTION[1], "warmstart.task")
    else:  # verl's default_compute_score, by each row's data_source
        put("reward.custom_reward_function.path", None, "data.reward")
    if v.micro_batch_size_per_gpu is None:  # the learner's token-budget micro-batches
        put(f"{_ACTOR}.use_dynamic_bsz", True, "verl.micro_batch_size_per_gpu")
        put(f"{_ACTOR}.ppo_max_token_len_per_gpu", lr.tokens_per_microbatch, "learner.tokens_per_microbatch")
    else:
        put(f"{_ACTOR}.ppo_micro_batch_size_per_gpu", v.micro_batch_size_per_gpu, "verl.micro_batch_size_per_gpu")
        put(f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu", v.micro_batch_size_per_gpu,
            "verl.micro_batch_size_per_gpu")
    # the rollout engine
    put(f"{_ROLLOUT}.name", v.rollout, "verl.rollout")
    put(f"{_ROLLOUT}.tensor_model_parallel_size", v.rollout_tensor_parallel, "verl.rollout_tensor_parallel")
    put(f"{_ROLLOUT}.expert_parallel_size", v.rollout_expert_parallel, "verl.rollout_expert_parallel")
    put(f"{_ROLLOUT}.seed", run.seed, "seed")
    put(f"{_ROLLOUT}.dtype", sm.dtype, "sampler.dtype")
    put(f"{_ROLLOUT}.max_model_len", sm.max_model_len, "sampler.max_model_len")
    put(f"{_ROLLOUT}.max_num_seqs", sm.max_num_seqs, "sampler.max_num_seqs")
    put(f"{_ROLLOUT}.gpu_memory_utilization", sm.memory_fraction, "sampler.memory_fraction")
    put(f"{_ROLLOUT}.temperature", sm.temperature, "sampler.temperature")
    put(f"{_ROLLOUT}.enable_prefix_caching", sm.enable_prefix_caching, "sampler.enable_prefix_caching")
    put(f"{_ROLLOUT}.mode", "async", "backend", why=_WHY_MODE)
    put(f"{_ROLLOUT}.checkpoint_engine.backend", "naive", "backend", why=_WHY_SYNC)
    o.extend(_rollout_quantization(run, payload))
    # mismatch metrics: rollout log-probs on, rollout correction metrics-only (no IS weights, no rejection)
    put(f"{_ROLLOUT}.calculate_log_probs", True, "metrics", why=_WHY_LOGPROBS)
    put("algorithm.rollout_correction.rollout_is", None, "metrics", why=None)
    put("algorithm.rollout_correction.bypass_mode", lr.old_logprobs == "sampler", "learner.old_logprobs")
    # tracking: verl's MLflow logger inside fp8rl's run
    put("trainer.logger", ["console", "mlflow"], "backend", why=_WHY_MLFLOW)
    put("trainer.project_name", experiment, "sweep", why=_WHY_MLFLOW)
    put("trainer.experiment_name", run_name, "run", why=_WHY_MLFLOW)
    put("trainer.val_before_train", False, "backend", why=None)
    put("trainer.test_freq", -1, "backend", why=None)
    if v.save_checkpoints:  # the actor's HF model after every step, in the run's folder; a rerun starts afresh
        put("trainer.save_freq", 1, "verl.save_checkpoints")
        put("trainer.default_local_dir", str(data_dir / CHECKPOINTS_DIR), "verl.save_checkpoints")
        put("trainer.resume_mode", "disable", "verl.save_checkpoints")
        put(f"{_ACTOR}.checkpoint.save_contents", ["hf_model"], "verl.save_checkpoints")
    else:
        put("trainer.save_freq", -1, "backend", why=None)
    if mlflow_run_id:
        put("ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID", mlflow_run_id, "run", append=True, why=_WHY_MLFLOW)
    if tracking_uri:
        put("ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_TRACKING_URI", tracking_uri, "run", append=True,
            why=_WHY_MLFLOW)
    # what fp8rl's pieces in verl's processes read: the payload file (fp8rl_core.verl.payload)
    put(f"ray_kwargs.ray_init.runtime_env.env_vars.{PAYLOAD_ENV}", str(data_dir / PAYLOAD_FILE), "run", append=True,
        why=_WHY_PAYLOAD)
    if ray_address:
        put("ray_kwargs.ray_init.address", ray_address, "cluster", append=True, why=_WHY_CLUSTER)
    return o


def main_ppo_argv(overrides: list[Override], python: str = "python") -> list[str]:
    """The command that runs verl's trainer with ``overrides``: ``python -m verl.trainer.main_ppo <k=v> …``."""
    return [python, "-m", MAIN_PPO, *(o.hydra() for o in overrides)]


def _rollout_quantization(run: "RunConfig", payload: "VerlPayload") -> list[Override]:
    """How the rollout engine loads the weights: fp8rl's vLLM method on the learner's grid (its bytes, or
    BF16 requantized by the method for ``requant``; the payload's schemes), verl's own block FP8 for
    ``other-grid``, nothing for a BF16 rollout."""
    from fp8rl_core.grids.schemes import VerlRollout
    from fp8rl_core.sampler.presets import PRESETS
    from fp8rl_core.verl.payload import uses_fp8rl_method

    preset = PRESETS[run.preset]
    if uses_fp8rl_method(run):
        qc = {"quant_method": "fp8rl", "layers": dict(sorted(payload.rollout_schemes.items())), "mx_grid": payload.mx_grid}
        kw = f"{_ROLLOUT}.engine_kwargs.vllm"
        return [
            _o(f"{kw}.quantization", "fp8rl", "preset", append=True, why=_WHY_METHOD),
            _o(f"{kw}.hf_overrides", {"quantization_config": qc}, "preset", append=True, why=_WHY_METHOD),
            _o(f"{kw}.worker_extension_cls", WORKER_EXTENSION, "backend", append=True, why=_WHY_EXTENSION),
        ]
    # (a vLLM rollout on CPU loads with fp8rl's method above for every preset: a BF16 one with every layer bf16,
    # block FP8 requantized from the BF16 views by that method, as the native sampler does)
    if preset.scheme.verl is VerlRollout.DEFAULT:
        return []
    if preset.scheme.verl is VerlRollout.VERL_FP8:
        # verl's own FP8 rollout: BF16 sent, 128×128 requantized in the worker (Triton: GPUs only)
        return [_o(f"{_ROLLOUT}.quantization", "fp8", "preset", why=_WHY_METHOD)]
    # SGLang's MXFP8 method, loaded with fp8rl's bytes by fp8rl's loader (sampler.sglang)
    from fp8rl_core.sampler.sglang.loader import LOADER

    kw = f"{_ROLLOUT}.engine_kwargs.sglang"
    return [_o(f"{kw}.quantization", "mxfp8", "preset", append=True, why=_WHY_METHOD),
            _o(f"{kw}.custom_weight_loader", [LOADER], "verl.rollout", append=True, why=_WHY_METHOD)]
