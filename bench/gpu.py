"""One prepared GPU benchmark: grids on the device vs CPU bytes, the learner's GEMM layers
per micro-batch (BF16, emulated MXFP8, real block-FP8), the cost-model fit on real FP8 tensor cores,
fingerprint throughput vs a device copy, the checks' fingerprints on device tensors vs the CPU's, and the
GPU export's bytes and its cut of TE's padded scale buffer on device tensors. Writes ``gpu.json`` and PNGs
into OUT; exits 1 when any device bytes or fingerprints differ from the CPU's.

    python bench/gpu.py docs/results/gpu-h200          # on a CUDA machine (≤ 8 min on one H200)
    python bench/gpu.py /tmp/gpu-smoke --cpu-smoke     # tiny sizes on CPU (the test that keeps it alive)

Every timing is a ratio against a baseline measured in the same run: the micro-batch times against
BF16 at the same token count, the fingerprint against a device copy of the same bytes. On Hopper the
"real FP8" variant is 128-block FP8 (1×128 activations × 128×128 weights, TE's blockwise recipe): the
paper's MXFP8 claims (f1)/(f2) measured on Hopper's FP8 in place of Blackwell's MXFP8, and labelled so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl_core.grids import quantize  # noqa: E402
from fp8rl_core.learner.recipe import Recipe  # noqa: E402
from fp8rl_core.learner.fp8gemm import block_fp8_linear, supported  # noqa: E402
from fp8rl_core.learner.mxfp8 import clear_weight_cache, linear as mxfp8_linear  # noqa: E402
from fp8rl_core.metrics.timing import cost_model  # noqa: E402

GRIDS = [f"mxfp8-{e}-{r}{n}" for e in ("e4m3", "e5m2") for r in ("rceil", "floor", "ceil", "even")
         for n in ("", "-nan-propagate")] + [
    "fp8-block128-e4m3", "fp8-block128-e4m3-ue8m0", "fp8-tensor-e4m3", "fp8-tensor-e5m2-pow2",
    "fp8-kv-e4m3-vllm", "fp8-kv-e5m2-sglang"]
LABEL_REAL = "block FP8 on tensor cores (Hopper FP8 in place of Blackwell MXFP8)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------ 1. grids: device bytes == CPU bytes
def _bytes(t: torch.Tensor | None) -> bytes:
    """The raw bytes of a tensor (NaN payloads included), wherever it lives."""
    if t is None:
        return b""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def grid_bytes(device: torch.device, rows: int) -> dict[str, bool]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 256, generator=g) * torch.logspace(-20, 20, rows).unsqueeze(1)
    x[0, :8] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 448.0, 6e4])
    out = {}
    for grid in GRIDS:
        roles = ["weight", "activation"] if grid.startswith("fp8-block128") else ["weight"]
        for role in roles:
            kw = {"role": role} if grid.startswith("fp8-block128") else {}
            cpu = quantize(x, grid, **kw)
            dev = quantize(x.to(device), grid, **kw)
            same = _bytes(cpu.data) == _bytes(dev.data) and _bytes(cpu.scale) == _bytes(dev.scale)
            out[grid + ("" if role == "weight" or not kw else f" ({role})")] = bool(same)
    return out


# ------------------------------------------------------------------ 2. learner GEMM layers per micro-batch
def block_layers(hidden: int, inter: int, device: torch.device) -> list[torch.Tensor]:
    """The weights of one dense transformer block's GEMMs: qkv, o, gate_up, down (fp32 masters)."""
    g = torch.Generator().manual_seed(1)
    shapes = [(3 * hidden, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)]
    return [(torch.randn(*s, generator=g) * s[1] ** -0.5).to(device).requires_grad_() for s in shapes]


def micro_batch(variant: str, weights: list[torch.Tensor], x: torch.Tensor, real_ok: bool) -> None:
    """Forward + backward of the block's GEMMs on one micro-batch of tokens (no attention, no norms)."""
    h = x
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        for w in weights:
            if h.shape[-1] != w.shape[1]:
                h = h[..., : w.shape[1]] if h.shape[-1] > w.shape[1] else F.pad(h, (0, w.shape[1] - h.shape[-1]))
            if variant == "bf16":
                h = F.linear(h, w)
            elif variant == "mxfp8-emulated":
                h = mxfp8_linear(h, w, None, Recipe(cache_weights=True))
            else:
                h = block_fp8_linear(h.to(torch.bfloat16), w, fallback=not real_ok)
    h.float().square().mean().backward()
    for w in weights:
        w.grad = None


