"""Does fp8rl's GRPO raise the reward, and at which settings? The learner alone, no engine: from the warm start of a
config's first run, each variant samples its own rollouts (the learner's policy, temperature 1), takes fp8rl's real
``Learner.step`` (BF16 learner, AdamW, the config's group size and clipping) for ``steps`` steps, and reports the
mean reward of its first and last five steps' rollouts, a held-out sampled reward (``--eval`` prompts, temperature
1) before and after, and the first update's size per weight (median |Δw| against median |w|, the share of weights
moved). ``sign -1`` negates the rewards: the same run must then destroy the reward faster (the gradient's sign
checked end to end). One JSON line per variant.

    python tools/grpo_learns.py CONFIG [--model qwen3-dense-mini] [--steps 40] [--eval 256]
        [--variant '{"lr": 1e-3, "seed": 0}' ...]     # keys: lr, seed, sign, prompts

Measured numbers: docs/library.md, The GRPO step ("Does it learn?").
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fp8rl_core.learner.config import GRPOConfig, LearnerConfig  # noqa: E402
from fp8rl_core.learner.grpo import RolloutBatch  # noqa: E402
from fp8rl_core.learner.learner import Learner  # noqa: E402
from fp8rl_core.learner.rollout import sample_completions  # noqa: E402

DEFAULT_VARIANTS = [{"lr": lr, "seed": s} for lr in (1e-3, 1e-4, 1e-5) for s in (0, 1)] + [{"lr": 1e-3, "seed": 0, "sign": -1.0}]


def held_out_reward(model: torch.nn.Module, task, n: int, seed: int = 12345) -> float:
    """Mean reward of one sample (temperature 1) on each of ``n`` held-out prompts."""
    p = task.prompts(n, seed=seed, split="eval")
    ids, mask, _ = sample_completions(model, p.prompt_ids, task.max_new_tokens, eos_id=task.eos_id, pad_id=task.pad_id,
                                      seed=seed)
    return float(task.reward(p, torch.where(mask.bool(), ids, task.pad_id)).mean())


def learn(base: torch.nn.Module, task, *, group_size: int, lr: float, seed: int, sign: float = 1.0, prompts: int = 4,
          steps: int = 40, n_eval: int = 256) -> dict:
    """One variant from a copy of ``base``: its rewards over ``steps`` GRPO steps, before/after and first update."""
    model = copy.deepcopy(base)
    learner = Learner(model, LearnerConfig(precision="bf16", lr=lr, grpo=GRPOConfig(group_size=group_size)))
    before_eval = held_out_reward(model, task, n_eval)
    rewards, first = [], None
    for step in range(1, steps + 1):
        group = task.prompts(prompts, seed=seed * 1_000_003 + step, split="train").repeat_interleave(group_size)
        ids, mask, logprobs = sample_completions(model, group.prompt_ids, task.max_new_tokens, eos_id=task.eos_id,
                                                 pad_id=task.pad_id, seed=seed * 7919 + step * 104729,
                                                 autocast=learner.autocast())
        r = task.reward(group, torch.where(mask.bool(), ids, task.pad_id))
        rewards.append(float(r.mean()))
        was = [q.detach().clone() for q in model.parameters()]
        res = learner.step(RolloutBatch(group.prompt_ids, ids, mask, sign * r, logprobs))
        moved = torch.cat([(q.detach() - b).abs().flatten() for q, b in zip(model.parameters(), was)])
        if first is None and float(moved.max()) > 0:
            w = torch.cat([b.abs().flatten() for b in was])
            first = {"step": step, "median_abs_dw": float(moved.median()), "share_moved": float((moved > 0).float().mean()),
                     "median_abs_w": float(w.median()), "grad_norm": float(res.grad_norm)}
    k = min(5, steps)
    return {"lr": lr, "seed": seed, "sign": sign, "prompts": prompts, "steps": steps,
            "first5": sum(rewards[:k]) / k, "last5": sum(rewards[-k:]) / k,
            "eval_before": before_eval, "eval_after": held_out_reward(model, task, n_eval), "first_update": first}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--model", default="qwen3-dense-mini")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval", type=int, default=256, dest="n_eval")
    p.add_argument("--cache", default=str(ROOT / ".cache" / "warmstart"))
    p.add_argument("--variant", action="append", type=json.loads)
    a = p.parse_args(argv)
    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.learner.warmstart import load_policy, warm_start

    run = Sweep.load(a.config, [f"axes.model=[{a.model}]"]).runs[0]
    ws = warm_start(run.spec, run.config.warmstart, a.cache)
    base, task = load_policy(ws.path), run.config.warmstart.task
    for kw in a.variant or DEFAULT_VARIANTS:
        t = time.time()
        out = learn(base, task, group_size=run.config.learner.group_size, steps=a.steps, n_eval=a.n_eval, **kw)
        print(json.dumps(out | {"s": round(time.time() - t, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
