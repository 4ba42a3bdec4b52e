"""fp8rl_core.verl.capture: the wrapper around verl's ``calculate_debug_metrics`` on a real verl ``DataProto`` —
verl's result unchanged, each step's tokens rows (the native schema, version = step − 1, bounded by the payload's
sequence count) and numbers written whole; fp8rl's k1/k3 from the captured tokens equal verl's own
``rollout_corr/kl`` / ``k3_kl`` of the same tensors, and the step's NeMo-RL numbers equal fp8rl's functions on
them; the names it wraps still exist in the installed verl;
the rollout side reads a step's numbers for its sync's alarm."""

from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch

from fp8rl_core.metrics.mismatch import gen_kl_error, token_mult_prob_error
from fp8rl_core.metrics.summary import run_kl_summary
from fp8rl_core.schemas import validate
from fp8rl_core.verl import capture
from fp8rl_core.vocabulary import VERL_K3_ABS_TOL
LENGTHS = (5, 3, 1, 4, 2, 5)  # response lengths of the batch's rows (right-padded to 5)


def _batch(seed: int = 0, noise: float = 0.05):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    b, t = len(LENGTHS), max(LENGTHS)
    mask = torch.zeros(b, t)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    rollout = -torch.rand(b, t, generator=g) * 2
    actor = (rollout + torch.randn(b, t, generator=g) * noise).clamp(max=0.0)
    return DataProto.from_dict(tensors={"responses": torch.randint(0, 16, (b, t), generator=g),
                                        "rollout_log_probs": rollout, "old_log_probs": actor,
                                        "response_mask": mask})


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The wrapper installed over a fresh binding of verl's function (restored afterwards)."""
    import sys

    module = importlib.import_module(capture.CAPTURED[0])
    for m in [module, *(sys.modules[n] for n in capture.TRAINER_MODULES if n in sys.modules)]:
        monkeypatch.setattr(m, capture.CAPTURED[1], getattr(m, capture.CAPTURED[1]))
    return module, capture.install(tmp_path / "tokens", None), tmp_path / "tokens"


def test_the_wrapper_returns_verls_metrics_and_writes_every_steps_tokens_and_numbers(installed):
    module, wrapper, folder = installed
    upstream = wrapper.__wrapped__
    assert getattr(module, capture.CAPTURED[1]) is wrapper and capture.install(folder) is wrapper  # once
    data = _batch()
    for _ in range(2):  # two RL steps
        assert module.calculate_debug_metrics(data) == upstream(data)
    rows = capture.read_tokens(folder)
    validate("tokens", rows)
    assert len(rows) == 2 * sum(LENGTHS)
    assert sorted({(r["step"], r["version"]) for r in rows}) == [(1, 0), (2, 1)]
    first = [r for r in rows if r["step"] == 1 and r["sequence"] == 1]
    assert [r["position"] for r in first] == [0, 1, 2]
    assert [r["token"] for r in first] == data.batch["responses"][1, :3].tolist()
    assert [r["sampler_logprob"] for r in first] == data.batch["rollout_log_probs"][1, :3].tolist()
    assert [r["learner_logprob"] for r in first] == data.batch["old_log_probs"][1, :3].tolist()
    numbers = capture.read_numbers(folder, 2)
    assert numbers["training/rollout_probs_diff_mean"] == upstream(data)["training/rollout_probs_diff_mean"]
    assert set(numbers) == {"rollout_corr/kl", "rollout_corr/k3_kl", "training/rollout_probs_diff_mean",
                            "mismatch/token_mult_prob_error", "mismatch/gen_kl_error"}
    assert capture.read_numbers(folder, 3) == {}
    assert not list(folder.glob("*.tmp"))
    # fp8rl's own numbers of every captured step, for the launcher to log per step (verl logs the others itself)
    logged = capture.read_step_metrics(folder)
    assert sorted(logged) == [1, 2] and logged[2] == {k: numbers[k] for k in capture.STEP_METRICS}
    assert capture.STEP_METRICS == ("mismatch/token_mult_prob_error", "mismatch/gen_kl_error")
    assert capture.read_step_metrics(folder.parent / "absent") == {}


def test_the_sequences_per_step_are_bounded_by_the_payloads_count(tmp_path):
    rows = capture.token_rows(_batch(), step=3, max_sequences=2)
    assert sorted({r["sequence"] for r in rows}) == [0, 1] and len(rows) == LENGTHS[0] + LENGTHS[1]
    assert {r["version"] for r in rows} == {2}


def test_the_shared_bound_is_two_float32_ulps_of_one():
    assert VERL_K3_ABS_TOL == 2 * torch.finfo(torch.float32).eps  # exp(r) ≈ 1 cancels in float32