def learner_times(device: torch.device, hidden: int, inter: int, tokens: list[int], repeats: int) -> dict:
    weights = block_layers(hidden, inter, device)
    real_ok = supported("blockwise", device)
    rows = []
    for t in tokens:
        x = torch.randn(t, hidden, device=device).requires_grad_()
        for variant in ("bf16", "mxfp8-emulated", "fp8-block-real"):
            clear_weight_cache()
            s = timed(lambda: micro_batch(variant, weights, x, real_ok), device, repeats)
            rows.append({"tokens": t, "variant": variant, "seconds": s})
    base = {r["tokens"]: r["seconds"] for r in rows if r["variant"] == "bf16"}
    for r in rows:
        r["vs_bf16"] = r["seconds"] / base[r["tokens"]]
    return {"hidden": hidden, "intermediate": inter, "real_fp8_on_tensor_cores": real_ok, "rows": rows}


def fit(rows: list[dict], candidate: str, emulated: bool) -> dict:
    data = [{"precision": "bf16" if r["variant"] == "bf16" else "mxfp8", "tokens": r["tokens"], "seconds": r["seconds"]}
            for r in rows if r["variant"] in ("bf16", candidate)]
    cm = cost_model(data, n_boot=200, emulated=emulated)
    return {"candidate": candidate, "delta_fixed_s": cm.delta_fixed, "per_token_saving_s": cm.per_token_saving,
            "break_even_tokens": cm.break_even, "status": cm.status, "headline": cm.headline,
            "label": LABEL_REAL if candidate == "fp8-block-real" and not emulated else candidate}


# ------------------------------------------------------------------ 4. fingerprints vs a device copy
def fingerprint_speed(device: torch.device, mb: int, repeats: int) -> dict:
    t = torch.randint(0, 255, (mb * 2**20,), dtype=torch.uint8, device=device)
    t_copy = timed(lambda: t.clone(), device, repeats)
    from fp8rl_core.sync.fingerprint import tensor_hash  # the checks' own hash, run where the bytes are

    t_fp = timed(lambda: tensor_hash(t), device, repeats)
    gb = t.numel() / 1e9
    return {"mb": mb, "copy_gb_s": gb / t_copy, "fingerprint_gb_s": gb / t_fp, "fingerprint_vs_copy": t_fp / t_copy,
            "fingerprint_fn": "fp8rl_core.sync.fingerprint.tensor_hash"}


