"""Reading a sweep file: overrides take effect (and only what they name); a bad file, override, model
spec or section fails fast with one message naming the file, the field and what would be valid."""

from __future__ import annotations

import pytest

from fp8rl_core.config.loading import ConfigError, read_sweep
from fp8rl_core.config.runs import Sweep
from fp8rl_core.learner.spec import MXFP8_BLOCK
from fp8rl_core.sampler.presets import PRESETS
from tests.core.config.files import CONFIGS, FIXED_BASE, GOOD_BASE, MODELS, SMOKE, configs, run_ids, write, write_beside_models


@pytest.mark.parametrize(
    ("overrides", "n_runs", "check"),
    [
        (["learner.lr=1e-3"], 30, lambda r: r.learner.lr == 1e-3),
        (["learner.lr=2.5e-4"], 30, lambda r: r.learner.lr == 2.5e-4),
        (["base.learner.lr=2.5e-4"], 30, lambda r: r.learner.lr == 2.5e-4),
        (["axes.seed=[0]"], 10, lambda r: r.seed == 0),
        (["base.loop.steps=1"], 30, lambda r: r.loop.steps == 1),
        (["loop.steps=1", "axes.seed=[2]", "axes.preset=[half, all]"], 4,
         lambda r: r.loop.steps == 1 and r.seed == 2 and r.preset in ("half", "all")),
        (["axes.model=[qwen3-dense-mini]", "sampler.kv_cache_dtype=fp8_e4m3"], 15,
         lambda r: r.model == "qwen3-dense-mini" and r.sampler.kv_cache_dtype == "fp8_e4m3"),
        (["warmstart.task.digits=1"], 30, lambda r: r.warmstart.task.digits == 1 and r.warmstart.steps == 800),
        (["axes.learner.group_size=[2, 8]", "axes.seed=[0]"], 20, lambda r: r.learner.group_size in (2, 8)),
    ],
)
def test_overrides_take_effect(overrides, n_runs, check):
    runs = configs(SMOKE, overrides)
    assert len(runs) == n_runs
    assert all(check(r) for r in runs)
    assert len(set(run_ids(runs))) == n_runs


def test_override_of_a_dotted_axis():
    """Axis keys are dotted field paths; ``axes.<key>=...`` replaces that axis, it does not nest."""
    mb = CONFIGS / "microbatch-sweep.yaml"
    runs = configs(mb, ["axes.learner.tokens_per_microbatch=[512]", "axes.seed=[0]"])
    assert [(r.preset, r.learner.tokens_per_microbatch) for r in runs] == [("bf16-e2e", 512), ("all", 512)]
    for shadowed in ("learner.tokens_per_microbatch=512", "learner={tokens_per_microbatch: 512}"):
        with pytest.raises(ConfigError, match="'learner.tokens_per_microbatch' is an axis"):
            Sweep.load(mb, [shadowed])
    # a section override that leaves the axis' field alone is fine
    runs = configs(mb, ["learner={lr: 2.0e-3, group_size: 4}"])
    assert len(runs) == 30 and {r.learner.lr for r in runs} == {2e-3}


def test_overrides_change_only_what_they_name():
    base = configs(SMOKE)
    runs = configs(SMOKE, ["learner.lr=1e-3"])  # smoke already has lr 1e-3: the same runs
    assert run_ids(runs) == run_ids(base)
    subset = configs(SMOKE, ["axes.seed=[0]"])
    assert set(run_ids(subset)) <= set(run_ids(base))
    changed = configs(SMOKE, ["learner.lr=2e-3"])  # another run: another id (a sweep does not skip it)
    assert set(run_ids(changed)).isdisjoint(run_ids(base))


