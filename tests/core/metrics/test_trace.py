"""Trace analysis on a hand-written GPU trace with planted gaps, on small synthetic traces, and on CPU
traces recorded here with torch.profiler.

The fixture ``fixtures/gpu_trace_mxfp8.json`` (times in µs; host pid 100/tid 100, device 0 streams 7, 13)::

    host   aten::mm 1050–1095 ⊃ launch c1 @1060      quantize-annotation 1095–1260 ⊃ mxfp8::quantize_rowwise
           1096–1112 ⊃ launch c2 @1100, aten::_to_copy 1150–1250   gemm-annotation 1270–1300 ⊃ aten::mm
           1275–1295 ⊃ launch c3 @1280   aten::add 1345–1370 ⊃ launches c4 @1350, c5 @1360   aten::index
           1380–1585   gemm-annotation 1585–1640 ⊃ aten::mm 1588–1595 ⊃ launch @1590 (flow id 6 only)
           aten::copy_ 1690–1705 ⊃ cudaMemcpyAsync c7 @1695
    device c1 sm90_xmma_gemm 1100–1200 | c2 quantize_mxfp8 1200–1250 | gap A 1250–1300 (launch 1280: host)
           | c3 cutlass_mxfp8_gemm 1300–1400 | gap B 1400–1420 (launch 1350 < 1400: device-side)
           | c4 elementwise 1420–1450 ∪ c5 (stream 13) 1440–1480 | gap C 1480–1600 (launch 1590: host)
           | flow-linked ampere gemm 1600–1650 | gap D 1650–1700 (launch 1695: host) | memcpy c7 1700–1710
    wall 1050–1710 = 660; device busy 370; device span 1100–1710 = 610 → idle 240, host-bound 220
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from fp8rl_core.grids import quantize
from fp8rl_core.metrics.trace import (
    NO_DEVICE_MESSAGE,
    added_time_idle_fraction,
    gpu_idle,
    load_trace,
    phase_times,
    wall_window,
)

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_trace_mxfp8.json"


def X(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def bf16_trace() -> dict:
    """Same work without MXFP8: one op launching two back-to-back kernels. Wall 1000–1400 = 400 µs;
    idle = the leading 100 µs before the first kernel, host-bound (its launch at 1010 ≥ 1000)."""
    return {"traceEvents": [
        X("aten::mm", "cpu_op", 1000, 90), X("cudaLaunchKernel", "cuda_runtime", 1010, 10, correlation=1),
        X("cudaLaunchKernel", "cuda_runtime", 1030, 10, correlation=2),
        X("sm90_xmma_gemm_bf16", "kernel", 1100, 200, pid=0, tid=7, device=0, correlation=1),
        X("sm90_xmma_gemm_bf16", "kernel", 1300, 100, pid=0, tid=7, device=0, correlation=2),
    ]}


# ------------------------------------------------------------------------------------ the GPU fixture


def test_fixture_is_a_chrome_trace():
    events = load_trace(FIXTURE)
    assert len(events) == len(json.loads(FIXTURE.read_text())["traceEvents"]) == 33
    assert wall_window(FIXTURE) == (1050.0, 1710.0)  # the 'Trace' envelope 1000–1900 is not the wall


def test_gpu_idle_recovers_the_planted_gaps():
    r = gpu_idle(FIXTURE)
    assert r.has_device_activity and r.message is None
    assert r.device_events == 7  # gpu_user_annotation is not device work
    assert r.window_us == (1100.0, 1710.0)
    assert (r.busy_us, r.idle_us) == (370.0, 240.0)
    assert r.idle_fraction == 240 / 610
    got = [(g.start_us, g.end_us, g.cause, g.launch_us) for g in r.gaps]
    assert got == [(1250, 1300, "host", 1280), (1400, 1420, "device", 1350), (1480, 1600, "host", 1590),
                   (1650, 1700, "host", 1695)]
    assert r.gaps[2].next == "ampere_bf16_s16816gemm_bf16_128x64"  # linked through flow events only
    assert (r.n_gaps, r.host_bound_gaps) == (4, 3)
    assert (r.host_bound_us, r.device_side_us, r.unknown_us) == (220.0, 20.0, 0.0)
    assert r.host_bound_fraction == 220 / 240
    assert r.host_bound_gap_fraction == 3 / 4


@pytest.mark.parametrize(
    "window, busy, idle, host, unknown, first_gap",
    [
        ("wall", 370, 290, 270, 0, (1050, 1100, "host")),  # + idle before the first kernel (launched at 1060)
        ((1050, 1800), 370, 380, 270, 90, (1050, 1100, "host")),  # + a trailing gap with no kernel after it
        ((1260, 1500), 160, 80, 40, 20, (1260, 1300, "host")),  # clipped: c3 and c4∪c5 only
    ],
)
def test_gpu_idle_windows(window, busy, idle, host, unknown, first_gap):
    r = gpu_idle(FIXTURE, window)
    assert (r.busy_us, r.idle_us, r.host_bound_us, r.unknown_us) == (busy, idle, host, unknown)
    assert (r.gaps[0].start_us, r.gaps[0].end_us, r.gaps[0].cause) == first_gap
    assert sum(g.dur_us for g in r.gaps) == idle


@pytest.mark.parametrize(
    "by, where, expected, counts",
    [
        ("annotations", "host", {"gemm": 85, "quantize": 165, "other": 410}, {"gemm": 2, "quantize": 1}),
        ("names", "host", {"gemm": 72, "quantize": 16, "other": 572}, {"gemm": 3, "quantize": 1}),
        # kernels take the phase of the annotation around their launch: c1 (launched outside one) is other
        ("annotations", "device", {"gemm": 150, "quantize": 50, "other": 170, "idle": 290}, {"gemm": 2, "quantize": 1}),
        ("names", "device", {"gemm": 250, "quantize": 50, "other": 70, "idle": 290}, {"gemm": 3, "quantize": 1}),
    ],
)
def test_phase_times_on_the_fixture(by, where, expected, counts):
    r = phase_times(FIXTURE, by=by, where=where)
    assert r["by"] == by and r["wall_us"] == 660.0
    assert r["phases_us"] == expected
    assert r["counts"] == counts
    assert sum(r["phases_us"].values()) == r["wall_us"]


def test_auto_prefers_annotations_and_falls_back_to_names():
    assert phase_times(FIXTURE)["by"] == "annotations"
    events = [e for e in load_trace(FIXTURE) if e.get("cat") != "user_annotation"]
    r = phase_times(events)
    assert r["by"] == "names" and r["phases_us"]["gemm"] == 72


def test_added_time_idle_fraction_planted():
    # MXFP8 wall 660, idle 290 (host-bound 270); BF16 wall 400, idle 100 (host-bound 100)
    r = added_time_idle_fraction(FIXTURE, bf16_trace())
    assert r.wall_us == {"mxfp8": 660.0, "bf16": 400.0}
    assert r.idle_us == {"mxfp8": 290.0, "bf16": 100.0}
    assert (r.added_wall_us, r.added_idle_us, r.added_host_bound_us) == (260.0, 190.0, 170.0)
    assert r.idle_fraction_of_added == 190 / 260
    assert r.host_bound_fraction_of_added == 170 / 260
    assert r.message is None


def test_added_time_is_undefined_when_mxfp8_is_not_slower():
    r = added_time_idle_fraction(bf16_trace(), FIXTURE)
    assert r.added_wall_us == -260.0
    assert r.idle_fraction_of_added is None and "added no wall time" in r.message


# --------------------------------------------------------------------------- attribution, edge cases


@pytest.mark.parametrize(
    "events, expected",
    [
        # nested: the inner quantize range takes its 20 µs out of the outer gemm range
        ([X("gemm", "user_annotation", 0, 100), X("quantize", "user_annotation", 20, 20)],
         {"gemm": 80, "quantize": 20, "other": 0}),
        # the same phase on two threads, overlapping 30–50: counted once
        ([X("gemm", "user_annotation", 0, 50, tid=1), X("gemm", "user_annotation", 30, 50, tid=2),
          X("step", "user_annotation", 0, 100)], {"gemm": 80, "quantize": 0, "other": 20}),
        # a namespaced label is recognised; an unrelated annotation is not
        ([X("fp8rl::quantize", "user_annotation", 10, 30), X("optimizer", "user_annotation", 0, 100)],
         {"gemm": 0, "quantize": 30, "other": 70}),
    ],
)
def test_each_instant_is_attributed_once(events, expected):
    r = phase_times(events)
    assert r["phases_us"] == expected
    assert r["wall_us"] == 100


def test_nested_ops_are_not_double_counted_by_name():
    events = [X("aten::linear", "cpu_op", 0, 100), X("aten::matmul", "cpu_op", 5, 90), X("aten::mm", "cpu_op", 10, 80),
              X("aten::t", "cpu_op", 6, 2)]
    r = phase_times(events)
    assert r["by"] == "names" and r["phases_us"] == {"gemm": 90, "quantize": 0, "other": 10}
    assert r["counts"]["gemm"] == 2


def test_custom_phases_and_window():
    events = [X("attn_fwd", "cpu_op", 0, 40), X("aten::mm", "cpu_op", 40, 60)]
    r = phase_times(events, {"attention": r"attn"}, window=(20, 100))
    assert r["phases_us"] == {"attention": 20, "other": 60} and r["window_us"] == (20, 100)


def test_device_choice_is_required_with_two_devices():
    events = bf16_trace()["traceEvents"] + [X("k", "kernel", 1100, 10, pid=1, tid=7, device=1)]
    with pytest.raises(ValueError, match="device"):
        gpu_idle(events)
    assert gpu_idle(events, device=1).busy_us == 10


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: phase_times(FIXTURE, by="ops"), "by"),
        (lambda: phase_times(FIXTURE, where="gpu"), "where"),
        (lambda: phase_times(FIXTURE, {"other": "x"}), "phases"),
        (lambda: phase_times(FIXTURE, {"gemm": "("}), "phases"),
        (lambda: phase_times(FIXTURE, window=(5, 5)), "window"),
        (lambda: gpu_idle(FIXTURE, "all"), "window"),
        (lambda: gpu_idle(FIXTURE, device=3), "device"),
        (lambda: gpu_idle({"events": []}), "traceEvents"),
        (lambda: gpu_idle("/nonexistent/trace.json"), "no such file"),
        (lambda: phase_times({"traceEvents": [{"ph": "M", "name": "process_name"}]}), "nothing was profiled"),
        (lambda: phase_times([X("aten::mm", "cpu_op", 0, 1)], where="device"), "where"),
    ],
)
def test_bad_inputs_are_named(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# -------------------------------------------------------------------------- traces recorded here (CPU)


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    x, w = torch.randn(64, 256), torch.randn(256, 128)
    path = tmp_path_factory.mktemp("trace") / "cpu.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("quantize"):
            qx = quantize(x, "mxfp8-e4m3-rceil", axis=-1)
        with record_function("gemm"):
            qx.dequantize(torch.float32) @ w
    prof.export_chrome_trace(str(path))
    return path


def test_recorded_cpu_trace_phases(cpu_trace):
    r = phase_times(cpu_trace)
    assert r["by"] == "annotations" and r["counts"] == {"gemm": 1, "quantize": 1}
    p = r["phases_us"]
    assert p["quantize"] > 0 and p["gemm"] > 0 and p["other"] >= 0
    assert p["quantize"] + p["gemm"] <= r["wall_us"]
    assert sum(p.values()) == pytest.approx(r["wall_us"])
    by_name = phase_times(cpu_trace, by="names")
    assert by_name["counts"]["gemm"] >= 1 and 0 < by_name["phases_us"]["gemm"] <= p["gemm"] + p["other"]


def test_cpu_trace_has_no_device_kernels(cpu_trace):
    r = gpu_idle(cpu_trace)
    assert r.has_device_activity is False and r.message == NO_DEVICE_MESSAGE
    assert r.idle_us is None and r.gaps == ()
    a = added_time_idle_fraction(cpu_trace, cpu_trace)
    assert a.idle_fraction_of_added is None and "no device kernels" in a.message


def test_trace_of_a_grpo_step(tmp_path):
    """The learner's own trace (grpo_step(trace_path=...)) parses; its matmuls are found by name."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from fp8rl_core.learner.config import GRPOConfig
    from fp8rl_core.learner.grpo import RolloutBatch, grpo_step
    from fp8rl_core.learner.rollout import sample_completions

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, attn_implementation="eager"))
    prompts = torch.randint(5, 64, (1, 4), generator=torch.Generator().manual_seed(0)).repeat_interleave(4, 0)
    ids, mask, lp = sample_completions(model, prompts, 4, eos_id=2, seed=0)
    batch = RolloutBatch(prompts, ids, mask, torch.tensor([0.0, 1.0, 0.0, 1.0]), lp)
    path = tmp_path / "step.json"
    grpo_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, GRPOConfig(), version=0, trace_path=path)
    r = phase_times(path, by="names")
    assert r["phases_us"]["gemm"] > 0 and r["counts"]["gemm"] > 0
    assert r["phases_us"]["gemm"] + r["phases_us"]["quantize"] <= r["wall_us"]
    assert gpu_idle(path).message == NO_DEVICE_MESSAGE


