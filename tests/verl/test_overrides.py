"""fp8rl_core.verl.overrides: what a backend: verl run sets in verl's config (no verl import needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp8rl_core.config.loading import ConfigError
from fp8rl_core.config.runs import Run, Sweep
from fp8rl_core.config.schema import RunConfig

from fp8rl_core.verl import Override, hydra_value, verl_overrides
from fp8rl_core.verl.overrides import main_ppo_argv
from fp8rl_core.verl.payload import PAYLOAD_ENV
from fp8rl_core.verl.extension import mxfp8_align_size, padding_patch_needed


@pytest.fixture(autouse=True)
def _gsm8k_files(gsm8k_home):
    """configs/gpu/*.yaml read ~/data/gsm8k: the test's GSM8K files there."""


GPU = {"qwen3-8b": "configs/gpu/qwen3-8b.yaml", "qwen3-30b-a3b": "configs/gpu/qwen3-30b-a3b.yaml"}


def gpu_run(name: str, preset: str = "all", *overrides: str) -> Run:
    runs = Sweep.load(GPU[name], [f"axes.preset=[{preset}]", "axes.seed=[0]", *overrides]).runs
    return runs[0]


def as_dict(ov: list[Override]) -> dict[str, object]:
    return {o.key: o.value for o in ov}


def test_importing_fp8rl_core_verl_loads_neither_verl_nor_ray():
    code = ("import sys, fp8rl_core.verl, fp8rl_core.verl.overrides, fp8rl_core.verl.compose, fp8rl_core.verl.extension, "
            "fp8rl_core.verl.data, fp8rl_core.verl.reward\n"
            "print(sorted({k.split('.')[0] for k in sys.modules} & {'verl', 'ray', 'hydra'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("value, text", [
    (None, "null"), (True, "true"), (3, "3"), (1e-06, "1e-06"), ("megatron", "megatron"),
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"), ("true", "'true'"), ("a b", "'a b'"), ("it's", "'it\\'s'"),
    (["console", "mlflow"], "[console,mlflow]"), ({"a.b": 1, "c": {"d": None}}, "{a.b:1,c:{d:null}}"),
])
def test_hydra_value(value, text):
    assert hydra_value(value) == text


def test_dense_all_on_blackwell_sets_te_mxfp8_and_fp8rl_vllm_method():
    ov = verl_overrides(gpu_run("qwen3-8b"))
    d = as_dict(ov)
    te = "actor_rollout_ref.actor.megatron.override_transformer_config"
    assert d["model_engine"] == "megatron" and d["algorithm.adv_estimator"] == "grpo"
    assert d[f"{te}.fp8"] == "e4m3" and d[f"{te}.fp8_recipe"] == "mxfp8"
    assert d["actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe"] == "mxfp8"
    assert d["actor_rollout_ref.model.external_lib"] == "fp8rl_core.verl.extension"
    assert d["actor_rollout_ref.model.path"] == "Qwen/Qwen3-8B"
    vllm = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    assert d[f"{vllm}.quantization"] == "fp8rl"
    assert d[f"{vllm}.worker_extension_cls"] == "fp8rl_core.verl.extension.Fp8rlVerlWorkerExtension"
    qc = d[f"{vllm}.hf_overrides"]["quantization_config"]
    assert qc["quant_method"] == "fp8rl" and qc["mx_grid"] == "mxfp8-e4m3-rceil"
    # 36 blocks × (qkv, o, gate_up, down), all on the learner's grid; lm_head stays BF16
    assert len(qc["layers"]) == 36 * 4 and set(qc["layers"].values()) == {"mxfp8"}
    assert "model.layers.35.mlp.gate_up_proj" in qc["layers"] and not any("lm_head" in k for k in qc["layers"])
    # mismatch metrics on, the algorithm untouched (no IS weights), MLflow logging
    assert d["actor_rollout_ref.rollout.calculate_log_probs"] is True
    assert d["algorithm.rollout_correction.rollout_is"] is None
    assert d["trainer.logger"] == ["console", "mlflow"]
    # the GRPO step: 64 prompts × 8, token-budget micro-batches, 2-way tensor parallel on 8 GPUs
    assert d["data.train_batch_size"] == 64 and d["actor_rollout_ref.rollout.n"] == 8
    assert d["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert d["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 8192
    assert d["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == 2
    assert d["trainer.n_gpus_per_node"] == 8
    assert [o.hydra() for o in ov if o.append] == [o.hydra() for o in ov if o.hydra().startswith("+")]


def test_each_override_names_the_fp8rl_field_it_comes_from():
    ov = verl_overrides(gpu_run("qwen3-30b-a3b"), mlflow_run_id="abc123", ray_address="10.0.0.1:6379")
    top = set(RunConfig.model_fields) | {"metrics", "sweep", "run", "cluster"}
    assert all(o.source.split(".")[0] in top for o in ov), [o for o in ov if o.source.split(".")[0] not in top]
    by_key = {o.key: o.source for o in ov}
    assert by_key["actor_rollout_ref.actor.megatron.expert_model_parallel_size"] == "verl.expert_parallel"
    assert by_key["actor_rollout_ref.rollout.n"] == "learner.group_size"
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID=abc123" in [o.hydra() for o in ov]


def test_presets_map_to_verl_precisions():
    bf16 = as_dict(verl_overrides(gpu_run("qwen3-8b", "bf16-e2e")))
    assert not any("fp8" in k or "quantization" in k for k in bf16)
    sampler_bf16 = as_dict(verl_overrides(gpu_run("qwen3-8b", "bf16-sampler")))
    assert any(k.endswith("override_transformer_config.fp8_recipe") for k in sampler_bf16)
    assert not any("quantization" in k for k in sampler_bf16)
    other = as_dict(verl_overrides(gpu_run("qwen3-8b", "other-grid")))
    assert other["actor_rollout_ref.rollout.quantization"] == "fp8"  # verl's own 128x128 block FP8 rollout
    half = as_dict(verl_overrides(gpu_run("qwen3-8b", "half")))
    layers = half["actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"]["quantization_config"]["layers"]
    assert 0 < len(layers) < 36 * 4
    moe = as_dict(verl_overrides(gpu_run("qwen3-30b-a3b")))
    moe_layers = moe["actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"]["quantization_config"]["layers"]
    assert moe_layers["model.layers.0.mlp.experts"] == "mxfp8" and "model.layers.0.mlp.gate" not in moe_layers


def test_hardware_learner_and_rollout_choices():
    hopper = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", "verl.hardware=hopper")))
    assert hopper["actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe"] == "blockwise"
    hybrid = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", "learner.grad=e5m2")))
    assert hybrid["actor_rollout_ref.actor.megatron.override_transformer_config.fp8"] == "hybrid"
    bypass = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", "learner.old_logprobs=sampler")))
    assert bypass["algorithm.rollout_correction.bypass_mode"] is True
    sgl = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", "verl.rollout=sglang")))
    assert sgl["actor_rollout_ref.rollout.name"] == "sglang"
    assert sgl["actor_rollout_ref.rollout.engine_kwargs.sglang.quantization"] == "mxfp8"
    # verl hands the list to SGLang's server args; SGLang resolves an update request's load_format in it
    assert sgl["actor_rollout_ref.rollout.engine_kwargs.sglang.custom_weight_loader"] == ["fp8rl_core.sampler.sglang.loader.load_weights"]
    assert not any(k.startswith("actor_rollout_ref.rollout.engine_kwargs.vllm") for k in sgl)
    fixed = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", "verl.micro_batch_size_per_gpu=2")))
    assert fixed["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 2 and "actor_rollout_ref.actor.use_dynamic_bsz" not in fixed
    with pytest.raises(ValueError, match="learner.rule"):
        verl_overrides(gpu_run("qwen3-8b", "all", "learner.rule=floor"))
    with pytest.raises(ValueError, match="backend"):
        verl_overrides(Run.of(RunConfig()))


def test_backend_and_verl_section_go_together():
    with pytest.raises(ConfigError, match="backend = 'verl' needs a 'verl' section"):
        Sweep.load(GPU["qwen3-8b"], ["verl=null"])
    with pytest.raises(ConfigError, match="backend = 'native' takes no 'verl' section"):
        Sweep.load(GPU["qwen3-8b"], ["backend=native"])
    with pytest.raises(ConfigError, match=r"base\.verl\.tensor_paralel: unknown field"):
        Sweep.load(GPU["qwen3-8b"], ["verl.tensor_paralel=2"])


def test_mxfp8_padding_rule():
    assert all(mxfp8_align_size(a)[0] % 32 == 0 and mxfp8_align_size(a)[0] % a == 0 for a in range(1, 65))
    assert not padding_patch_needed(mxfp8_align_size)


def test_installed_verl_padding_still_needs_the_patch():
    """Fails the day verl's own FP8 padding reaches 32 tokens (upstream PR #7519): then drop the patch."""
    util = pytest.importorskip("verl.models.mcore.util", reason="needs Megatron-Core (GPU hosts)")
    assert padding_patch_needed(util._compute_fp8_thd_align_size) or util._compute_fp8_thd_align_size is mxfp8_align_size


def test_task_data_reward_and_checks_reach_verl():
    # the GPU config on the addition task (its data section emptied): the task's files written for verl
    run = gpu_run("qwen3-8b", "all", "checks.full_every=3", "base.warmstart.task.digits=4", "base.data={}")
    d = as_dict(verl_overrides(run, experiment="gpu-qwen3-8b", run_name="r1", data_dir="/shared/verl/r1"))
    assert d["data.train_files"] == "/shared/verl/r1/train.parquet" and d["data.val_files"] == "/shared/verl/r1/val.parquet"
    assert d["data.shuffle"] is False  # batch s = the native loop's step s (fp8rl_core.verl.data)
    assert d["data.max_response_length"] == 4 + 2 + 1 and d["data.max_prompt_length"] == 1536 - 7
    assert d["reward.custom_reward_function.path"] == "pkg://fp8rl_core.verl.reward"
    assert d["reward.custom_reward_function.name"] == "compute_score"
    env = "ray_kwargs.ray_init.runtime_env.env_vars"
    # fp8rl's one variable in verl's workers: the payload file beside the dataset (fp8rl_core.verl.payload)
    assert d[f"{env}.{PAYLOAD_ENV}"] == "/shared/verl/r1/payload.json"
    assert not any(k.startswith(f"{env}.FP8RL_") and k != f"{env}.{PAYLOAD_ENV}" for k in d)
    assert "ray_kwargs.ray_init.address" not in d
    default = as_dict(verl_overrides(run, experiment="gpu-qwen3-8b"))
    assert default["data.train_files"] == "verl-data/gpu-qwen3-8b/qwen3-8b-all-s0/train.parquet"
    ov = verl_overrides(run, ray_address="auto", mlflow_run_id="abc")
    argv = main_ppo_argv(ov, "/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "verl.trainer.main_ppo"] and argv[3:] == [o.hydra() for o in ov]
    assert "+ray_kwargs.ray_init.address=auto" in argv and "+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID=abc" in argv


def test_the_owned_keys_are_the_overrides_fp8rl_sets_with_a_reason():
    ov = verl_overrides(gpu_run("qwen3-8b"), ray_address="auto", mlflow_run_id="abc", tracking_uri="sqlite:///m.db")
    owned = {o.key: o.why for o in ov if o.why}
    vllm, env = "actor_rollout_ref.rollout.engine_kwargs.vllm", "ray_kwargs.ray_init.runtime_env.env_vars"
    for key in (f"{vllm}.quantization", f"{vllm}.hf_overrides", f"{vllm}.worker_extension_cls",
                "actor_rollout_ref.model.external_lib", "actor_rollout_ref.rollout.checkpoint_engine.backend",
                "actor_rollout_ref.rollout.mode", "trainer.logger", "trainer.project_name", "trainer.experiment_name",
                f"{env}.MLFLOW_RUN_ID", f"{env}.MLFLOW_TRACKING_URI", f"{env}.{PAYLOAD_ENV}", "ray_kwargs.ray_init.address",
                "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.temperature", "data.train_batch_size"):
        assert owned.get(key), key
    assert owned["actor_rollout_ref.actor.optim.lr"] == "fp8rl sets it from its field learner.lr; set learner.lr in the fp8rl config"
    # fp8rl's defaults a recipe may change: no reason
    defaults = {o.key for o in ov if not o.why}
    assert {"actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.use_kl_loss", "trainer.save_freq",
            "trainer.test_freq", "algorithm.rollout_correction.rollout_is"} <= defaults


@pytest.mark.parametrize("item, owner, why", [
    ("actor_rollout_ref.rollout.engine_kwargs.vllm.quantization=fp8", "actor_rollout_ref.rollout.engine_kwargs.vllm.quantization",
     "the rollout loads the learner's bytes through the quantization method the preset chooses (set preset)"),
    ("actor_rollout_ref.rollout.engine_kwargs={}", "actor_rollout_ref.rollout.engine_kwargs.vllm.quantization",
     "the rollout loads the learner's bytes"),  # a section above an owned key
    ("+actor_rollout_ref.model.external_lib=my.module", "actor_rollout_ref.model.external_lib", "registers its rollout adapter"),
    ("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "actor_rollout_ref.rollout.checkpoint_engine.backend",
     "verl's naive checkpoint engine calls the rollout adapter that carries fp8rl's bytes at every sync"),
    ("trainer.logger=[console,wandb]", "trainer.logger", "verl's MLflow logger writes into fp8rl's MLflow run"),
    # owned at launch only (fp8rl run passes an MLflow run and the cluster): refused in every config
    ("+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID=x", "ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID",
     "fp8rl's MLflow run"),
    ("+ray_kwargs.ray_init.address=auto", "ray_kwargs.ray_init.address", "verl joins the Ray cluster fp8rl checked"),
    ("actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr", "set learner.lr in the fp8rl config"),
    ("actor_rollout_ref.rollout.n=5", "actor_rollout_ref.rollout.n", "set learner.group_size in the fp8rl config"),
])
def test_an_override_of_a_key_fp8rl_owns_is_refused_saying_why(item, owner, why):
    run = gpu_run("qwen3-8b", "all", f"verl.overrides=[{item!r}]")
    with pytest.raises(ValueError) as e:
        verl_overrides(run)
    msg = str(e.value)
    assert msg.startswith(f"verl.overrides: {item!r} is refused: fp8rl owns {owner} — ") and why in msg and "\n" not in msg


def test_a_bf16_rollout_refuses_the_quantizing_presets_keys_too():
    """A BF16 rollout sets no quantization key; an entry that would quantize it is still fp8rl's (the preset's)."""
    for item, owner in [("actor_rollout_ref.rollout.quantization=fp8", "actor_rollout_ref.rollout.quantization"),
                        ("+actor_rollout_ref.rollout.engine_kwargs.vllm.quantization=fp8",
                         "actor_rollout_ref.rollout.engine_kwargs.vllm.quantization")]:
        run = gpu_run("qwen3-8b", "bf16-sampler", f"verl.overrides=[{item!r}]")
        with pytest.raises(ValueError, match=f"fp8rl owns {owner} — the rollout loads the learner's bytes through the "
                                             "quantization method the preset chooses"):
            verl_overrides(run)


def test_allowed_overrides_come_last_verbatim_and_replace_fp8rls_defaults():
    items = ["actor_rollout_ref.actor.ppo_epochs=2", "algorithm.kl_ctrl.kl_coef=0.01",
             "actor_rollout_ref.actor.use_kl_loss=True", "+actor_rollout_ref.actor.kl_loss_type=low_var_kl",
             "ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG='1'"]
    run = gpu_run("qwen3-8b", "all", f"verl.overrides={items!r}")
    ov = verl_overrides(run, mlflow_run_id="abc")
    assert [o.hydra() for o in ov[-5:]] == items and {o.source for o in ov[-5:]} == {"verl.overrides"}
    assert ov[-2].append and ov[-2].key == "actor_rollout_ref.actor.kl_loss_type"
    # fp8rl's default use_kl_loss=false is replaced, not repeated; everything else fp8rl sets stays
    assert [o.key for o in ov].count("actor_rollout_ref.actor.use_kl_loss") == 1
    plain = verl_overrides(gpu_run("qwen3-8b"), mlflow_run_id="abc")
    assert [o for o in ov if o.source != "verl.overrides"] == [o for o in plain if o.key != "actor_rollout_ref.actor.use_kl_loss"]


def test_a_dataset_becomes_verls_data_and_reward_keys(tmp_path):
    from tests import gsm8k_data

    model = gsm8k_data.train_tokenizer(gsm8k_data.corpus(gsm8k_data.problems(32)), tmp_path / "model", 400)
    # a local Qwen3-8B as downloaded: its config.json (checked against the spec) and sharded weights
    from fp8rl_core.learner.spec import load_model_spec

    load_model_spec("configs/models/qwen3-8b.yaml").hf_config().to_json_file(model / "config.json")
    (model / "model-00001-of-00005.safetensors").write_bytes(b"")
    train, val = gsm8k_data.write_dataset(tmp_path / "gsm8k", 16, 4)
    data = [f"model_path={model}", f"data.train={train}", f"data.val={val}", "data.max_response_length=200",
            "sampler.max_model_len=1024"]
    d = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", *data), data_dir="/w/r"))
    assert d["data.train_files"] == str(train.resolve()) and d["data.val_files"] == str(val.resolve())
    assert d["data.prompt_key"] == "prompt" and d["data.max_response_length"] == 200
    assert d["data.max_prompt_length"] == 512  # the config's; unset: sampler.max_model_len − max_response_length
    assert d["reward.custom_reward_function.path"] is None  # verl's default_compute_score by data_source
    assert "reward.custom_reward_function.name" not in d and "data.shuffle" not in d
    assert "data.apply_chat_template_kwargs.enable_thinking" not in d
    assert d["actor_rollout_ref.model.path"] == str(model)
    fn = tmp_path / "score.py"
    fn.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    d = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", *data, f"data.reward={fn}:score")))
    assert (d["reward.custom_reward_function.path"], d["reward.custom_reward_function.name"]) == (str(fn), "score")
    d = as_dict(verl_overrides(gpu_run("qwen3-8b", "all", *data, "data.reward=fp8rl_core.verl.reward:compute_score")))
    assert d["reward.custom_reward_function.path"] == "pkg://fp8rl_core.verl.reward"
    with pytest.raises(ValueError, match="fp8rl owns reward.custom_reward_function.path — fp8rl sets it from its field "
                                         "data.reward; set data.reward in the fp8rl config"):
        verl_overrides(gpu_run("qwen3-8b", "all", *data, "verl.overrides=[reward.custom_reward_function.path=x.py]"))


def test_save_checkpoints_has_verl_write_the_actors_hf_model_after_every_step_in_the_runs_folder():
    """``verl.save_checkpoints``: the checkpoints the fixed-weights experiment measures (docs/fixed-weights.md);
    off (the default), verl saves nothing and the run's id is the one it had before the field."""
    smoke = ["axes.preset=[all]", "axes.model=[qwen3-dense-mini]"]
    off = Sweep.load("configs/verl-smoke.yaml", smoke).runs[0]
    on = Sweep.load("configs/verl-smoke.yaml", [*smoke, "verl.save_checkpoints=true"]).runs[0]
    assert on.id != off.id and off.id == Sweep.load("configs/verl-smoke.yaml", [*smoke, "verl.save_checkpoints=false"]).runs[0].id
    d_off = as_dict(verl_overrides(off, data_dir="/w/r"))
    assert d_off["trainer.save_freq"] == -1 and "trainer.default_local_dir" not in d_off
    ov = verl_overrides(on, data_dir="/w/r")
    saved = {o.key: (o.value, o.source) for o in ov if o.source == "verl.save_checkpoints"}
    assert saved == {"trainer.save_freq": (1, "verl.save_checkpoints"),
                     "trainer.default_local_dir": ("/w/r/checkpoints", "verl.save_checkpoints"),
                     "trainer.resume_mode": ("disable", "verl.save_checkpoints"),
                     "actor_rollout_ref.actor.checkpoint.save_contents": (["hf_model"], "verl.save_checkpoints")}
    assert "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]" in [o.hydra() for o in ov]


def test_the_chat_template_kwargs_reach_verls_data_section():
    """data.apply_chat_template_kwargs (e.g. Qwen3's enable_thinking) is verl's own key, passed as it is (the native
    loop renders its prompts with the same: tests/core/learner/test_checkpoint_spec.py)."""
    run = gpu_run("qwen3-8b", "all", "data.apply_chat_template_kwargs.enable_thinking=false")
    assert run.config.data.apply_chat_template_kwargs == {"enable_thinking": False}
    (o,) = [o for o in verl_overrides(run) if o.key.startswith("data.apply_chat_template_kwargs")]
    assert (o.key, o.value, o.hydra()) == ("data.apply_chat_template_kwargs.enable_thinking", False,
                                         "+data.apply_chat_template_kwargs.enable_thinking=false")
    assert run.id != gpu_run("qwen3-8b", "all").id  # set: part of the run's id; unset: ids as before