def test_a_sample_of_a_steps_sequences_is_not_compared_with_verls_numbers_of_the_whole_batch():
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    data = _batch(0, 0.5)
    b = data.batch
    verl = compute_offpolicy_metrics(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"])
    (sample, _run) = run_kl_summary(capture.token_rows(data, step=1, max_sequences=2), run_id="r", preset="all",
                                    model="m", seed=0, n_boot=0)
    assert abs(sample["k3"] - verl["k3_kl"]) > 10 * VERL_K3_ABS_TOL  # a sample's k3 is another number
    batch = b["response_mask"].shape[0]
    assert not capture.captures_whole_batches(2, batch)
    assert capture.captures_whole_batches(None, batch) and capture.captures_whole_batches(batch, batch)


def test_fp8rl_k1_k3_from_the_captured_tokens_equal_verls_rollout_corr_of_the_same_step(tmp_path):
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    for seed, noise in ((0, 0.05), (1, 1e-3), (2, 0.5)):
        data = _batch(seed, noise)
        b = data.batch
        verl = compute_offpolicy_metrics(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"])
        rows = capture.token_rows(data, step=1)
        (step, _run) = run_kl_summary(rows, run_id="r", preset="all", model="m", seed=0, n_boot=0)
        # verl computes exp(r) − r − 1 in float32, where it cancels to a few ulp(1) per token; fp8rl in float64
        assert step["k3"] == pytest.approx(verl["k3_kl"], rel=1e-4, abs=VERL_K3_ABS_TOL), (seed, noise)
        assert step["k1"] == pytest.approx(verl["kl"], rel=1e-4, abs=VERL_K3_ABS_TOL), (seed, noise)
        numbers = capture.step_numbers(data, {})  # what the alarm judges: verl's formula on the same tensors
        assert numbers["rollout_corr/k3_kl"] == pytest.approx(verl["k3_kl"], rel=1e-6)
        assert numbers["rollout_corr/kl"] == pytest.approx(verl["kl"], rel=1e-6)
        # NeMo-RL's numbers of the whole batch: the functions on the captured columns, the step's kl_summary value,
        # and (gen_kl_error, kl_type k3) verl's own k3_kl to verl's float32 rounding
        s, lrn = [r["sampler_logprob"] for r in rows], [r["learner_logprob"] for r in rows]
        assert numbers["mismatch/token_mult_prob_error"] == pytest.approx(token_mult_prob_error(s, lrn), rel=1e-12)
        assert numbers["mismatch/gen_kl_error"] == pytest.approx(gen_kl_error(s, lrn), rel=1e-12)
        assert numbers["mismatch/token_mult_prob_error"] == pytest.approx(step["token_mult_prob_error"], rel=1e-12)
        assert numbers["mismatch/token_mult_prob_error"] > 1.0
        assert numbers["mismatch/gen_kl_error"] == pytest.approx(verl["k3_kl"], rel=1e-4, abs=VERL_K3_ABS_TOL)


def test_the_wrapped_upstream_names_still_exist_where_verls_trainers_look_them_up():
    """verl 0.9.1: the module function, the v1 trainer's import-time binding, the legacy trainer's call-time
    import, and the batch keys verl's function reads (a rename upstream fails here, not silently in a run)."""
    module = importlib.import_module(capture.CAPTURED[0])
    fn = getattr(module, capture.CAPTURED[1])
    assert list(inspect.signature(fn).parameters) == ["data"]
    src = inspect.getsource(getattr(fn, "__wrapped__", fn))
    assert all(f'"{k}"' in src for k in ("rollout_log_probs", "old_log_probs", "response_mask", "responses"))
    for name in capture.TRAINER_MODULES:
        trainer = importlib.import_module(name)
        assert f"from {capture.CAPTURED[0]} import {capture.CAPTURED[1]}" in inspect.getsource(trainer)
        assert f"{capture.CAPTURED[1]}(data)" in inspect.getsource(trainer)
    from verl.trainer.ppo import ray_trainer

    assert f"from {capture.CAPTURED[0]} import {capture.CAPTURED[1]}" in inspect.getsource(ray_trainer.RayPPOTrainer.fit)


def test_the_sync_reads_its_steps_numbers_for_the_alarm(tmp_path):
    capture.write_step(tmp_path, 2, [], {"rollout_corr/k3_kl": 0.4, "tokens": 10.0})
    assert capture.read_numbers(tmp_path, 2) == {"rollout_corr/k3_kl": 0.4}
    from fp8rl_core.checks.alarm import MismatchAlarm

    obs = MismatchAlarm().observe(2, capture.read_numbers(tmp_path, 2))
    assert obs is not None and obs.reason() == "behavioural alarm: step 2: rollout_corr/k3_kl = 0.4 above its bound 0.1"



def test_the_alarm_does_not_judge_fp8rls_own_step_metrics(tmp_path):
    """NeMo-RL's numbers are reported, not watched: even a non-finite one raises no suspicion."""
    from fp8rl_core.checks.alarm import ALARM_BOUNDS, MismatchAlarm

    assert not {b.metric for b in ALARM_BOUNDS} & set(capture.STEP_METRICS)
    capture.write_step(tmp_path, 3, [], {"mismatch/token_mult_prob_error": math.inf, "mismatch/gen_kl_error": 9.0})
    assert MismatchAlarm().observe(3, capture.read_numbers(tmp_path, 3)) is None  # none of its numbers
