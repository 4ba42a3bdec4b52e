"""Experiment configs: every shipped sweep loads and expands to stable, unique runs; overrides take effect;
bad configs fail fast with a message naming the file, the field and what would be valid."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from pathlib import Path

import pytest

from fp8rl_core.config import ConfigError, LearnerSection, Run, RunConfig, load_sweep, run_id, run_name, run_tags
from fp8rl_core.identity import digest
from fp8rl_core.learner.spec import MXFP8_BLOCK, load_model_spec, spec_hash
from fp8rl_core.sampler.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
MODELS = CONFIGS / "models"

#: every sweep shipped under configs/ and its number of runs (a new config must be added here)
EXPECTED_RUNS = {
    "smoke.yaml": 30,
    "dense-matching.yaml": 12,
    "moe-grids.yaml": 12,
    "microbatch-sweep.yaml": 30,
    "dense-matching-small.yaml": 16,
    "moe-grids-small.yaml": 32,
    "matching-fixed-weights.yaml": 6,
    "nightly.yaml": 12,
    "verl-smoke.yaml": 8,
    "nightly-verl.yaml": 2,
    "gpu/qwen3-8b.yaml": 18,
    "gpu/qwen3-30b-a3b.yaml": 18,
}
CPU_CONFIGS = [n for n in EXPECTED_RUNS if not n.startswith("gpu/")]


def _shipped() -> list[str]:
    return sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.y*ml") if "models" not in p.parts)


def _ids(runs: list[RunConfig]) -> list[str]:
    return [run_id(r) for r in runs]


def configs(path, overrides=()) -> list[RunConfig]:
    """The run configs of a sweep file, in its order."""
    return [r.config for r in load_sweep(path, overrides)[1]]


def test_every_shipped_config_is_listed():
    assert _shipped() == sorted(EXPECTED_RUNS)


@pytest.mark.parametrize("name", sorted(EXPECTED_RUNS))
def test_shipped_config_loads_and_expands(name):
    sweep, expanded = load_sweep(CONFIGS / name)
    runs = [r.config for r in expanded]
    assert len(runs) == EXPECTED_RUNS[name] == math.prod(len(v) for v in sweep.axes.values())
    ids = _ids(runs)
    # each run's identity computed once, at expansion: the id, name and tags of its config, the spec it read
    # (a fixed-weights run's id also hashes the matching section: tests/core/test_config_matching.py)
    if sweep.matching is None:
        assert [(r.id, r.name, r.tags, r.spec) for r in expanded] == [(run_id(c), run_name(c), run_tags(c), c.spec())
                                                                        for c in runs]
    else:
        assert [(r.id, r.spec) for r in expanded] == [(digest(f"{run_id(c)}:{sweep.matching.id()}", 12), c.spec())
                                                      for c in runs]
    assert all(isinstance(r, Run) for r in expanded)
    assert len(set(ids)) == len(ids), "run ids must be unique within a sweep"
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)
    # stable: the same file gives the same ids, in the same (file) order
    assert _ids(configs(CONFIGS / name)) == ids
    # the id is the SHA-256 of the resolved config's canonical JSON, without the machine's models_dir,
    # plus the hash of the model spec's contents
    r = runs[0]
    body = r.model_dump(mode="json", exclude={"models_dir"}) | {"model_spec": spec_hash(r.spec())}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert ids[0] == hashlib.sha256(canon.encode()).hexdigest()[:12]
    # the runs are the cartesian product of the axes in file order
    keys = list(sweep.axes)
    for run, combo in zip(runs, itertools.product(*sweep.axes.values())):
        dumped = run.model_dump(mode="json")
        for key, value in zip(keys, combo):
            cur = dumped
            for part in key.split("."):
                cur = cur[part]
            assert cur == value
    for run in runs:
        spec = run.spec()
        assert spec.name == Path(run.spec_path()).stem


@pytest.mark.parametrize("name", sorted(EXPECTED_RUNS))
def test_shipped_config_loads_the_same_from_any_working_directory(name, tmp_path, monkeypatch):
    ids = _ids(configs(CONFIGS / name))
    monkeypatch.chdir(tmp_path)
    assert _ids(configs(CONFIGS / name)) == ids


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_cpu_configs_are_cpu_scale(name):
    """The CPU sweeps use the mini or small models, a short warm start and a few hundred prompts per run, so
    each finishes in minutes (measured: dense-matching and moe-grids, 8 steps x 16 prompts, ~3 min for 9 runs;
    the small sweeps: docs/results/power.md)."""
    runs = configs(CONFIGS / name)
    for r in runs:
        assert r.model in ("qwen3-dense-mini", "qwen3-moe-mini", "qwen3-dense-small", "qwen3-moe-small")
        assert r.warmstart.steps <= 1000 and r.warmstart.task.digits == 2
        assert r.loop.steps <= 8 and r.loop.steps * r.loop.prompts_per_step <= 256


def test_shipped_sweeps_cover_the_reference_results():
    dense = configs(CONFIGS / "dense-matching.yaml")
    assert {r.preset for r in dense} == {"bf16-sampler", "half", "all", "requant"}
    assert {r.model for r in dense} == {"qwen3-dense-mini"} and len({r.seed for r in dense}) >= 3
    moe = configs(CONFIGS / "moe-grids.yaml")
    assert {"all", "requant", "other-grid", "bf16-e2e"} == {r.preset for r in moe}
    assert {r.model for r in moe} == {"qwen3-moe-mini"} and len({r.seed for r in moe}) >= 3
    mb = configs(CONFIGS / "microbatch-sweep.yaml")
    assert {r.preset for r in mb} == {"bf16-e2e", "all"}
    assert sorted({r.learner.tokens_per_microbatch for r in mb}) == [256, 512, 1024, 2048, 4096]
    assert len({r.seed for r in mb}) >= 3
    nightly = configs(CONFIGS / "nightly.yaml")
    assert {(r.model, r.preset) for r in nightly} == {(m, p) for m in ("qwen3-dense-mini", "qwen3-moe-mini")
                                                       for p in PRESETS}
    assert {r.seed for r in nightly} == {0}
    for name, model in (("gpu/qwen3-8b.yaml", "qwen3-8b"), ("gpu/qwen3-30b-a3b.yaml", "qwen3-30b-a3b")):
        runs = configs(CONFIGS / name)
        assert {r.model for r in runs} == {model} and {r.preset for r in runs} == set(PRESETS)
        assert len({r.seed for r in runs}) >= 3
        assert Path(runs[0].spec_path()) == MODELS / f"{model}.yaml"


def test_small_sweeps_cover_the_issue_16_experiments():
    """dense-matching-small: claims a/b on the dense small; moe-grids-small: claims d/e on the MoE small and,
    on the same presets, seeds and protocol, the MoE mini — the block-size ablation (one 128×128 block per
    expert matrix vs ≥ 4×4), with a warm start per model that starts both at a comparable reward."""
    dense = configs(CONFIGS / "dense-matching-small.yaml")
    assert {r.preset for r in dense} == {"bf16-sampler", "half", "all", "requant"} and {r.model for r in dense} == {"qwen3-dense-small"}
    moe = configs(CONFIGS / "moe-grids-small.yaml")
    assert {(r.model, r.preset) for r in moe} == {(m, p) for m in ("qwen3-moe-mini", "qwen3-moe-small")
                                                   for p in ("all", "requant", "other-grid", "bf16-e2e")}
    for runs in (dense, [r for r in moe if r.model == "qwen3-moe-mini"], [r for r in moe if r.model == "qwen3-moe-small"]):
        assert len({r.seed for r in runs}) >= 4
        # one warm start and one RL/probe protocol per model
        assert len({(r.warmstart, r.learner, r.loop, r.metrics) for r in runs}) == 1
    # the two MoE models differ only in the model and the warm start's length
    mini = next(r for r in moe if r.model == "qwen3-moe-mini")
    small = next(r for r in moe if r.model == "qwen3-moe-small")
    assert (mini.warmstart.steps, small.warmstart.steps) == (800, 350)
    assert mini.warmstart.model_copy(update={"steps": 350}) == small.warmstart
    assert (mini.learner, mini.loop, mini.metrics, mini.sampler) == (small.learner, small.loop, small.metrics, small.sampler)


def test_gpu_model_specs_hold_the_published_architectures():
    dense = load_model_spec(MODELS / "qwen3-8b.yaml")
    assert (dense.kind, dense.vocab_size, dense.hidden_size, dense.intermediate_size, dense.num_hidden_layers,
            dense.num_attention_heads, dense.num_key_value_heads, dense.head_dim, dense.max_position_embeddings,
            dense.tie_word_embeddings, dense.rope_theta) == (
        "dense", 151936, 4096, 12288, 36, 32, 8, 128, 40960, False, 1e6)
    moe = load_model_spec(MODELS / "qwen3-30b-a3b.yaml")
    assert (moe.kind, moe.vocab_size, moe.hidden_size, moe.intermediate_size, moe.num_hidden_layers,
            moe.num_attention_heads, moe.num_key_value_heads, moe.head_dim, moe.max_position_embeddings,
            moe.moe_intermediate_size, moe.num_experts, moe.num_experts_per_tok, moe.tie_word_embeddings) == (
        "moe", 151936, 2048, 6144, 48, 32, 4, 128, 40960, 768, 128, 8, False)


# ----------------------------------------------------------------------------------------------------
# Overrides
# ----------------------------------------------------------------------------------------------------
SMOKE = CONFIGS / "smoke.yaml"


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
    assert len(set(_ids(runs))) == n_runs


def test_override_of_a_dotted_axis():
    """Axis keys are dotted field paths; ``axes.<key>=...`` replaces that axis, it does not nest."""
    mb = CONFIGS / "microbatch-sweep.yaml"
    runs = configs(mb, ["axes.learner.tokens_per_microbatch=[512]", "axes.seed=[0]"])
    assert [(r.preset, r.learner.tokens_per_microbatch) for r in runs] == [("bf16-e2e", 512), ("all", 512)]
    for shadowed in ("learner.tokens_per_microbatch=512", "learner={tokens_per_microbatch: 512}"):
        with pytest.raises(ConfigError, match="'learner.tokens_per_microbatch' is an axis"):
            load_sweep(mb, [shadowed])
    # a section override that leaves the axis' field alone is fine
    runs = configs(mb, ["learner={lr: 2.0e-3, group_size: 4}"])
    assert len(runs) == 30 and {r.learner.lr for r in runs} == {2e-3}


def test_overrides_change_only_what_they_name():
    base = configs(SMOKE)
    runs = configs(SMOKE, ["learner.lr=1e-3"])  # smoke already has lr 1e-3: the same runs
    assert _ids(runs) == _ids(base)
    subset = configs(SMOKE, ["axes.seed=[0]"])
    assert set(_ids(subset)) <= set(_ids(base))
    changed = configs(SMOKE, ["learner.lr=2e-3"])  # another run: another id (a sweep does not skip it)
    assert set(_ids(changed)).isdisjoint(_ids(base))


@pytest.mark.parametrize("override", ["seed=3", "base.seed=3", "preset=half", "model=qwen3-moe-tiny"])
def test_override_of_a_field_an_axis_sets_is_refused(override):
    with pytest.raises(ConfigError) as e:
        load_sweep(SMOKE, [override])
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
        load_sweep(SMOKE, [override])
    assert expect in str(e.value)


# ----------------------------------------------------------------------------------------------------
# Bad configs
# ----------------------------------------------------------------------------------------------------
def _write(tmp_path: Path, body: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body.replace("MODELS", str(MODELS)))
    return path


GOOD_BASE = """
  models_dir: MODELS
  model: qwen3-dense-mini
  warmstart: {steps: 300, warmup: 30, task: {digits: 2}}
  sampler: {max_model_len: 64}
