"""The correctness driver on a real engine (the dense mini, every layer on the learner's grid): a clean
series raises no alarm on the checks' cadence and vLLM's own weight checksums agree with the learner's bytes
at every sync; an injected fault goes through the real sync path, is caught at its first sync by the check of
its declared condition (and by vLLM's checksums, naming the parameter), and a clean repair sync passes again.
On the MoE mini: a negated expert copy planted after a later sync is named by the compute-copy check (W6) at
that sync; with that check off, W7's probe fails there at a full-tier sync. The behavioural alarm is a suspicion:
a suspect step's sync runs the full tier, which confirms a fault there (the run fails naming it) or dismisses it as
a mismatch event of the run (the engine right, the run goes on). At tensor
parallel 2, a rotary cache nudged by one float32 step on rank 1 is named by W6's check of the engine's other
state at that cheap-tier sync."""

from __future__ import annotations

from fp8rl_core import correctness
from fp8rl_core.checks import CONDITIONS, CheckPolicy, CheckRunner
from fp8rl_core.checks.alarm import ALARM_BOUNDS, alarm_numbers
from fp8rl_core.checks.faults import fault
from fp8rl_core.checks.matrix import summarize
from fp8rl_core.checks.runner import PROBE_EVENT
from fp8rl_core.loop import RLStep
from fp8rl_core.sync.hooks import NO_HOOKS
from fp8rl_core.vocabulary import ENGINE_CHECKSUM

# the shared engine fixtures (warm-started minis, engines reused through acquire, released at the end)
from .sampler.conftest import TASK, checkpoints, engines, tp2_pipeline  # noqa: F401

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
    # vLLM's own weight checker (SHA-256 per parameter, vLLM's code) agrees with the learner's bytes at every sync
    assert [r[f"check/{ENGINE_CHECKSUM}"] for r in clean] == [True] * 3
    assert all(0 < r[f"{ENGINE_CHECKSUM}_s"] < r["step_s"] for r in clean)

    f = fault("qkv-order-swapped")  # W3: k and v fused in the wrong order in layer 0
    row = correctness.inject(pipe, runner, TASK, f, prompts_per_step=4, seed=0)
    assert (row["fault"], row["condition"], row["stage"], row["warmup_clean"]) == (f.name, "W3", "export", True)
    assert row["caught_first"] and row["W3"] == 1 and row["tier"] == "full", row
    assert "qkv_proj" in row["declared_offenders"]
    # the swapped bytes reached the engine: vLLM's checksum of that parameter disagrees with the learner's
    assert row[ENGINE_CHECKSUM] == 1, row
    offenders = row[f"{ENGINE_CHECKSUM}_offenders"].split("; ")
    assert offenders[0].startswith("tp rank 0/1: model.layers.0.self_attn.qkv_proj.weight: vLLM's SHA-256 "), offenders
    assert all("layers.0.self_attn.qkv_proj" in o for o in offenders)
    assert row["repaired"] is True  # the clean sync of the same version after it passes every check
    assert pipe.learner.version == pipe.sampler.version == v0 + 5  # warm-up step + faulty step

    s = summarize([row], clean)
    assert (s["faults/total"], s["faults/caught_first"], s["clean/syncs"], s["clean/false_alarms"]) == (1, 1, 3, 0)
    assert "qkv-order-swapped" in s["checks"]["W3"]["fired_on"]
    assert s[ENGINE_CHECKSUM] == {"clean_syncs_run": 3, "clean_syncs_not_run": 0, "clean_disagreements": 0,
                                  "faults_run": 1, "fired_on": ["qkv-order-swapped"]}


def _step(pipe, runner, fault=None):
    # 16 prompts (~320 sampled tokens) a step: at 4 (~65 tokens) how many of the step's tokens pass through the
    # negated expert depends on the draw, and the alarm missed the fault at 2 of 6 placements (docs/correctness.md)
    row, report, _ = correctness.step(pipe, runner, TASK, pipe.learner.version + 1, prompts_per_step=16, seed=0,
                                      fault=fault)
    _numbers[report.version] = alarm_numbers(row)
    return report


_numbers: dict[int, dict[str, float]] = {}  # each version's step numbers the alarm judges (alarm_numbers)


def _above_floor(version: int) -> list[str]:
    """The alarm's numbers of the step of ``version`` that rose above their floor (where a jump can count)."""
    numbers = _numbers[version]
    return [f"{b.metric} = {numbers[b.metric]:.4g}" for b in ALARM_BOUNDS if numbers.get(b.metric, 0.0) > b.floor]


