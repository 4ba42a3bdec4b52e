"""Per-rank checks: each tensor-parallel rank's live shard against its slice of the sync.

Rule: two tiers as for the whole-engine checks — fingerprints (:func:`check_rank_fingerprints`) and
every byte (:func:`check_rank_shards`; floating tensors as the bits of their float32 values) — against
the slices :mod:`fp8rl_core.sync.ranks` cuts; a failure names the rank, the layer, the tensor and the
first differing position. In the live engine each rank checks itself in its worker
(:func:`check_engine_ranks`). docs/gpu.md (Tensor-parallel ranks and SGLang).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from fp8rl_core.sync.ranks import RankCheck, RankSlice, fingerprint_offenders, first_difference, shard_offenders

from .basic import CheckResult
from .expected import Expected

__all__ = ["check_engine_ranks", "check_rank_fingerprints", "check_rank_results", "check_rank_shards",
           "expected_sync_tensors", "first_difference"]


def check_rank_shards(slices: Sequence[RankSlice], live: Mapping[int, Mapping[str, torch.Tensor]]) -> CheckResult:
    """Full tier: every tensor of every rank's live shard (``live``: rank → name → tensor, the sync's
    names) equals that rank's slice, byte for byte; none missing, none extra
    (:func:`fp8rl_core.sync.ranks.shard_offenders` per rank).

    A mismatch names the rank, the layer, the tensor and the **first differing position** (its index in the
    rank's shard, and the two values there), so a fault confined to one rank's shard — a wrong slice, a
    replica of a kv head loaded from the wrong shard, a corrupted copy on one GPU — points at that rank.
    ``measured`` = differing elements (full tier) or differing tensors (cheap tier), over all ranks.
    """
    t0 = time.perf_counter()
    offenders: list[str] = []
    differing = 0
    for s in slices:
        off, n = shard_offenders(s, live.get(s.rank))
        offenders += off
        differing += n
    return CheckResult("W2/W4", not offenders, float(differing), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0,
                       f"every byte of {len(slices)} tensor-parallel ranks' shards against their slices of the sync")


def check_rank_fingerprints(slices: Sequence[RankSlice], live: Mapping[int, Mapping[str, str]]) -> CheckResult:
    """Cheap tier: every rank's fingerprint of every tensor (``live``: rank → name → fingerprint) equals
    its slice's. Names the rank and the layer; the full tier then finds the position."""
    t0 = time.perf_counter()
    off = [o for s in slices for o in fingerprint_offenders(s, live.get(s.rank))]
    return CheckResult("W2/W4", not off, float(len(off)), 0.0, off, len(off), time.perf_counter() - t0,
                       f"fingerprints of {len(slices)} tensor-parallel ranks' shards")


def check_rank_results(results: Sequence[RankCheck]) -> CheckResult:
    """One result from the per-rank verdicts of a live engine: passes when every rank ``0 … tp-1`` answered
    exactly once and passed; the offenders name each failing rank's layer and position (its own
    offenders), a rank that did not answer or answered twice. ``measured``: the ranks' differing counts."""
    t0 = time.perf_counter()
    tps = {r.tp for r in results}
    tp = max(tps, default=0)
    offenders = [o for r in sorted(results, key=lambda r: r.rank) for o in r.offenders]
    if len(tps) > 1:
        offenders.append(f"ranks disagree on the tensor-parallel size: {sorted(tps)}")
    answered = [r.rank for r in results]
    offenders += [f"tp rank {k}/{tp}: no result" for k in range(tp) if k not in answered]
    offenders += [f"tp rank {k}/{tp}: {answered.count(k)} results" for k in sorted(set(answered))
                  if answered.count(k) > 1]
    if not results:
        offenders.append("no rank answered")
    failed = sorted({r.rank for r in results if not r.passed})
    tiers = sorted({r.tier for r in results}) or ["none"]
    detail = (f"{len(results)} tensor-parallel ranks checked their own live shards ({'/'.join(tiers)})"
              + (f"; failing ranks {failed}" if failed else ""))
    return CheckResult("W2/W4", not offenders, float(sum(r.differing for r in results)), 0.0, offenders,
                       len(offenders), time.perf_counter() - t0 + sum(r.seconds for r in results), detail, failed)


#: which expected tensors a per-rank check compares, and the condition its result is reported under
_KINDS = {"all": "W2/W4", "grid": "W2", "views": "W4"}


def expected_sync_tensors(exp: Expected, kind: str = "all") -> dict[str, torch.Tensor]:
    """The full tensors the engine must hold, by sync name: on-grid bytes (``kind="grid"``: the learner's
    synced bytes and scales, and the bytes a ``requant`` layer must compute from its BF16 view, ``exp.requant``),
    BF16 views (``"views"``) or both, less those the engine cannot read back as values (``exp.skip``:
    prepacked BF16 experts)."""
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    grid = exp.grid | exp.requant
    chosen = {"all": grid | exp.views, "grid": grid, "views": exp.views}[kind]
    return {n: t for n, t in chosen.items() if n not in exp.skip}


def check_engine_ranks(sampler, exp: Expected, *, full: bool = False, kind: str = "all") -> CheckResult:
    """Every rank of ``sampler``'s live engine checks its shards against its slice of ``exp``'s tensors
    of ``kind`` (:func:`expected_sync_tensors`; :meth:`fp8rl_core.sampler.seam.Sampler.check_ranks`:
    fingerprints, or with ``full`` every byte); one result naming every failing rank
    (:func:`check_rank_results`), under W2 for on-grid tensors, W4 for BF16 views."""
    res = check_rank_results(sampler.check_ranks(expected_sync_tensors(exp, kind), full=full))
    res.condition = _KINDS[kind]
    return res
