"""Sync hooks: production passes none (every hook a no-op); a fault of the catalogue is a set of hooks, and
no production signature of the sync path carries a fault argument."""

from __future__ import annotations

import inspect

from fp8rl_core.checks.faults import FAULTS, fault
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks


def test_no_hooks_change_nothing():
    schemes, tensors = {"model.layers.0.mlp.gate_up_proj": "mxfp8"}, {"a": 1}
    assert NO_HOOKS.schemes_for_engine(schemes) == schemes and NO_HOOKS.on_export(None, tensors) is tensors
    assert not NO_HOOKS.skips_replica(0) and not NO_HOOKS.skips_replica(1)
    assert NO_HOOKS.sync_bucket_mb(64.0) == 64.0 and NO_HOOKS.on_transport(None) is None
    assert NO_HOOKS.worker_hook() is None and NO_HOOKS.resets_prefix_cache()


def test_every_fault_is_a_set_of_sync_hooks_acting_where_its_stage_says():
    assert all(isinstance(f, SyncHooks) for f in FAULTS)
    assert fault("dropped-bucket").sync_bucket_mb(64.0) == 0.25
    assert not fault("prefix-cache-kept").resets_prefix_cache()
    assert fault("replica-left-behind").skips_replica(1) and not fault("replica-left-behind").skips_replica(0)
    assert fault("post-load-twice").worker_hook() == "fp8rl_core.checks.faults:worker_process_twice"
    router = fault("router-quantized").schemes_for_engine({"model.layers.0.mlp.experts": "mxfp8"})
    assert router == {"model.layers.0.mlp.experts": "mxfp8", "model.layers.0.mlp.gate": "block128"}
    gate = fault("gate-up-bf16-by-substring").schemes_for_engine(
        {"model.layers.0.mlp.gate_up_proj": "mxfp8", "model.layers.0.self_attn.o_proj": "mxfp8"})
    assert gate == {"model.layers.0.self_attn.o_proj": "mxfp8"}
    lm = fault("lm-head-assumed-tied").on_export(None, {"lm_head.weight": 1, "model.norm.weight": 2})
    assert lm == {"model.norm.weight": 2}
    for f in FAULTS:  # the others leave each hook they do not use as production has it
        if f.stage in ("export", "config", "post-load"):
            assert f.resets_prefix_cache() and f.sync_bucket_mb(64.0) == 64.0 and not f.skips_replica(1)


def test_production_signatures_of_the_sync_path_carry_no_fault_argument():
    from fp8rl_core.loop import start_pipeline, sync_weights
    from fp8rl_core.sampler.vllm.engine import VllmSampler

    for fn in (VllmSampler.sync, sync_weights, start_pipeline):
        params = set(inspect.signature(fn).parameters)
        assert "hooks" in params, fn
        assert not params & {"fault", "tamper", "worker_fault", "bucket_mb", "reset_prefix_cache", "engine_schemes"}, fn
        assert inspect.signature(fn).parameters["hooks"].default is NO_HOOKS
