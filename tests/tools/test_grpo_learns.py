"""tools/grpo_learns.py's variant on a real (untrained) dense mini, three GRPO steps of fp8rl's Learner: the record's
fields, rewards in [0, 1], and Adam's first update — about the learning rate per moved weight, whatever the gradient's
size (the step-size effect docs/library.md's "Does it learn?" measures). An untrained model never answers right, so
the task's reward is replaced by one that differs within a group (the parity of the first sampled token)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import grpo_learns  # noqa: E402


def test_a_variant_reports_its_rewards_and_adams_first_update_is_the_learning_rate(monkeypatch):
    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.learner.models import build_model

    run = Sweep.load(str(ROOT / "configs" / "verl-smoke.yaml"), ["axes.model=[qwen3-dense-mini]"]).runs[0]
    model, task = build_model(run.spec, 0), run.config.warmstart.task
    monkeypatch.setattr(type(task), "reward", lambda self, prompts, ids: (ids[:, 0] % 2 == 0).float())
    out = grpo_learns.learn(model, task, group_size=4, lr=1e-3, seed=0, prompts=4, steps=3, n_eval=8)
    assert set(out) >= {"first5", "last5", "eval_before", "eval_after", "first_update"}
    assert all(0.0 <= out[k] <= 1.0 for k in ("first5", "last5", "eval_before", "eval_after"))
    first = out["first_update"]
    assert first["step"] == 1 and first["grad_norm"] > 0, first
    assert 0.5e-3 <= first["median_abs_dw"] <= 1.05e-3, first  # ≈ lr · sign(g): Adam's first step
    assert 0.5 < first["share_moved"] <= 1 and 0.005 < first["median_abs_w"] < 0.05, first  # ~2–20% of a weight a step
