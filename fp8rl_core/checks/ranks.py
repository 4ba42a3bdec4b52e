"""Per-rank checks: each tensor-parallel rank's live shard against its slice of the sync.

With tensor parallelism a rank holds shards (:mod:`fp8rl_core.sync.ranks` cuts the same shards from the
full tensors the learner's expectation describes). Two tiers, as for the whole-engine checks:

* :func:`check_rank_fingerprints` (cheap): every rank's fingerprint of every tensor against its slice's;
* :func:`check_rank_shards` (full): every byte. On-grid tensors (E4M3 data, E8M0 scales) compare as
  bytes; floating tensors as the bits of their float32 values (a rank may hold a BF16 view in float32 —
  the same values — as :func:`fp8rl_core.sync.fingerprint.fingerprint` canonicalises them).

A mismatch names the rank, the layer, the tensor and the **first differing position** (its index in the
rank's shard, and the two values there), so a fault confined to one rank's shard — a wrong slice, a
replica of a kv head loaded from the wrong shard, a corrupted copy on one GPU — points at that rank.
``measured`` = differing elements (full tier) or differing tensors (cheap tier), over all ranks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from fp8rl_core.sync.ranks import RankSlice

from .basic import CheckResult

__all__ = ["check_rank_fingerprints", "check_rank_shards", "first_difference"]


def _is_bytes(t: torch.Tensor) -> bool:
    """FP8 data and E8M0 scales, whatever 1-byte dtype views them (uint8, float8_e4m3fn, …)."""
    return t.element_size() == 1


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a 1-byte tensor (uint8), the bits of a wider floating tensor's float32 values (int32),
    other tensors as they are; same shape."""
    t = t.detach().contiguous()
    if _is_bytes(t):
        return t.view(torch.uint8)
    return t.float().view(torch.int32) if t.dtype.is_floating_point else t


def first_difference(got: torch.Tensor, want: torch.Tensor) -> tuple[tuple[int, ...], int, int, int] | None:
    """``(index, got value, expected value, number of differing elements)`` of the first position (in
    row-major order) where ``got`` and ``want`` differ, compared canonically (bytes, or float32 bits);
    None when they are equal. Shapes must match."""
    a, b = _canonical(got), _canonical(want)
    if torch.equal(a, b):
        return None
    diff = (a != b).reshape(-1)
    flat = int(diff.nonzero()[0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return index, int(a.reshape(-1)[flat]), int(b.reshape(-1)[flat]), int(diff.sum())


def _fmt(v: int, floating: bool) -> str:
    if floating:
        return f"{torch.tensor([v], dtype=torch.int32).view(torch.float32).item():.6g}"
    return f"0x{v:02x}"


def _where(s: RankSlice, name: str) -> str:
    layer, _, param = name.rpartition(".")
    return f"{s.label}, layer {layer}, {param}"


def check_rank_shards(slices: Sequence[RankSlice], live: Mapping[int, Mapping[str, torch.Tensor]]) -> CheckResult:
    """Full tier: every tensor of every rank's live shard (``live``: rank → name → tensor, the sync's
    names) equals that rank's slice, byte for byte; none missing, none extra."""
    t0 = time.perf_counter()
    offenders: list[str] = []
    differing = 0
    for s in slices:
        held = live.get(s.rank)
        if held is None:
            offenders.append(f"{s.label}: no shard read back")
            differing += sum(t.numel() for t in s.tensors.values())
            continue
        offenders += [f"{s.label}: extra tensor {n}" for n in sorted(set(held) - set(s.tensors))]
        for name, want in s.tensors.items():
            got = held.get(name)
            if got is None or tuple(got.shape) != tuple(want.shape):
                what = "missing" if got is None else f"shape {list(got.shape)}"
                offenders.append(f"{_where(s, name)}: {what}, expected {list(want.shape)}")
                differing += want.numel()
                continue
            if _is_bytes(got) != _is_bytes(want):
                offenders.append(f"{_where(s, name)}: engine holds {str(got.dtype).removeprefix('torch.')}, expected "
                                 f"{'bytes' if _is_bytes(want) else 'floating point'}")
                differing += want.numel()
                continue
            d = first_difference(got, want)
            if d is None:
                continue
            index, g, w, n = d
            fl = not _is_bytes(want) and want.dtype.is_floating_point
            offenders.append(f"{_where(s, name)}: first difference at {list(index)} (engine {_fmt(g, fl)}, expected "
                             f"{_fmt(w, fl)}); {n} of {want.numel()} elements differ")
            differing += n
    return CheckResult("W2/W4", not offenders, float(differing), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0,
                       f"every byte of {len(slices)} tensor-parallel ranks' shards against their slices of the sync")


def check_rank_fingerprints(slices: Sequence[RankSlice], live: Mapping[int, Mapping[str, str]]) -> CheckResult:
    """Cheap tier: every rank's fingerprint of every tensor (``live``: rank → name → fingerprint) equals
    its slice's. Names the rank and the layer; the full tier then finds the position."""
    t0 = time.perf_counter()
    off = [f"{_where(s, n)}: fingerprint {live.get(s.rank, {}).get(n, 'missing')}, expected {fp}"
           for s in slices for n, fp in sorted(s.fingerprints.items()) if live.get(s.rank, {}).get(n) != fp]
    return CheckResult("W2/W4", not off, float(len(off)), 0.0, off, len(off), time.perf_counter() - t0,
                       f"fingerprints of {len(slices)} tensor-parallel ranks' shards")
