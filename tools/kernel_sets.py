"""Does a warm start come out byte-identical under another torch CPU kernel set or thread count?

Each variant ``CAP/THREADS`` (``ATEN_CPU_CAPABILITY``: ``default`` — what torch picks on this CPU — or a set such as
``avx2``; ``THREADS`` torch's intra-op threads) trains the warm start of the config's first run in a fresh process
(:func:`fp8rl_core.learner.warmstart._train`, the code ``warm_start`` runs), hashing every parameter (SHA-256 of
the fp32 bytes, in name order) before the optimizer steps in ``--at`` and after the last. The first variant is the
reference; for each other one it prints the first hashed step whose parameters differ from the reference's (``none``:
byte-identical at every hashed step and at the end).

    python tools/kernel_sets.py CONFIG [--model qwen3-dense-mini] [--steps 60]
        [--variants default/1,avx2/1,default/2,avx2/2] [--at 0,1,2,3,10,20,...]

Measured numbers: docs/results/README.md, Do the numbers travel?
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import hashlib, json, sys
import torch
config, model_name, steps, threads, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
from fp8rl_core.config.runs import Sweep
from fp8rl_core.learner import warmstart as ws

run = Sweep.load(config, [f"axes.model=[{model_name}]"]).runs[0]
cfg = run.config.warmstart.model_copy(update={"steps": steps})
at = {int(s) for s in at.split(",") if s}
model, seen, hashes = {}, [0], []

def digest(m):
    h = hashlib.sha256()
    for k, v in sorted(m.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

build, loss_fn = ws.build_model, ws.F.cross_entropy
def built(*a, **k):
    model["m"] = build(*a, **k)
    return model["m"]
def loss(*a, **k):  # once per optimizer step, before its backward: the parameters after the steps before it
    if seen[0] in at:
        hashes.append([seen[0], digest(model["m"])])
    seen[0] += 1
    return loss_fn(*a, **k)
ws.build_model, ws.F.cross_entropy = built, loss
trained, tail_loss = ws._train(run.spec, cfg, progress=False)
hashes.append(["end", digest(trained)])
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                  "tail_loss": tail_loss, "hashes": hashes}))
"""


def train(config: str, model: str, steps: int, variant: str, at: str) -> dict:
    """One variant's run in a fresh process: its capability, threads, tail loss and hashes."""
    cap, threads = variant.split("/")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=threads)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if cap != "default":
        env["ATEN_CPU_CAPABILITY"] = cap
    out = subprocess.run([sys.executable, "-c", _CHILD, config, model, str(steps), threads, at], env=env, cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"variant {variant} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_difference(hashes: list, reference: list) -> str:
    """The first hashed step at which ``hashes`` differ from ``reference`` (``none`` where none does)."""
    return next((str(s) for (s, h), (_, r) in zip(hashes, reference) if h != r), "none")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--model", default="qwen3-dense-mini")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--variants", default="default/1,avx2/1,default/2,avx2/2")
    p.add_argument("--at", default=",".join(map(str, [0, 1, 2, 3, *range(10, 1000, 10)])))
    a = p.parse_args(argv)
    results = [(v, train(a.config, a.model, a.steps, v, a.at)) for v in a.variants.split(",")]
    reference = results[0][1]["hashes"]
    for v, r in results:
        print(f"{v}: capability {r['capability']}, {r['threads']} threads, tail loss {r['tail_loss']:.6f}, "
              f"end {r['hashes'][-1][1]}, first step differing from {a.variants.split(',')[0]}: "
              f"{first_difference(r['hashes'], reference)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