@pytest.mark.parametrize("override", ["seed=3", "base.seed=3", "preset=half", "model=qwen3-moe-tiny"])
def test_override_of_a_field_an_axis_sets_is_refused(override):
    with pytest.raises(ConfigError) as e:
        Sweep.load(SMOKE, [override])
    key = override.split("=")[0].removeprefix("base.")
    assert f"'{key}' is an axis" in str(e.value) and f"axes.{key}=" in str(e.value)
    assert str(SMOKE) in str(e.value)


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ("learner.lr", "is not key=value"),
        ("=3", "empty key"),
        ("learner.lr=[1, 2", "not valid YAML"),
        ("learner.lr=-1", "base.learner.lr"),
        ("learner.lr.x=1", "'lr' is a value"),
        ("axes.seed=[]", "have no values"),
    ],
)
def test_bad_overrides_fail_with_a_message(override, expect):
    with pytest.raises(ConfigError, match=None) as e:
        Sweep.load(SMOKE, [override])
    assert expect in str(e.value)


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}  learner: {{lrr: 1.0}}\n",
                     ["base.learner.lrr", "unknown field", "valid fields here are", "lr", "tokens_per_microbatch"],
                     id="unknown-nested-key"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}  seeds: 1\n",
                     ["base.seeds", "unknown field", "seed", "preset", "warmstart"], id="unknown-run-key"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}axis: {{seed: [0]}}\n",
                     ["axis: unknown field", "axes, base, correctness, description, matching, per_model, resources, sweep"], id="unknown-top-key"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, warmstart: {task: {digitz: 2}}}\n",
                     ["base.warmstart.task.digitz", "digits"], id="unknown-deep-key"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}  loop: {{steps: many}}\n",
                     ["base.loop.steps", "valid integer"], id="wrong-type"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}  learner: {{rule: round}}\n",
                     ["base.learner.rule", "'rceil' or 'floor'"], id="wrong-literal"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}axes: seed\n", ["axes", "valid dictionary"], id="axes-not-a-map"),
        pytest.param(f"base:{GOOD_BASE}", ["sweep: required field is missing"], id="missing-sweep"),
        pytest.param(f"sweep: 'a b'\nbase:{GOOD_BASE}", ["sweep:", "pattern"], id="bad-sweep-name"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}  preset: all-layers\n",
                     ["base.preset", "unknown preset 'all-layers'", "valid presets: " + ", ".join(PRESETS)],
                     id="unknown-preset"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}axes: {{preset: [all, everything]}}\n",
                     ["unknown preset 'everything'", "valid presets", "(in the run preset=everything)"],
                     id="unknown-preset-on-an-axis"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-giant}\n",
                     ["model 'qwen3-giant'", "no spec file", "known models", "qwen3-dense-mini"], id="unknown-model"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, sampler: {max_model_len: 16},"
                     " warmstart: {steps: 300, warmup: 30, task: {digits: 4}}}\n",
                     ["sampler.max_model_len = 16", "shorter than a task sequence", "warmstart.task.digits = 4",
                      "at least 17"], id="max-model-len-below-sequence"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, warmstart: {steps: 10, warmup: 30}}\n",
                     ["base.warmstart", "warmup (30)", "exceeds steps (10)"], id="warmstart-phases"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, sampler: {block_size: 48}}\n",
                     ["base.sampler.vllm.block_size", "multiple of 32"], id="kv-block-size"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, preset: requant, backend: verl,"
                     " verl: {hardware: cpu, rollout: sglang}}\n",
                     ["preset 'requant' with verl.rollout = 'sglang'", "use verl.rollout: vllm"],
                     id="requant-on-sglang"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, preset: all, sampler: {engine: sglang}}\n",
                     ["the SGLang engine cannot run schemes ['mxfp8'] on CPU", "need AMX",
                      "use sampler.engine: vllm or a BF16-sampler preset"], id="mxfp8-on-sglang"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, preset: bf16-e2e,"
                     " sampler: {engine: sglang, kv_cache_dtype: fp8_e4m3}}\n", ["kv_cache_dtype = 'fp8_e4m3' with sampler.engine: sglang",
                                                "use kv_cache_dtype: auto"], id="fp8-kv-on-sglang"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, preset: bf16-e2e, backend: verl,"
                     " sampler: {engine: sglang}, verl: {hardware: cpu}}\n",
                     ["sampler.engine: sglang with backend: verl", "set verl.rollout: sglang"], id="sglang-engine-on-verl"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}axes: {{seed: []}}\n", ["axes", "['seed'] have no values"],
                     id="empty-axis"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}axes: {{seed: [0, 1, 0]}}\n",
                     ["the axes produce identical runs", "remove the repeated values"], id="duplicate-runs"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}axes: {{preset: [all], seed: [0]}}\nconcurrency: 2\n",
                     ["'concurrency' is gone", "dispatched on Ray", "resources: {num_cpus: 2}"], id="concurrency-gone"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}resources: {{num_cpus: 0}}\n",
                     ["resources.num_cpus", "greater than 0"], id="resources-cpus"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}resources: {{gpus: 1}}\n",
                     ["resources.gpus", "unknown field", "memory_gb, num_cpus, num_gpus"], id="resources-unknown"),
        pytest.param("- just\n- a list\n", ["expected a mapping with 'sweep', 'base' and 'axes', got list"],
                     id="not-a-mapping"),
        pytest.param("", ["expected a mapping", "got NoneType"], id="empty-file"),
        pytest.param("sweep: t\nbase: {model: [qwen3\n", ["not valid YAML"], id="invalid-yaml"),
        pytest.param(f"sweep: t\nbase:{GOOD_BASE}  model: qwen3-moe-mini\n",
                     ["duplicate key 'model'", "line 7", "first at line 4"], id="duplicate-key"),
    ],
)
def test_bad_config_fails_fast_naming_file_and_field(tmp_path, body, expect):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        Sweep.load(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for part in expect:
        assert part in msg, f"{part!r} not in:\n{msg}"
    assert "Traceback" not in msg


def test_native_runs_on_sglang_load_for_bf16_samplers_and_the_correctness_stage_refuses_sglang(tmp_path):
    """sampler.engine: sglang with a sampler holding BF16 layers (bf16-e2e, bf16-sampler), BF16 or FP32: valid
    runs; the correctness stage (faults planted in vLLM's engine and workers) refuses it in one line."""
    body = ("sweep: t\nbase: {model: qwen3-dense-mini, sampler: {engine: sglang}}\n"
            "axes: {preset: [bf16-e2e, bf16-sampler], sampler.dtype: [bfloat16, float32]}\n")
    runs = Sweep.load(write_beside_models(tmp_path, body)).runs
    assert sorted((r.config.preset, r.config.sampler.dtype) for r in runs) == [
        ("bf16-e2e", "bfloat16"), ("bf16-e2e", "float32"), ("bf16-sampler", "bfloat16"), ("bf16-sampler", "float32")]
    assert {r.config.sampler.engine for r in runs} == {"sglang"}
    path = tmp_path / "fw.yaml"
    path.write_text(body + "correctness: {preset: bf16-e2e, base: {sampler: {engine: sglang}}}\n")
    with pytest.raises(ConfigError) as e:
        Sweep.load(path)
    assert str(e.value) == (f"{path}: correctness: sampler.engine: sglang in the correctness stage: its faults are "
                            "planted in vLLM's engine and its workers; use sampler.engine: vllm there")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        Sweep.load(tmp_path / "nope.yaml")
    assert f"{tmp_path / 'nope.yaml'}: no such config file" in str(e.value)


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("hidden_size", 100, ["hidden_size = 100 is not a multiple of 32", "MXFP8 block size", "96 or 128"]),
        ("intermediate_size", 390, ["intermediate_size = 390 is not a multiple of 32", "MXFP8 block size"]),
        ("vocab_size", 1000, ["vocab_size", "not a multiple of 32"]),
        ("head_dim", 20, ["num_attention_heads·head_dim", "not a multiple of 32", "MXFP8 block size"]),
        ("num_key_value_heads", 3, ["not a multiple of num_key_value_heads (3)", "valid num_key_value_heads"]),
    ],
)
def test_bad_model_spec_names_the_spec_file_and_field(tmp_path, field, value, expect):
    spec = (MODELS / "qwen3-dense-mini.yaml").read_text()
    lines = [f"{field}: {value}" if line.startswith(f"{field}:") else line for line in spec.splitlines()]
    models = tmp_path / "models"
    models.mkdir()
    (models / "bad-mini.yaml").write_text("\n".join(lines).replace("name: qwen3-dense-mini", "name: bad-mini") + "\n")
    path = tmp_path / "sweep.yaml"
    path.write_text("sweep: t\nbase: {model: bad-mini, warmstart: {steps: 300, warmup: 30, task: {digits: 2}}}\n")
    with pytest.raises(ConfigError) as e:
        Sweep.load(path)
    msg = str(e.value)
    assert str(path) in msg and str(models / "bad-mini.yaml") in msg and f": {field}" in msg, msg
    for part in expect:
        assert part in msg, f"{part!r} not in:\n{msg}"
    assert MXFP8_BLOCK == 32


