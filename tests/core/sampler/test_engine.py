"""The sampler on a real vLLM engine: byte-exact syncs, the cache reset, the W7 probe, reuse, the loop.

Tests are ordered by the engine they use (see conftest: at most two engines live at once).
"""

from __future__ import annotations

import math
import os
import threading

import pytest
import torch

from fp8rl_core.checks import CheckPolicy, CheckRunner, expected_from_learner, expected_sync_tensors
from fp8rl_core.learner.task import EOS
from fp8rl_core.loop import run_rl
from fp8rl_core.checks.faults import Fault, fault
from fp8rl_core.sampler.config import SamplerConfig, cpu_fp8_kv_support
from fp8rl_core.sampler import pool
from fp8rl_core.sampler.seam import SamplerError
from fp8rl_core.sampler.vllm.engine import VllmSampler

from .conftest import ENGINE, SPAWNED, TASK, tp2_pipeline

PROBE = TASK.prompts(16, seed=123, split="eval").sequences  # [16, 11]: prompt + answer
LONG = torch.tensor([[1] + [5 + (i * 7) % 10 for i in range(39)]])  # 40 tokens: one full 32-token KV block


def _assert_readback_equals_export(pipe) -> None:
    want = pipe.export()
    got = pipe.sampler.read_back()
    missing = sorted(set(want) - set(got))
    assert not missing, f"engine lacks {missing[:5]}"
    bad = []
    for name, t in want.items():
        r = got[name]
        if t.dtype == torch.uint8:  # on-grid: FP8 data / E8M0 scale bytes
            ok = r.dtype == torch.uint8 and r.shape == t.shape and torch.equal(r, t)
        else:  # BF16 view, held in the engine's float32
            ok = r.shape == t.shape and torch.equal(r, t.to(r.dtype))
        if not ok:
            bad.append(name)
    assert bad == [], f"{len(bad)} tensors differ from the learner's, e.g. {bad[:5]}"


def _assert_loop_finite(pipe, steps=3) -> None:
    v0 = pipe.learner.version
    res = run_rl(pipe, TASK, steps, prompts_per_step=4, seed=1)
    assert [r["version"] for r in res.steps] == list(range(v0, v0 + steps))
    assert pipe.learner.version == pipe.sampler.version == v0 + steps
    assert pipe.sampler.engine_version() == [v0 + steps]
    for r in res.steps:
        for key in ("mean_reward", "loss", "grad_norm", "mean_abs_logprob_diff", "generate_s", "learner_s",
                    "export_s", "transport_s", "load_s", "total_s"):
            assert math.isfinite(r[key]), (key, r)
        assert 0 <= r["mean_reward"] <= 1 and r["tokens"] > 0 and r["sync_bytes"] > 0
        assert r["generate_s"] > 0 and r["load_s"] > 0 and r["total_s"] >= r["generate_s"] + r["learner_s"]
    assert len(res.tokens) == sum(r["tokens"] for r in res.steps)
    assert all(t["sampler_logprob"] <= 0 and math.isfinite(t["learner_logprob"]) for t in res.tokens)
    assert any(r["grad_norm"] > 0 for r in res.steps)  # partial rewards: the policy really trained


# ---------------------------------------------------------------- dense, every layer on the learner's grid
def test_dense_sync_lands_the_learners_exact_bytes(engines):
    pipe = engines.get("dense", "all")
    assert set(pipe.schemes.values()) == {"mxfp8"} and len(pipe.schemes) == 8
    _assert_readback_equals_export(pipe)
    before = pipe.sampler.layers()
    runner = CheckRunner(CheckPolicy(), probe=PROBE)
    runner.start(pipe.samplers)
    run_rl(pipe, TASK, 1, prompts_per_step=4)  # a real GRPO step, then the sync
    assert pipe.learner.version == 1 and pipe.sampler.engine_version() == [1]
    _assert_readback_equals_export(pipe)
    after = pipe.sampler.layers()
    assert {p: after[p]["processed"] - before[p]["processed"] for p in after} == {p: 1 for p in after}
    report = runner.check(pipe)  # the first sync gets the full tier: all seven conditions
    assert report.full and report.why == "first sync"
    assert {r.condition: r.passed for r in report.results} == {f"W{i}": True for i in range(1, 8)}, report.message()
    # the effective operand (probe forward with an identity input) is the dequantized forward weight
    fw = pipe.learner.forward_weights()
    eff = pipe.sampler.read_back(["model.layers.1.self_attn.qkv_proj.effective"], effective=True)
    want = torch.cat([fw[f"model.layers.1.self_attn.{s}_proj"].dequantize() for s in "qkv"])
    assert torch.equal(eff["model.layers.1.self_attn.qkv_proj.effective"], want)