def test_a_negated_expert_copy_after_a_later_sync_is_named_by_w6_and_with_that_check_off_fails_w7_there(engines):
    """expert-copy-negated (the fp32 copies expert 0 of layer 0 computes with, negated after the reload; bytes and
    scales intact) planted at the fourth sync of a runner: with the compute-copy check on, W6 names rank, layer
    and expert at that sync; with it off and that sync at the full tier (as every sync of the correctness series
    through verl), W7's probe fails there; with it off at a cheap-tier sync nothing sees it there."""
    pipe = engines.get("moe", "all")
    f = fault("expert-copy-negated")
    for compute_copy, full_every in ((True, 100), (False, 1), (False, 100)):
        runner = CheckRunner(CheckPolicy(full_every=full_every, compute_copy=compute_copy), probe=PROBE)
        runner.start(pipe.samplers)
        clean = [_step(pipe, runner) for _ in range(3)]
        assert [r.failed for r in clean] == [[], [], []], [r.message() for r in clean]  # no false alarm
        assert all("W7" in r.results_by for r in clean)  # the probe (full tier) or the alarm (cheap) ran
        at = _step(pipe, runner, f)
        again = [_step(pipe, runner) for _ in range(2)]
        assert at.results_by["W2"].passed and at.results_by["W1"].passed  # the held bytes are the learner's
        if compute_copy:  # W6 names rank, layer and expert at the fault's own sync (then the full tier runs too)
            w6 = at.results_by["W6"]
            assert not w6.passed and at.full and at.why == "cheap tier failed: W6", at.message()
            assert w6.offenders[0].startswith("tp rank 0/1: model.layers.0.mlp.experts.w13_weight expert 0: "
                                              "compute copy ≠ dequantized held bytes at "), w6.offenders
            assert "W7" in [r.condition for r in at.failed]  # the full tier's probe sees the behaviour too
        elif full_every == 1:  # nothing structural sees it; W7's probe fails at that very sync
            assert [r.condition for r in at.failed] == ["W7"] and at.full, at.message()
            assert at.results_by["W7"].offenders[0].startswith("probe sequence "), at.results_by["W7"].offenders
            assert "compute copy" not in at.results_by["W6"].detail
        else:  # a cheap-tier sync without the compute-copy check: nothing reads the copy there
            assert at.failed == [] and not at.full, at.message()
        # the reload at the next sync rebuilds the copy: every check passes again. The numbers of the step whose
        # rollouts ran on the negated copy may rise: how far is the draw (how many sampled tokens the router sends
        # through expert 0) and the CPU's kernels — k3 0.014, 0.25 and 0.15 at this series' three placements on an
        # Intel Xeon, under the floor at some on an AMD EPYC (docs/correctness.md, The behavioural alarm). Where
        # the compute-copy check is off and they rose above the alarm's floors (which sit above every clean step
        # measured), the alarm suspects that step: the full tier runs there, finds the engine repaired, and the
        # step is a mismatch event of the run, not a failure
        assert again[0].failed == [], again[0].message()
        risen = _above_floor(again[0].version)
        if not compute_copy and risen:
            assert again[0].full and again[0].why.startswith(f"behavioural alarm: step {again[0].version}: "), \
                (again[0].why, risen)
            assert again[0].events and all(e.step == again[0].version for e in again[0].events), again[0].events
            assert again[0].events[0].probe_mean is not None  # the probe ran and passed there
        assert again[1].failed == [], again[1].message()


def _checked(pipe, runner, numbers: dict[str, float], fault=None):
    """One RL step (4 prompts) and its sync (``fault``'s hooks on it), checked with the alarm fed ``numbers``."""
    rl = RLStep(pipe, TASK, pipe.learner.version + 1, prompts_per_step=4, seed=0)
    rl.learn()
    rl.sync(fault or NO_HOOKS)
    return runner.check(pipe, [(int(rl.row["version"]), int(rl.row["new_version"]) - 1)], numbers, step=rl.index)


