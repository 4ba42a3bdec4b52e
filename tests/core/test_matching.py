"""The fixed-weights matching experiment on real engines (tiny dense model): every variant gets the same
checkpoints through the sync path and passes W1–W7; a mismatch planted in one variant — its engine's final
norm scaled by 2, so it computes softmax(2·z) where the learner computes softmax(z) — comes out as the KL
that the learner's own logits give for that change, and the ratio to another variant is recovered. The BF16
sampler also runs on a real SGLang server (.venv-sglang; one OpenMP thread) beside its vLLM twin: both engines'
KL to the learner and to each other on the same probe sequences."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fp8rl_core import matching
from fp8rl_core.config.runs import Sweep
from fp8rl_core.checks.runner import CheckPolicy
from fp8rl_core.metrics.matching import matching_ratio
from fp8rl_core.sampler.presets import PRESETS, Variant
from fp8rl_core.sync.hooks import SyncHooks

from .sampler.conftest import ENGINE, TASK, checkpoints  # noqa: F401 — the shared warm-started test models

NORM = "model.norm.weight"
#: the SGLang venv's interpreter (`make setup-sglang`; `make test` builds it): without it the SGLang variant is left out
SGLANG = Path(__file__).resolve().parents[2] / ".venv-sglang" / "bin" / "python"


class DoubledNorm(SyncHooks):
    """Sends the final RMSNorm's weight ×2 (exact in BF16): the engine's logits become 2·z."""

    def on_export(self, pipe, tensors: dict) -> dict:
        return tensors | {NORM: tensors[NORM] * 2}


def _policy(dtype: str, preset: str) -> CheckPolicy:
    return CheckPolicy(full_every=1, w7_mean=5e-2, w7_max=1.0)  # BF16 engine: W7 at BF16 bounds


@pytest.fixture(scope="module")
def measured(checkpoints):  # noqa: F811
    path = checkpoints["dense"]
    cks = [matching.warm_checkpoint(path, 0)]
    state = {k: v.clone() for k, v in cks[0].state.items()}
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"] * 1.01  # a second, different checkpoint
    cks.append(matching.Checkpoint("seed0/step1", 0, 1, state))
    probe = matching.probe_set(TASK, 24, 24, seed=3)
    variants = [Variant("bf16-sampler"), Variant("all"), Variant("half"), Variant("all", engine_dtype="float32",
                                                                                 learner_forward="fp32")]
    variants += [Variant("bf16-sampler", engine="sglang")] if SGLANG.exists() else []
    cfg = ENGINE.model_copy(update={"dtype": "bfloat16"})
    with pytest.MonkeyPatch.context() as mp:  # the SGLang server's interpreter and its one OpenMP thread
        mp.setenv("FP8RL_SGLANG_PYTHON", str(SGLANG))
        mp.setenv("OMP_NUM_THREADS", "1")
        return cks, probe, matching.measure(
            path, cks, variants, probe, learner=PRESETS["all"].learner_config(), sampler_cfg=cfg, policy=_policy,
            w7_probe=TASK.prompts(8, seed=5, split="eval").sequences, hooks={"half": DoubledNorm()},
            on_failure="record")


def test_every_variant_is_synced_checked_and_measured_at_every_checkpoint(measured):
    cks, probe, res = measured
    by = {(c["variant"], c["checkpoint"]): c for c in res.checks if c["variant"] != "bf16-sampler@sglang"}
    assert set(by) == {(v, c.name) for v in ("bf16-sampler", "all", "half", "all@engine=float32,learner=fp32")
                       for c in cks}
    versions = [c["version"] for c in res.checks]
    assert versions == sorted(set(versions))  # every sync a new version
    for v in ("bf16-sampler", "all", "all@engine=float32,learner=fp32"):
        for c in cks:
            assert by[(v, c.name)]["passed"], by[(v, c.name)]["detail"]
            assert by[(v, c.name)]["check/W7"] == 1.0  # the full tier ran
    for c in cks:  # the plant is a real difference from the learner's weights: W4 names the tensor
        row = by[("half", c.name)]
        assert not row["passed"] and "W4" in row["failed"].split(","), row
        assert NORM in row["detail"] or "norm" in row["detail"], row["detail"]
    keys = {(r["variant"], r["checkpoint"], r["source"]) for r in res.rows if r["variant"] != "bf16-sampler@sglang"}
    assert len(keys) == 4 * 2 * 2
    for v in ("bf16-sampler", "all"):
        for c in cks:
            held = [r for r in res.rows if (r["variant"], r["checkpoint"], r["source"]) == (v, c.name, "held-out")]
            assert [r["sequence"] for r in held] == list(range(24))
            assert all(r["positions"] == TASK.seq_len - 1 and r["kl"] > 0 for r in held)
            samp = [r for r in res.rows if (r["variant"], r["checkpoint"], r["source"]) == (v, c.name, "sampled")]
            assert len(samp) == 24 and all(1 <= r["positions"] <= TASK.answer_len + 1 for r in samp)
    assert 1 <= res.engines <= 4 + SGLANG.exists()


def test_the_planted_mismatch_is_measured_as_the_learners_logits_predict(measured, checkpoints):  # noqa: F811
    cks, probe, res = measured
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.warmstart import load_policy

    lrn = Learner(load_policy(checkpoints["dense"]), PRESETS["all"].learner_config())
    for ck in cks:
        lrn.model.load_state_dict(ck.state)
        z = lrn.full_logprobs(probe.held_out).double()  # log-softmax(z): z up to a constant per position
        p2 = torch.log_softmax(2 * z, dim=-1)  # the planted engine's distribution
        want = (p2.exp() * (p2 - z)).sum(-1).sum(-1)  # KL(softmax(2z) ‖ softmax(z)) per sequence
        got = torch.tensor([r["kl"] for r in res.rows if (r["variant"], r["checkpoint"], r["source"])
                            == ("half", ck.name, "held-out")], dtype=torch.float64)
        # the engine's BF16 logits (rounded to 1/16 at |z| ~ 10, then doubled) and `half`'s own numerics move
        # single sequences (median 2-4%; the largest by 15% with torch on two threads, 27.5-49% on one, whose
        # reductions round in another order, depending on the warm start the process trained); over the probe
        # set they average out
        assert float(want.mean()) > 0.05
        rel = (got - want).abs() / want.clamp_min(1e-3)
        assert float(rel.median()) < 0.05 and float(rel.max()) < 0.6, (got[:4], want[:4])
        # in sum: within 3% with two torch threads, 7% with one on the 2026-12-03 machine (the same on the
        # tree before that day's changes): the measurement, not the tolerance, is what this test pins
        assert float(got.sum()) == pytest.approx(float(want.sum()), rel=0.1)
        base = [r for r in res.rows if (r["variant"], r["checkpoint"], r["source"]) == ("all", ck.name, "held-out")]
        expect = float(want.sum()) / float(sum(r["kl"] for r in base))
        r = matching_ratio(res.rows, "all", "half", checkpoint=ck.name, source="held-out", n_boot=200)
        assert r.ratio == pytest.approx(expect, rel=0.1)
        assert r.lo > 1 and r.direction == "higher"


def test_all_in_fp32_on_both_sides_leaves_almost_no_kl(measured):
    _, _, res = measured
    for ck in ("seed0/step0", "seed0/step1"):
        r = matching_ratio(res.rows, "all", "all@engine=float32,learner=fp32", checkpoint=ck, n_boot=200)
        assert r.b_mean < 0.05 * r.a_mean, r  # the residual KL of `all` is the BF16 compute, not the grid
        assert math.isfinite(r.median_ratio)


@pytest.mark.skipif(not SGLANG.exists(), reason=".venv-sglang is absent: `make setup-sglang` builds the SGLang venv")
def test_the_bf16_sampler_on_sglang_is_measured_against_the_learner_and_its_vllm_twin(measured):
    """The same checkpoints synced into a BF16 SGLang server and checked (W1–W7 pass at the full tier); its exact
    KL to the learner on the held-out sequences and its own rollouts; and both engines' distributions against each
    other on the same sequences — the held-out ones and the vLLM twin's rollouts (measured first), which SGLang
    scores too. Measured here (24 + 24 sequences, 2 checkpoints): the two BF16 engines differ from each other by
    about an eighth of what either differs from the MXFP8 learner (docs/fixed-weights.md, The engine axis)."""
    cks, probe, res = measured
    v, twin = "bf16-sampler@sglang", "bf16-sampler"
    for c in (c for c in res.checks if c["variant"] == v):
        assert c["passed"] and c["check/W7"] == 1.0 and c["ablation"], c["detail"]
    assert {c["checkpoint"] for c in res.checks if c["variant"] == v} == {c.name for c in cks}
    mean = lambda rows: sum(r["kl"] for r in rows) / sum(r["positions"] for r in rows)  # noqa: E731
    for source in ("held-out", "sampled"):
        for ck in cks:
            mine = [r for r in res.rows if (r["variant"], r["checkpoint"], r["source"]) == (v, ck.name, source)]
            ref = [r for r in res.rows if (r["variant"], r["checkpoint"], r["source"]) == (twin, ck.name, source)]
            both = [r for r in res.engine_rows if (r["checkpoint"], r["source"]) == (ck.name, source)]
            assert [r["sequence"] for r in mine] == [r["sequence"] for r in both] == list(range(24))
            assert all(r["positions"] >= 1 and r["kl"] >= 0 and r["kl_rev"] >= 0 for r in mine + both)
            assert {(r["variant"], r["reference"], r["engine"], r["reference_engine"], r["rollouts"]) for r in both} \
                == {(v, twin, "sglang", "vllm", twin)}
            if source == "sampled":  # SGLang scored the twin's rollouts: the same counted positions
                assert [r["positions"] for r in both] == [r["positions"] for r in ref]
            else:
                assert all(r["positions"] == TASK.seq_len - 1 for r in both)
        mine = [r for r in res.rows if (r["variant"], r["source"]) == (v, source)]
        ref = [r for r in res.rows if (r["variant"], r["source"]) == (twin, source)]
        both = [r for r in res.engine_rows if r["source"] == source]
        # closer to each other than either is to the MXFP8 learner (measured: held-out 131 against 1100 and 1028
        # µnats per position; on the twin's rollouts 34 against 108 and 133)
        assert 0 < mean(both) < 0.5 * min(mean(mine), mean(ref)), (source, mean(both), mean(mine), mean(ref))
        if source == "held-out":  # the same sequences: the same order of KL to the learner (measured: 0.93)
            assert 0.5 < mean(mine) / mean(ref) < 2, (mean(mine), mean(ref))
    assert len(res.engine_rows) == 2 * 2 * 24


def test_engine_rows_are_kl_of_the_other_engine_to_vllm_whichever_was_measured_first():
    """The engine-vs-engine rows of a twin pair, from constructed distributions: KL(SGLang‖vLLM) per sequence,
    summed over the counted positions, on the held-out sequences and on the rollouts of the one measured first
    (its mask), the same orientation in either order."""
    g = torch.Generator().manual_seed(0)
    logp = lambda *shape: torch.log_softmax(torch.randn(*shape, generator=g) * 2, dim=-1)  # noqa: E731
    ck = matching.Checkpoint("seed0/step0", 0, 0, {})
    held_mask = torch.ones(3, 4, dtype=torch.bool)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    seqs = torch.zeros(2, 5, dtype=torch.long)
    sg_held, vl_held, sg_on_rollouts, vl_on_rollouts = logp(3, 4, 16), logp(3, 4, 16), logp(2, 4, 16), logp(2, 4, 16)
    sg, vl = Variant("bf16-sampler", engine="sglang"), Variant("bf16-sampler")

    def kl(p, q, m):  # Σ over counted positions of KL(p‖q), per sequence
        return ((p.exp() * (p - q)).sum(-1) * m).sum(-1).tolist()

    vllm_first = matching._engine_rows(ck, matching._EngineSide(vl, vl_held, seqs, mask, vl_on_rollouts),
                                       matching._EngineSide(sg, sg_held, seqs, mask, torch.empty(0)), sg_on_rollouts,
                                       held_mask)
    sglang_first = matching._engine_rows(ck, matching._EngineSide(sg, sg_held, seqs, mask, sg_on_rollouts),
                                         matching._EngineSide(vl, vl_held, seqs, mask, torch.empty(0)), vl_on_rollouts,
                                         held_mask)
    for rows, first in ((vllm_first, "bf16-sampler"), (sglang_first, "bf16-sampler@sglang")):
        assert {(r["variant"], r["reference"], r["engine"], r["reference_engine"], r["rollouts"]) for r in rows} == {
            ("bf16-sampler@sglang", "bf16-sampler", "sglang", "vllm", first)}
        held = [r for r in rows if r["source"] == "held-out"]
        assert [r["kl"] for r in held] == pytest.approx(kl(sg_held, vl_held, held_mask), rel=1e-6)
        assert [r["kl_rev"] for r in held] == pytest.approx(kl(vl_held, sg_held, held_mask), rel=1e-6)
        sampled = [r for r in rows if r["source"] == "sampled"]
        assert [r["positions"] for r in sampled] == [2, 1]
        assert [r["kl"] for r in sampled] == pytest.approx(kl(sg_on_rollouts, vl_on_rollouts, mask), rel=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints from elsewhere: a verl run's saved checkpoints
# ----------------------------------------------------------------------------------------------------------------
FIXED = Path(__file__).resolve().parents[2] / "configs" / "matching-fixed-weights.yaml"


def fixed_weights_from(checkpoint_dir: str | Path, model: str = "qwen3-dense-mini", *overrides: str):
    """A fixed-weights run of the shipped sweep (configs/matching-fixed-weights.yaml) on the checkpoints
    ``checkpoint_dir`` names (``matching.checkpoints``: an HF directory, a verl ``global_step_N`` or a verl run's
    checkpoint folder), at test size: ``model``'s runs, seed 0, every preset of the config, no ablation, 8 held-out
    and 8 sampled probe sequences — loaded and validated as ``fp8rl run`` loads it, then measured in this process
    (:func:`fp8rl_core.matching.run_matching`: in-process BF16 engines). Returns (the sweep, its measurement)."""
    sweep = Sweep.load(FIXED, [f"axes.model=[{model}]", "axes.seed=[0]", "per_model={}", "matching.steps=[]",
                               f"matching.checkpoints=[{checkpoint_dir}]", "matching.held_out=8", "matching.sampled=8",
                               "matching.ablations=[]", "matching.ablation_models=null", *overrides])
    (run,) = sweep.runs
    cfg = run.config
    task = None
    if not cfg.data.is_task:  # a run with a dataset: its probes from data.val (the flow passes the same task)
        from fp8rl_core.verl.reward import scorer

        task = cfg.dataset_task(scorer(cfg.data.reward))
    return sweep, matching.run_matching(None, cfg, sweep.config.matching, task=task)


def assert_every_sync_passed(sweep, res) -> None:
    """Every preset of the sweep got every named checkpoint through the sync path and passed W1–W7 at the full
    tier; every (checkpoint, preset) measured on every probe sequence with a finite KL."""
    section = sweep.config.matching
    names = [c.name for c in section.checkpoints]
    by = {(c["variant"], c["checkpoint"]): c for c in res.checks}
    assert set(by) == {(p, n) for p in section.presets for n in names}
    for c in res.checks:
        assert c["passed"], c["detail"]
        assert [c[f"check/W{i}"] for i in range(1, 8)] == [1.0] * 7, c
    keys = {(r["variant"], r["checkpoint"], r["source"]): 0 for r in res.rows}
    for r in res.rows:
        keys[(r["variant"], r["checkpoint"], r["source"])] += 1
        assert math.isfinite(r["kl"]) and r["kl"] >= 0 and r["positions"] >= 1
    assert keys == {(p, n, s): 8 for p in section.presets for n in names for s in ("held-out", "sampled")}


def assert_measured_on_validation_prompts(sweep, res) -> None:
    """A fixed-weights run with a dataset (a user's checkpoint and data, tests/conftest.py ``gsm8k_experiment``;
    tests/flows/test_verl.py measures a checkpoint verl saved of it): the probes are the validation file's
    chat-templated prompts in the checkpoint's tokenizer — held-out ones of different lengths, every position
    inside each counted; the others completed by each variant's engine up to the run's response length."""
    from fp8rl_core.verl.reward import scorer

    cfg = sweep.runs[0].config
    task = cfg.dataset_task(scorer(None))
    probe = matching.dataset_probe_set(task, 8, 8, seed=cfg.seed)
    lengths = [len(task.prompt_ids(r, "eval")) for r in range(task.size("eval"))]
    assert probe.held_lengths is not None and set(probe.held_lengths) <= set(lengths) and len(set(probe.held_lengths)) > 1
    rows = [r for r in res.rows if r["variant"] == "all"]
    held = sorted(r["positions"] for r in rows if r["source"] == "held-out")
    assert held == sorted(n - 1 for n in probe.held_lengths)  # every next-token position of each prompt, no padding
    sampled = [r["positions"] for r in rows if r["source"] == "sampled"]
    assert all(1 <= n <= 24 for n in sampled) and probe.max_new_tokens == 24  # data.max_response_length
    assert probe.prompt_mask is not None and probe.eos_id == task.eos_id and probe.pad_id == task.pad_id