def test_dense_on_grid_probe_matches_the_learner_tightly(engines):
    pipe = engines.get("dense", "all")
    s = pipe.sampler.prompt_logprobs(PROBE)
    lrn = pipe.learner.probe_logprobs(PROBE)
    d = (s - lrn).abs()
    # measured: mean 1e-4, max 8e-3 — fp32 summation-order noise flips a few FP8 activation roundings
    assert d.mean() < 1e-3 and d.max() < 0.05, (float(d.mean()), float(d.max()))
    full_s = pipe.sampler.prompt_logprobs(PROBE[:4], full=True)
    full_l = pipe.learner.probe_logprobs(PROBE[:4], full=True)
    kl = (full_s.exp() * (full_s - full_l)).sum(-1)
    assert full_s.shape == (4, PROBE.shape[1] - 1, 1024) and kl.max() < 1e-2 and kl.min() > -1e-6
    assert torch.allclose(full_s.logsumexp(-1), torch.zeros(4, PROBE.shape[1] - 1), atol=1e-4)
    assert torch.equal(full_s.gather(-1, PROBE[:4, 1:, None]).squeeze(-1), s[:4])
    pipe.probe_mean_abs = float(d.mean())


def test_sync_changes_generation_and_the_prefix_cache_reset_is_needed(engines):
    pipe = engines.get("dense", "all")
    sampler, learner = pipe.sampler, pipe.learner

    def gen():
        return sampler.generate(LONG, 1, 6, seed=7, eos_id=EOS)

    first = gen()
    again = gen()
    assert again.cached_tokens >= 32  # the prompt's full block came from the prefix cache
    assert torch.equal(again.completion_ids, first.completion_ids) and torch.equal(again.sampler_logprobs, first.sampler_logprobs)
    with torch.no_grad():  # a large change of every weight, then a sync *without* the cache reset
        g = torch.Generator().manual_seed(0)
        for p in learner.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    learner.version += 1
    runner = CheckRunner(CheckPolicy(), probe=None)
    runner.start(pipe.samplers)
    runner.request_full("")  # cheap tier only: the cache check needs no read-back
    runner.seen.add(sampler.instance)
    sampler.sync(pipe.export(), learner.version, hooks=fault("prefix-cache-kept"))  # the catalogue's fault
    assert sampler.prefix_cache_blocks() > 0
    report = runner.check(pipe)
    w6 = report.results_by["W6"]
    assert not w6.passed and w6.offenders[:2] == [f"prefix cache holds {sampler.prefix_cache_blocks()} blocks",
                                                  "the prefix cache was not reset since the previous sync"]
    assert report.full and report.why == "cheap tier failed: W6"  # suspicion escalates to the full tier
    stale = gen()
    assert stale.cached_tokens >= 32
    sampler.reset_prefix_cache()
    assert sampler.prefix_cache_blocks() == 0
    fresh = gen()
    assert fresh.cached_tokens == 0
    assert not torch.equal(fresh.sampler_logprobs, first.sampler_logprobs)  # new weights, new generation
    assert not torch.equal(stale.sampler_logprobs, fresh.sampler_logprobs)  # the stale cache changed results
    # a normal sync resets the cache: its first generation equals a cache-free one
    learner.version += 1
    sampler.sync(pipe.export(), learner.version)
    assert sampler.prefix_cache_blocks() == 0
    after = gen()
    assert after.cached_tokens == 0 and torch.equal(after.sampler_logprobs, fresh.sampler_logprobs)


def test_loop_dense_all(engines):
    _assert_loop_finite(engines.get("dense", "all"))


# ---------------------------------------------------------------- dense, BF16 sampler (one engine, two presets)
def test_one_engine_serves_both_bf16_sampler_presets_identically(engines):
    a = engines.get("dense", "bf16-e2e")
    first = a.sampler.generate(PROBE[:4, :7], 2, 5, seed=3, eos_id=EOS)
    b = engines.get("dense", "bf16-sampler")
    assert b.sampler is a.sampler  # reused, not restarted: same engine identity
    assert b.learner.cfg.precision == "mxfp8" and a.learner.cfg.precision == "bf16"
    run_rl(b, TASK, 1, prompts_per_step=4)  # B's weights move
    moved = a.sampler.generate(PROBE[:4, :7], 2, 5, seed=3, eos_id=EOS)
    assert not torch.equal(moved.sampler_logprobs, first.sampler_logprobs)
    a.sampler.sync(a.export(), 0)  # back to A's weights
    again = a.sampler.generate(PROBE[:4, :7], 2, 5, seed=3, eos_id=EOS)
    assert torch.equal(again.completion_ids, first.completion_ids)
    assert torch.equal(again.sampler_logprobs, first.sampler_logprobs)