def test_the_alarm_is_a_suspicion_the_full_tier_confirms_on_a_faulty_engine_and_dismisses_on_a_right_one(engines):
    """The alarm fed a suspect number at a sync the cadence leaves to the cheap tier: the full tier runs there. On
    a right engine every check passes — the step is a mismatch event (value, jump, the probe's numbers), the run's
    verdict does not fail, and the value joins the run's history; on an engine whose expert copy is negated
    (``expert-copy-negated`` with the compute-copy check off, so nothing in the cheap tier sees it) W7's probe
    confirms it and the verdict fails naming the probe, the alarm's line and the suspicion; a NaN fails alone."""
    pipe = engines.get("moe", "all")
    runner = CheckRunner(CheckPolicy(full_every=100, compute_copy=False), probe=PROBE)
    runner.start(pipe.samplers)
    k3 = "mismatch/k3"
    first = [_checked(pipe, runner, {k3: v}) for v in (1e-4, 2e-4, 1e-4)]
    assert [(r.full, r.failed, r.events) for r in first] == [(True, [], []), (False, [], []), (False, [], [])]
    # vLLM's table of the attributes with a counterpart in the learner's config finds every one on the MoE mini
    # (a name vLLM renames drops out, and this count with it)
    assert ("engine configuration vs the learner's: 29 attributes of 13 quantities (attention_scale, emittable, "
            "head_dim, logit_scale, logit_soft_cap, norm_topk_prob, num_attention_heads, num_experts, "
            "num_experts_per_tok, num_key_value_heads, rms_norm_eps, rope_theta, vocab_size) on 1 ranks") \
        in first[1].results_by["W6"].detail, first[1].results_by["W6"].detail
    right = _checked(pipe, runner, {k3: 0.08})  # 800x the median 1e-4, above the floor 0.05: suspect
    assert right.full and right.why.startswith(f"behavioural alarm: step {right.version}: {k3} = 0.08 jumped 800×")
    assert right.failed == [] and not right.verdict("fail").fails_run and right.verdict("fail").message == ""
    (e,) = right.events
    assert (e.step, e.metric, e.value, e.reason, e.reference) == (right.version, k3, 0.08, "jump", 1e-4)
    assert e.probe_mean is not None and e.probe_mean < 1e-3 and right.metrics()["check/alarm_events"] == 1.0
    assert right.as_dict()["events"] == [e.as_dict()] and runner.alarm.history[k3][-1] == 0.08
    faulty = _checked(pipe, runner, {k3: 0.3}, fault=fault("expert-copy-negated"))  # above the absolute bound 0.1
    v = faulty.verdict("fail")
    assert faulty.full and v.fails_run and v.failed == ("W7",) and faulty.events == [], faulty.message()
    w7 = faulty.results_by["W7"]
    assert w7.offenders[0].startswith("probe sequence ") and f"step {faulty.version}: {k3} = 0.3 above its bound 0.1" \
        in w7.offenders, w7.offenders
    assert v.message.startswith(f"weight sync to version {faulty.version}: W7 failed: ")
    assert "the full tier ran on suspicion (behavioural alarm: " in v.message
    assert not faulty.verdict("warn").fails_run and faulty.verdict("warn").failed == ("W7",)
    repaired = _checked(pipe, runner, {k3: 1e-4})  # the next sync's reload rebuilds the copy
    assert repaired.failed == [] and not repaired.full, repaired.message()
    nan = _checked(pipe, runner, {k3: float("nan")})  # fails on its own, whatever the full tier finds
    assert nan.verdict("fail").fails_run and nan.results_by["W7"].offenders == [f"step {nan.version}: {k3} = nan is not finite"]
    # where W7's probe is behavioural evidence (``w7_verdict: event``: an engine that adds its own rounding), the
    # probe above its bound with every exact check passing is an event of reason "probe"; with an exact check
    # failing beside it (the compute copy, W6), it stays a failure
    for compute_copy in (False, True):
        coarse = CheckRunner(CheckPolicy(full_every=1, compute_copy=compute_copy, w7_verdict="event"), probe=PROBE)
        coarse.start(pipe.samplers)
        assert _checked(pipe, coarse, {}).failed == []
        at = _checked(pipe, coarse, {}, fault=fault("expert-copy-negated"))
        if compute_copy:
            assert sorted(r.condition for r in at.failed) == ["W6", "W7"] and at.events == [], at.message()
        else:
            (e,) = at.events
            assert at.failed == [] and (e.reason, e.metric, e.step) == ("probe", PROBE_EVENT, at.version), at.events
            assert e.value == e.probe_mean > 1e-3 and "a mismatch event, not a verdict" in at.results_by["W7"].detail
        assert _checked(pipe, coarse, {}).failed == []  # repaired by the next load


