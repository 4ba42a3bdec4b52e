"""W6's engine's-other-state result from the ranks' verdicts: passes when no rank names an offender, fails naming
each rank's offenders and the failing ranks, says which ranks did not run it, and is None when none did."""

from __future__ import annotations

from fp8rl_core.checks.engine_state import check_engine_state


def _rank(rank: int, offenders=(), checked: int = 5) -> dict:
    return {"rank": rank, "tp": 2, "checked": checked, "offenders": list(offenders), "changing": {"kv_cache": "why"},
            "seconds": 0.25}


def test_the_ranks_verdicts_make_one_w6_result():
    assert check_engine_state([None, None]) is None
    ok = check_engine_state([_rank(0), _rank(1)])
    assert (ok.condition, ok.passed, ok.count, ok.failing_ranks) == ("W6", True, 0, [])
    assert ok.detail == ("engine's other state vs its engine start (fingerprints): 10 tensors on 2 ranks; "
                         "declared as changing at a sync: kv_cache")
    assert ok.seconds >= 0.5
    bad = check_engine_state([_rank(0), _rank(1, ["tp rank 1/2: x.cos_sin_cache: changed …"]), None])
    assert (bad.passed, bad.measured, bad.offenders, bad.failing_ranks) == (
        False, 1.0, ["tp rank 1/2: x.cos_sin_cache: changed …"], [1])
    assert "; not run on 1 ranks" in bad.detail
