"""Cost of the weight-sync checks against the RL step they guard, on a run of the smoke config.

Baseline: the step itself, measured in the same run — rollout on the live vLLM engine, one GRPO learner
step, export + transport + load of the weights (``rollout_and_learn`` + ``sync_weights``). After every
sync the checks run three ways on the same engine state, each timed separately:

* ``cheap``   — the cheap tier alone (what every sync pays between full checks),
* ``full``    — the full tier (read-back of every tensor, layout by content, probe batch for W7),
* ``cadence`` — what the run pays at ``checks.full_every`` from the config: full at the first sync and
  every N-th, cheap otherwise (the mean over the steps).

Also the parts of the cheap tier: the learner-side expectation (forward weights, on-grid bytes, BF16
views, their fingerprints), the engine snapshot (one engine-core call: the worker's ``fp8rl_state``
fingerprinting every tensor + the cache counters), the same without fingerprints, and a bare RPC (the
round trip's floor). Prints per-step medians and the ratios ``x step``.

    .venv/bin/python bench/checks.py [--config configs/smoke.yaml] [--model qwen3-dense-mini] [--preset all] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fp8rl_core.checks import CheckRunner, expected_from_learner  # noqa: E402
from fp8rl_core.config import load_sweep  # noqa: E402
from fp8rl_core.learner.warmstart import warm_start  # noqa: E402
from fp8rl_core.loop import rollout_and_learn, start_pipeline, sync_weights  # noqa: E402
from fp8rl_core.sampler.pool import release_all  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "smoke.yaml"))
    ap.add_argument("--model", default="qwen3-dense-mini")
    ap.add_argument("--preset", default="all")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "warmstart"))
    args = ap.parse_args()

    _, runs = load_sweep(args.config, [f"axes.model=[{args.model}]", f"axes.preset=[{args.preset}]", "axes.seed=[0]"])
    cfg = runs[0]
    ckpt = warm_start(cfg.spec(), cfg.warmstart, Path(args.cache).resolve(), progress=True).path
    pipe = start_pipeline(ckpt, cfg.preset, learner=cfg.learner_config(), sampler_cfg=cfg.sampler)
    policy, probe = cfg.check_policy(), cfg.check_probe()

    def runner(full_every: int) -> CheckRunner:
        r = CheckRunner(replace(policy, full_every=full_every), probe)
        r.start(pipe.samplers)
        r.seen.update(s.instance for s in pipe.samplers)
        r.request_full("")
        return r

    cheap, full, cadence = runner(10**9), runner(1), CheckRunner(policy, probe)
    cadence.start(pipe.samplers)
    cols: dict[str, list[float]] = {k: [] for k in ("step", "cheap", "full", "cadence", "expected", "snapshot",
                                                    "snapshot_no_fp", "bare_rpc")}
    failures = 0
    cadence_why: list[str] = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        rollout_and_learn(pipe, cfg.warmstart.task, step, prompts_per_step=cfg.loop.prompts_per_step, seed=cfg.seed)
        sync_weights(pipe)
        cols["step"].append(time.perf_counter() - t0)
        # full tiers last: their probe requests may leave prefix-cache blocks that a later cheap tier
        # of the same sync would (rightly) flag
        order = (("cheap", cheap), ("cadence", cadence), ("full", full))
        for name, r in order:
            rep = r.check(pipe)
            if name == "cadence":
                cadence_why.append(rep.why)
            if rep.failed:
                failures += 1
                print(f"  {name}: {rep.message()}")
            cols[name].append(rep.seconds)
        t0 = time.perf_counter()
        expected_from_learner(pipe.learner, pipe.configured)
        cols["expected"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pipe.sampler.state()
        cols["snapshot"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pipe.sampler.state(fingerprints=False)
        cols["snapshot_no_fp"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pipe.sampler.engine_version()
        cols["bare_rpc"].append(time.perf_counter() - t0)
        print(f"step {step}: step {cols['step'][-1]:.3f} s, cheap {cols['cheap'][-1] * 1e3:.1f} ms, "
              f"full {cols['full'][-1] * 1e3:.1f} ms, cadence {cols['cadence'][-1] * 1e3:.1f} ms ({cadence_why[-1]})",
              flush=True)
    release_all()
    step_s = statistics.median(cols["step"])
    cadence_mean = statistics.fmean(cols["cadence"])
    print(f"\n{args.model} / {args.preset} / sampler {cfg.sampler.dtype}, {args.steps} steps, "
          f"full_every={cfg.checks.full_every}; check failures: {failures}")
    print(f"{'':22s}{'median s':>10s}{'x step':>9s}")
    for name in ("step", "cheap", "full", "expected", "snapshot", "snapshot_no_fp", "bare_rpc"):
        v = statistics.median(cols[name])
        print(f"{name:22s}{v:10.4f}{v / step_s:9.3f}")
    print(f"{'cadence (mean)':22s}{cadence_mean:10.4f}{cadence_mean / step_s:9.3f}")
    print(f"checks_vs_step={cadence_mean / step_s:.4f}")


if __name__ == "__main__":
    main()
