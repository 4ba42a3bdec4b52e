"""A sweep's runs: every shipped sweep loads and expands to stable, unique runs (the cartesian product of
its axes, per-model settings merged); the :class:`Sweep` holds them, expanded once, with the correctness
section's runs; fixed-weights runs hash their section."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from pathlib import Path

import pytest

from fp8rl_core.config.loading import ConfigError
from fp8rl_core.config.runs import ID_NEUTRAL, ID_PLACED, Run, Sweep, run_id, run_name, run_tags, sweep_id
from fp8rl_core.config.sections import LearnerSection
from fp8rl_core.identity import digest
from fp8rl_core.learner.spec import load_model_spec, spec_hash
from fp8rl_core.sampler.presets import PRESETS
from tests.core.config.files import CONFIGS, FIXED_BASE, GOOD_BASE, MODELS, ROOT, configs, run_ids, write, write_beside_models


@pytest.fixture(autouse=True)
def _gsm8k_files(gsm8k_home):
    """configs/gpu/*.yaml read ~/data/gsm8k: the test's GSM8K files there."""


#: every sweep shipped under configs/ and its number of runs (a new config must be added here)
EXPECTED_RUNS = {
    "smoke.yaml": 30,
    "dense-matching.yaml": 12,
    "moe-grids.yaml": 12,
    "microbatch-sweep.yaml": 30,
    "dense-matching-small.yaml": 16,
    "moe-grids-small.yaml": 32,
    "matching-fixed-weights.yaml": 6,
    "matching-engines.yaml": 3,
    "nightly.yaml": 12,
    "verl-smoke.yaml": 8,
    "nightly-verl.yaml": 2,
    "clean-long.yaml": 18,
    "gpu/qwen3-8b.yaml": 18,
    "gpu/qwen3-30b-a3b.yaml": 18,
}

CPU_CONFIGS = [n for n in EXPECTED_RUNS if not n.startswith("gpu/")]
SHIPPED = CONFIGS / "matching-fixed-weights.yaml"



def _shipped() -> list[str]:
    return sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.y*ml") if "models" not in p.parts)


def test_every_shipped_config_is_listed():
    assert _shipped() == sorted(EXPECTED_RUNS)


@pytest.mark.parametrize("name", sorted(EXPECTED_RUNS))
def test_shipped_config_loads_and_expands(name):
    loaded = Sweep.load(CONFIGS / name)
    sweep, expanded = loaded.config, loaded.runs
    runs = [r.config for r in expanded]
    assert len(runs) == EXPECTED_RUNS[name] == math.prod(len(v) for v in sweep.axes.values())
    ids = run_ids(runs)
    # each run's identity computed once, at expansion: the id, name and tags of its config, the spec it read
    # (a fixed-weights run's id also hashes the matching section: below)
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
    assert run_ids(configs(CONFIGS / name)) == ids
    # the id is the SHA-256 of the resolved config's canonical JSON, without the machine's models_dir and the
    # fields added later while they hold their neutral values (ID_NEUTRAL), plus the hash of the model spec's contents
    r = runs[0]
    body = r.model_dump(mode="json", exclude={"models_dir"}) | {"model_spec": spec_hash(r.spec())}
    # a field moved since ids were issued is hashed where it was (model_path: in the verl section of a verl run;
    # left out of a native run's while unset)
    assert ID_PLACED == {"model_path": "verl"}
    # the sampler's engine subsections (sampler.vllm) are hashed flat, where their fields were first
    assert r.sampler.flat()["process"] == r.sampler.vllm.process and "vllm" not in r.sampler.flat()
    body["sampler"] = r.sampler.flat()
    if isinstance(body["verl"], dict):
        body["verl"]["model_path"] = body.pop("model_path")
    else:
        assert body.pop("model_path") is None
    for section, neutral in ID_NEUTRAL.items():
        if isinstance(body.get(section), dict):
            body[section] = {k: v for k, v in body[section].items() if neutral.get(k, object()) != v}
            if not body[section]:  # a section wholly at its neutral values (data: the addition task) is left out
                del body[section]
    assert ("data" in body) == name.startswith("gpu/")  # the GPU configs train on GSM8K, the others the task
    assert body["checks"] == {"full_every": 10, "on_failure": "fail", "probe_sequences": 8, "w7_mean": None,
                              "w7_max": None} or name.startswith(("nightly", "matching"))
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
    ids = run_ids(configs(CONFIGS / name))
    monkeypatch.chdir(tmp_path)
    assert run_ids(configs(CONFIGS / name)) == ids


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_cpu_configs_are_cpu_scale(name):
    """The CPU sweeps use the mini or small models, a short warm start and a few hundred prompts per run, so
    each finishes in minutes (measured: dense-matching and moe-grids, 8 steps x 16 prompts, ~3 min for 9 runs;
    the small sweeps: docs/results/power.md; clean-long, 40 steps x 4 prompts, 18 runs in 6 min)."""
    runs = configs(CONFIGS / name)
    for r in runs:
        assert r.model in ("qwen3-dense-mini", "qwen3-moe-mini", "qwen3-dense-small", "qwen3-moe-small")
        assert r.warmstart.steps <= 1000 and r.warmstart.task.digits == 2
        assert r.loop.steps * r.loop.prompts_per_step <= 256


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


def test_duplicate_runs_between_an_axis_and_the_base(tmp_path):
    """Two axis values that resolve to the same config (the default and the same value spelled out)."""
    path = write(tmp_path, f"sweep: t\nbase:{GOOD_BASE}axes: {{learner.lr: [1.0e-4, 0.0001]}}\n")
    with pytest.raises(ConfigError, match="identical runs"):
        Sweep.load(path)


def test_sequence_longer_than_the_model(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "short.yaml").write_text((MODELS / "qwen3-dense-mini.yaml").read_text().replace(
        "name: qwen3-dense-mini", "name: short").replace("max_position_embeddings: 64", "max_position_embeddings: 16"))
    path = write(tmp_path, "sweep: t\nbase: {model: short, warmstart: {steps: 300, warmup: 30, task: {digits: 4}}}\n")
    with pytest.raises(ConfigError) as e:
        Sweep.load(path)
    assert "model 'short' has max_position_embeddings = 16, shorter than the task's 17 tokens" in str(e.value)


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
    assert run_ids(configs(path)) == run_ids(runs)
    # the id does not depend on where the specs live (the same run on every machine)
    assert "models_dir" not in json.dumps(runs[0].model_dump(mode="json", exclude={"models_dir"}))
    assert os.path.isabs(runs[0].models_dir)


def test_editing_the_model_spec_changes_the_run_id(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    spec = (MODELS / "qwen3-dense-mini.yaml").read_text()
    (models / "m.yaml").write_text(spec)
    cfg = tmp_path / "s.yaml"
    cfg.write_text("sweep: t\nbase: {model: m, warmstart: {steps: 100, warmup: 10, task: {digits: 2}}}\n")
    (before,) = configs(cfg)
    id_before = run_id(before)
    (models / "m.yaml").write_text(spec.replace("rms_norm_eps: 1.0e-6", "rms_norm_eps: 1.0e-5"))
    (after,) = configs(cfg)
    assert before == after  # the run config itself is unchanged ...
    assert run_id(after) != id_before  # ... but the architecture is not


PER_MODEL = f"""sweep: t
base:{GOOD_BASE}axes: {{model: [qwen3-dense-mini, qwen3-moe-mini], seed: [0, 1]}}
per_model:
  qwen3-moe-mini: {{warmstart: {{steps: 700}}, learner: {{lr: 3.0e-4}}}}
"""


def test_per_model_settings_reach_only_that_models_runs_and_merge_over_base(tmp_path):
    runs = configs(write(tmp_path, PER_MODEL))
    by = {(r.model, r.seed): r for r in runs}
    assert len(runs) == 4
    for seed in (0, 1):
        dense, moe = by[("qwen3-dense-mini", seed)], by[("qwen3-moe-mini", seed)]
        assert (dense.warmstart.steps, dense.learner.lr) == (300, LearnerSection().lr)
        # merged: the rest of base's warm start (warmup, task) stays
        assert (moe.warmstart.steps, moe.warmstart.warmup, moe.warmstart.task.digits, moe.learner.lr) == (700, 30, 2, 3e-4)
    # a dotted override reaches a per-model setting
    runs = configs(write(tmp_path, PER_MODEL), ["per_model.qwen3-moe-mini.warmstart.steps=650"])
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
        Sweep.load(write(tmp_path, body))
    assert expect in str(e.value) and str(tmp_path) in str(e.value)


def test_the_shipped_config_measures_every_preset_at_two_checkpoints_per_seed():
    loaded = Sweep.load(SHIPPED)
    sweep, runs = loaded.config, loaded.runs
    m = sweep.matching
    assert set(m.presets) == set(PRESETS) and m.steps == [0, 8] and (m.held_out, m.sampled) == (1024, 1024)
    assert [(r.config.model, r.config.seed) for r in runs] == [(mo, s) for mo in ("qwen3-dense-small", "qwen3-moe-small")
                                                               for s in (0, 1, 2)]
    assert {r.config.preset for r in runs} == {"all"} and {r.config.loop.steps for r in runs} == {8}
    assert [r.name for r in runs[:2]] == ["dense-small·fixed-weights·s0", "dense-small·fixed-weights·s1"]
    assert all(r.tags["experiment"] == "fixed-weights" for r in runs)
    assert all(r.config.warmstart.seed == r.config.seed for r in runs)  # each seed its own warm start
    small = Sweep.load(CONFIGS / "dense-matching-small.yaml").runs[0].config
    dense = runs[0].config
    assert (dense.warmstart, dense.learner) == (small.warmstart, small.learner)  # the small sweeps' protocol
    assert dense.loop.prompts_per_step == small.loop.prompts_per_step
    moe_small = Sweep.load(CONFIGS / "moe-grids-small.yaml").runs
    moe = next(r.config for r in moe_small if r.config.model == "qwen3-moe-small")
    assert runs[3].config.warmstart == moe.warmstart
    names = [v.name for v in m.variants("qwen3-dense-small")]
    assert names[:6] == list(m.presets) and "all@engine=float32,learner=fp32" in names
    assert "bf16-sampler@engine=float32,learner=fp32" in names and "all@activations=floor" in names
    assert [v.name for v in m.variants("qwen3-moe-small")] == list(m.presets)  # ablations: dense only


def test_ids_hash_the_section_so_a_changed_variant_list_is_a_new_run():
    runs = Sweep.load(SHIPPED).runs
    fewer = Sweep.load(SHIPPED, ["matching.presets=[bf16-sampler, all]"]).runs
    same = Sweep.load(SHIPPED).runs
    assert [r.id for r in runs] == [r.id for r in same]
    assert not {r.id for r in runs} & {r.id for r in fewer}
    assert len({r.id for r in runs}) == len(runs)


def test_a_preset_axis_is_refused_with_what_to_set_instead(tmp_path):
    path = write_beside_models(tmp_path, FIXED_BASE.replace("axes: {seed: [0, 1]}", "axes: {preset: [all, half]}") + "matching: {}\n")
    with pytest.raises(ConfigError, match="set base.preset, not an axis 'preset'"):
        Sweep.load(path)


def test_a_sweep_is_its_file_read_and_expanded_once_and_carried_as_data(tmp_path):
    """The :class:`Sweep` holds what the flows need — the validated config, the file and overrides it came
    from, the runs, the correctness section's runs with their specs — and needs its files no more: moved
    away, nothing is missing, and it pickles (as Prefect and Ray ship it) to an equal object."""
    import pickle
    import shutil

    folder = tmp_path / "cfg"
    shutil.copytree(CONFIGS, folder, ignore=shutil.ignore_patterns("gpu"))
    path = folder / "nightly.yaml"
    sweep = Sweep.load(path, ["axes.preset=[all]"])
    shutil.rmtree(folder)
    assert (sweep.name, sweep.source, sweep.overrides) == ("nightly", str(path), ("axes.preset=[all]",))
    assert sweep.config.axes["preset"] == ["all"] and sweep.config.correctness.id() == "c926af75bff6"
    assert [r.name for r in sweep.runs] == ["dense-mini·all·s0", "moe-mini·all·s0"]
    assert sweep.id == sweep_id(sweep.runs) and len(sweep.id) == 12
    assert {k: (r.id, r.config.model, r.spec.name) for k, r in sweep.correctness.items()} == {
        "dense": ("9281b16108b4", "qwen3-dense-mini", "qwen3-dense-mini"),
        "moe": ("51366ebb7bb5", "qwen3-moe-mini", "qwen3-moe-mini")}
    assert pickle.loads(pickle.dumps(sweep)) == sweep
    assert Sweep.load(CONFIGS / "smoke.yaml").correctness == {}  # no section: no runs



def test_a_field_added_later_keeps_old_ids_at_its_neutral_value_and_changes_them_otherwise():
    """``checks.compute_copy`` / ``alarm`` / ``alarm_jump`` came after run ids were issued: at their defaults a
    run keeps its id (a finished sweep is still skipped); set otherwise, the run is another experiment."""
    base = Sweep.load(CONFIGS / "smoke.yaml").runs[0]
    off = Sweep.load(CONFIGS / "smoke.yaml", ["checks.alarm=false"]).runs[0]
    same = Sweep.load(CONFIGS / "smoke.yaml", ["checks.alarm=true", "checks.compute_copy=true"]).runs[0]
    assert same.id == base.id != off.id


def test_the_shipped_sections_id_is_the_one_it_had_before_named_checkpoints():
    assert Sweep.load(SHIPPED).config.matching.id() == "e7c9d92c5735"


NAMED = ["axes.model=[qwen3-dense-mini]", "axes.seed=[0]", "per_model={}", "matching.steps=[]", "matching.ablations=[]",
         "matching.ablation_models=null"]


@pytest.fixture(scope="module")
def verl_run_folder(tmp_path_factory):
    """A verl run's checkpoint folder of qwen3-dense-mini's shape: global_step_1 and global_step_2 (other weights)."""
    from tests.core.learner.conftest import hf_checkpoint

    spec = load_model_spec(MODELS / "qwen3-dense-mini.yaml")
    root = tmp_path_factory.mktemp("verl") / "dense-mini-all-s0"
    for step in (1, 2):
        hf_checkpoint(root / f"global_step_{step}" / "actor" / "huggingface", spec, seed=step)
    return root


def test_named_checkpoints_are_resolved_identified_and_measured_instead_of_rl_steps(verl_run_folder):
    sweep = Sweep.load(SHIPPED, [*NAMED, f"matching.checkpoints=[{verl_run_folder}]"])
    refs = sweep.config.matching.checkpoints
    assert [(r.name, r.step, r.path) for r in refs] == [
        (f"dense-mini-all-s0/step{n}", n, str(verl_run_folder / f"global_step_{n}" / "actor" / "huggingface"))
        for n in (1, 2)]
    assert len({r.weights for r in refs}) == 2 and sweep.config.matching.measured() == 2
    (run,) = sweep.runs
    assert run.name == "dense-mini·fixed-weights·s0" and run.config.loop.steps == 1  # nothing trained: no RL steps
    one = Sweep.load(SHIPPED, [*NAMED, f"matching.checkpoints=[{verl_run_folder / 'global_step_2'}]"])
    assert [r.name for r in one.config.matching.checkpoints] == ["dense-mini-all-s0/step2"]
    assert one.runs[0].id != run.id


def test_a_changed_checkpoint_is_a_new_run_and_an_unchanged_one_the_same(verl_run_folder, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    step = shutil.copytree(verl_run_folder / "global_step_1", tmp_path / "global_step_1")
    over = [*NAMED, f"matching.checkpoints=[{step}]"]
    first, again = (Sweep.load(SHIPPED, over).runs[0].id for _ in range(2))
    assert first == again
    w = step / "actor" / "huggingface" / "model.safetensors"
    tensors = load_file(w)
    tensors["model.norm.weight"][3] *= 2
    save_file(tensors, w, metadata={"format": "pt"})
    changed = Sweep.load(SHIPPED, over)
    assert changed.runs[0].id != first
    recorded = changed.config.matching.checkpoints[0]
    tensors["model.norm.weight"][3] /= 2
    save_file(tensors, w, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="its weight files changed"):  # a recorded identity is checked, not trusted
        type(recorded).model_validate(recorded.model_dump())


@pytest.mark.parametrize("extra, expect", [
    (["matching.checkpoints=[/nonexistent/ckpt]"], "matching.checkpoints: /nonexistent/ckpt: no such directory"),
    (["matching.steps=[0, 8]", "matching.checkpoints=[FOLDER]"], "checkpoints and steps [0, 8] are two sources"),
    (["matching.checkpoints=[FOLDER]", "axes.model=[qwen3-moe-mini]"],
     "matching.checkpoints.0 (FOLDER/global_step_1/actor/huggingface) is not a checkpoint of the runs' model "
     "qwen3-moe-mini: kind dense vs moe (checkpoint vs spec)"),
    (["matching.checkpoints=[FOLDER]", "base.backend=verl", "base.verl={hardware: cpu}"],
     "the fixed-weights experiment runs on the native backend"),
    ([], "steps is empty and no checkpoints are named"),
])
def test_bad_named_checkpoints_are_refused_in_one_line_naming_the_field(verl_run_folder, extra, expect):
    extra = [e.replace("FOLDER", str(verl_run_folder)) for e in extra]
    with pytest.raises(ConfigError) as e:
        Sweep.load(SHIPPED, [*NAMED, *extra])
    msg = str(e.value)
    assert expect.replace("FOLDER", str(verl_run_folder)) in msg and "\n" not in msg, msg
