"""A real 2-step run for the table tests: loop.run_rl with a real learner, the sampler replaced by an
in-process one sampling from the learner's model."""

from __future__ import annotations

import time

import pytest

from fp8rl_core.learner.config import GRPOConfig, LearnerConfig
from fp8rl_core.learner.grpo import microbatch_rows
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.rollout import sample_completions
from fp8rl_core.loop import run_rl
from fp8rl_core.sampler.seam import Rollout, SyncTiming

from .samples import TASK

SPEC = ModelSpec(name="schemas-test", kind="dense", vocab_size=1024, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 max_position_embeddings=64)


class LocalSampler:
    """The sampler's interface (generate → Rollout, sync → SyncTiming) sampling from the learner's model."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.version = 0

    def generate(self, prompt_ids, n, max_new, *, seed, eos_id, pad_id, prompt_mask=None):
        assert prompt_mask is None, "the addition task's prompts are of one length"
        t0 = time.perf_counter()
        prompts = prompt_ids.repeat_interleave(n, 0)
        ids, mask, lp = sample_completions(self.learner.model, prompts, max_new, eos_id=eos_id, pad_id=pad_id,
                                           seed=seed)
        return Rollout(prompts, ids, mask, lp, self.version, time.perf_counter() - t0, cached_tokens=0)

    def sync(self, tensors, version, *, export_s=0.0, **_):
        t0 = time.perf_counter()
        self.version = version
        return SyncTiming(version=version, export_s=export_s, transport_s=time.perf_counter() - t0, load_s=1e-4,
                          reset_s=1e-5, bytes=4096, buckets=1)


class LocalPipe:
    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.sampler = LocalSampler(learner)
        self.samplers = [self.sampler]
        self.emittable = None  # no vocabulary tail (the addition task's ids)

    def export(self):
        return {}


@pytest.fixture(scope="session", params=["bf16", "mxfp8"])
def real_run(request):
    """(precision, steps, tokens, microbatches) of a 2-step run of the real loop; micro-batch rows from the
    real StepResult.microbatches (learner.grpo.microbatch_rows)."""
    budget = 48
    learner = Learner(build_model(SPEC, seed=0), LearnerConfig(precision=request.param, lr=1e-4,
                                                               grpo=GRPOConfig(group_size=2, tokens_per_microbatch=budget)))
    mbs: list[dict] = []
    step_fn = learner.step

    def recording_step(batch, **kw):
        res = step_fn(batch, **kw)
        mbs.extend(microbatch_rows("run-abc", request.param, res.version, budget, res.microbatches))
        return res

    learner.step = recording_step
    result = run_rl(LocalPipe(learner), TASK, 2, prompts_per_step=3, seed=1)
    return request.param, result.steps, result.tokens, mbs
