"""The paper's claims as data (fp8rl_core.report.claims): the table rendered from them, what each needs,
and a claim of an unknown kind refused where it is defined."""

from __future__ import annotations

import pytest

from fp8rl_core.report import CLAIM_KINDS, CLAIMS, KL_KINDS, Claim, claims_table


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
