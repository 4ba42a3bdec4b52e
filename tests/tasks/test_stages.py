"""tasks.stages: the experiment flow's three stage tasks of an RL step (train-step, weight-sync,
invariant-checks) drive one fp8rl_core.loop.RLStep, so the step's ``total_s`` is the loop's one definition, the
checks timed in — a real learner (the table tests' tiny dense model), its in-process sampler and a real
CheckReport; the tasks' functions called without Prefect."""

from __future__ import annotations

import time

import pytest

from fp8rl_core.config.runs import Sweep
from fp8rl_core.learner.config import GRPOConfig, LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.metrics.mismatch import gen_kl_error, token_mult_prob_error
from fp8rl_core.vocabulary import STEP_TIMES
from tasks import stages
from tests.core.schemas.conftest import SPEC, LocalPipe
from tests.core.schemas.samples import TASK, report


class _Runner:
    """The check runner's one call the task makes, answering with a real (passing) report of the sync."""

    def __init__(self) -> None:
        self.calls = 0

    def check(self, pipe, tags, mismatch, step=None):
        self.calls += 1
        out = report(pipe.learner.version, self.calls, full=True)
        time.sleep(out.seconds)  # the seconds the report says its checks took
        return out


def test_the_three_stage_tasks_share_one_rl_step_and_its_total():
    cfg = Sweep.load("configs/smoke.yaml", ["axes.seed=[0]"]).runs[0].config
    learner = Learner(build_model(SPEC, seed=0), LearnerConfig(precision="bf16", lr=1e-4, grpo=GRPOConfig(group_size=2)))
    stages.LIVE["k"] = stages.LiveRun(cfg, LocalPipe(learner), task=TASK, runner=_Runner())
    try:
        for step in (1, 2):
            row = stages.train_step.fn("k", step)
            assert row["train_stage_s"] == row["total_s"] >= row["generate_s"] + row["learner_s"]
            # NeMo-RL's numbers of the step's own tokens; with its default kl_type gen_kl_error is the row's k3
            mine = [t for t in stages.LIVE["k"].tokens if t["step"] == step]
            s, lrn = [t["sampler_logprob"] for t in mine], [t["learner_logprob"] for t in mine]
            assert row["token_mult_prob_error"] == token_mult_prob_error(s, lrn) >= 1.0
            assert row["gen_kl_error"] == gen_kl_error(s, lrn) == pytest.approx(row["k3"], rel=1e-5, abs=1e-12)
            assert stages.STEP_METRICS["token_mult_prob_error"] == "mismatch/token_mult_prob_error"
            assert stages.STEP_METRICS["gen_kl_error"] == "mismatch/gen_kl_error"
            row |= stages.weight_sync.fn("k")
            out = stages.invariant_checks.fn("k", [[row["version"], row["new_version"] - 1]], row)
            assert out["total_s"] == stages.LIVE["k"].step.seconds  # what the flow reads: the loop's clock
            assert out["total_s"] >= row["train_stage_s"] + sum(row[c] for c in STEP_TIMES[2:]) + out["checks_s"] - 1e-3
            assert (row["new_version"], stages.LIVE["k"].last_good_version) == (step, step)
        assert len(stages.LIVE["k"].tokens) > 0 and len(stages.LIVE["k"].microbatches) == 2
    finally:
        stages.LIVE.pop("k", None)