def test_bf16_sampler_differs_measurably_from_the_mxfp8_learner(engines):
    pipe = engines.get("dense", "bf16-sampler")
    d = (pipe.sampler.prompt_logprobs(PROBE) - pipe.learner.probe_logprobs(PROBE)).abs()
    assert d.mean() > 2e-3, float(d.mean())  # measured ≈ 2e-2: 20-200x the on-grid sampler's
    bf16 = engines.get("dense", "bf16-e2e")
    d0 = (bf16.sampler.prompt_logprobs(PROBE) - bf16.learner.probe_logprobs(PROBE)).abs()
    assert d0.max() < 1e-5, float(d0.max())  # BF16 end to end in fp32: the same arithmetic, ~1e-6


@pytest.mark.parametrize("preset", ["bf16-e2e", "bf16-sampler"])
def test_loop_dense_bf16_samplers(engines, preset):
    _assert_loop_finite(engines.get("dense", preset))


@pytest.mark.parametrize("preset", ["half", "other-grid"])
def test_loop_dense_other_presets(engines, preset):
    pipe = engines.get("dense", preset)
    layers = pipe.sampler.layers()
    on = {p for p, v in layers.items() if v["scheme"] != "bf16"}
    if preset == "half":
        assert on == {p for p in layers if p.startswith("model.layers.1.")}
        _assert_readback_equals_export(pipe)
    else:
        assert {layers[p]["scheme"] for p in on} == {"block128"} and len(on) == 8
    _assert_loop_finite(pipe)


# ---------------------------------------------------------------- dense, the sampler requantizes the BF16 view
#: one wrong E4M3 byte on top of a requant sampler's own quantization (layer 0's qkv_proj, first byte)
REQUANT_FAULT = Fault("requant-byte-flipped", "W2", "post-load", "dense",
                      "one byte of the sampler's own MXFP8 quantization of the BF16 view is wrong",
                      worker="fp8rl_core.checks.faults:worker_requant_byte_flipped")
#: the same byte flipped on tensor-parallel rank 1 only
REQUANT_FAULT_RANK1 = Fault("requant-byte-flipped-rank1", "W2", "post-load", "dense",
                            "one byte of rank 1's own MXFP8 quantization of its BF16 shard is wrong",
                            worker="fp8rl_core.checks.faults:worker_requant_byte_flipped_on_rank1")


def _requant_runner() -> CheckRunner:
    """The checks as a run configures them for preset requant on a float32 engine (W7: the coarse bound of a
    sampler whose bytes are not the learner's)."""
    return CheckRunner(CheckPolicy().for_engine("float32", "requant"), probe=PROBE)


def _vllm_online_mxfp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import _mxfp8_e4m3_quantize_torch

    data, scale = _mxfp8_e4m3_quantize_torch(w)
    return data.view(torch.uint8), scale


def _assert_engine_requantizes_like_vllm(pipe) -> set[str]:
    """The sync sends the BF16 view of every requant layer (no scales), and the live engine holds vLLM's
    online MXFP8 quantization of it, byte for byte; returns the requant layers."""
    layers = pipe.sampler.layers()
    on = {p for p, v in layers.items() if v["scheme"] != "bf16"}
    assert {layers[p]["scheme"] for p in on} == {"requant"}
    sent, held = pipe.export(), pipe.sampler.read_back()
    for p in on:
        for w in (("w13_", "w2_") if p.endswith(".experts") else ("",)):
            view = sent[f"{p}.{w}weight"]
            assert view.dtype == torch.bfloat16 and f"{p}.{w}weight_scale" not in sent
            data, scale = _vllm_online_mxfp8(view)
            assert torch.equal(held[f"{p}.{w}mx_data"], data), f"{p}.{w}mx_data"
            assert torch.equal(held[f"{p}.{w}mx_scale"], scale), f"{p}.{w}mx_scale"
    return on