@pytest.mark.parametrize("section, expect", [
    ("{presets: [all, nope]}", "unknown presets ['nope']"),
    ("{presets: [all, all]}", "presets must be distinct"),
    ("{steps: [8, 0]}", "steps must be distinct RL step counts ≥ 0 in increasing order"),
    ("{held_out: 1}", "matching.held_out"),
    ("{ablations: [{preset: all}]}", "ablations repeat a variant: ['all']"),
    ("{ablations: [{preset: all, engine_dtype: float16}]}", "matching.ablations.0.engine_dtype"),
    ("{ablations: [{preset: all, activation_rule: up}]}", "matching.ablations.0.activation_rule"),
    ("{ablations: [{preset: x, learner_forward: fp32}]}", "unknown preset 'x'"),
    ("{ablations: [{preset: half, engine: sglang}]}", "preset 'half' with engine 'sglang': the SGLang engine cannot run"),
    ("{ablations: [{preset: bf16-sampler, engine: trt}]}", "matching.ablations.0.engine"),
    ("{ablation_models: [qwen3-moe-tiny]}", "matching.ablation_models names ['qwen3-moe-tiny'], which no run"),
    ("{held_outs: 3}", "matching.held_outs"),
])
def test_a_bad_section_names_the_file_and_the_field(tmp_path, section, expect):
    path = write_beside_models(tmp_path, FIXED_BASE + f"matching: {section}\n")
    with pytest.raises(ConfigError) as e:
        Sweep.load(path)
    assert str(path) in str(e.value) and expect in str(e.value), str(e.value)


def test_read_sweep_validates_the_file_with_its_overrides_and_expands_nothing(tmp_path):
    """The file read and validated as written: a model without a spec file is found only by the expansion."""
    path = write(tmp_path, f"sweep: t\nbase:{GOOD_BASE}axes: {{seed: [0, 1], model: [qwen3-dense-mini, qwen3-giant]}}\n")
    sweep = read_sweep(path, ["axes.seed=[2]", "learner.lr=3.0e-4"])
    assert (sweep.sweep, sweep.axes, sweep.base["learner"], sweep.base["model"]) == (
        "t", {"seed": [2], "model": ["qwen3-dense-mini", "qwen3-giant"]}, {"lr": 3e-4}, "qwen3-dense-mini")
    with pytest.raises(ConfigError) as e:
        Sweep.load(path, ["axes.seed=[2]"])
    assert f"{path}: base: model 'qwen3-giant': no spec file {MODELS / 'qwen3-giant.yaml'}" in str(e.value)
    assert str(e.value).endswith("(in the run seed=2, model=qwen3-giant)")

