"""The choice of check tier (cheap / full) per sync, directly on the pure rule: cadence, first sync,
restarts, suspicion, and which reason wins when several apply."""

from __future__ import annotations

import pytest

from fp8rl_core.checks.runner import full_tier_reason

FIRST = "first sync"  # what CheckRunner forces at its first check
NEW = "new engine instance (start or restart)"


def _series(syncs: int, full_every: int, *, restarts: tuple[int, ...] = (), failures: dict[int, list[str]] | None = None,
            requested: dict[int, str] | None = None) -> list[str]:
    """The reasons of syncs 1..``syncs`` as a run sees them: the first sync forced, engines restarted at
    ``restarts``, cheap-tier failures and :meth:`CheckRunner.request_full` reasons at the given syncs."""
    failures, requested = failures or {}, requested or {}
    out = []
    for n in range(1, syncs + 1):
        forced = FIRST if n == 1 else requested.get(n, "")
        out.append(full_tier_reason(n, full_every, forced=forced, new_engine=n in restarts,
                                    cheap_failed=failures.get(n, ())))
    return out


def test_the_first_sync_is_full_then_every_nth():
    assert _series(7, 3) == [FIRST, "", "every 3 syncs", "", "", "every 3 syncs", ""]
    assert _series(12, 5) == [FIRST, "", "", "", "every 5 syncs", "", "", "", "", "every 5 syncs", "", ""]


def test_full_every_one_checks_every_sync_fully():
    assert _series(4, 1) == [FIRST, "every 1 syncs", "every 1 syncs", "every 1 syncs"]


def test_a_cadence_longer_than_the_run_leaves_only_the_first_sync_full():
    assert _series(6, 10) == [FIRST, "", "", "", "", ""]


def test_a_restart_and_a_cheap_failure_escalate_at_their_own_sync():
    got = _series(12, 5, restarts=(7,), failures={3: ["W2", "W4"], 10: ["W5"]}, requested={11: "after a fault"})
    assert got == [FIRST, "", "cheap tier failed: W2, W4", "", "every 5 syncs", "", NEW, "", "",
                   "every 5 syncs", "after a fault", ""]


@pytest.mark.parametrize("kwargs, reason", [
    (dict(forced="requested", new_engine=True, cheap_failed=["W1"]), "requested"),  # forced wins over all
    (dict(new_engine=True, cheap_failed=["W1"]), NEW),                              # then a new engine
    (dict(cheap_failed=["W1"]), "every 4 syncs"),                                   # then the cadence
])
def test_the_first_applicable_reason_wins(kwargs, reason):
    assert full_tier_reason(8, 4, **kwargs) == reason


def test_suspicion_names_the_failed_conditions_in_order():
    assert full_tier_reason(2, 10, cheap_failed=["W1", "W5", "W6"]) == "cheap tier failed: W1, W5, W6"
    assert full_tier_reason(2, 10, cheap_failed=[]) == ""


def test_a_cadence_below_one_is_refused():
    with pytest.raises(ValueError, match="full_every must be at least 1, got 0"):
        full_tier_reason(1, 0)
