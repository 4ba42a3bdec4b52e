"""The checks' fingerprint on CPU tensors against a memory copy of the same bytes, and the hashing libraries
it was chosen from, measured on this CPU in the same run.

Candidates, each over the same ``--mb`` MB of random bytes (one thread, best of ``--repeats``): XXH3-64,
XXH3-128 and XXH64 (the ``xxhash`` package), BLAKE3 (the ``blake3`` package, one thread and its own thread
pool), and fp8rl's two hashes (``fp8rl_core.sync.fingerprint``: ``xxh3``, what a CPU tensor gets, and
``words``, the on-device kernel run by torch on the CPU). Then ``fingerprints`` as the checks call it, on the
bytes as uint8 (FP8 data, scales) and as BF16 (hashed as their float32 values). Baselines: a memory copy into a
fresh tensor (``torch.empty_like(t).copy_(t)``, what bench/sync.py and bench/checks.py use: it pays the
output's page faults) and into a tensor allocated before (the bandwidth ceiling). ``x copy`` = copy time /
hash time: 1.00 is as fast as the copy; the goal is ``fingerprint_vs_copy`` >= 0.5 against the
fresh copy. A package that is not installed is reported, not measured.

    .venv/bin/python bench/fingerprint.py [--mb 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sync import best_of  # noqa: E402
from fp8rl_core.sync.fingerprint import fingerprints, tensor_hash  # noqa: E402


def candidates(data: torch.Tensor) -> dict[str, object]:
    """name → a call hashing ``data``'s bytes (or the reason it cannot run here)."""
    mv = memoryview(data.numpy())
    out: dict[str, object] = {}
    try:
        xx = importlib.import_module("xxhash")
        out |= {f"xxhash {xx.VERSION} XXH3-64": lambda: xx.xxh3_64_intdigest(mv),
                f"xxhash {xx.VERSION} XXH3-128": lambda: xx.xxh3_128_intdigest(mv),
                f"xxhash {xx.VERSION} XXH64": lambda: xx.xxh64_intdigest(mv)}
    except ImportError:
        out["xxhash"] = "not installed"
    try:
        b3 = importlib.import_module("blake3")
        out |= {"blake3 BLAKE3, 1 thread": lambda: b3.blake3(mv).digest(),
                "blake3 BLAKE3, its threads": lambda: b3.blake3(mv, max_threads=b3.blake3.AUTO).digest()}
    except ImportError:
        out["blake3"] = "not installed"
    out |= {"fp8rl tensor_hash xxh3": lambda: tensor_hash(data, "xxh3"),
            "fp8rl tensor_hash words (torch, CPU)": lambda: tensor_hash(data, "words")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="MB of bytes hashed (default 256)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = args.mb << 20
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    into = torch.empty_like(data)
    fresh = best_of(lambda: torch.empty_like(data).copy_(data), args.repeats)
    warm = best_of(lambda: into.copy_(data), args.repeats)
    print(f"{args.mb} MB, 1 thread, best of {args.repeats}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"  {'what':40s}{'GB/s':>8s}{'x copy':>8s}{'x copy into':>13s}")
    print(f"  {'memory copy, fresh output':40s}{n / fresh / 1e9:8.2f}{1:8.2f}{warm / fresh:13.2f}")
    print(f"  {'memory copy, into an allocated tensor':40s}{n / warm / 1e9:8.2f}{fresh / warm:8.2f}{1:13.2f}")
    for name, fn in candidates(data).items():
        if isinstance(fn, str):
            print(f"  {name:40s}{fn}")
            continue
        t = best_of(fn, args.repeats)
        print(f"  {name:40s}{n / t / 1e9:8.2f}{fresh / t:8.2f}{warm / t:13.2f}")
    # the checks' call: uint8 (FP8 data, scales) and BF16 (hashed as float32 values: twice the bytes hashed)
    bf16 = data.view(torch.bfloat16).clone()
    bf16.view(torch.int16).bitwise_and_(0x3FFF | -0x8000)  # no NaN/inf, as weights
    t_u8 = best_of(lambda: fingerprints({"w": data}), args.repeats)
    t_bf = best_of(lambda: fingerprints({"w": bf16}), args.repeats)
    print(f"  {'fingerprints, uint8':40s}{n / t_u8 / 1e9:8.2f}{fresh / t_u8:8.2f}{warm / t_u8:13.2f}")
    print(f"  {'fingerprints, BF16 (as float32)':40s}{n / t_bf / 1e9:8.2f}{fresh / t_bf:8.2f}{warm / t_bf:13.2f}")
    print(f"fingerprint_vs_copy={fresh / t_u8:.2f}")
    print(f"fingerprint_bf16_vs_copy={fresh / t_bf:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
