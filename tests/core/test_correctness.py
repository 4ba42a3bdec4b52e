"""The correctness driver on a real engine (the dense mini, every layer on the learner's grid): a clean
series raises no alarm on the checks' cadence; an injected fault goes through the real sync path, is
caught at its first sync by the check of its declared condition, and a clean repair sync passes again."""

from __future__ import annotations

from fp8rl_core import correctness
from fp8rl_core.checks import CONDITIONS, CheckPolicy, CheckRunner
from fp8rl_core.checks.faults import fault
from fp8rl_core.checks.matrix import summarize

# the shared engine fixtures (warm-started minis, engines reused through acquire, released at the end)
from .sampler.conftest import TASK, checkpoints, engines  # noqa: F401

PROBE = TASK.prompts(16, seed=123, split="eval").sequences


def test_clean_series_then_a_fault_caught_at_its_first_sync_and_repaired(engines):
    pipe = engines.get("dense", "all")
    runner = CheckRunner(CheckPolicy(full_every=3), probe=PROBE)
    runner.start(pipe.samplers)
    v0 = pipe.learner.version
    seen = []
    clean = correctness.clean_series(pipe, runner, TASK, 3, prompts_per_step=4, seed=0, on_sync=seen.append)
    assert seen == clean
    assert [(r["sync"], r["version"], r["tier"]) for r in clean] == [(1, v0 + 1, "full"), (2, v0 + 2, "cheap"),
                                                                     (3, v0 + 3, "full")]
    assert [r["false_alarm"] for r in clean] == [False] * 3, [r["alarms"] for r in clean]
    assert all(r[f"check/{c}"] for r in clean for c in CONDITIONS if f"check/{c}" in r)
    assert {f"check/{c}" for c in CONDITIONS} == set(clean[0]) & {f"check/{c}" for c in CONDITIONS}  # full: all 7
    assert all(0 <= r["mean_reward"] <= 1 and r["step_s"] > 0 and r["checks_s"] > 0 for r in clean)

    f = fault("qkv-order-swapped")  # W3: k and v fused in the wrong order in layer 0
    row = correctness.inject(pipe, runner, TASK, f, prompts_per_step=4, seed=0)
    assert (row["fault"], row["condition"], row["stage"], row["warmup_clean"]) == (f.name, "W3", "export", True)
    assert row["caught_first"] and row["W3"] == 1 and row["tier"] == "full", row
    assert "qkv_proj" in row["declared_offenders"]
    assert row["repaired"] is True  # the clean sync of the same version after it passes every check
    assert pipe.learner.version == pipe.sampler.version == v0 + 5  # warm-up step + faulty step

    s = summarize([row], clean)
    assert (s["faults/total"], s["faults/caught_first"], s["clean/syncs"], s["clean/false_alarms"]) == (1, 1, 3, 0)
    assert "qkv-order-swapped" in s["checks"]["W3"]["fired_on"]
