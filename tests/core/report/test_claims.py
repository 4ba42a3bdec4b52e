"""The paper's claims as data (fp8rl_core.report.claims): the table rendered from them, what each needs,
and a claim of an unknown kind refused where it is defined."""

from __future__ import annotations

import pytest

from fp8rl_core.metrics.power import VarianceComponents, sample_needed
from fp8rl_core.report import CLAIM_KINDS, CLAIMS, KL_KINDS, Claim, claim_verdict, claims_table, joint_verdict, needed_text


def test_the_claims_table_is_rendered_from_the_claims():
    lines = claims_table().splitlines()
    assert lines[0] == lines[2] == lines[-1] and set(lines[0]) == {"=", " "}
    assert lines[1].split()[:3] == ["id", "statement", "paper"]
    body = lines[3:-1]
    assert [ln.split()[0] for ln in body] == [c.id for c in CLAIMS]
    assert all(c.text in ln and c.paper in ln and ln.endswith(c.needs) for c, ln in zip(CLAIMS, body))


def test_every_claim_has_a_known_kind_and_every_kind_a_claim():
    assert {c.kind for c in CLAIMS} == set(CLAIM_KINDS)
    assert set(KL_KINDS) < set(CLAIM_KINDS)
    assert [c.id for c in CLAIMS if c.kind in KL_KINDS] == ["a", "b", "d", "e"]


def test_a_claim_of_an_unknown_kind_is_refused_naming_it_and_the_valid_kinds():
    with pytest.raises(ValueError) as err:
        Claim("z", "MXFP8 halves the cost", "2× cheaper", "cost_total")
    message = str(err.value)
    assert message.startswith("claim 'z': unknown kind 'cost_total'; valid: 'kl_ratio', 'kl_ratio_first_step', ")
    assert all(repr(k) in message for k in CLAIM_KINDS)


@pytest.mark.parametrize("field, value", [("direction", "sideways"), ("models", "sparse")])
def test_a_claim_with_an_unknown_direction_or_model_class_is_refused(field, value):
    with pytest.raises(ValueError, match=f"claim 'z': unknown {field} '{value}'; valid: "):
        Claim("z", "text", "paper", "kl_ratio", "bf16-sampler", "all", **{field: value})


def test_what_each_kind_needs():
    needs = {c.id: c.needs for c in CLAIMS}
    assert needs["a"] == "presets half and bf16-sampler with their tokens table"
    assert needs["d"] == "a MoE model, presets other-grid and all with their tokens table"
    assert needs["h3"] == "a dense model, presets all and bf16-e2e with a steps table or run time metrics"
    assert needs["c"] == "W2 checks of runs whose sampler holds layers on the learner's grid (presets half, all)"
    assert needs["f1"] == needs["f2"] == "micro-batch timings of a BF16 and an MXFP8 learner"
    assert needs["g"] == "a GPU profiler trace of each precision"


# ------------------------------------------------------------------- the one verdict rule, on real numbers

@pytest.mark.parametrize("what,lo,hi,direction,verdict", [
    # (b) on the MoE small at fixed weights, pooled (docs/results/matching-fixed-weights/summary.md)
    ("(b) MoE small, fixed weights", 0.587, 0.705, "lower", "reproduced"),
    # (d) on the MoE small at fixed weights, pooled
    ("(d) MoE small, fixed weights", 2.05, 2.57, "higher", "reproduced"),
    # (a) at the dense small's checkpoint seed2/step0: the CI lies on the other side of 1
    ("(a) dense small, seed2/step0", 1.13, 1.25, "lower", "contradicted"),
    # (a) on the dense small at fixed weights, pooled: the CI includes 1 (and the paper's 0.89 does not)
    ("(a) dense small, fixed weights", 0.921, 1.15, "lower", "unresolved"),
    # (a) on the dense mini by sampled-token k3 (docs/results/dense-matching): the CI holds the paper's own 0.89
    ("(a) dense mini, k3", 0.374, 10.2, "lower", "unresolved"),
    # (a) on the dense small after RL, exact probe KL (docs/results/dense-matching-small): holds 0.89 too
    ("(a) dense small, RL probe", 0.528, 2.25, "lower", "unresolved"),
    # f1 as a difference (ms): a CI across 0 (moe-grids-small)
    ("(f1) MoE small", -1.89e5, 5.92e5, "higher", "unresolved"),
])
def test_the_verdict_says_what_the_interval_can_say(what, lo, hi, direction, verdict):
    null = 0.0 if what.startswith("(f1)") else 1.0
    assert claim_verdict(lo, hi, direction, null) == verdict, what


def test_an_interval_that_holds_the_papers_ratio_is_unresolved_with_the_sample_it_needs():
    # (a) on the dense small after RL (dense-matching-small, Power): 4 seeds × 192, σ²_between 0.561, σ²_within 8.91;
    # its CI [0.528, 2.25] holds the paper's 0.89 — "not reproduced" said too much, "unresolved" with 352 seeds does not
    assert claim_verdict(0.528, 2.25, "lower") == "unresolved"
    n = sample_needed(VarianceComponents(0.561, 8.91, 4, 768), 0.89, 192)
    assert n.groups == 352
    assert needed_text(n, "the paper's 0.89").startswith(
        "a resolution of the paper's 0.89 at 80% power needs 352 seeds × 192 sequences (")
    # at fixed weights, (a) on the dense small: 15 checkpoints × 2048 sequences
    n = sample_needed(VarianceComponents(0.0231, 3.07, 6, 6 * 2048), 0.89, 2048)
    assert needed_text(n, "the paper's −11%", "checkpoints") == (
        "a resolution of the paper's −11% at 80% power needs 15 checkpoints × 2048 sequences (7–64 over "
        "σ²_between's 90% interval; at least 14 however many sequences; this design: 6)")


def test_joint_verdicts():
    assert joint_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert joint_verdict(["reproduced", "unresolved"]) == "unresolved"
    assert joint_verdict(["unresolved", "contradicted"]) == "contradicted"
    with pytest.raises(ValueError, match="direction must be 'lower' or 'higher', got 'up'"):
        claim_verdict(0.5, 0.6, "up")
