"""Fingerprints of sync tensors: a 64-bit digest over every byte, computed where the tensor lives (CPU,
or the GPU a CUDA engine holds it on), so the learner and the live engine can compare what they hold
without moving the tensors (W2/W4, the cheap tier of the checks).

Rule: position-keyed little-endian 64-bit words, each mixed by an invertible xorshift-multiply chain,
summed mod 2**64 and finalised by SplitMix64's ``fmix64`` — a change inside one word always changes the
digest, random corruption goes unseen with probability ≈ 2**-64; not cryptographic. Specified in
docs/correctness.md (The fingerprint).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch

__all__ = ["BLOCK_WORDS", "fingerprint", "fingerprints", "fmix64", "tensor_hash", "tensor_hashes"]

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


def _hash_sources(srcs: list[_Source]) -> list[int]:
    """The 64-bit hash of each source (docs/correctness.md, The fingerprint), grouped by device."""
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


# ---------------------------------------------------------------------------------------------------
# public
# ---------------------------------------------------------------------------------------------------
def tensor_hashes(tensors: Iterable[torch.Tensor]) -> list[int]:
    """:func:`tensor_hash` of each tensor, small ones hashed together in one batch per device."""
    return _hash_sources([_Source(t, False) for t in tensors])


def tensor_hash(t: torch.Tensor) -> int:
    """The 64-bit hash (an unsigned int) of ``t``'s bytes in logical order (docs/correctness.md, The fingerprint):
    equal for equal bytes whatever the dtype, shape, strides or device."""
    return tensor_hashes([t])[0]


def _header(t: torch.Tensor, floating: bool) -> int:
    text = f"{'f' if floating else 'u'}|{tuple(t.shape)}|".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def fingerprints(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """``{name: fingerprint}`` of a mapping or an iterable of (name, tensor) pairs, computed on each
    tensor's device (small tensors in one batch)."""
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    floating = [t.dtype.is_floating_point for _, t in items]
    hashes = _hash_sources([_Source(t, f) for (_, t), f in zip(items, floating)])
    return {name: f"{fmix64(h ^ _header(t, f)):016x}" for (name, t), f, h in zip(items, floating, hashes)}


def fingerprint(t: torch.Tensor) -> str:
    """The fingerprint of ``t`` (canonical bytes + value class + shape; docs/correctness.md, The
    fingerprint), 16 hex chars."""
    return fingerprints([("", t)])[""]
