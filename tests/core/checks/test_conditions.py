"""W3 layout, W7 behaviour and fingerprints as pure functions, on hand-made cases; the fault catalogue's
declarations; the matrix verdicts."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.checks import check_behaviour, check_layout
from fp8rl_core.checks.faults import FAULTS, fault
from fp8rl_core.checks.layout import block_amax, match_error
from fp8rl_core.checks.matrix import summarize
from fp8rl_core.grids import quantize
from fp8rl_core.sync.fingerprint import fingerprint

GRID = "mxfp8-e4m3-rceil"


# ---------------------------------------------------------------------------- fingerprints
def test_fingerprint_covers_every_byte_and_is_canonical_across_float_dtypes():
    t = torch.arange(4096, dtype=torch.uint8).reshape(64, 64)
    fp = fingerprint(t)
    for i in (0, 1, 2047, 4095):  # any single byte flips the digest
        u = t.clone().flatten()
        u[i] ^= 0x01
        assert fingerprint(u.reshape(64, 64)) != fp
    assert fingerprint(t.reshape(32, 128)) != fp  # the shape is part of it
    b = torch.randn(8, 8).to(torch.bfloat16)
    assert fingerprint(b) == fingerprint(b.float())  # a float32 engine holding the BF16 view
    assert fingerprint(b.float() + 1e-6) != fingerprint(b)  # a value off the BF16 grid


# ---------------------------------------------------------------------------- W3 layout
def test_block_amax_by_hand():
    m = torch.tensor([[1.0, -3.0, 2.0, 0.5], [0.0, 0.25, -8.0, 1.0]])
    assert torch.equal(block_amax(m, 1, 2), torch.tensor([[3.0, 3.0, 2.0, 2.0], [0.25, 0.25, 8.0, 8.0]]))
    assert torch.equal(block_amax(m, 2, 4), torch.full((2, 4), 8.0))
    # an error of 1/4 of its block's amax is exactly the tolerance
    slot = m.clone()
    slot[1, 2] += 2.0
    assert match_error(slot, m, 1, 2) == pytest.approx(0.25)


def _engine(members: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    qs = [quantize(m, GRID) for m in members]
    return {"L.weight": torch.cat([q.data.view(torch.uint8) for q in qs]), "L.weight_scale": torch.cat([q.scale for q in qs])}


@pytest.fixture
def qkv():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 64, generator=g) * 0.05 for n in (64, 32, 32))
    masters = {"q_proj": q, "k_proj": k, "v_proj": v}
    return masters, {"L": {"scheme": "mxfp8", "sizes": [64, 32, 32]}}, {"L": ["q_proj", "k_proj", "v_proj"]}


def _layout(rb, masters, layers, groups, expected_shapes=None):
    shapes = {n: (list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in rb.items()}
    return check_layout(rb, shapes, expected_shapes or {}, layers, groups, masters, GRID)


def test_layout_passes_the_right_order_and_also_a_floor_requantization(qkv):
    masters, layers, groups = qkv
    assert _layout(_engine([masters["q_proj"], masters["k_proj"], masters["v_proj"]]), masters, layers, groups).passed
    floor = [quantize(quantize(m, GRID).dequantize(), "mxfp8-e4m3-floor") for m in masters.values()]
    rb = {"L.weight": torch.cat([q.data.view(torch.uint8) for q in floor]), "L.weight_scale": torch.cat([q.scale for q in floor])}
    assert _layout(rb, masters, layers, groups).passed  # another legal grid is W2's business, not W3's


def test_layout_names_a_swapped_fused_order(qkv):
    masters, layers, groups = qkv
    r = _layout(_engine([masters["q_proj"], masters["v_proj"], masters["k_proj"]]), masters, layers, groups)
    assert not r.passed
    assert r.offenders == ["L slot 1 holds v_proj, expected k_proj", "L slot 2 holds k_proj, expected v_proj"]


def test_layout_catches_scales_of_the_other_orientation(qkv):
    masters, layers, groups = qkv
    rb = _engine(list(masters.values()))
    full = torch.cat(list(masters.values()))
    col = quantize(full, GRID, axis=0).scale  # [N/32, K]
    rb["L.weight_scale"] = col.t().contiguous().reshape(rb["L.weight_scale"].shape)
    r = _layout(rb, masters, layers, groups)
    assert not r.passed and all("matches no member" in o for o in r.offenders)


def test_layout_reports_both_shapes(qkv):
    masters, layers, groups = qkv
    rb = _engine(list(masters.values()))
    rb["L.weight_scale"] = rb["L.weight_scale"].t().contiguous()
    r = _layout(rb, masters, {}, groups, {"L.weight_scale": ((128, 2), True)})
    assert r.offenders == ["L.weight_scale: engine [2, 128] uint8, expected [128, 2] bytes"]


def test_layout_finds_an_expert_permutation():
    g = torch.Generator().manual_seed(1)
    gu, down = torch.randn(3, 64, 32, generator=g) * 0.05, torch.randn(3, 32, 32, generator=g) * 0.05
    masters = {"E.gate_up_proj": gu, "E.down_proj": down}
    q13, q2 = quantize(torch.roll(gu, 1, 0), GRID), quantize(down, GRID)
    rb = {"E.experts.w13_weight": q13.data.view(torch.uint8), "E.experts.w13_weight_scale": q13.scale,
          "E.experts.w2_weight": q2.data.view(torch.uint8), "E.experts.w2_weight_scale": q2.scale}
    r = _layout(rb, masters, {"E.experts": {"scheme": "mxfp8", "sizes": None}}, {"E.experts": list(masters)})
    assert not r.passed
    assert "E.experts w13[0].gate holds expert 2 gate, expected expert 0 gate" in r.offenders
    assert not any("w2" in o for o in r.offenders)


# ---------------------------------------------------------------------------- W7 behaviour
def test_behaviour_bounds_by_hand():
    s = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    ok = check_behaviour(s, s + torch.tensor([[1e-4, -1e-4], [0.0, 2e-4]]), 1e-3, 0.05)
    assert ok.passed and ok.measured == pytest.approx(1e-4, rel=1e-3)
    bad = check_behaviour(s, s + torch.tensor([[0.0, 0.0], [0.0, 0.2]]), 1e-1, 0.05)
    assert not bad.passed and bad.offenders[0] == "probe sequence 1 position 2: |Δlogp| 0.2"
    assert not check_behaviour(s, s * float("nan"), 1.0, 1.0).passed
    with pytest.raises(ValueError, match="shape"):
        check_behaviour(s, s[:1], 1.0, 1.0)


def test_a_coarse_probe_judges_the_positions_where_either_side_gives_the_token_real_probability():
    """The clean dense mini at step 40 (tests/correctness.md, W7): a probe token both sides deem impossible
    (log p −34.2 vs −25.8) moves |Δlogp| by 8.35 on a BF16 engine; with ``min_prob`` 1e-3 such a position is not
    judged, a token either side gives ≥ 1e-3 is (here the engine's −0.5 against the learner's −9.0: a fault)."""
    learner = torch.tensor([[-0.1, -34.2, -2.0], [-9.0, -0.7, -1.0]])
    engine = torch.tensor([[-0.2, -25.8, -2.1], [-9.1, -0.6, -1.1]])
    assert not check_behaviour(engine, learner, 0.5, 8.0).passed  # every position: the max is 8.4
    ok = check_behaviour(engine, learner, 0.5, 8.0, min_prob=1e-3)
    assert ok.passed and ok.measured == pytest.approx(0.1, abs=1e-6) and "(4 judged: p ≥ 0.001 on either side)" in ok.detail
    fault = engine.clone()
    fault[1, 0] = -0.5  # the engine puts real probability on a token the learner deems rare: judged, and it fails
    bad = check_behaviour(fault, learner, 0.5, 8.0, min_prob=1e-3)
    assert not bad.passed and bad.offenders[0] == "probe sequence 1 position 1: |Δlogp| 8.5"
    assert not check_behaviour(engine * float("nan"), learner, 0.5, 8.0, min_prob=1e-3).passed  # NaN always judged


# ---------------------------------------------------------------------------- catalogue and verdicts
def test_catalogue_declares_every_condition_w1_to_w6_and_the_issue_faults():
    names = {f.name for f in FAULTS}
    assert len(FAULTS) >= 15 and len(names) == len(FAULTS)
    assert {f.condition for f in FAULTS} == {"W1", "W2", "W3", "W4", "W5", "W6"}
    assert {f.stage for f in FAULTS} == {"config", "export", "transport", "post-load", "engine"}
    assert fault("replica-left-behind").replicas == 2
    with pytest.raises(KeyError, match="valid: dropped-bucket"):
        fault("nope")


def test_summary_marks_unique_and_redundant_checks():
    row = lambda name, cond, on: {"fault": name, "condition": cond, "caught_first": cond in on} | {
        c: int(c in on) for c in ("W1", "W2", "W3", "W4", "W5", "W6", "W7")}
    matrix = [row("a", "W2", {"W2", "W7"}), row("b", "W6", {"W6"}), row("c", "W3", {"W2", "W3", "W7"})]
    clean = [{"false_alarm": False}, {"false_alarm": True}]
    s = summarize(matrix, clean)
    assert (s["faults/total"], s["faults/caught_first"], s["clean/false_alarms"]) == (3, 3, 1)
    assert s["checks"]["W6"]["unique"] == ["b"] and s["checks"]["W6"]["necessary"]
    assert s["checks"]["W2"]["unique_among_w1_w6"] == ["a"] and s["checks"]["W2"]["necessary"]
    assert not s["checks"]["W3"]["necessary"] and "fired with W2, W7" in s["checks"]["W3"]["why_redundant"]
    assert "fired on no fault" in s["checks"]["W1"]["why_redundant"]
