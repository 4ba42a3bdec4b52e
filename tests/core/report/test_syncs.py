"""The weight-sync checks grouped by what the sampler holds (fp8rl_core.report.syncs), on synthetic sweeps
(tests/core/report/sweeps.py: the cheap tier W1, W2, W4, W5, W6 at 2 syncs per run)."""

from __future__ import annotations

import pandas as pd

from fp8rl_core.report.syncs import Tally, sync_groups
from fp8rl_core.sampler.presets import PRESETS

from .sweeps import BASE_DELTA, DENSE, make_sweep

EVERY_PRESET = ("bf16-e2e", "bf16-sampler", "half", "all", "requant", "other-grid")


def test_the_presets_say_what_their_sampler_holds():
    assert {n: p.scheme.name for n, p in PRESETS.items()} == {
        "bf16-e2e": "bf16", "bf16-sampler": "bf16", "half": "mxfp8", "all": "mxfp8", "requant": "requant",
        "other-grid": "block128"}
    assert [n for n, p in PRESETS.items() if p.scheme.on_learner_grid] == ["half", "all"]


def test_each_runs_syncs_fall_in_the_group_its_preset_names():
    data = make_sweep(presets=EVERY_PRESET, models=(DENSE,), seeds=(0, 1), steps=False,
                      levels={"requant": BASE_DELTA})
    groups = sync_groups(data)
    got = [(g.holds, g.presets, g.runs, g.syncs, g.key_tallies(), g.checks, g.failures) for g in groups]
    assert got == [
        ("mxfp8", ("half", "all"), 4, 8, [("W2", Tally(8, 8))], Tally(40, 40), ()),
        ("bf16", ("bf16-e2e", "bf16-sampler"), 4, 8, [("W4", Tally(8, 8))], Tally(40, 40), ()),
        ("requant", ("requant",), 2, 4, [("W2", Tally(4, 4)), ("W4", Tally(4, 4))], Tally(20, 20), ()),
        ("block128", ("other-grid",), 2, 4, [("W4", Tally(4, 4))], Tally(20, 20), ()),
    ]
    assert groups[0].tally("W3") is None and groups[0].tally("W5") == Tally(8, 8)


def test_a_failure_is_named_in_its_own_group():
    data = make_sweep(presets=("all", "bf16-sampler"), models=(DENSE,), seeds=(0, 1), fail_w2=True, steps=False)
    learner, bf16 = sync_groups(data)
    assert learner.failures == () and learner.tally("W2") == Tally(4, 4)
    assert bf16.tally("W2") == Tally(3, 4) and bf16.checks == Tally(19, 20)
    assert bf16.failures == (("W2", "dense-mini/bf16-sampler/s0 sync 2 (model.layers.0.mlp.down_proj)"),)
    assert bf16.failed(("W4",)) == [] and bf16.summary().endswith(
        "; failed: dense-mini/bf16-sampler/s0 sync 2 (model.layers.0.mlp.down_proj)")


def test_checks_of_runs_outside_the_sweep_are_their_own_group():
    data = make_sweep(presets=("all",), models=(DENSE,), seeds=(0,), steps=False)
    stray = data.checks.assign(run_id="not-a-run")
    data.checks = pd.concat([data.checks, stray], ignore_index=True)
    learner, unknown = sync_groups(data)
    assert (learner.holds, learner.runs, learner.syncs, learner.checks) == ("mxfp8", 1, 2, Tally(10, 10))
    assert (unknown.holds, unknown.presets, unknown.runs, unknown.syncs) == ("unknown", (), 1, 2)
    assert unknown.summary().startswith("runs not among the sweep's runs (no preset): 2 syncs of 1 run, W1 2/2 passed")


def test_no_checks_no_groups():
    assert sync_groups(make_sweep(presets=("all",), models=(DENSE,), seeds=(0,), steps=False, checks=False)) == []
