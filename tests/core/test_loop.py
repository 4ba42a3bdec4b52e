"""fp8rl_core.loop.RLStep, the one assembly of an RL step and the one definition of its ``total_s``: a real
learner (the tiny dense model of the table tests) and the in-process sampler sampling from it."""

from __future__ import annotations

import time

from fp8rl_core.learner.config import GRPOConfig, LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.loop import RLStep, run_rl
from fp8rl_core.vocabulary import STEP_TIMES

from .schemas.conftest import SPEC, LocalPipe
from .schemas.samples import TASK


def _pipe() -> LocalPipe:
    return LocalPipe(Learner(build_model(SPEC, seed=0), LearnerConfig(precision="bf16", lr=1e-4,
                                                                      grpo=GRPOConfig(group_size=2))))


def test_a_steps_total_is_the_wall_time_of_its_stages_checks_included():
    pipe = _pipe()
    step = RLStep(pipe, TASK, 1, prompts_per_step=3, seed=1)
    row = step.learn()
    after_learn = row["total_s"]
    assert after_learn == step.seconds > row["generate_s"] + row["learner_s"] and row["new_version"] == 1
    step.sync()
    assert pipe.sampler.version == 1 and step.row["total_s"] > after_learn
    assert step.row["total_s"] >= sum(step.row[c] for c in STEP_TIMES)
    before = step.seconds
    assert step.timed(lambda: (time.sleep(0.05), "checked")[1]) == "checked"  # what runs after the sync: timed in
    assert step.row["total_s"] == step.seconds >= before + 0.05
    assert len(step.tokens) == step.row["tokens"] > 0


def test_run_rl_rows_are_rlsteps_learned_and_synced():
    pipe = _pipe()
    seen = []
    res = run_rl(pipe, TASK, 2, prompts_per_step=3, seed=1, on_step=seen.append)
    assert seen == res.steps and [r["step"] for r in res.steps] == [1, 2] and pipe.sampler.version == 2
    assert all(r["total_s"] >= sum(r[c] for c in STEP_TIMES) for r in res.steps)
    assert len(res.tokens) == sum(r["tokens"] for r in res.steps)
