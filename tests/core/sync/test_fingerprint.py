"""The 64-bit tensor hash and the checks' fingerprints: both hashes' definitions (``words`` against a
pure-Python reference, ``xxh3`` against the xxhash library on the raw bytes), equality on equal bytes whatever
the dtype/view/layout/storage, and a changed hash for every single-bit flip position class, swapped blocks,
lengths and zero-length tensors — under each hash."""

from __future__ import annotations

import struct

import pytest
import torch
import xxhash

from fp8rl_core.sync.fingerprint import BLOCK_WORDS, HASH_OF_DEVICE, fingerprint, fingerprints, fmix64, tensor_hash, tensor_hashes

M64 = (1 << 64) - 1
GOLDEN, C1, C2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SEED_R, SEED_Q, SEED_LEN = 0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0


def reference_hash(data: bytes) -> int:
    """The module docstring's definition, word by word in Python integers."""
    padded = data + bytes(-len(data) % 8)
    total = 0
    for i, (w,) in enumerate(struct.iter_unpack("<Q", padded)):
        q, r = divmod(i, BLOCK_WORDS)
        key_r = fmix64((SEED_R + (r + 1) * GOLDEN) & M64)
        key_q = fmix64((SEED_Q + (q + 1) * GOLDEN) & M64)
        x = w ^ key_r
        x ^= x >> 32
        x = (x * C1 + key_q) & M64
        x ^= x >> 29
        x = (x * C2) & M64
        total = (total + (x ^ (x >> 32))) & M64
    return fmix64(total ^ fmix64((len(data) + SEED_LEN) & M64))


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, 9, 4096, 8 * BLOCK_WORDS - 3, 8 * BLOCK_WORDS, 8 * (2 * BLOCK_WORDS + 5) + 3])
def test_hash_is_the_documented_definition(nbytes):
    # words: below one block the batched path, from one block on the block-by-block path: both the same sum
    g = torch.Generator().manual_seed(nbytes)
    t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    assert tensor_hash(t, "words") == reference_hash(raw(t))
    # xxh3, what a CPU tensor gets: XXH3-64 of the bytes, seed 0
    assert HASH_OF_DEVICE["cpu"] == "xxh3"
    assert tensor_hash(t) == tensor_hash(t, "xxh3") == xxhash.xxh3_64_intdigest(raw(t))
    assert tensor_hash(t, "words") != tensor_hash(t)


def test_floating_tensors_hash_their_float32_bytes_a_chunk_at_a_time(monkeypatch):
    # the xxh3 hash of a BF16 tensor streams its float32 bytes: the same digest as the whole float32 copy at once
    import fp8rl_core.sync.fingerprint as fp

    b = torch.randn(3 * 1000 + 7, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    want = fingerprint(b.float())
    monkeypatch.setattr(fp, "_XXH3_CHUNK", 1000)
    assert fingerprint(b) == want == fingerprint(b.to(torch.float16).float().bfloat16())
    assert fingerprint(b, "words") == fingerprint(b.float(), "words") != want


def test_an_unknown_hash_is_named():
    with pytest.raises(ValueError, match="unknown fingerprint hash 'md5'.*valid: \\['words', 'xxh3'\\]"):
        fingerprint(torch.zeros(3), "md5")


@pytest.fixture(params=["xxh3", "words"])
def cpu_hash(request, monkeypatch):
    """The property tests run under each hash: the one a CPU tensor gets, set to each in turn."""
    import fp8rl_core.sync.fingerprint as fp

    monkeypatch.setitem(fp.HASH_OF_DEVICE, "cpu", request.param)
    return request.param


def test_deterministic_and_batched_equals_alone(cpu_hash):
    g = torch.Generator().manual_seed(0)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in (3, 64, 1000, 8 * BLOCK_WORDS + 1)]
    alone = [tensor_hash(t) for t in ts]
    assert tensor_hashes(ts) == alone == tensor_hashes(ts)
    assert len(set(alone)) == len(alone)
    assert all(0 <= h <= M64 for h in alone)


def test_equal_bytes_hash_alike_across_dtypes_views_layouts_and_storage(cpu_hash):
    g = torch.Generator().manual_seed(1)
    base = torch.randint(0, 256, (64, 96), dtype=torch.uint8, generator=g)
    h = tensor_hash(base)
    assert tensor_hash(base.view(torch.float8_e4m3fn)) == h  # FP8 data as uint8 or FP8: the same bytes
    assert tensor_hash(base.view(torch.bfloat16)) == h
    assert tensor_hash(base.view(torch.int64)) == h
    assert tensor_hash(base.reshape(96, 64)) == h  # bytes only: the shape is not part of tensor_hash
    assert tensor_hash(base.clone()) == h  # a copy on another storage
    # a non-contiguous tensor hashes its bytes in logical order: the same as its contiguous copy
    wide = torch.randint(0, 256, (64, 200), dtype=torch.uint8, generator=g)
    wide[:, 50:146] = base
    view = wide[:, 50:146]
    assert not view.is_contiguous() and tensor_hash(view) == h
    assert tensor_hash(base.t()) == tensor_hash(base.t().contiguous()) != h  # the transpose's order differs
    # a view at an odd storage offset (not 8-byte aligned)
    flat = torch.randint(0, 256, (1001,), dtype=torch.uint8, generator=g)
    assert tensor_hash(flat[3:]) == tensor_hash(flat[3:].clone())
    assert tensor_hash(flat[3:], "words") == reference_hash(raw(flat[3:]))