def test_trace_of_an_mxfp8_learner_step_names_its_phases(tmp_path):
    """An MXFP8 learner's step labels its quantization and GEMMs (``timers.timed`` opens a
    ``record_function`` while the profiler records): the annotations give both phases."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from fp8rl_core.learner.grpo import RolloutBatch
    from fp8rl_core.learner.config import LearnerConfig
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.rollout import sample_completions

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=32, attn_implementation="eager"))
    learner = Learner(model, LearnerConfig(precision="mxfp8", lr=1e-3))
    prompts = torch.randint(5, 64, (1, 4), generator=torch.Generator().manual_seed(0)).repeat_interleave(4, 0)
    ids, mask, lp = sample_completions(model, prompts, 4, eos_id=2, seed=0)
    path = tmp_path / "mxfp8-step.json"
    res = learner.step(RolloutBatch(prompts, ids, mask, torch.tensor([0.0, 1.0, 0.0, 1.0]), lp), trace_path=path)
    r = phase_times(path, by="annotations")
    assert r["counts"]["quantize"] > 0 and r["counts"]["gemm"] > 0
    assert r["phases_us"]["quantize"] > 0 and r["phases_us"]["gemm"] > 0
    assert sum(r["phases_us"].values()) == pytest.approx(r["wall_us"])
    # the trace's quantize share is the same order as the step's own timers (both measure the same blocks)
    timed_q = sum(m.quantize_s for m in res.microbatches) * 1e6
    assert 0.2 * timed_q < r["phases_us"]["quantize"] < 5 * timed_q