def test_requant_sampler_measures_its_bytes_and_a_planted_byte_is_caught(engines):
    pipe = engines.get("dense", "requant")
    assert len(_assert_engine_requantizes_like_vllm(pipe)) == 8
    runner = _requant_runner()
    runner.start(pipe.samplers)
    run_rl(pipe, TASK, 1, prompts_per_step=4)
    report = runner.check(pipe)
    assert report.full and len(report.results) == 7 and not report.failed, report.message()
    m = report.metrics()
    # measured on this test's warm start at version 0: data 3.43%, scales 0.35% (a measured fraction, not a failure)
    assert 0.01 < m["requant/data_bytes_differ"] < 0.1 and 0 < m["requant/scale_bytes_differ"] < 0.05, m
    assert {k.rsplit("/", 1)[-1] for k in m if k.count("/") == 2} == {"attention", "mlp"}
    assert "of data bytes" in report.results_by["W2"].detail
    # one byte flipped on top of the requantization: W2 computes the expected bytes, so it fails naming the tensor
    pipe.sampler.sync(pipe.export(), pipe.learner.version, hooks=REQUANT_FAULT)
    runner.request_full("planted fault")
    report = runner.check(pipe)
    assert [r.condition for r in report.failed] == ["W2"], report.message()
    w2 = report.results_by["W2"]
    assert "model.layers.0.self_attn.qkv_proj.mx_data" in w2.offenders  # the cheap tier's fingerprint
    assert any(o.startswith("model.layers.0.self_attn.qkv_proj.mx_data (1 of ") for o in w2.offenders)
    assert w2.quantities == {k: v for k, v in m.items() if k.startswith("requant/")}  # the same learner bytes
    pipe.sampler.sync(pipe.export(), pipe.learner.version)  # clean again for the next user of the engine
    assert not runner.check(pipe).failed


def test_requant_at_tensor_parallel_2_checks_each_ranks_own_bytes_and_names_a_byte_flipped_on_rank_1(
        checkpoints, tmp_path):
    """A spawned engine over two tensor-parallel ranks (vLLM's multiprocess executor), preset requant: each
    rank quantizes the BF16 shard it loaded, and W2 compares those bytes, per rank, with the rule applied to
    the learner's BF16 view cut for that rank — fingerprints (cheap tier) and every byte (full tier). One
    byte flipped on rank 1 only, in layer 0's qkv_proj, fails W2 naming rank 1 and the tensor."""
    with pytest.raises(SamplerError, match="1 for an in-process engine"):
        VllmSampler(checkpoints["dense"], {}, {}, ENGINE, tensor_parallel=2)
    pipe = tp2_pipeline(checkpoints["dense"], "requant", tmp_path)
    learner, sampler, schemes = pipe.learner, pipe.sampler, pipe.schemes
    try:
        assert [r["version"] for r in sampler.state(fingerprints=False)["ranks"]] == [0, 0]  # two ranks
        runner = _requant_runner()
        runner.start(pipe.samplers)
        run_rl(pipe, TASK, 1, prompts_per_step=4)
        report = runner.check(pipe)  # the first sync: both tiers
        assert report.full and not report.failed, report.message()
        w2 = report.results_by["W2"]
        assert w2.detail.count("2 tensor-parallel ranks checked their own live shards") == 2, w2.detail
        assert 0.01 < w2.quantities["requant/data_bytes_differ"] < 0.1, w2.quantities
        # what the ranks compared: every requant layer's own data and scales (8 layers), nothing else on the grid
        grid = expected_sync_tensors(expected_from_learner(learner, schemes), "grid")
        assert len(grid) == 16 and all(n.endswith((".mx_data", ".mx_scale")) for n in grid)
        assert [(c.rank, c.passed, c.tensors) for c in sampler.check_ranks(grid)] == [(0, True, 16), (1, True, 16)]

        sampler.sync(pipe.export(), learner.version, hooks=REQUANT_FAULT_RANK1)
        report = runner.check(pipe)
        assert report.why == "cheap tier failed: W2" and [r.condition for r in report.failed] == ["W2"], \
            report.message()
        w2 = report.results_by["W2"]
        assert w2.failing_ranks == [1] and len(w2.offenders) == 2, w2.offenders
        where = "tp rank 1/2, layer model.layers.0.self_attn.qkv_proj, mx_data"
        assert w2.offenders[0].startswith(f"{where}: fingerprint ")  # the cheap tier
        assert w2.offenders[1].startswith(f"{where}: first difference at [0, 0] ")  # the full tier, its position
        assert w2.offenders[1].endswith("; 1 of 16384 elements differ")  # rank 1's q | k | v rows: 128 × 128
        sampler.sync(pipe.export(), learner.version)
        assert not runner.check(pipe).failed
    finally:
        sampler.close()


