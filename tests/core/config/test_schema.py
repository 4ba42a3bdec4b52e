"""The schema: one config tree whose sections build their components' configs with the components' own
defaults (declared once), light to import."""

from __future__ import annotations

import os

import pytest

from fp8rl_core.config.runs import run_id
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sections import LearnerSection
from fp8rl_core.config.sweep import MatchingSection
from fp8rl_core.sampler.presets import PRESETS
from tests.core.config.files import CONFIGS, ROOT, configs


def test_the_learner_section_builds_the_learner_config_with_the_documented_defaults():
    from fp8rl_core.learner.config import GRPOConfig, LearnerConfig, Recipe

    built = RunConfig().learner_config()  # preset "all"
    assert built == LearnerConfig(precision="mxfp8", layers="all", recipe=Recipe(cache_weights=True), lr=1e-4,
                                  grpo=GRPOConfig(group_size=4, clip_eps_low=0.2, clip_eps_high=0.2,
                                                  tokens_per_microbatch=4096, max_grad_norm=1.0))
    assert built.recipe == Recipe(fwd="e4m3", grad="e4m3", rule="rceil", cache_weights=True)
    assert built.lr == 1e-4 and built.grpo.old_logprobs == "learner"
    bf16 = RunConfig(preset="bf16-e2e").learner_config()
    assert (bf16.precision, bf16.layers) == ("bf16", "none") and bf16.recipe == built.recipe


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_learner_sections_defaults_are_the_learners_defaults(preset):
    """No drift possible: a default section builds exactly the component's default config."""
    assert LearnerSection().build(PRESETS[preset]) == PRESETS[preset].learner_config()


def test_every_learner_setting_reaches_the_learner_config():
    s = LearnerSection(lr=3e-3, rule="floor", grad="e5m2", cache_weights=False, group_size=8,
                       tokens_per_microbatch=512, clip_eps=0.1, old_logprobs="sampler", max_grad_norm=0.5,
                       device="cuda")
    cfg = s.build(PRESETS["half"])
    assert (cfg.precision, cfg.layers, cfg.lr, cfg.device) == ("mxfp8", "all", 3e-3, "cuda")
    assert (cfg.recipe.rule, cfg.recipe.grad, cfg.recipe.cache_weights) == ("floor", "e5m2", False)
    g = cfg.grpo
    assert (g.group_size, g.tokens_per_microbatch, g.clip_eps_low, g.clip_eps_high, g.old_logprobs, g.max_grad_norm) == (
        8, 512, 0.1, 0.1, "sampler", 0.5)
    assert set(LearnerSection.model_fields) == {"lr", "rule", "grad", "cache_weights", "group_size",
                                                "tokens_per_microbatch", "clip_eps", "old_logprobs", "max_grad_norm", "device"}


def test_the_checks_and_metrics_sections_defaults_are_their_components():
    import inspect

    from fp8rl_core.checks.policy import W7_COARSE, W7_COARSE_MIN_PROB, W7_EXACT, CheckPolicy
    from fp8rl_core.metrics.summary import run_kl_summary

    run = RunConfig(sampler={"dtype": "float32"})
    assert run.checks == CheckPolicy()  # the section is the policy: one class, one set of defaults
    assert run.check_policy() == CheckPolicy(w7_mean=1e-3, w7_max=0.05, w7_min_prob=0.0, w7_verdict="fail")  # float32, learner grid: exact
    assert W7_EXACT == (1e-3, 0.05) and CheckPolicy().w7_bounds() == W7_EXACT
    assert RunConfig().check_policy() == CheckPolicy(w7_mean=0.5, w7_max=8.0, w7_min_prob=1e-3, w7_verdict="event")  # BF16: coarse
    assert RunConfig(preset="requant", sampler={"dtype": "float32"}).check_policy().w7_bounds() == W7_COARSE
    assert RunConfig(checks={"w7_mean": 0.2}, sampler={"dtype": "float32"}).check_policy().w7_bounds() == (0.2, 0.05)
    # the positions W7's probe judges: every one on an exact engine, p ≥ 1e-3 on either side on a coarse one
    assert RunConfig(sampler={"dtype": "float32"}).check_policy().w7_min_prob == 0.0
    assert RunConfig(preset="requant", sampler={"dtype": "float32"}).check_policy().w7_min_prob == W7_COARSE_MIN_PROB == 1e-3
    assert RunConfig(sampler={"dtype": "bfloat16"}).check_policy().w7_min_prob == 1e-3
    assert RunConfig(checks={"w7_min_prob": 0.0}, sampler={"dtype": "bfloat16"}).check_policy().w7_min_prob == 0.0
    assert RunConfig(checks={"full_every": 3}).check_policy().full_every == 3
    defaults = inspect.signature(run_kl_summary).parameters
    assert (run.metrics.bootstrap, run.metrics.ci_level) == (defaults["n_boot"].default, defaults["level"].default)
    assert tuple(run.check_probe().shape) == (run.checks.probe_sequences, run.warmstart.task.seq_len)


