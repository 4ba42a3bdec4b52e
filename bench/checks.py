"""Cost of the weight-sync checks, at two scales.

**mini** (``--scale mini``, needs vLLM): against the RL step they guard, on a run of the smoke config.
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

**synthetic** (``--scale synthetic``, no engine): the bandwidth parts at scale, on a dense layer set of
``--params`` parameters (default 1e9) as at sync — MXFP8 data and E8M0 scale bytes for every GEMM layer,
BF16 embeddings, lm_head and norms (:func:`bench.sync.synthetic`) — and an "engine" copy of it. Best of
``--repeats``, in GB/s of the set's bytes: the cheap tier's hashing (:func:`fingerprints` of one side;
the tier hashes both, learner and engine), the full tier's byte compare
(:func:`~fp8rl_core.checks.differing_bytes` of every tensor), and in the same run the baselines
``torch.equal`` over the same tensors and a memory copy of the same bytes. From these rates, the
projected cost per sync of both tiers for Qwen3-8B and Qwen3-30B-A3B (configs/models/, preset ``all``:
every GEMM layer of the blocks on the grid, the rest BF16) and the step time at which the cheap tier
is 1% of a step.

    .venv/bin/python bench/checks.py [--scale both|mini|synthetic] [--params 1e9] [--repeats 3] [--threads 1]
        [--config configs/smoke.yaml] [--model qwen3-dense-mini] [--preset all] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sync import best_of, memcpy, nbytes, synthetic  # noqa: E402
from fp8rl_core.checks import CheckRunner, differing_bytes, expected_from_learner  # noqa: E402
from fp8rl_core.config.runs import Sweep  # noqa: E402
from fp8rl_core.learner.warmstart import warm_start  # noqa: E402
from fp8rl_core.loop import rollout_and_learn, start_pipeline, sync_weights  # noqa: E402
from fp8rl_core.learner.spec import ModelSpec, load_model_spec  # noqa: E402
from fp8rl_core.sampler.pool import release_all  # noqa: E402
from fp8rl_core.sync.fingerprint import fingerprints  # noqa: E402

#: the paper's models (configs/models/), for the projection
PAPER_MODELS = ("qwen3-8b", "qwen3-30b-a3b")


def mini(args) -> None:
    """The smoke mini on live engines (the module docstring's first scale)."""
    runs = Sweep.load(args.config, [f"axes.model=[{args.model}]", f"axes.preset=[{args.preset}]", "axes.seed=[0]"]).runs
    cfg = runs[0].config
    ckpt = warm_start(cfg.spec(), cfg.warmstart, Path(args.cache).resolve(), progress=True).path
    pipe = start_pipeline(ckpt, cfg.preset, learner=cfg.learner_config(), sampler_cfg=cfg.sampler)
    policy, probe = cfg.check_policy(), cfg.check_probe()

    def runner(full_every: int) -> CheckRunner:
        r = CheckRunner(policy.model_copy(update={"full_every": full_every}), probe)
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


# ----------------------------------------------------------------------------------------------------
# synthetic scale
# ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rates:
    """Seconds (best of the repeats) over a set of ``grid_bytes`` on-grid bytes (FP8 data + E8M0 scales)
    and ``bf16_bytes`` BF16 bytes, per part: the cheap tier's hashing of one side, the full tier's byte
    compare, ``torch.equal`` and a memory copy. ``*_grid`` / ``*_bf16``: the same on each kind alone."""

    tensors: int
    grid_bytes: int
    bf16_bytes: int
    seconds: dict[str, float]  # part → seconds over the whole set
    grid_s: dict[str, float]  # part → seconds over the on-grid tensors
    bf16_s: dict[str, float]  # part → seconds over the BF16 tensors
    hashes_agree: bool  # learner and engine copies fingerprint alike (they must)
    compare_clean: bool  # the full compare found no differing byte (it must)

    @property
    def total_bytes(self) -> int:
        return self.grid_bytes + self.bf16_bytes

    def gbps(self, part: str) -> float:
        return self.total_bytes / self.seconds[part] / 1e9


PARTS = ("hash (one side)", "full compare", "torch.equal", "memory copy")


def measure(params: float, repeats: int) -> Rates:
    """Time the parts on a synthetic set of ``params`` parameters and an engine copy of it."""
    learner, _ = synthetic(params)
    for t in learner.values():  # BF16 from random bytes: clear the top exponent bit (no NaN/inf, as weights)
        if t.dtype == torch.bfloat16:
            t.view(torch.int16).bitwise_and_(0x3FFF | -0x8000)
    engine = {n: t.clone() for n, t in learner.items()}
    grid = [n for n, t in learner.items() if t.element_size() == 1]
    bf16 = [n for n, t in learner.items() if t.element_size() != 1]

    def parts(names: list[str]) -> dict[str, float]:
        a, b = {n: learner[n] for n in names}, {n: engine[n] for n in names}
        return {
            "hash (one side)": best_of(lambda: fingerprints(b), repeats),
            "full compare": best_of(lambda: [differing_bytes(b[n], a[n]) for n in names], repeats),
            "torch.equal": best_of(lambda: [torch.equal(b[n], a[n]) for n in names], repeats),
            "memory copy": best_of(lambda: memcpy(a), repeats),
        }

    g, f = parts(grid), parts(bf16)
    return Rates(len(learner), nbytes({n: learner[n] for n in grid}), nbytes({n: learner[n] for n in bf16}),
                 {k: g[k] + f[k] for k in PARTS}, g, f, fingerprints(learner) == fingerprints(engine),
                 sum(differing_bytes(engine[n], learner[n]) for n in learner) == 0)


def sync_bytes(spec: ModelSpec) -> tuple[int, int]:
    """(on-grid bytes, BF16 bytes) of one sync of ``spec`` under preset ``all``: every GEMM layer of the
    blocks as MXFP8 data (1 byte) + E8M0 scales (1 per 32); embeddings, lm_head, norms, router in BF16."""
    h, nh, nkv, d = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    attn = h * (nh + 2 * nkv) * d + nh * d * h
    if spec.is_moe:
        mlp, bf16_layer = 3 * h * spec.moe_intermediate_size * spec.num_experts, h * spec.num_experts
    else:
        mlp, bf16_layer = 3 * h * spec.intermediate_size, 0
    gemm = spec.num_hidden_layers * (attn + mlp)
    bf16 = spec.num_hidden_layers * (bf16_layer + 2 * h + 2 * d) + h + spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    return gemm + gemm // 32, 2 * bf16


def project(rates: Rates, spec: ModelSpec) -> dict[str, float]:
    """Seconds per sync of each part for ``spec`` at the rates measured (on-grid and BF16 bytes apart);
    ``cheap tier`` hashes both sides."""
    grid, bf16 = sync_bytes(spec)
    out = {k: grid / rates.grid_bytes * rates.grid_s[k] + bf16 / rates.bf16_bytes * rates.bf16_s[k] for k in PARTS}
    out["cheap tier"] = 2 * out["hash (one side)"]
    return out


def synthetic_scale(args) -> Rates:
    r = measure(args.params, args.repeats)
    print(f"synthetic set: {args.params:.3g} parameters, {r.tensors} tensors, {r.grid_bytes / 1e9:.3f} GB on-grid "
          f"+ {r.bf16_bytes / 1e9:.3f} GB BF16; best of {args.repeats}; torch threads {torch.get_num_threads()}")
    print(f"  learner and engine fingerprints agree: {r.hashes_agree}; full compare clean: {r.compare_clean}")
    print(f"  {'part':18s}{'s':>9s}{'GB/s':>8s}{'x torch.equal':>15s}{'x copy':>8s}")
    for k in PARTS:
        print(f"  {k:18s}{r.seconds[k]:9.3f}{r.gbps(k):8.2f}{r.gbps(k) / r.gbps('torch.equal'):15.2f}"
              f"{r.gbps(k) / r.gbps('memory copy'):8.2f}")
    print("\nprojected per sync at these rates (preset all; the cheap tier hashes learner and engine side):")
    print(f"  {'model':16s}{'sync GB':>8s}{'cheap s':>9s}{'full s':>8s}{'equal s':>8s}{'copy s':>8s}{'1% needs a step of':>20s}")
    for name in PAPER_MODELS:
        spec = load_model_spec(ROOT / "configs" / "models" / f"{name}.yaml")
        p, size = project(r, spec), sum(sync_bytes(spec)) / 1e9
        print(f"  {name:16s}{size:8.2f}{p['cheap tier']:9.2f}{p['full compare']:8.2f}{p['torch.equal']:8.2f}"
              f"{p['memory copy']:8.2f}{100 * p['cheap tier']:18.0f} s")
    print(f"full_vs_equal={r.gbps('full compare') / r.gbps('torch.equal'):.2f}")
    print(f"hash_vs_copy={r.gbps('hash (one side)') / r.gbps('memory copy'):.2f}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=("both", "mini", "synthetic"), default="both")
    ap.add_argument("--params", type=float, default=1e9, help="parameters of the synthetic set (default 1e9)")
    ap.add_argument("--repeats", type=int, default=3, help="synthetic: best of this many (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="synthetic: torch threads for every part alike (default 1: on a shared 2-core machine "
                         "a parallel region waits for a descheduled thread)")
    ap.add_argument("--config", default=str(ROOT / "configs" / "smoke.yaml"))
    ap.add_argument("--model", default="qwen3-dense-mini")
    ap.add_argument("--preset", default="all")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "warmstart"))
    args = ap.parse_args()
    if args.scale in ("both", "synthetic"):
        threads = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        synthetic_scale(args)
        torch.set_num_threads(threads)
    if args.scale in ("both", "mini"):
        print()
        mini(args)


if __name__ == "__main__":
    main()
