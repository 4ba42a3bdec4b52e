"""W6, the engine's other state: on every rank of every replica, every tensor the model computes with that no
sync writes (buffers, caches built at load, tensor attributes) is as it was when the engine started.

Rule: each rank compares its own tensors with the fingerprints it recorded at the engine's start
(:mod:`fp8rl_core.sampler.engine_state`, in the cheap tier's snapshot: every sync) and sends only its verdict;
this module makes one result of the ranks' verdicts. The tensors that legitimately change at a sync are
declared in :data:`fp8rl_core.sampler.engine_state.CHANGES_AT_SYNC`. docs/correctness.md (The engine's other
state).
"""

from __future__ import annotations

import time

from .basic import CheckResult

__all__ = ["check_engine_state"]


def check_engine_state(reports: list[dict | None]) -> CheckResult | None:
    """W6, the engine's other state, from the ranks' verdicts (``reports``: each rank's ``engine_state`` of its
    snapshot, :func:`fp8rl_core.sampler.engine_state.compare`; ``None`` for a rank that did not run it). Fails
    naming each rank, tensor and first differing element; ``count`` = offenders; ``failing_ranks`` the ranks
    with one. Ranks that did not run it are named in ``detail``; ``None`` when no rank ran it."""
    t0 = time.perf_counter()
    ran = [r for r in reports if r is not None]
    if not ran:
        return None
    offenders = [o for r in ran for o in r["offenders"]]
    detail = (f"engine's other state vs its engine start (fingerprints): {sum(r['checked'] for r in ran)} tensors "
              f"on {len(ran)} ranks")
    if len(ran) < len(reports):
        detail += f"; not run on {len(reports) - len(ran)} ranks"
    changing = sorted({p for r in ran for p in r.get("changing", {})})
    if changing:
        detail += f"; declared as changing at a sync: {', '.join(changing)}"
    return CheckResult("W6", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0 + sum(r["seconds"] for r in ran), detail,
                       sorted({int(r["rank"]) for r in ran if r["offenders"]}))