# ---------------------------------------------------------------- MoE
def test_moe_sync_lands_the_learners_exact_bytes(engines):
    pipe = engines.get("moe", "all")
    assert pipe.schemes["model.layers.0.mlp.experts"] == "mxfp8" and "model.layers.0.mlp.gate" not in pipe.schemes
    _assert_readback_equals_export(pipe)
    runner = CheckRunner(CheckPolicy(), probe=PROBE)
    runner.start(pipe.samplers)
    run_rl(pipe, TASK, 1, prompts_per_step=4)
    _assert_readback_equals_export(pipe)
    report = runner.check(pipe)
    assert report.full and len(report.results) == 7 and not report.failed, report.message()
    d = (pipe.sampler.prompt_logprobs(PROBE) - pipe.learner.probe_logprobs(PROBE)).abs()
    assert d.mean() < 2e-3, float(d.mean())


def test_a_spawned_engine_computes_what_an_in_process_one_does_and_stops_in_the_background(engines):
    """The same bytes in an engine of processes of its own (``process="spawn"``, what a deployment runs)
    and in one inside this process: the same weights read back, bit-identical log-probs at the same thread
    count, every check passing; evicted from the pool, the spawned engine stops in a background thread
    while the next engine starts, and its processes exit by themselves."""
    one = {"threads": 1}
    inproc = engines.get("moe", "all", ENGINE.model_copy(update=one))
    want = inproc.sampler.prompt_logprobs(PROBE)
    spawned = engines.get("moe", "all", SPAWNED.model_copy(update=one))
    sampler = spawned.sampler
    assert sampler is not inproc.sampler and not sampler.in_process and inproc.sampler.in_process
    procs = list(sampler.llm.llm_engine.engine_core.resources.engine_manager.processes)
    assert procs and all(p.is_alive() and p.pid != os.getpid() for p in procs)
    _assert_readback_equals_export(spawned)
    assert torch.equal(sampler.prompt_logprobs(PROBE), want)
    runner = CheckRunner(CheckPolicy(), probe=PROBE)
    runner.start(spawned.samplers)
    run_rl(spawned, TASK, 1, prompts_per_step=4)
    report = runner.check(spawned)
    assert report.full and len(report.results) == 7 and not report.failed, report.message()

    # the next in-process engine closes the live in-process one at once (one per process) and, with room for
    # one engine, evicts the spawned one, which stops in the background while the new one starts
    nxt, resync = pool.acquire(engines.checkpoints["moe"], spawned.schemes, spawned.export(), ENGINE, max_live=1)
    assert resync is None and nxt.in_process and list(pool._ENGINES.values()) == [nxt]
    assert inproc.sampler.llm is None and sampler not in pool._ENGINES.values()
    for t in [t for t in threading.enumerate() if t.name == "fp8rl-engine-close"]:
        t.join()
    assert not pool.closing() and sampler.llm is None and not sampler.alive
    # its engine core exited by itself (a negative exit code would mean killed by a signal)
    assert all(p.exitcode is not None and p.exitcode >= 0 for p in procs), [p.exitcode for p in procs]


