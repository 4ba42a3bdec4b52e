"""Engine start and close: a vLLM engine in processes of its own (``spawn``, the baseline) vs in the calling
process (``in-process``), on the mini models, in the same run.

For each model (``--models``, default the smoke sweep's dense and MoE minis) and each kind of engine
(``SamplerConfig.process``), ``--cycles`` times: start a :class:`~fp8rl_core.sampler.vllm.engine.VllmSampler` on an
MXFP8 learner's exported weights (every layer on the learner's grid, as preset ``all``), sync once, generate
one batch, close it. It prints per cycle the start (``VllmSampler(...)``: vLLM's ``LLM`` construction and the
first version handshake), the first sync, the generation and the close, and then per model the median
start and close of each kind and their ratio ``spawn / in-process``. The process's resident memory after
each in-process close is printed too: an in-process engine's model and KV cache live in this process, and
it must give them back when it closes.

Where a spawned start goes (``VLLM_LOGGING_LEVEL=DEBUG`` timestamps and ``python -X importtime``, bench/README.md):
two interpreters — the engine core, then its worker — each import vLLM (~10 s each on 2 cores), before ~2 s of
model load, KV-cache allocation and warm-up. In-process, vLLM is imported once by the caller and neither
process is started.

The last line is ``start_spawn_vs_in_process=<median spawned start / median in-process start>`` over all models.

    .venv/bin/python bench/engine.py [--models qwen3-dense-mini qwen3-moe-mini] [--cycles 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cycles(model_name: str, process: str, n: int) -> list[dict]:
    import torch

    from fp8rl_core.learner.config import LearnerConfig
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.models import build_model
    from fp8rl_core.learner.patterns import gemm_layers
    from fp8rl_core.learner.spec import load_model_spec
    from fp8rl_core.sampler.config import SamplerConfig
    from fp8rl_core.sampler.vllm.engine import VllmSampler
    from fp8rl_core.sampler.presets import sampler_schemes
    from fp8rl_core.sync.export import export_weights

    spec = load_model_spec(ROOT / "configs" / "models" / f"{model_name}.yaml")
    model = build_model(spec, seed=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fp8rl-bench-engine-") as ckpt:
        model.save_pretrained(ckpt, save_original_format=True)
        learner = Learner(model, LearnerConfig(precision="mxfp8", layers="all"))
        schemes = sampler_schemes(gemm_layers(model), "all", "mxfp8")
        tensors = export_weights(model, learner.forward_weights(), schemes)
        cfg = SamplerConfig(dtype="bfloat16", max_model_len=spec.max_position_embeddings, max_num_seqs=64,
                            process=process)
        prompts = torch.randint(3, spec.vocab_size, (8, 8), generator=torch.Generator().manual_seed(0))
        for i in range(n):
            t0 = time.perf_counter()
            sampler = VllmSampler(ckpt, schemes, tensors, cfg)
            t1 = time.perf_counter()
            sampler.sync(tensors, 1)
            t2 = time.perf_counter()
            sampler.generate(prompts, 4, 16, seed=i, eos_id=0)
            t3 = time.perf_counter()
            sampler.close()
            t4 = time.perf_counter()
            row = {"model": model_name, "process": process, "cycle": i, "start": t1 - t0, "sync": t2 - t1,
                   "generate": t3 - t2, "close": t4 - t3, "rss_mb": rss_mb()}
            rows.append(row)
            print(f"{model_name:18s} {process:10s} {i:5d} {row['start']:8.2f} {row['sync']:7.2f} "
                  f"{row['generate']:9.2f} {row['close']:7.2f} {row['rss_mb']:8.0f}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-dense-mini", "qwen3-moe-mini"])
    ap.add_argument("--cycles", type=int, default=3, help="start/sync/generate/close cycles per model and kind")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # keep the table readable (the engine logs to stdout)
    t0 = time.perf_counter()
    import vllm  # noqa: F401 — the caller's own import, once (a spawned engine's processes each redo it)

    print(f"import vllm in this process: {time.perf_counter() - t0:.1f} s")
    print(f"{'model':18s} {'process':10s} {'cycle':>5s} {'start s':>8s} {'sync s':>7s} {'generate s':>9s} "
          f"{'close s':>7s} {'rss MB':>8s}")
    rows = []
    for model_name in args.models:
        for process in ("spawn", "in-process"):
            rows += cycles(model_name, process, args.cycles)
    print(f"\n{'model':18s} {'median start':>24s} {'median close':>24s}")
    print(f"{'':18s} {'spawn':>8s} {'in-proc':>8s} {'ratio':>6s} {'spawn':>8s} {'in-proc':>8s} {'ratio':>6s}")

    def med(m, p, k):
        return statistics.median(r[k] for r in rows if r["model"] == m and r["process"] == p)

    for m in args.models:
        s, i = med(m, "spawn", "start"), med(m, "in-process", "start")
        cs, ci = med(m, "spawn", "close"), med(m, "in-process", "close")
        print(f"{m:18s} {s:8.2f} {i:8.2f} {s / i:6.1f} {cs:8.2f} {ci:8.2f} {cs / ci:6.1f}")
    inproc = [r["rss_mb"] for r in rows if r["process"] == "in-process"]
    print(f"resident memory after the in-process closes: {min(inproc):.0f}–{max(inproc):.0f} MB")
    spawn = statistics.median(r["start"] for r in rows if r["process"] == "spawn")
    inp = statistics.median(r["start"] for r in rows if r["process"] == "in-process")
    print(f"start_spawn_vs_in_process={spawn / inp:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