def test_at_tensor_parallel_2_the_negated_expert_copy_on_rank_1_is_named_there_and_seen_by_w7_without_w6(
        checkpoints, tmp_path):
    """A spawned MoE engine over two tensor-parallel ranks (vLLM's multiprocess executor), preset all:
    ``expert-copy-negated`` plants on the last rank, rank 1, leaving rank 0 and every held byte right. With the
    compute-copy check on, W6 names rank 1, the layer and the expert at the fault's own sync; with it off at a
    full-tier sync, W7's probe fails there; the reload at the next sync repairs it (W7's alarm aside, on the
    faulted version's rollouts). Then ``rotary-cache-nudged``, ``norm-eps-changed`` and ``norm-eps-unlike-learner``
    on rank 1 at cheap-tier syncs (W6 names the rank, the attribute and both values). ``rotary-cache-nudged``: W6's check of the
    engine's other state names rank 1, the rotary cache and its element there. ``sync-wrote-elsewhere`` on rank 1 at
    a cheap-tier sync: W2 names rank 1's held bytes."""
    pipe = tp2_pipeline(checkpoints["moe"], "all", tmp_path)
    sampler = pipe.sampler
    f = fault("expert-copy-negated")
    try:
        assert [r["version"] for r in sampler.state(fingerprints=False)["ranks"]] == [0, 0]  # two ranks
        for compute_copy, full_every in ((True, 100), (False, 1)):
            runner = CheckRunner(CheckPolicy(full_every=full_every, compute_copy=compute_copy), probe=PROBE)
            runner.start(pipe.samplers)
            clean = [_step(pipe, runner) for _ in range(2)]
            assert [r.failed for r in clean] == [[], []], [r.message() for r in clean]
            at = _step(pipe, runner, f)
            assert at.results_by["W2"].passed and at.results_by["W1"].passed  # each rank's bytes are right
            if compute_copy:
                w6 = at.results_by["W6"]
                assert not w6.passed and at.why == "cheap tier failed: W6", at.message()
                assert w6.offenders[0].startswith("tp rank 1/2: model.layers.0.mlp.experts.w13_weight expert 0: "
                                                  "compute copy ≠ dequantized held bytes at "), w6.offenders
                assert not any(o.startswith("tp rank 0/2") for o in w6.offenders), w6.offenders
            else:
                assert [r.condition for r in at.failed] == ["W7"] and at.full, at.message()
                assert at.results_by["W7"].offenders[0].startswith("probe sequence "), at.results_by["W7"].offenders
            after = _step(pipe, runner)
            assert after.failed == [], after.message()  # repaired; the alarm on the faulted rollouts an event at most
        # the engine's other state: one element of the rotary cos/sin cache the layers share, moved by one float32
        # step on rank 1 after the reload of a cheap-tier sync: no synced tensor changes, and the cheap tier's W6
        # names rank 1, the buffer and the element at that sync; the next load writes it right again
        runner = CheckRunner(CheckPolicy(full_every=100), probe=PROBE)
        runner.start(pipe.samplers)
        assert _step(pipe, runner).failed == []
        at = _step(pipe, runner, fault("rotary-cache-nudged"))
        assert at.results_by["W2"].passed and at.results_by["W1"].passed and at.why == "cheap tier failed: W6", at.message()
        w6 = at.results_by["W6"]
        assert w6.offenders == ["tp rank 1/2: model.layers.0.self_attn.rotary_emb.cos_sin_cache: changed since the "
                                "engine started, first at [0, 1] (1 → 1.00000012; 1 of 2048 elements differ)"], w6.offenders
        assert w6.failing_ranks == [1]
        assert _step(pipe, runner).failed == []
        # a module attribute, not a tensor: layer 1's input norm eps ×10 on rank 1 after the reload of a cheap-tier
        # sync — the attribute check names rank 1, the module, the attribute and both values, and the configuration
        # check names it unlike the learner's; the same eps as the engine's start held it (an engine configured
        # unlike its learner): only the configuration check. Each repaired by the next load
        eps = "model.layers.1.input_layernorm.variance_epsilon"
        for name, lines in (("norm-eps-changed", [f"tp rank 1/2: {eps}: attribute 1e-06 at the engine start, now "
                                                  "9.999999999999999e-06"]), ("norm-eps-unlike-learner", [])):
            at = _step(pipe, runner, fault(name))
            w6 = at.results_by["W6"]
            assert at.why == "cheap tier failed: W6" and w6.failing_ranks == [1], at.message()
            assert w6.offenders == lines + [f"tp rank 1/2: {eps} = 9.999999999999999e-06, the learner's rms_norm_eps "
                                            "is 1e-06"], w6.offenders
            assert _step(pipe, runner).failed == []
        # a sync that wrote somewhere else on rank 1: the rank keeps the previous version whole (its load ran, its
        # version moved); the read-back names rank 1's held bytes (W2: every on-grid tensor of its shard) and its
        # BF16 tensors (W4), and rank 0 stays right; the next load writes it
        at = _step(pipe, runner, fault("sync-wrote-elsewhere"))
        for cond in ("W2", "W4"):
            r = at.results_by[cond]
            assert not r.passed and r.failing_ranks == [1], at.message()
            assert r.offenders and all(o.startswith("tp rank 1/2, layer ") for o in r.offenders), r.offenders
        assert "tp rank 1/2, layer model.layers.0.mlp.experts, w13_weight: fingerprint " in at.results_by["W2"].offenders[0]
        assert _step(pipe, runner).failed == []
    finally:
        sampler.close()