def test_an_in_process_engine_leaves_the_process_as_it_found_it(engines, checkpoints, tmp_path):
    """vLLM's in-process start-up pins torch to one thread, disables ``torch.set_num_threads``, seeds the
    global generators, freezes the GC heap and edits the environment (vllm_compat, 3): none of it may
    reach the learner that shares the process. A second live in-process engine is refused (vLLM keeps the
    parallel groups and worker extension process-wide)."""
    import gc
    import os as _os
    import random
    import weakref

    import numpy as np

    from fp8rl_core.sampler.vllm.engine import VllmSampler

    pipe = engines.get("dense", "all")
    cfg = ENGINE.model_copy(update={"max_num_seqs": 32})  # an identity of its own: a start, not the pool's
    with pytest.raises(SamplerError, match="already live in this process.*close it first"):
        VllmSampler(checkpoints["dense"], pipe.schemes, pipe.export(), cfg, work_root=tmp_path)
    want = pipe.sampler.prompt_logprobs(PROBE)
    pool.release_all()  # the pool's in-process engine closed: now this process may start another
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = (torch.get_num_threads(), torch.set_num_threads, dict(_os.environ), gc.get_freeze_count(), gc.collect,
              torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    sampler = VllmSampler(checkpoints["dense"], pipe.schemes, pipe.export(), cfg, work_root=tmp_path)
    try:
        sampler.generate(PROBE[:2, :6], 2, 4, seed=0, eos_id=EOS)
        sampler.prompt_logprobs(PROBE[:2])  # samples a token without a seed: vLLM's global generator
        sampler.sync(pipe.export(), 1)
        assert sampler.state()["ranks"][0]["version"] == 1
        engine = weakref.ref(sampler.llm.llm_engine)
    finally:
        sampler.close()
    # the close's one collection (vllm_compat.collected_once) ran after the engine was dropped: it is gone
    assert engine() is None
    after = (torch.get_num_threads(), torch.set_num_threads, dict(_os.environ), gc.get_freeze_count(), gc.collect,
             torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    assert after[:5] == before[:5]
    assert torch.equal(after[5], before[5]) and after[6] == before[6] and (after[7] == before[7]).all()
    torch.set_num_threads(before[0])  # the real function: it takes effect
    assert torch.get_num_threads() == before[0]
    # the next in-process engine starts afresh and computes what the closed one did
    again = engines.get("dense", "all")
    assert again.sampler is not pipe.sampler and again.sampler.alive and not pipe.sampler.alive
    assert torch.equal(again.sampler.prompt_logprobs(PROBE), want)


def test_loop_moe_all(engines):
    _assert_loop_finite(engines.get("moe", "all"))


def test_moe_bf16_experts_are_repacked_on_every_sync(engines):
    """vLLM 0.32's CPU MoE prepacks BF16 experts only at first load; the plugin redoes it per sync.
    Re-syncing identical weights must leave every log-prob bit-identical (it moved them by 0.11 before)."""
    pipe = engines.get("moe", "bf16-e2e")
    before = pipe.sampler.prompt_logprobs(PROBE)
    for v in (0, 0):
        pipe.sampler.sync(pipe.export(), v)
    assert torch.equal(pipe.sampler.prompt_logprobs(PROBE), before)
    d = (before - pipe.learner.probe_logprobs(PROBE)).abs()
    assert d.max() < 1e-4, float(d.max())


@pytest.mark.parametrize("preset", ["bf16-e2e", "bf16-sampler", "half", "other-grid"])
def test_loop_moe_presets(engines, preset):
    _assert_loop_finite(engines.get("moe", preset))


def test_moe_requant_sampler_requantizes_the_experts_and_measures_them(engines):
    pipe = engines.get("moe", "requant")
    assert "model.layers.0.mlp.experts" in _assert_engine_requantizes_like_vllm(pipe)
    runner = _requant_runner()
    runner.start(pipe.samplers)
    _assert_loop_finite(pipe, steps=1)
    report = runner.check(pipe)
    assert report.full and not report.failed, report.message()
    m = report.metrics()
    assert {k.rsplit("/", 1)[-1] for k in m if k.count("/") == 2} == {"attention", "experts"}
    assert 0 < m["requant/data_bytes_differ/experts"] < 0.1, m


# ---------------------------------------------------------------- FP8 KV cache
@pytest.mark.parametrize("text, ok", [("flags : fpu sse avx2 avx512f avx512bw", True), ("flags : fpu sse amx_tile", True),
                                      ("flags : fpu sse avx2 fma", False)])
def test_fp8_kv_support_detection(text, ok):
    got, why = cpu_fp8_kv_support(text)
    assert got is ok and ("AVX-512" in why or ok)


def test_fp8_kv_cache_runs_or_is_refused_clearly(engines, monkeypatch):
    cfg = SamplerConfig(**(ENGINE.model_dump() | {"kv_cache_dtype": "fp8_e4m3", "dtype": "bfloat16"}))
    if not cpu_fp8_kv_support()[0]:
        with pytest.raises(SamplerError, match="AVX-512"):
            engines.get("dense", "all", cfg)
        return
    pipe = engines.get("dense", "all", cfg)
    roll = pipe.sampler.generate(PROBE[:4, :7], 2, 5, seed=0, eos_id=EOS)
    assert torch.isfinite(roll.sampler_logprobs).all() and roll.tokens > 0
    d = (pipe.sampler.prompt_logprobs(PROBE) - pipe.learner.probe_logprobs(PROBE)).abs()
    assert math.isfinite(float(d.mean()))
