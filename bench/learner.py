"""Per-micro-batch learner time vs tokens per micro-batch: BF16 (baseline) vs emulated MXFP8, with and
without the forward-weight cache, on identical data.

For each token budget, one GRPO step is run on the same rollout batch (same prompts, completions and
rewards) from the same initial weights; the table shows the median seconds per micro-batch, the
quantization and GEMM shares reported by the MXFP8 layers, and the ratio to BF16 at the same budget.
On CPU the MXFP8 path is an *emulation* (exact quantization, fp32 products), so it is slower than BF16
here; what the table measures honestly is the fixed per-micro-batch cost the weight quantization adds
(and what the cache removes) against the per-token cost.

    .venv/bin/python bench/learner.py [--model configs/models/qwen3-dense-tiny.yaml] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl_core.learner.config import GRPOConfig, LearnerConfig, Recipe  # noqa: E402
from fp8rl_core.learner.grpo import RolloutBatch  # noqa: E402
from fp8rl_core.learner.learner import Learner  # noqa: E402
from fp8rl_core.learner.models import build_model  # noqa: E402
from fp8rl_core.learner.spec import load_model_spec  # noqa: E402


def make_batch(vocab: int, rows: int, prompt_len: int, completion_len: int, group: int) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(5, vocab, (rows // group, prompt_len), generator=g).repeat_interleave(group, 0)
    comps = torch.randint(5, vocab, (rows, completion_len), generator=g)
    mask = torch.ones(rows, completion_len, dtype=torch.long)
    rewards = torch.rand(rows, generator=g)
    return RolloutBatch(prompts, comps, mask, rewards, torch.zeros(rows, completion_len), version=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "configs/models/qwen3-dense-tiny.yaml"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budgets", default="256,512,1024,2048,4096")
    ap.add_argument("--rows", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    spec = load_model_spec(args.model)
    seq = 32  # prompt 8 + completion 24: one 32-token row per sequence
    batch = make_batch(spec.vocab_size, args.rows, 8, seq - 8, group=4)
    variants = {
        "bf16": LearnerConfig(precision="bf16", lr=1e-6),
        "mxfp8": LearnerConfig(precision="mxfp8", layers="all", recipe=Recipe(cache_weights=False), lr=1e-6),
        "mxfp8+cache": LearnerConfig(precision="mxfp8", layers="all", recipe=Recipe(cache_weights=True), lr=1e-6),
    }
    budgets = [int(b) for b in args.budgets.split(",")]
    print(f"model {spec.name}: {args.rows} sequences x {seq} tokens, threads={torch.get_num_threads()}, baseline=bf16")
    print(f"{'tokens/mb':>9} {'variant':>12} {'mbs':>4} {'s/mb':>8} {'quant s':>8} {'gemm s':>8} {'vs bf16':>8}")
    for budget in budgets:
        base = None
        for name, cfg in variants.items():
            learner = Learner(build_model(spec, seed=0), LearnerConfig(**{**cfg.__dict__, "grpo": GRPOConfig(tokens_per_microbatch=budget)}))
            learner.step(batch)  # warm-up (allocations, first-call costs)
            res = learner.step(batch)
            per_mb = statistics.median(m.seconds for m in res.microbatches)
            q = statistics.median(m.quantize_s for m in res.microbatches)
            gm = statistics.median(m.gemm_s for m in res.microbatches)
            base = per_mb if name == "bf16" else base
            print(f"{budget:>9} {name:>12} {len(res.microbatches):>4} {per_mb:>8.4f} {q:>8.4f} {gm:>8.4f} {per_mb / base:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