def test_a_learner_config_for_another_preset_is_refused():
    from fp8rl_core.loop import start_pipeline

    with pytest.raises(ValueError, match=r"preset 'bf16-e2e' bf16 on 'none'.*PRESETS\['bf16-e2e'\]\.learner_config"):
        start_pipeline("/nonexistent", "bf16-e2e", learner=PRESETS["all"].learner_config())


def test_importing_the_config_loads_no_model_library():
    """fp8rl_core.config's modules validate and expand configs with light modules only: no vLLM, no
    transformers (torch is still loaded: the task's prompts, the presets' layer patterns and the checks'
    policy live beside it)."""
    import subprocess
    import sys

    code = ("import sys, fp8rl_core.config.schema, fp8rl_core.config.loading, fp8rl_core.config.runs; "
            "print(','.join(m for m in ('vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == ""


def test_learner_device_defaults_to_cpu_and_stays_out_of_run_ids():
    runs = configs(CONFIGS / "smoke.yaml")
    run = runs[0]
    assert run.learner.device == "cpu" and run.learner_config().device == "cpu"
    on_gpu = run.model_copy(update={"learner": run.learner.model_copy(update={"device": "cuda:0"})})
    assert on_gpu.learner_config().device == "cuda:0"
    assert run_id(on_gpu) == run_id(run)  # where it runs, not what it is (like models_dir)
    assert "device" not in run.model_dump(mode="json")["learner"]
    with pytest.raises(ValueError, match="learner device must be cpu or cuda"):
        LearnerSection(device="meta")


def test_the_defaults_measure_every_preset_from_the_warm_start_and_after_eight_steps():
    m = MatchingSection()
    assert m.presets == list(PRESETS) and m.steps == [0, 8] and m.ablations == []
    assert [v.name for v in m.variants()] == list(PRESETS)


def test_an_ablation_on_sglang_is_a_variant_of_its_own_and_the_id_of_a_section_without_one_is_kept():
    """``engine: sglang`` makes a variant (``bf16-sampler@sglang``: measured on SGLang, compared with its vLLM
    twin); MXFP8 sampler layers are refused on it in one line; ``engine: vllm`` written out is the section
    without it (the same id as before the field)."""
    m = MatchingSection(presets=["bf16-sampler"], ablations=[{"preset": "bf16-sampler", "engine": "sglang"},
                                                             {"preset": "bf16-e2e", "engine": "sglang",
                                                              "engine_dtype": "float32"}])
    assert [(v.name, v.engine, v.ablation) for v in m.variants()] == [
        ("bf16-sampler", "vllm", False), ("bf16-sampler@sglang", "sglang", True),
        ("bf16-e2e@sglang,engine=float32", "sglang", True)]
    plain = MatchingSection(ablations=[{"preset": "all", "engine_dtype": "float32"}])
    written = MatchingSection(ablations=[{"preset": "all", "engine_dtype": "float32", "engine": "vllm"}])
    assert written.id() == plain.id() != MatchingSection(ablations=[{"preset": "bf16-sampler", "engine": "sglang"}]).id()
    with pytest.raises(ValueError, match=r"preset 'all' with engine 'sglang': the SGLang engine cannot run schemes "
                                         r"\['mxfp8'\] on CPU"):
        MatchingSection(ablations=[{"preset": "all", "engine": "sglang"}])
    with pytest.raises(ValueError, match="ablations repeat a variant"):
        MatchingSection(ablations=[{"preset": "bf16-sampler", "engine": "sglang"}] * 2)
