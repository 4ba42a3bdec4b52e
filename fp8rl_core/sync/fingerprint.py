"""Fingerprints of sync tensors: a 64-bit digest over every byte, computed where the tensor lives (CPU,
or the GPU a CUDA engine holds it on), so the learner and the live engine can compare what they hold
without moving the tensors (W2/W4, the cheap tier of the checks).

Rule, one hash per kind of device (``HASH_OF_DEVICE``): on the CPU ``xxh3``, XXH3-64 with seed 0 of the
bytes (the ``xxhash`` library, xxHash 0.8 by Yann Collet: memory-bound on a CPU core); on a GPU (any other
device) ``words``: position-keyed little-endian 64-bit words, each mixed by an invertible xorshift-multiply
chain, summed mod 2**64 and finalised by SplitMix64's ``fmix64``, run where the tensor lives. Random
corruption goes unseen with probability ≈ 2**-64 under either; not cryptographic. The two give different
digests of the same bytes: both sides of a comparison hash on the same kind of device, or name the hash
(``hash=``). Specified in docs/correctness.md (The fingerprint).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch
import xxhash

__all__ = ["BLOCK_WORDS", "HASH_OF_DEVICE", "HASHES", "fingerprint", "fingerprints", "fmix64", "tensor_hash",
           "tensor_hashes"]

_M64 = (1 << 64) - 1
#: words per block of the keys (docs/correctness.md, The fingerprint); a tensor of fewer words is one partial block
BLOCK_WORDS = 1 << 15
_GOLDEN = 0x9E3779B97F4A7C15
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # odd: multiplication by either is a bijection mod 2**64
_SEED_R, _SEED_Q, _SEED_LEN = 0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0
#: words per step: on a GPU 512 blocks (a few kernels over 128 MiB); on a CPU one block (256 KiB: the
#: step's temporaries stay in L2, each op stays at torch's intra-op grain of 32768 elements, and the ~16
#: ops' dispatch, ~0.1 ms a step, is amortised over 256 KiB)
_STEP_WORDS = {"cuda": 512 * BLOCK_WORDS, "cpu": BLOCK_WORDS}


def _signed(v: int) -> int:
    v &= _M64
    return v - (1 << 64) if v >> 63 else v


def fmix64(x: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit integers that spreads every input bit over
    every output bit (host-side, Python ints)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 lanes (torch's ``>>`` is arithmetic on signed integers)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _fmix64_lanes(x: torch.Tensor) -> torch.Tensor:
    """:func:`fmix64` on int64 lanes (wrapping arithmetic); used only to make the key tables."""
    x = (x ^ _shr(x, 30)) * _signed(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _signed(0x94D049BB133111EB)
    return x ^ _shr(x, 31)


def _key_table(seed: int, n: int, device: torch.device) -> torch.Tensor:
    """``fmix64(seed + (k + 1) * golden)`` for k < n, as int64 on ``device``."""
    k = torch.arange(1, n + 1, dtype=torch.int64, device=device)
    return _fmix64_lanes(k * _signed(_GOLDEN) + _signed(seed))


_KEYS: dict[tuple[str, str], torch.Tensor] = {}


def _keys(kind: str, n: int, device: torch.device) -> torch.Tensor:
    """The first ``n`` keys R (offsets in a block) or Q (blocks), cached per device."""
    cache_key = (kind, str(device))
    have = _KEYS.get(cache_key)
    if have is None or have.numel() < n:
        size = BLOCK_WORDS if kind == "R" else max(1 << 10, 1 << (max(n, 1) - 1).bit_length())
        have = _key_table(_SEED_R if kind == "R" else _SEED_Q, size, device)
        _KEYS[cache_key] = have
    return have[:n]


def _xorshift_(x: torch.Tensor, k: int, tmp: torch.Tensor) -> torch.Tensor:
    """``x = x XOR (x >> k)`` (logical shift) in place; ``tmp``: scratch of x's shape."""
    torch.bitwise_right_shift(x, k, out=tmp).bitwise_and_((1 << (64 - k)) - 1)
    return x.bitwise_xor_(tmp)


