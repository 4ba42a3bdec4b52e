"""run_kl_summary: per-step and whole-run kl_summary rows with intervals over sequences."""

from __future__ import annotations

import math

import pytest

from fp8rl_core.metrics.summary import CI_METRICS, run_kl_summary
from fp8rl_core.schemas import validate


def _tokens(deltas: dict[tuple[int, int], list[float]]) -> list[dict]:
    """Token rows with sampler log-prob −1 and learner log-prob −1 + δ, per (step, sequence)."""
    rows = []
    for (step, seq), ds in deltas.items():
        for pos, d in enumerate(ds):
            rows.append({"step": step, "sequence": seq, "position": pos, "sampler_logprob": -1.0,
                         "learner_logprob": -1.0 + d})
    return rows


def _k3(d: float) -> float:  # (r − 1) − log r with log r = δ
    return math.expm1(d) - d


def test_rows_per_step_and_for_the_run_by_hand():
    toks = _tokens({(1, 0): [0.1, -0.1], (1, 1): [0.2], (2, 0): [0.0, 0.3, -0.2]})
    rows = run_kl_summary(toks, run_id="r", preset="all", model="m", seed=3, n_boot=200)
    assert [r["step"] for r in rows] == [1, 2, None]
    assert [(r["tokens"], r["sequences"]) for r in rows] == [(3, 2), (3, 1), (6, 3)]
    assert rows[0]["k3"] == pytest.approx((_k3(0.1) + _k3(-0.1) + _k3(0.2)) / 3)
    assert rows[1]["k1"] == pytest.approx(-(0.0 + 0.3 - 0.2) / 3)
    assert rows[2]["mean_abs_logprob_diff"] == pytest.approx((0.1 + 0.1 + 0.2 + 0.0 + 0.3 + 0.2) / 6)
    assert rows[2]["max_abs_logprob_diff"] == pytest.approx(0.3)
    # sequence ids are (step, sequence): sequence 0 of step 1 and of step 2 are different sequences
    assert rows[2]["sequences"] == 3
    for r in rows:
        assert (r["run_id"], r["preset"], r["model"], r["seed"]) == ("r", "all", "m", 3)
        for m in CI_METRICS:
            assert r[f"{m}_lo"] <= r[m] + 1e-12 and r[m] <= r[f"{m}_hi"] + 1e-12, m
    assert validate("kl_summary", rows).shape[0] == 3


def test_intervals_can_be_switched_off_and_are_deterministic():
    toks = _tokens({(1, q): [0.05 * q, -0.02] for q in range(6)})
    plain = run_kl_summary(toks, run_id="r", preset="all", model="m", seed=0, n_boot=0)
    assert not any(k.endswith(("_lo", "_hi")) for k in plain[-1])
    a = run_kl_summary(toks, run_id="r", preset="all", model="m", seed=0, n_boot=300, boot_seed=5)
    b = run_kl_summary(toks, run_id="r", preset="all", model="m", seed=0, n_boot=300, boot_seed=5)
    assert a == b


@pytest.mark.parametrize("identical", [True])
def test_identical_sides_give_zero_mismatch(identical):
    toks = _tokens({(1, q): [0.0, 0.0] for q in range(4)})
    run = run_kl_summary(toks, run_id="r", preset="bf16-e2e", model="m", seed=0, n_boot=100)[-1]
    assert run["k1"] == run["k3"] == run["mean_abs_logprob_diff"] == run["chi2_token"] == 0.0
    assert run["token_mult_prob_error"] == 1.0 and run["k3_lo"] == run["k3_hi"] == 0.0


def test_an_empty_token_table_is_named():
    with pytest.raises(ValueError, match="run r: the token table is empty"):
        run_kl_summary([], run_id="r", preset="all", model="m", seed=0)