def flip(t: torch.Tensor, byte: int, bit: int) -> torch.Tensor:
    u = t.clone()
    u[byte] ^= 1 << bit
    return u


@pytest.mark.parametrize("nbytes", [24, 8 * BLOCK_WORDS + 24])  # the batched and the block-by-block path
def test_every_single_bit_flip_position_class_changes_the_hash(nbytes, cpu_hash):
    t = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    h = tensor_hash(t)
    positions = {0, nbytes - 1}  # first and last byte
    positions |= {8 + lane for lane in range(8)}  # each byte lane of a 64-bit word
    positions |= {nbytes - 16 + lane for lane in range(8)}
    if nbytes > 8 * BLOCK_WORDS:  # either side of the block boundary
        positions |= {8 * BLOCK_WORDS - 1, 8 * BLOCK_WORDS}
    seen = {h}
    for byte in sorted(positions):
        for bit in range(8):
            g = tensor_hash(flip(t, byte, bit))
            assert g != h, (byte, bit)
            seen.add(g)
    assert len(seen) == 1 + 8 * len(positions)  # every flip gives its own hash


def test_order_length_and_empty_tensors(cpu_hash):
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, 256, (4, 4096), dtype=torch.uint8, generator=g)
    h = tensor_hash(t)
    assert tensor_hash(t[[1, 0, 2, 3]]) != h  # two swapped rows (blocks of words)
    assert tensor_hash(t[[0, 1, 3, 2]]) != h
    words = t.reshape(-1).view(torch.int64)
    swapped = words.clone()
    swapped[[5, 9]] = words[[9, 5]]
    assert tensor_hash(swapped) != h  # two swapped words
    big = torch.randint(0, 256, (4 * 8 * BLOCK_WORDS,), dtype=torch.uint8, generator=g).view(4, -1)
    assert tensor_hash(big[[2, 1, 0, 3]]) != tensor_hash(big)  # swapped whole key blocks
    assert tensor_hash(t.roll(1)) != h  # a shifted copy
    # the length is part of it: trailing zeros are not padding
    z = torch.zeros(3, dtype=torch.uint8)
    hashes = [tensor_hash(z[:n]) for n in range(4)] + [tensor_hash(torch.zeros(8, dtype=torch.uint8))]
    assert len(set(hashes)) == 5
    empty = [torch.empty(0, dtype=torch.uint8), torch.empty(0, 5, dtype=torch.bfloat16), torch.empty(3, 0)]
    assert len({tensor_hash(e) for e in empty}) == 1  # no bytes: one hash
    assert tensor_hash(empty[0], "words") == reference_hash(b"")
    assert fingerprint(empty[1]) != fingerprint(empty[2])  # the fingerprint adds value class and shape
    assert fingerprints({"a": empty[0], "b": t})["a"] == fingerprint(empty[0])


def test_fingerprint_is_canonical_for_floats_and_tells_bytes_apart(cpu_hash):
    b = torch.randn(300, 7, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert fingerprint(b) == fingerprint(b.float())  # the BF16 view held in float32
    assert fingerprint(b.t()) == fingerprint(b.t().contiguous())
    big = torch.randn(3, 8 * BLOCK_WORDS // 3 + 5, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert fingerprint(big) == fingerprint(big.float())  # block-by-block path, converted per block
    u = big.float().clone()
    u[2, -1] = torch.nextafter(u[2, -1], torch.tensor(float("inf")))  # one value off the BF16 grid
    assert fingerprint(u) != fingerprint(big)
    q = torch.randint(0, 256, (16, 32), dtype=torch.uint8)
    assert fingerprint(q) == fingerprint(q.view(torch.int8))  # integer bytes: raw
    assert fingerprint(q) != fingerprint(q.reshape(32, 16))


def test_all_single_and_paired_bit_flips_give_distinct_hashes(cpu_hash):
    # every single-bit flip of 256 bytes, and the same bit flipped in two words (the pattern a weak
    # per-word mix passes on unchanged): all hashes distinct from each other and from the original
    t = torch.randint(0, 256, (256,), dtype=torch.uint8, generator=torch.Generator().manual_seed(6))
    variants = [t] + [flip(t, byte, bit) for byte in range(256) for bit in range(8)]
    for bit in (0, 7):  # bits 56 and 63 of a word's last byte, bits 0 and 7 of its first
        for lane in (0, 7):
            for a in range(32):
                for b in range(a + 1, 32):
                    variants.append(flip(flip(t, 8 * a + lane, bit), 8 * b + lane, bit))
    hashes = tensor_hashes(variants)
    assert len(set(hashes)) == len(variants)


@pytest.mark.parametrize("step", [BLOCK_WORDS // 4, BLOCK_WORDS, 4 * BLOCK_WORDS])
def test_any_step_gives_the_same_hash(monkeypatch, step):
    # the CPU reads a block per step, a GPU 512 blocks: the sum does not depend on the step
    import fp8rl_core.sync.fingerprint as fp

    t = torch.randint(0, 256, (8 * (5 * BLOCK_WORDS + 7) + 5,), dtype=torch.uint8,
                      generator=torch.Generator().manual_seed(7))
    b = torch.randn(2 * BLOCK_WORDS + 9, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    want, want_b = reference_hash(raw(t)), fingerprint(b, "words")
    monkeypatch.setitem(fp._STEP_WORDS, "cpu", step)
    assert tensor_hash(t, "words") == want
    assert fingerprint(b, "words") == want_b