# ------------------------------------------------------- 5. the checks' fingerprints: device == CPU
def fingerprint_tensors(big: int) -> dict[str, torch.Tensor]:
    """What a sync and the checks fingerprint: E4M3 bytes and E8M0 scales (large: the per-block path; small:
    batched), BF16 and fp32 views with NaN/Inf/-0.0, a strided view, an odd byte count."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(big, 1024, generator=g)
    q = quantize(w, "mxfp8-e4m3-rceil", axis=-1)
    f32 = torch.randn(33, 65, generator=g)
    f32[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    return {"w.mx_data": q.data.view(torch.uint8), "w.mx_scale": q.scale.view(torch.uint8),
            "small.mx_data": q.data.view(torch.uint8)[:3], "norm.bf16": f32.to(torch.bfloat16), "probe.fp32": f32,
            "strided": f32.t()[::2], "odd": torch.arange(7, dtype=torch.uint8)}


def fingerprints_on_device(device: torch.device, big: int) -> dict:
    """``fp8rl_core.sync.fingerprint.fingerprints`` of the same tensors on the device (its kind's hash,
    ``HASH_OF_DEVICE``) and on the CPU by the same hash: equal per tensor; one byte flipped on the device
    changes its fingerprint."""
    from fp8rl_core.sync.fingerprint import HASH_OF_DEVICE, fingerprints

    cpu = fingerprint_tensors(big)
    dev = {n: t.to(device) for n, t in cpu.items()}
    want, got = fingerprints(cpu, HASH_OF_DEVICE.get(device.type, "words")), fingerprints(dev)
    flipped = dev["w.mx_data"].clone()
    flipped.view(-1)[flipped.numel() // 2] ^= 1
    changed = fingerprints({"w.mx_data": flipped})["w.mx_data"] != got["w.mx_data"]
    return {"equal": {n: want[n] == got[n] for n in want}, "flip_changes_it": bool(changed),
            "fn": "fp8rl_core.sync.fingerprint.fingerprints"}


# ----------------------------------------- 6. the GPU export's cut of TE's padded scales, on the device
def export_slicing(device: torch.device, shapes: list[tuple[int, ...]], repeats: int) -> dict:
    """The GPU export on device tensors: ``fp8rl_core.verl.rollout.quantize_rowwise`` (TE's grid; without TE
    the grids path) gives the CPU bytes, and ``fp8rl_core.grids.te.compact_rowwise_scales`` cuts the scales
    out of a TE-shaped padded buffer on the device (padding a sentinel) — equal to the compact scales, on
    the device, timed against a device copy of the buffer."""
    from fp8rl_core.grids.te import compact_rowwise_scales, scale_shape
    from fp8rl_core.verl.rollout import quantize_rowwise

    rows = []
    for shape in shapes:
        g = torch.Generator().manual_seed(2)
        w = torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[-1])
        data_cpu, scale_cpu = quantize_rowwise(w)
        data_dev, scale_dev = quantize_rowwise(w.to(device))
        n, k = w.numel() // shape[-1], shape[-1]
        padded = torch.full(scale_shape(shape), 0xAB, dtype=torch.uint8, device=device)
        padded[:n, : k // 32] = scale_dev.reshape(n, k // 32)
        cut = compact_rowwise_scales(padded, shape)
        t_cut = timed(lambda: compact_rowwise_scales(padded, shape), device, repeats)
        t_copy = timed(lambda: padded.clone(), device, repeats)
        rows.append({"shape": list(shape), "padded": list(padded.shape), "on_device": cut.device.type == device.type,
                     "bytes_equal_cpu": _bytes(data_dev) == _bytes(data_cpu) and _bytes(scale_dev) == _bytes(scale_cpu),
                     "cut_equal": _bytes(cut) == _bytes(scale_cpu) and tuple(cut.shape) == tuple(scale_cpu.shape),
                     "cut_ms": t_cut * 1e3, "copy_ms": t_copy * 1e3})
    return {"rows": rows, "fn": "fp8rl_core.grids.te.compact_rowwise_scales"}


def plots(out: Path, learner: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in ("mxfp8-emulated", "fp8-block-real"):
        pts = [(r["tokens"], r["vs_bf16"]) for r in learner["rows"] if r["variant"] == variant]
        label = LABEL_REAL if variant == "fp8-block-real" and learner["real_fp8_on_tensor_cores"] else variant
        ax.plot(*zip(*pts), marker="o", label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per micro-batch")
    ax.set_ylabel("time per micro-batch / BF16 (same run)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "learner_vs_bf16.png", dpi=120)
    plt.close(fig)
    return ["learner_vs_bf16.png"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for gpu.json and the PNGs")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (tests)")
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke on CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if smoke else "cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tokens = [128, 256] if smoke else [256, 512, 1024, 2048, 4096, 8192, 16384]
    hidden, inter = (128, 256) if smoke else (4096, 12288)  # Qwen3-8B's block
    result = {
        "device": "cpu (smoke)" if smoke else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "grids_equal_cpu": grid_bytes(device, 64 if smoke else 4096),
    }
    result["learner"] = learner_times(device, hidden, inter, tokens, repeats=1 if smoke else 5)
    real = result["learner"]["real_fp8_on_tensor_cores"]
    result["cost_model"] = [fit(result["learner"]["rows"], "mxfp8-emulated", emulated=True),
                            fit(result["learner"]["rows"], "fp8-block-real", emulated=not real)]
    result["fingerprint"] = fingerprint_speed(device, 8 if smoke else 1024, repeats=3 if smoke else 10)
    result["fingerprints_on_device"] = fingerprints_on_device(device, 64 if smoke else 4096)
    shapes = [(100, 64), (2, 48, 96)] + ([(256, 512)] if smoke else [(4096, 4096), (12288, 4096), (4096, 12288),
                                                                      (16, 768, 2048)])
    result["export_slicing"] = export_slicing(device, shapes, repeats=1 if smoke else 10)
    result["plots"] = plots(args.out, result["learner"])
    result["seconds"] = time.perf_counter() - t0
    (args.out / "gpu.json").write_text(json.dumps(result, indent=1))
    from fp8rl_core.report.gpu import gpu_summary  # the same page `fp8rl gpu-report` writes

    (args.out / "summary.md").write_text(gpu_summary(result))
    bad = [g for g, ok in result["grids_equal_cpu"].items() if not ok]
    bad += [f"fingerprint {n}" for n, ok in result["fingerprints_on_device"]["equal"].items() if not ok]
    bad += [] if result["fingerprints_on_device"]["flip_changes_it"] else ["fingerprint: a flipped byte went unseen"]
    bad += [f"export {r['shape']}" for r in result["export_slicing"]["rows"]
            if not (r["bytes_equal_cpu"] and r["cut_equal"] and r["on_device"])]
    print(f"grids, fingerprints and the export equal to CPU bytes: {'all' if not bad else 'no'}"
          + (f" (differ: {', '.join(bad)})" if bad else ""))
    for r in result["learner"]["rows"]:
        print(f"{r['tokens']:>6} {r['variant']:>16} {r['seconds'] * 1e3:9.2f} ms  x bf16 {r['vs_bf16']:.2f}")
    for c in result["cost_model"]:
        print(f"cost model {c['label']}: {c['headline']}")
    fp = result["fingerprint"]
    print(f"fingerprint {fp['fingerprint_gb_s']:.1f} GB/s, device copy {fp['copy_gb_s']:.1f} GB/s, "
          f"fingerprint_vs_copy={fp['fingerprint_vs_copy']:.2f}")
    print(f"wrote {args.out / 'gpu.json'} in {result['seconds']:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
