"""The fixed-weights sweep's config: the ``matching`` section validates its presets, ablations and
checkpoints naming what is wrong; its runs get ids that also hash the section, names that say what they
are, RL to the last checkpoint; the shipped config measures every preset on both small models with the
warm starts and RL settings of the small sweeps, and its ablations on the dense one."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8rl_core.config import ConfigError, MatchingSection, load_sweep
from fp8rl_core.sampler.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "configs" / "matching-fixed-weights.yaml"
BASE = "sweep: fw\nbase: {model: qwen3-dense-tiny, warmstart: {steps: 100, task: {digits: 2}}}\naxes: {seed: [0, 1]}\n"


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fw.yaml"
    path.write_text(body)
    (tmp_path / "models").symlink_to(ROOT / "configs" / "models")
    return path


def test_the_shipped_config_measures_every_preset_at_two_checkpoints_per_seed():
    sweep, runs = load_sweep(SHIPPED)
    m = sweep.matching
    assert set(m.presets) == set(PRESETS) and m.steps == [0, 8] and (m.held_out, m.sampled) == (1024, 1024)
    assert [(r.config.model, r.config.seed) for r in runs] == [(mo, s) for mo in ("qwen3-dense-small", "qwen3-moe-small")
                                                               for s in (0, 1, 2)]
    assert {r.config.preset for r in runs} == {"all"} and {r.config.loop.steps for r in runs} == {8}
    assert [r.name for r in runs[:2]] == ["dense-small·fixed-weights·s0", "dense-small·fixed-weights·s1"]
    assert all(r.tags["experiment"] == "fixed-weights" for r in runs)
    assert all(r.config.warmstart.seed == r.config.seed for r in runs)  # each seed its own warm start
    small = load_sweep(ROOT / "configs" / "dense-matching-small.yaml")[1][0].config
    dense = runs[0].config
    assert (dense.warmstart, dense.learner) == (small.warmstart, small.learner)  # the small sweeps' protocol
    assert dense.loop.prompts_per_step == small.loop.prompts_per_step
    moe_small = load_sweep(ROOT / "configs" / "moe-grids-small.yaml")[1]
    moe = next(r.config for r in moe_small if r.config.model == "qwen3-moe-small")
    assert runs[3].config.warmstart == moe.warmstart
    names = [v.name for v in m.variants("qwen3-dense-small")]
    assert names[:6] == list(m.presets) and "all@engine=float32,learner=fp32" in names
    assert "bf16-sampler@engine=float32,learner=fp32" in names and "all@activations=floor" in names
    assert [v.name for v in m.variants("qwen3-moe-small")] == list(m.presets)  # ablations: dense only


def test_ids_hash_the_section_so_a_changed_variant_list_is_a_new_run():
    _, runs = load_sweep(SHIPPED)
    _, fewer = load_sweep(SHIPPED, ["matching.presets=[bf16-sampler, all]"])
    _, same = load_sweep(SHIPPED)
    assert [r.id for r in runs] == [r.id for r in same]
    assert not {r.id for r in runs} & {r.id for r in fewer}
    assert len({r.id for r in runs}) == len(runs)


@pytest.mark.parametrize("section, expect", [
    ("{presets: [all, nope]}", "unknown presets ['nope']"),
    ("{presets: [all, all]}", "presets must be distinct"),
    ("{steps: [8, 0]}", "steps must be distinct RL step counts ≥ 0 in increasing order"),
    ("{held_out: 1}", "matching.held_out"),
    ("{ablations: [{preset: all}]}", "ablations repeat a variant: ['all']"),
    ("{ablations: [{preset: all, engine_dtype: float16}]}", "matching.ablations.0.engine_dtype"),
    ("{ablations: [{preset: all, activation_rule: up}]}", "matching.ablations.0.activation_rule"),
    ("{ablations: [{preset: x, learner_forward: fp32}]}", "unknown preset 'x'"),
    ("{ablation_models: [qwen3-moe-tiny]}", "matching.ablation_models names ['qwen3-moe-tiny'], which no run"),
    ("{held_outs: 3}", "matching.held_outs"),
])
def test_a_bad_section_names_the_file_and_the_field(tmp_path, section, expect):
    path = _write(tmp_path, BASE + f"matching: {section}\n")
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert str(path) in str(e.value) and expect in str(e.value), str(e.value)


def test_a_preset_axis_is_refused_with_what_to_set_instead(tmp_path):
    path = _write(tmp_path, BASE.replace("axes: {seed: [0, 1]}", "axes: {preset: [all, half]}") + "matching: {}\n")
    with pytest.raises(ConfigError, match="set base.preset, not an axis 'preset'"):
        load_sweep(path)


def test_the_defaults_measure_every_preset_from_the_warm_start_and_after_eight_steps():
    m = MatchingSection()
    assert m.presets == list(PRESETS) and m.steps == [0, 8] and m.ablations == []
    assert [v.name for v in m.variants()] == list(PRESETS)