def _contributions(w: torch.Tensor, r_keys: torch.Tensor, q_keys: torch.Tensor) -> torch.Tensor:
    """``z_i`` of the words ``w`` at block offsets keyed ``r_keys`` in blocks keyed ``q_keys``
    (broadcast), as a new int64 tensor (the three lines of docs/correctness.md, The fingerprint)."""
    x = torch.bitwise_xor(w, r_keys)
    tmp = torch.empty_like(x)
    _xorshift_(x, 32, tmp).mul_(_signed(_C1)).add_(q_keys)
    _xorshift_(x, 29, tmp).mul_(_signed(_C2))
    return _xorshift_(x, 32, tmp)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in logical order as a 1-D uint8 tensor (a view when it already is contiguous)."""
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.contiguous().reshape(-1).view(torch.uint8)


def _words(b: torch.Tensor) -> torch.Tensor:
    """1-D uint8 → int64 words, the last zero-padded (a view when size and offset allow it)."""
    if b.numel() % 8 or b.storage_offset() % 8:
        pad = (-b.numel()) % 8
        b = torch.cat([b, b.new_zeros(pad)]) if pad else b.clone()
    return b.view(torch.int64)


# ---------------------------------------------------------------------------------------------------
# the sum Σ z_i, two ways: one large tensor block by block; many small ones (< one block) in one batch
# ---------------------------------------------------------------------------------------------------
class _Source:
    """A tensor to hash: its word count and a reader of word ranges (canonical bytes made per range)."""

    def __init__(self, t: torch.Tensor, as_float32: bool):
        self.t, self.f32 = t.detach(), as_float32
        if as_float32:
            self.flat = self.t.reshape(-1)
            self.nbytes = 4 * self.flat.numel()
        else:
            self.flat = _as_bytes(self.t)
            self.nbytes = self.flat.numel()
        self.nwords = (self.nbytes + 7) // 8

    def read(self, w0: int, w1: int) -> torch.Tensor:
        """Words ``w0 … w1-1`` as int64 (the last word of the tensor zero-padded)."""
        if not self.f32:
            return _words(self.flat[8 * w0:8 * w1])
        part = self.flat[2 * w0:2 * w1]
        if part.dtype == torch.bfloat16:  # BF16 → float32 is exact: the same bits shifted up 16 (no float op)
            bits = part.view(torch.int16).to(torch.int32).bitwise_left_shift_(16)
        else:
            bits = part.to(torch.float32).contiguous().view(torch.int32)
        return _words(bits.view(torch.uint8))


def _sum_large(src: _Source) -> torch.Tensor:
    """Σ z_i of one tensor, a step at a time (512 blocks on a GPU, one on a CPU)."""
    device = src.t.device
    step = _STEP_WORDS.get(device.type, BLOCK_WORDS)
    R = _keys("R", BLOCK_WORDS, device)
    Q = _keys("Q", (src.nwords + BLOCK_WORDS - 1) // BLOCK_WORDS, device)
    acc = torch.zeros((), dtype=torch.int64, device=device)
    for w0 in range(0, src.nwords, step):
        w = src.read(w0, min(w0 + step, src.nwords))
        q0, r0 = divmod(w0, BLOCK_WORDS)
        if step <= BLOCK_WORDS:  # one block or a piece of one (the step divides the block)
            acc += _contributions(w, R[r0:r0 + w.numel()], Q[q0:q0 + 1]).sum()
            continue
        full = w.numel() // BLOCK_WORDS
        if full:
            acc += _contributions(w[:full * BLOCK_WORDS].view(full, BLOCK_WORDS), R, Q[q0:q0 + full, None]).sum()
        rest = w.numel() - full * BLOCK_WORDS
        if rest:
            acc += _contributions(w[full * BLOCK_WORDS:], R[:rest], Q[q0 + full:q0 + full + 1]).sum()
    return acc


def _sum_small(srcs: list[_Source]) -> torch.Tensor:
    """Σ z_i of each of several tensors of < one block (all in block 0), in one pass over their words."""
    device = srcs[0].t.device
    R = _keys("R", BLOCK_WORDS, device)
    Q0 = _keys("Q", 1, device)
    sizes = [s.nwords for s in srcs]
    w = torch.cat([s.read(0, s.nwords) for s in srcs])
    keys = torch.cat([R[:n] for n in sizes])
    seg = torch.repeat_interleave(torch.arange(len(srcs), device=device),
                                  torch.tensor(sizes, device=device))
    y = _contributions(w, keys, Q0)
    return torch.zeros(len(srcs), dtype=torch.int64, device=device).index_add_(0, seg, y)


def _batches(idx: list[int], srcs: list[_Source], words: int) -> list[list[int]]:
    """``idx`` cut into runs of at most ``words`` words in all (a larger source alone)."""
    out: list[list[int]] = [[]]
    total = 0
    for i in idx:
        if out[-1] and total + srcs[i].nwords > words:
            out.append([])
            total = 0
        out[-1].append(i)
        total += srcs[i].nwords
    return out


def _hash_words(srcs: list[_Source]) -> list[int]:
    """The ``words`` hash of each source (docs/correctness.md, The fingerprint), computed on its device."""
    sums: list[int | None] = [None] * len(srcs)
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(srcs):
        if s.nwords >= BLOCK_WORDS:
            sums[i] = int(_sum_large(s))
        elif s.nwords == 0:
            sums[i] = 0
        else:
            by_device.setdefault(s.t.device, []).append(i)
    for device, idx in by_device.items():
        for batch in _batches(idx, srcs, _STEP_WORDS.get(device.type, BLOCK_WORDS)):
            for i, v in zip(batch, _sum_small([srcs[i] for i in batch]).tolist()):
                sums[i] = v
    return [fmix64((sums[i] & _M64) ^ fmix64(s.nbytes + _SEED_LEN)) for i, s in enumerate(srcs)]


#: elements converted to float32 at a time by the ``xxh3`` hash of a floating tensor (256 KiB: stays in L2)
_XXH3_CHUNK = 1 << 16


def _xxh3_one(src: _Source) -> int:
    """XXH3-64 (seed 0) of one source's bytes in logical order (floating: its float32 bytes, a chunk at a
    time into the streaming state, which gives the one-shot digest). Host memory: a tensor on another device
    is copied to the CPU first."""
    flat = src.flat if src.flat.device.type == "cpu" else src.flat.cpu()
    if not src.f32:
        return xxhash.xxh3_64_intdigest(memoryview(flat.numpy()))
    if flat.dtype == torch.float32:
        return xxhash.xxh3_64_intdigest(memoryview(flat.contiguous().view(torch.uint8).numpy()))
    state = xxhash.xxh3_64()
    for e0 in range(0, flat.numel(), _XXH3_CHUNK):  # BF16, FP16, FP8 → float32: exact
        state.update(memoryview(flat[e0:e0 + _XXH3_CHUNK].to(torch.float32).view(torch.uint8).numpy()))
    return state.intdigest()


def _hash_xxh3(srcs: list[_Source]) -> list[int]:
    """The ``xxh3`` hash of each source."""
    return [_xxh3_one(s) for s in srcs]


#: the hashes by name (docs/correctness.md, The fingerprint)
HASHES = {"xxh3": _hash_xxh3, "words": _hash_words}
#: the hash a tensor gets by the kind of device it lives on; any kind not listed: ``words`` (on the device)
HASH_OF_DEVICE = {"cpu": "xxh3"}


def _hash_sources(srcs: list[_Source], hash: str | None) -> list[int]:
    """The 64-bit hash of each source: ``hash`` for all, or each by its device (``HASH_OF_DEVICE``)."""
    if hash is not None and hash not in HASHES:
        raise ValueError(f"unknown fingerprint hash {hash!r}; valid: {sorted(HASHES)}")
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(srcs):
        groups.setdefault(hash or HASH_OF_DEVICE.get(s.t.device.type, "words"), []).append(i)
    out: list[int] = [0] * len(srcs)
    for name, idx in groups.items():
        for i, h in zip(idx, HASHES[name]([srcs[i] for i in idx])):
            out[i] = h
    return out


# ---------------------------------------------------------------------------------------------------
# public
# ---------------------------------------------------------------------------------------------------
def tensor_hashes(tensors: Iterable[torch.Tensor], hash: str | None = None) -> list[int]:
    """:func:`tensor_hash` of each tensor (``words`` hashes small ones together in one batch per device)."""
    return _hash_sources([_Source(t, False) for t in tensors], hash)


def tensor_hash(t: torch.Tensor, hash: str | None = None) -> int:
    """The 64-bit hash (an unsigned int) of ``t``'s bytes in logical order (docs/correctness.md, The fingerprint):
    equal for equal bytes whatever the dtype, shape or strides; the hash is ``hash`` or the one of ``t``'s
    kind of device (``HASH_OF_DEVICE``)."""
    return tensor_hashes([t], hash)[0]


def _header(t: torch.Tensor, floating: bool) -> int:
    text = f"{'f' if floating else 'u'}|{tuple(t.shape)}|".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def fingerprints(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                 hash: str | None = None) -> dict[str, str]:
    """``{name: fingerprint}`` of a mapping or an iterable of (name, tensor) pairs, each computed on its
    tensor's device by that kind of device's hash, or by ``hash`` (a name in ``HASHES``) for all."""
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    floating = [t.dtype.is_floating_point for _, t in items]
    hashes = _hash_sources([_Source(t, f) for (_, t), f in zip(items, floating)], hash)
    return {name: f"{fmix64(h ^ _header(t, f)):016x}" for (name, t), f, h in zip(items, floating, hashes)}


def fingerprint(t: torch.Tensor, hash: str | None = None) -> str:
    """The fingerprint of ``t`` (canonical bytes + value class + shape; docs/correctness.md, The
    fingerprint), 16 hex chars."""
    return fingerprints([("", t)], hash)[""]