"""


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
                     ["base.sampler.block_size", "multiple of 32"], id="kv-block-size"),
        pytest.param("sweep: t\nbase: {models_dir: MODELS, model: qwen3-dense-mini, preset: requant, backend: verl,"
                     " verl: {hardware: cpu, rollout: sglang}}\n",
                     ["preset 'requant' with verl.rollout = 'sglang'", "use verl.rollout: vllm"],
                     id="requant-on-sglang"),
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
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for part in expect:
        assert part in msg, f"{part!r} not in:\n{msg}"
    assert "Traceback" not in msg


def test_duplicate_runs_between_an_axis_and_the_base(tmp_path):
    """Two axis values that resolve to the same config (the default and the same value spelled out)."""
    path = _write(tmp_path, f"sweep: t\nbase:{GOOD_BASE}axes: {{learner.lr: [1.0e-4, 0.0001]}}\n")
    with pytest.raises(ConfigError, match="identical runs"):
        load_sweep(path)


def test_sequence_longer_than_the_model(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "short.yaml").write_text((MODELS / "qwen3-dense-mini.yaml").read_text().replace(
        "name: qwen3-dense-mini", "name: short").replace("max_position_embeddings: 64", "max_position_embeddings: 16"))
    path = _write(tmp_path, "sweep: t\nbase: {model: short, warmstart: {steps: 300, warmup: 30, task: {digits: 4}}}\n")
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert "model 'short' has max_position_embeddings = 16, shorter than the task's 17 tokens" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_sweep(tmp_path / "nope.yaml")
    assert f"{tmp_path / 'nope.yaml'}: no such config file" in str(e.value)


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [
        ("hidden_size", 100, ["hidden_size = 100 is not a multiple of 32", "MXFP8 block size", "96 or 128"]),
        ("intermediate_size", 390, ["intermediate_size = 390 is not a multiple of 32", "MXFP8 block size"]),
        ("vocab_size", 1000, ["vocab_size", "greater than or equal to 1024"]),
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
        load_sweep(path)
    msg = str(e.value)
    assert str(path) in msg and str(models / "bad-mini.yaml") in msg and f": {field}" in msg, msg
    for part in expect:
        assert part in msg, f"{part!r} not in:\n{msg}"
    assert MXFP8_BLOCK == 32


def test_models_dir_is_relative_to_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "mini.yaml").write_text(
        (MODELS / "qwen3-dense-mini.yaml").read_text().replace("name: qwen3-dense-mini", "name: mini"))
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "sweep.yaml"
    path.write_text("sweep: t\nbase: {model: mini, models_dir: ../specs, "
                    "warmstart: {steps: 300, warmup: 30, task: {digits: 2}}}\n")
    monkeypatch.chdir(ROOT)
    runs = configs(path)
    assert Path(runs[0].models_dir) == tmp_path / "specs" and runs[0].spec().name == "mini"
    monkeypatch.chdir(tmp_path / "sub")
    assert _ids(configs(path)) == _ids(runs)
    # the id does not depend on where the specs live (the same run on every machine)
    assert "models_dir" not in json.dumps(runs[0].model_dump(mode="json", exclude={"models_dir"}))
    assert os.path.isabs(runs[0].models_dir)


def test_editing_the_model_spec_changes_the_run_id(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    spec = (Path(__file__).resolve().parents[2] / "configs" / "models" / "qwen3-dense-mini.yaml").read_text()
    (models / "m.yaml").write_text(spec)
    cfg = tmp_path / "s.yaml"
    cfg.write_text("sweep: t\nbase: {model: m, warmstart: {steps: 100, warmup: 10, task: {digits: 2}}}\n")
    (before,) = configs(cfg)
    id_before = run_id(before)
    (models / "m.yaml").write_text(spec.replace("rms_norm_eps: 1.0e-6", "rms_norm_eps: 1.0e-5"))
    (after,) = configs(cfg)
    assert before == after  # the run config itself is unchanged ...
    assert run_id(after) != id_before  # ... but the architecture is not


# ----------------------------------------------------------------------------------------------------
# One config tree: each section builds its component's config; the defaults are declared once
# ----------------------------------------------------------------------------------------------------
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
    from fp8rl_core.config import LearnerSection

    assert LearnerSection().build(PRESETS[preset]) == PRESETS[preset].learner_config()


def test_every_learner_setting_reaches_the_learner_config():
    from fp8rl_core.config import LearnerSection

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

    from fp8rl_core.checks.runner import CheckPolicy
    from fp8rl_core.metrics.summary import run_kl_summary

    run = RunConfig(sampler={"dtype": "float32"})
    assert run.check_policy() == CheckPolicy()  # float32 engine, learner grid: the policy's own bounds
    assert RunConfig().check_policy() == CheckPolicy(w7_mean=0.5, w7_max=8.0)  # BF16 engine: the coarse bound
    assert RunConfig(checks={"full_every": 3}).check_policy().full_every == 3
    defaults = inspect.signature(run_kl_summary).parameters
    assert (run.metrics.bootstrap, run.metrics.ci_level) == (defaults["n_boot"].default, defaults["level"].default)
    assert tuple(run.check_probe().shape) == (run.checks.probe_sequences, run.warmstart.task.seq_len)


def test_a_learner_config_for_another_preset_is_refused():
    from fp8rl_core.loop import start_pipeline

    with pytest.raises(ValueError, match=r"preset 'bf16-e2e' bf16 on 'none'.*PRESETS\['bf16-e2e'\]\.learner_config"):
        start_pipeline("/nonexistent", "bf16-e2e", learner=PRESETS["all"].learner_config())


def test_importing_the_config_loads_no_model_library():
    """fp8rl_core.config validates configs with light modules only: no vLLM, no transformers (torch is
    still loaded: the task's prompts, the presets' layer patterns and the checks' policy live beside it)."""
    import subprocess
    import sys

    code = ("import sys, fp8rl_core.config; "
            "print(','.join(m for m in ('vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == ""


def test_learner_device_defaults_to_cpu_and_stays_out_of_run_ids():
    from fp8rl_core.config import LearnerSection, run_id

    runs = configs(CONFIGS / "smoke.yaml")
    run = runs[0]
    assert run.learner.device == "cpu" and run.learner_config().device == "cpu"
    on_gpu = run.model_copy(update={"learner": run.learner.model_copy(update={"device": "cuda:0"})})
    assert on_gpu.learner_config().device == "cuda:0"
    assert run_id(on_gpu) == run_id(run)  # where it runs, not what it is (like models_dir)
    assert "device" not in run.model_dump(mode="json")["learner"]
    with pytest.raises(ValueError, match="learner device must be cpu or cuda"):
        LearnerSection(device="meta")


# ----------------------------------------------------------------------------------------------------
# per_model: settings that differ by model
# ----------------------------------------------------------------------------------------------------
PER_MODEL = f"""sweep: t
base:{GOOD_BASE}axes: {{model: [qwen3-dense-mini, qwen3-moe-mini], seed: [0, 1]}}
per_model:
  qwen3-moe-mini: {{warmstart: {{steps: 700}}, learner: {{lr: 3.0e-4}}}}
"""


def test_per_model_settings_reach_only_that_models_runs_and_merge_over_base(tmp_path):
    runs = configs(_write(tmp_path, PER_MODEL))
    by = {(r.model, r.seed): r for r in runs}
    assert len(runs) == 4
    for seed in (0, 1):
        dense, moe = by[("qwen3-dense-mini", seed)], by[("qwen3-moe-mini", seed)]
        assert (dense.warmstart.steps, dense.learner.lr) == (300, LearnerSection().lr)
        # merged: the rest of base's warm start (warmup, task) stays
        assert (moe.warmstart.steps, moe.warmstart.warmup, moe.warmstart.task.digits, moe.learner.lr) == (700, 30, 2, 3e-4)
    # a dotted override reaches a per-model setting
    runs = configs(_write(tmp_path, PER_MODEL), ["per_model.qwen3-moe-mini.warmstart.steps=650"])
    assert {r.warmstart.steps for r in runs if r.model == "qwen3-moe-mini"} == {650}


@pytest.mark.parametrize("tail,expect", [
    ("per_model: {qwen3-moe-small: {warmstart: {steps: 10}}}",
     "per_model names ['qwen3-moe-small'], which no run of this sweep uses; its models are ['qwen3-dense-mini', 'qwen3-moe-mini']"),
    ("per_model: {qwen3-moe-mini: {seed: 3}}", "per_model.qwen3-moe-mini.seed conflicts with the axis 'seed'"),
    ("per_model: {qwen3-moe-mini: {warmstart: {stepz: 3}}}", "base.warmstart.stepz: unknown field"),
])
def test_bad_per_model_settings_are_refused_naming_the_setting(tmp_path, tail, expect):
    body = f"sweep: t\nbase:{GOOD_BASE}axes: {{model: [qwen3-dense-mini, qwen3-moe-mini], seed: [0, 1]}}\n{tail}\n"
    with pytest.raises(ConfigError) as e:
        load_sweep(_write(tmp_path, body))
    assert expect in str(e.value) and str(tmp_path) in str(e.value)
