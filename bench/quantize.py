"""MXFP8 E4M3 RCEIL rowwise quantization throughput: fp8rl vs torchao ``to_mx`` on the same tensor.

A 256 MB bf16 tensor, 2 threads. First checks that both produce the same bytes (data and scales),
then times each (best of N, the same N for both) and prints GB/s of bf16 input; a plain memory copy of the tensor is
printed as the ceiling, and the cost of a fresh output of fp8rl's size written once (allocation + page
faults: the floor any quantizer returning new tensors pays). The last line is
``ratio_vs_torchao=<fp8rl GB/s / torchao GB/s>``.

    .venv/bin/python bench/quantize.py [--mb 256] [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sync import best_of  # noqa: E402  (the one best-of timer of bench/)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="size of the bf16 input in MB (default 256)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    from fp8rl_core.grids import quantize
    from fp8rl_core.grids import native
    from fp8rl_core.grids.mx import COMPILE_MIN_NUMEL

    k = 4096
    rows = args.mb * 2**20 // 2 // k
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(0)).mul_(3).to(torch.bfloat16)
    gb = x.numel() * x.element_size() / 1e9
    assert x.numel() >= COMPILE_MIN_NUMEL, "tensor too small for the compiled path"
    print(f"input: bf16 {tuple(x.shape)} = {gb * 1e3:.0f} MB, threads={torch.get_num_threads()}")

    t0 = time.perf_counter()
    ours = quantize(x, "mxfp8-e4m3-rceil")  # first call builds (or loads) the kernel
    lib = native.load()
    kernel = f"native C kernel {native.kernel_path().name}" if lib is not None else "torch.compile kernel"
    print(f"fp8rl first call ({kernel}, build or compile included): {time.perf_counter() - t0:.1f} s")
    ao_scale, ao_data = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    same_scale = torch.equal(ours.scale.flatten(), ao_scale.view(torch.uint8).flatten())
    same_data = torch.equal(ours.data.view(torch.uint8), ao_data.view(torch.uint8))
    print(f"bytes equal to torchao: scales={same_scale} data={same_data}")
    if not (same_scale and same_data):
        print("FAIL: fp8rl and torchao disagree on this input", file=sys.stderr)
        return 1
    ours_bytes = ours.data.numel() + ours.scale.numel()
    del ours, ao_scale, ao_data

    t_copy = best_of(lambda: x.clone(), args.repeats)
    t_fault = best_of(lambda: torch.empty(ours_bytes, dtype=torch.uint8).fill_(0), args.repeats)
    t_ours = best_of(lambda: quantize(x, "mxfp8-e4m3-rceil"), args.repeats)
    t_ao = best_of(lambda: to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL), args.repeats)
    for name, t in [("memory copy (ceiling)", t_copy), ("fresh output, written", t_fault),
                    ("fp8rl quantize", t_ours), ("torchao to_mx", t_ao)]:
        print(f"{name:24s} {t * 1e3:9.1f} ms  {gb / t:7.2f} GB/s")
    print(f"ratio_vs_torchao={t_ao / t_ours:.2f}")
    print(f"quantize_vs_memcpy={t_copy / t_ours:.2f}")  # the copy's time / fp8rl's: the goal is >= 0.8
    return 0


if __name__ == "__main__":
    sys.exit(main())
