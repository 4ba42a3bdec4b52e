"""Weight-sync throughput: the bucketed file transport (and the live engine's load) vs a plain memory copy.

Two parts, each against a baseline measured in the same run on the same tensors: a plain memory copy
(``torch.empty_like(t).copy_(t)`` for every tensor, fresh outputs, best of N).

1. Transport only, no engine: a synthetic set shaped like a dense transformer's sync tensors (16 layers of
   qkv/o/gate_up/down as MXFP8 uint8 data + uint8 E8M0 scales [N, K/32], BF16 embeddings, lm_head and
   norms; ``--params`` parameters, ≈1.1 GB at 1e9). ``write`` is :func:`write_sync` (to ``/dev/shm`` by
   default); ``read`` iterates :func:`read_sync` and copies every tensor into a fresh one, as a loader
   does (``safe_open`` maps the file lazily, so only the copy touches the bytes). Best of ``--repeats``.
2. The tiny models with a real vLLM CPU engine (``--no-engine`` skips): MXFP8 learner (all layers), every
   sampler layer on the learner's grid; ``--syncs`` syncs of the exported weights, median per column:
   ``export`` (export_weights), ``transport`` (write_sync) and ``load`` (the engine's in-place reload,
   RPC included) from :class:`SyncTiming`.

``x memcpy`` is the time divided by the memory copy of the same bytes (1.00 = as fast as a memcpy; a
file transport costs at least a serialising copy on write and a copy on read). The last line is
``transport_vs_memcpy=<(write + read) / memcpy>`` for the synthetic set. Torch runs on ``--threads`` (default
1): the writer (safetensors) is single-threaded, so one thread is the like-for-like copy, and a second OpenMP
thread on a busy 2-core machine stalls small copies by whole scheduler slices.

    .venv/bin/python bench/sync.py [--params 1e9] [--no-engine] [--repeats 3] [--syncs 5] [--bucket-mb 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl_core.sync.transport import default_root, read_sync, write_sync  # noqa: E402

LAYERS, VOCAB = 16, 32000


def best_of(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``fn``, in seconds (bench/'s one timer: checks.py and quantize.py use it)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def memcpy(tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t).copy_(t) for t in tensors.values()]


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def synthetic(params: float) -> tuple[dict[str, torch.Tensor], int]:
    """Sync tensors of a dense transformer with ≈``params`` parameters: hidden h, 16 layers of
    qkv [2h, h] (GQA), o [h, h], gate_up [6h, h], down [h, 3h] (12 h² per layer), untied V × h embeddings."""
    h = (-2 * VOCAB + math.sqrt(4 * VOCAB**2 + 4 * 12 * LAYERS * params)) / (2 * 12 * LAYERS)
    h = max(64, round(h / 64) * 64)
    g = torch.Generator().manual_seed(0)

    def rand(shape, dtype=torch.uint8):  # random bytes (contents do not matter to a copy; pages are touched)
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).view(shape)

    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rand((VOCAB, h), torch.bfloat16)}
    count = VOCAB * h
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for name, (n, k) in {"self_attn.qkv_proj": (2 * h, h), "self_attn.o_proj": (h, h),
                             "mlp.gate_up_proj": (6 * h, h), "mlp.down_proj": (h, 3 * h)}.items():
            out[f"{p}.{name}.weight"], out[f"{p}.{name}.weight_scale"] = rand((n, k)), rand((n, k // 32))
            count += n * k
        for name, n in {"input_layernorm": h, "post_attention_layernorm": h, "self_attn.q_norm": 128,
                        "self_attn.k_norm": 128}.items():
            out[f"{p}.{name}.weight"] = rand((n,), torch.bfloat16)
            count += n
    out["model.norm.weight"], out["lm_head.weight"] = rand((h,), torch.bfloat16), rand((VOCAB, h), torch.bfloat16)
    return out, count + h + VOCAB * h


def transport_only(args) -> float:
    tensors, count = synthetic(args.params)
    mb = nbytes(tensors) / 1e6
    root = Path(args.root) if args.root else default_root()
    print(f"synthetic dense set: {count / 1e9:.3f} B parameters, {len(tensors)} tensors, {mb:.0f} MB, "
          f"buckets {args.bucket_mb} MiB under {root}, threads={torch.get_num_threads()}, best of {args.repeats}")
    t_copy = best_of(lambda: memcpy(tensors), args.repeats)
    t_write = t_read = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        handle = write_sync(tensors, 1, bucket_bytes=int(args.bucket_mb * 2**20), root=root)
        t1 = time.perf_counter()
        try:
            outs = [torch.empty_like(t).copy_(t) for _, t in read_sync(handle.manifest)]
            t2 = time.perf_counter()
            assert len(outs) == len(tensors) and handle.total_bytes == nbytes(tensors)
            del outs
        finally:
            handle.remove()
        t_write, t_read = min(t_write, t1 - t0), min(t_read, t2 - t1)
    print(f"{'step':24s} {'s':>8} {'MB/s':>8} {'x memcpy':>9}")
    for name, t in [("memcpy (baseline)", t_copy), ("write_sync", t_write), ("read_sync + copy", t_read),
                    ("write + read", t_write + t_read)]:
        print(f"{name:24s} {t:8.3f} {mb / t:8.0f} {t / t_copy:9.2f}")
    return (t_write + t_read) / t_copy


def with_engine(args, model_yaml: str) -> None:
    from fp8rl_core.learner.config import LearnerConfig
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.models import build_model
    from fp8rl_core.learner.spec import load_model_spec
    from fp8rl_core.learner.patterns import gemm_layers
    from fp8rl_core.sampler.config import SamplerConfig
    from fp8rl_core.sampler.vllm.engine import VllmSampler
    from fp8rl_core.sampler.presets import sampler_schemes
    from fp8rl_core.sync.export import export_weights

    spec = load_model_spec(ROOT / model_yaml)
    model = build_model(spec, seed=0)
    with tempfile.TemporaryDirectory(prefix="fp8rl-bench-ckpt-") as ckpt:
        model.save_pretrained(ckpt, save_original_format=True)
        learner = Learner(model, LearnerConfig(precision="mxfp8", layers="all"))
        schemes = sampler_schemes(gemm_layers(model), "all", "mxfp8")
        tensors = export_weights(model, learner.forward_weights(), schemes)
        cfg = SamplerConfig(dtype="bfloat16", bucket_mb=args.bucket_mb)
        sampler = VllmSampler(ckpt, schemes, tensors, cfg)
        try:
            rows = []
            for v in range(1, args.syncs + 1):
                t0 = time.perf_counter()
                tensors = export_weights(model, learner.forward_weights(), schemes)
                export_s = time.perf_counter() - t0
                timing = sampler.sync(tensors, v, export_s=export_s)
                rows.append((export_s, timing.transport_s, timing.load_s, timing.reset_s))
            t_copy = best_of(lambda: memcpy(tensors), max(args.repeats, args.syncs))
        finally:
            sampler.close()
    ex, tr, ld, rs = (statistics.median(c) for c in zip(*rows))
    mb = timing.bytes / 1e6
    print(f"{spec.name}: {len(tensors)} tensors, {mb:.2f} MB, {timing.buckets} bucket(s), "
          f"{len(schemes)} layers mxfp8, engine start {sampler.startup_s:.1f} s, median of {args.syncs} syncs")
    print(f"  {'step':22s} {'s':>8} {'MB/s':>8} {'x memcpy':>9}")
    for name, t in [("memcpy (baseline)", t_copy), ("export", ex), ("transport", tr), ("load (engine)", ld),
                    ("reset prefix cache", rs), ("transport + load", tr + ld), ("export+transport+load", ex + tr + ld)]:
        print(f"  {name:22s} {t:8.4f} {mb / t:8.0f} {t / t_copy:9.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e9, help="parameters of the synthetic set (default 1e9)")
    ap.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True,
                    help="also time syncs into a live vLLM CPU engine for the tiny models (default on)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--root", default=None, help="folder for the sync files (default /dev/shm)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    ratio = transport_only(args)
    if args.engine:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the table readable (the engine logs to stdout)
        print("\nlive engine (vLLM CPU, bf16), per sync")
        for yaml in ("configs/models/qwen3-dense-tiny.yaml", "configs/models/qwen3-moe-tiny.yaml"):
            with_engine(args, yaml)
    print(f"transport_vs_memcpy={ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
