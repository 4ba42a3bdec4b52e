"""fp8rl's price inside verl: verl's own step phases and each part fp8rl adds, side by side in the same verl
runs on CPU; a cost model of fp8rl's per-sync time projected to Qwen3-8B and Qwen3-30B-A3B on a B200 node;
its cost goals (fp8rl's addition, the grid sync against verl's BF16 update, the cheap tier) as ratios with
pass/miss.

**Runs** (verl's trainer, ``backend: verl``, CPU; configs/verl-smoke.yaml's settings): for each ``--models``
two runs with the same model, data and seed — preset ``all`` (the sync on the learner's grid: MXFP8 data +
scales) and ``bf16-sampler`` (verl's BF16 weight update through the same adapter, nothing quantized) —
``--steps`` RL steps each, inline (one process, a temporary MLflow store). Per run, warm steps only (the first
step is left out): verl's ``timing_s/*`` phases and fp8rl's parts (:mod:`fp8rl_core.verl.costs`: export and
quantization, the masters' copy, verl's update with fp8rl's load in it, the checks with the alarm, the token
capture), each as a fraction of verl's mean step. The export's own timer is checked against a difference of
the same invocation: ``timing_s/update_weights`` of ``all`` less that of ``bf16-sampler``.

**Cost model**: per-sync fp8rl time (export + update + checks) = fixed + per-byte × sync bytes, least squares
over the runs' models with 95% intervals (Student t), then projected to the paper's models on a B200 node
from the bandwidths in :data:`B200` (each with its source), not from this CPU's per-byte term.

**Goals** (each printed as ``goal <name>: ratio=… (<= or >= bound) pass|miss``): fp8rl's addition <= 5% of a
30B-A3B step (projected: export, both sides' fingerprints, the masters' copy to the host, and the fixed term
measured here); the sync on the learner's grid <= 0.7x verl's BF16 update (measured here: fp8rl's
``update_s`` of ``all`` over ``bf16-sampler``'s; projected at 8B: verl's documented 7B update scaled to 8B
and taken as per-byte, carrying the grid's bytes instead, plus the export); the cheap tier <= 1% of an 8B step (projected) and the CPU fingerprint >= 0.5x a memory copy (here);
the MXFP8 quantizer >= 0.8x a memory copy (here).

    .venv/bin/python bench/verl_overhead.py [--models qwen3-dense-mini,qwen3-moe-mini] [--steps 3]
        [--warmstart-steps N] [--save runs.json] [--load a.json,b.json]   # --load: analyse saved runs, run nothing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the stated bandwidths of a B200 node the projection uses, each with its source
B200 = {
    "hbm_bytes_s": (8.0e12, "NVIDIA DGX B200 datasheet: 8 TB/s HBM3e per GPU"),
    "nvlink_bytes_s": (1.8e12, "NVIDIA NVLink 5 (Blackwell): 1.8 TB/s per GPU, both directions together"),
    "host_bytes_s": (5.0e10, "PCIe Gen5 x16: 64 GB/s nominal; ~50 GB/s measured pinned copies (assumed)"),
}
#: the anchors the goals are judged against (docs/gpu.md; /work/shared/notes/costs-and-checkpoints.md)
ANCHORS = {
    "step_30b_a3b_s": (188.5, "NeMo-RL #3804: Qwen3-30B-A3B GRPO step on B200/GB200"),
    "bf16_update_7b_s": (5.75, "verl docs: full BF16 weight broadcast 5.5-6 s at 7B"),
    "step_8b_s": (60.0, "assumed: no public 8B step time; NeMo-RL's 30B-A3B step is 188.5 s"),
}
#: passes of a tensor's bytes per part on the GPU (read + write counted in bytes moved per sync byte)
GPU_PASSES = {
    "export": 3.0,  # read BF16 (2 B/param) + write 1.03 B/param per ~1.03 sync bytes
    "fingerprint_side": 28.0,  # the words kernel: 14 element-wise ops, each a read and a write (bench/README.md)
}


@dataclass(frozen=True)
class RunCosts:
    """One verl run's warm-step means: verl's phases and fp8rl's parts (seconds), its sync bytes."""

    model: str
    preset: str
    steps: int
    sync_bytes: int
    verl: dict  # timing_s/<phase> → mean seconds over the warm steps
    fp8rl: dict  # <part>_s → mean seconds over the warm steps
    wall_s: float  # the run's wall time in the sweep (start-up included)
    startup: dict = field(default_factory=dict)  # time/startup/* of the run (fp8rl_core.verl.startup)


@dataclass(frozen=True)
class Fit:
    """``y = fixed + per_byte * x`` by least squares with 95% intervals (nan where too few points)."""

    fixed: float
    per_byte: float
    fixed_ci: tuple[float, float]
    per_byte_ci: tuple[float, float]
    n: int


# Student t quantiles, two-sided 95%, by degrees of freedom (an interval needs >= 1)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def fit_line(x: list[float], y: list[float]) -> Fit:
    """Ordinary least squares of ``y`` on ``x`` with the usual standard errors and t intervals."""
    n = len(x)
    if n < 2 or len(set(x)) < 2:
        raise ValueError(f"a fixed + per-byte fit needs two different sizes; got {n} points, {len(set(x))} sizes")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    b = sum((a - mx) * (c - my) for a, c in zip(x, y)) / sxx
    a = my - b * mx
    if n == 2:
        return Fit(a, b, (math.nan, math.nan), (math.nan, math.nan), n)
    s2 = sum((c - a - b * d) ** 2 for d, c in zip(x, y)) / (n - 2)
    se_b = math.sqrt(s2 / sxx)
    se_a = math.sqrt(s2 * (1 / n + mx * mx / sxx))
    t = _T95.get(n - 2, 1.96)
    return Fit(a, b, (a - t * se_a, a + t * se_a), (b - t * se_b, b + t * se_b), n)


def projected_sync(sync_bytes: float, bf16_bytes: float, fixed_s: float) -> dict[str, float]:
    """Seconds per sync on a B200 node (:data:`B200`): the export at HBM bandwidth, the transport of the sync
    bytes over NVLink, the cheap tier's fingerprints of both sides (learner and engine) at HBM bandwidth, the
    masters' copy to the host for the checks (fp32: 2x the BF16 bytes), plus the ``fixed_s`` measured here;
    ``bf16_update``: the same transport of the BF16 bytes (verl's own update)."""
    hbm, nvl, host = (B200[k][0] for k in ("hbm_bytes_s", "nvlink_bytes_s", "host_bytes_s"))
    return {"export": GPU_PASSES["export"] * sync_bytes / hbm,
            "transport": sync_bytes / nvl,
            "cheap_tier": 2 * GPU_PASSES["fingerprint_side"] * sync_bytes / hbm,
            "masters_copy": 2 * bf16_bytes / host,
            "fixed": fixed_s,
            "bf16_update": bf16_bytes / nvl}


def goal(name: str, ratio: float, bound: float, at_most: bool) -> str:
    """One goal line: ``goal <name>: ratio=<r> (<= bound) pass|miss``."""
    ok = ratio <= bound if at_most else ratio >= bound
    return f"goal {name}: ratio={ratio:.3f} ({'<=' if at_most else '>='} {bound}) {'pass' if ok else 'miss'}"


# ------------------------------------------------------------------------------------------------- runs
def sync_bytes_of(model: str) -> int:
    from bench.checks import sync_bytes
    from fp8rl_core.learner.spec import load_model_spec

    grid, bf16 = sync_bytes(load_model_spec(ROOT / "configs" / "models" / f"{model}.yaml"))
    return grid + bf16


def run_sweep(models: list[str], steps: int, cache: Path, warmstart_steps: int | None = None) -> list[RunCosts]:
    """The verl runs (module docstring), inline, in a temporary MLflow store; their warm-step costs."""
    import mlflow

    from fp8rl_core.verl.costs import PARTS

    work = Path(tempfile.mkdtemp(prefix="fp8rl-verl-overhead-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
    os.environ["FP8RL_ARTIFACTS"] = str(work / "mlartifacts")
    os.environ["FP8RL_CACHE"] = str(cache.resolve())
    import flows.pipelines as pipelines

    pipelines.WARMSTART_CACHE = os.environ["FP8RL_CACHE"]
    out: list[RunCosts] = []
    try:
        for model in models:
            for preset in ("all", "bf16-sampler"):  # one run at a time: each run's wall time is its own
                overrides = ["sweep=verl-overhead", f"axes.model=[{model}]", f"axes.preset=[{preset}]",
                             "axes.seed=[0]", f"base.loop.steps={steps}"]
                if warmstart_steps is not None:
                    overrides += [f"base.warmstart.steps={warmstart_steps}",  # warm-up within the steps
                                  f"base.warmstart.warmup={min(50, warmstart_steps // 4)}"]
                t0 = time.perf_counter()
                rows = pipelines.mxfp8_sweep(str(ROOT / "configs" / "verl-smoke.yaml"), overrides, report=False,
                                             inline=True)
                wall = time.perf_counter() - t0
                (row,) = rows
                if row.failed:
                    raise SystemExit(f"{row.name}: {row.status}")
                client = mlflow.tracking.MlflowClient()
                metrics = client.get_run(row.mlflow_run).data.metrics
                keys = [k for k in metrics if k.startswith(("timing_s/", "fp8rl/"))]
                hist = {k: sorted((m.step, m.value) for m in client.get_metric_history(row.mlflow_run, k)) for k in keys}
                warm = {k: [v for st, v in h if st > 1] or [v for _, v in h] for k, h in hist.items()}
                verl = {k: statistics.mean(v) for k, v in warm.items() if k.startswith("timing_s/")}
                ours = {k.split("/", 1)[1]: statistics.mean(v) for k, v in warm.items()
                        if k.split("/", 1)[1] in PARTS}
                startup = {k: v for k, v in metrics.items() if k.startswith("time/startup/")}
                out.append(RunCosts(model, preset, steps, sync_bytes_of(model), verl, ours, wall, startup))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------- CPU baselines
def cpu_ratios_fresh() -> dict[str, float]:
    """:func:`cpu_ratios` in a fresh Python process: after verl's runs inline, this process's state (the
    threads Ray, vLLM and Prefect leave running) slowed the quantizer's single-threaded baseline 3x
    (0.28-0.35x a copy here, 0.86x in a fresh process the same minute)."""
    import subprocess

    out = subprocess.run([sys.executable, __file__, "--cpu-ratios"], capture_output=True, text=True, check=True,
                         cwd=ROOT, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_ratios(mb: int = 64, repeats: int = 5) -> dict[str, float]:
    """This CPU, same invocation: the fingerprint and the MXFP8 quantizer against a memory copy (fresh output)."""
    import torch

    from bench.sync import best_of
    from fp8rl_core.grids import quantize
    from fp8rl_core.sync.fingerprint import fingerprints

    torch.set_num_threads(1)
    u8 = torch.randint(0, 256, (mb << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    copy_u8 = best_of(lambda: torch.empty_like(u8).copy_(u8), repeats)
    fp = best_of(lambda: fingerprints({"w": u8}), repeats)
    x = torch.randn(mb << 19 >> 12, 4096, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    quantize(x, "mxfp8-e4m3-rceil")  # builds or loads the kernel
    copy_x = best_of(lambda: x.clone(), repeats)
    q = best_of(lambda: quantize(x, "mxfp8-e4m3-rceil"), repeats)
    return {"fingerprint_vs_copy": copy_u8 / fp, "quantize_vs_copy": copy_x / q}


# ------------------------------------------------------------------------------------------- printing
def print_wall(r: RunCosts, step: float) -> None:
    """Where the run's wall went: its phases (fp8rl_core.verl.startup), fp8rl's own seconds inside the
    start-up and a 200-step run's projection (the single wall-less-steps figure for a run saved without them)."""
    from fp8rl_core.verl.startup import PHASES

    s = r.startup
    if "time/startup/wall_s" not in s:
        startup = r.wall_s - r.steps * step
        print(f"    wall: start-up and end (wall less the steps) {startup:.0f} s; {r.steps} steps "
              f"{r.steps * step:.0f} s; a 200-step run: {startup + 200 * step:.0f} s")
        return
    wall = s["time/startup/wall_s"]
    print(f"    wall {r.wall_s:.1f} s in the sweep: the verl task {wall:.1f} s, around it (the sweep's flow, MLflow) "
          f"{r.wall_s - wall:.1f} s; the task's phases:")
    for name, holds, _ in PHASES:
        v = s.get(f"time/startup/{name}_s", math.nan)
        extra = (f" ({s['time/startup/steps']:.0f} steps, warm step {s['time/startup/warm_step_s']:.2f} s sync to "
                 f"sync; verl's timing_s/step {step:.2f} s)") if name == "steps" else ""
        print(f"      {name:12s}{v:8.1f} s {v / wall:7.1%}  {holds}{extra}")
    own = {k.removeprefix("time/startup/fp8rl/"): v for k, v in s.items() if k.startswith("time/startup/fp8rl/")}
    print("      fp8rl inside them: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(own.items()))
          + f" ({s.get('time/startup/processes', 0):.0f} processes registered)")
    n = s["time/startup/steps"]
    print(f"      a 200-step run: this run's {wall:.1f} s + {200 - n:.0f} x {s['time/startup/warm_step_s']:.2f} s warm "
          f"= {s['time/startup/projected_200_steps_s']:.0f} s; the wall less the steps (start-up and end) "
          f"{wall - s['time/startup/steps_s']:.1f} s")


def report(runs: list[RunCosts], cpu: dict[str, float]) -> None:
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("\nside by side (warm steps; fraction of verl's mean step timing_s/step):")
    for r in runs:
        step = r.verl.get("timing_s/step", math.nan)
        print(f"  {r.model} / {r.preset}: step {step:.2f} s, run wall {r.wall_s:.0f} s, sync {r.sync_bytes / 1e6:.1f} MB")
        for k, v in sorted(r.verl.items()):
            if k != "timing_s/step":
                print(f"    verl {k:34s}{v:9.3f} s {v / step:7.1%}")
        for k, v in r.fp8rl.items():
            print(f"    fp8rl {k:33s}{v:9.3f} s {v / step:7.1%}")
        added = sum(r.fp8rl.get(k, 0.0) for k in ("export_s", "keep_s", "checks_s", "capture_s"))
        print(f"    fp8rl added (export+copy+checks+capture){added:8.3f} s {added / step:7.1%}")
        print_wall(r, step)
    by = {(r.model, r.preset): r for r in runs}
    ratios = []
    for model in sorted({r.model for r in runs}):
        grid, bf16 = by.get((model, "all")), by.get((model, "bf16-sampler"))
        if grid and bf16:
            diff = grid.verl.get("timing_s/update_weights", math.nan) - bf16.verl.get("timing_s/update_weights", math.nan)
            print(f"  {model}: update_weights(all) - update_weights(bf16-sampler) = {diff:.3f} s; "
                  f"the export's own timer {grid.fp8rl.get('export_s', math.nan):.3f} s")
            ratios.append((grid.sync_bytes, model, grid.fp8rl["update_s"] / bf16.fp8rl["update_s"]))
            print(f"  {model}: the grid's sync (update_s) over verl's BF16 update: {ratios[-1][2]:.3f} "
                  f"({grid.fp8rl['update_s']:.3f} s / {bf16.fp8rl['update_s']:.3f} s)")
    grid_runs = [r for r in runs if r.preset == "all"]
    print("\ncost model, per-sync fp8rl seconds (export + update + checks) = fixed + per_byte x sync bytes:")
    fit = None
    if len({r.sync_bytes for r in grid_runs}) >= 2:
        fit = fit_line([float(r.sync_bytes) for r in grid_runs],
                       [r.fp8rl["export_s"] + r.fp8rl["update_s"] + r.fp8rl["checks_s"] for r in grid_runs])
        print(f"  fixed {fit.fixed:.3f} s (95% {fit.fixed_ci[0]:.3f} .. {fit.fixed_ci[1]:.3f}); per byte "
              f"{fit.per_byte:.3e} s (95% {fit.per_byte_ci[0]:.3e} .. {fit.per_byte_ci[1]:.3e}); {fit.n} runs")
    else:
        print("  not fitted: fewer than two model sizes")
    fixed = fit.fixed if fit is not None and fit.fixed > 0 else 0.0
    print("\nprojected on a B200 node (fixed term as measured here):")
    for k, (v, src) in {**B200, **ANCHORS}.items():
        print(f"  {k} = {v:g}  [{src}]")
    from bench.checks import sync_bytes
    from fp8rl_core.learner.spec import load_model_spec

    proj = {}
    for name in ("qwen3-8b", "qwen3-30b-a3b"):
        grid_b, bf16_b = sync_bytes(load_model_spec(ROOT / "configs" / "models" / f"{name}.yaml"))
        params_bf16 = 2 * (grid_b * 32 // 33) + bf16_b  # every parameter as BF16
        p = projected_sync(grid_b + bf16_b, params_bf16, fixed)
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f} s" for k, v in p.items()))
        proj[name] = p | {"grid_bytes": grid_b + bf16_b, "bf16_bytes": params_bf16}
    print()
    p30 = proj["qwen3-30b-a3b"]
    added30 = p30["export"] + p30["cheap_tier"] + p30["masters_copy"] + p30["fixed"]
    print(goal("addition_vs_step_30b_a3b_projected", added30 / ANCHORS["step_30b_a3b_s"][0], 0.05, True))
    if ratios:  # judged where the bytes are largest: on a small sync both updates are fixed costs alike
        _, model, ratio = max(ratios)
        print(goal(f"grid_sync_vs_bf16_update_measured ({model}, the largest sync here)", ratio, 0.7, True))
    p8 = proj["qwen3-8b"]
    # verl's own BF16 update at 8B from its documented 7B figure, scaled by parameters and taken as per-byte
    # (transport + load): the same update carrying the grid's bytes, plus fp8rl's export
    bf16_8b = ANCHORS["bf16_update_7b_s"][0] * 8.2 / 7.6  # Qwen3-8B 8.2e9 parameters, Qwen2-7B 7.6e9
    grid_8b = bf16_8b * p8["grid_bytes"] / p8["bf16_bytes"] + p8["export"]
    print(f"  8B: verl's BF16 update {bf16_8b:.2f} s (verl docs, scaled), the grid's sync {grid_8b:.2f} s")
    print(goal("grid_sync_vs_bf16_update_8b_projected", grid_8b / bf16_8b, 0.7, True))
    print(goal("cheap_tier_vs_step_8b_projected", p8["cheap_tier"] / ANCHORS["step_8b_s"][0], 0.01, True))
    print(goal("fingerprint_vs_memcpy_cpu", cpu["fingerprint_vs_copy"], 0.5, False))
    print(goal("quantizer_vs_memcpy_cpu", cpu["quantize_vs_copy"], 0.8, False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-dense-mini,qwen3-moe-mini")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "warmstart"))
    ap.add_argument("--warmstart-steps", type=int, help="a shorter warm start than verl-smoke's (a large model's "
                    "RL rewards are not what is measured)")
    ap.add_argument("--save", help="write the runs' costs as JSON here")
    ap.add_argument("--load", help="analyse the runs saved by --save (comma-separated files); run nothing")
    ap.add_argument("--cpu-ratios", action="store_true", help=argparse.SUPPRESS)  # cpu_ratios_fresh's child
    args = ap.parse_args()
    if args.cpu_ratios:
        print(json.dumps(cpu_ratios()))
        return 0
    if args.load:
        runs = [RunCosts(**d) for f in args.load.split(",") for d in json.loads(Path(f).read_text())]
    else:
        runs = run_sweep(args.models.split(","), args.steps, Path(args.cache), args.warmstart_steps)
        if args.save:
            Path(args.save).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    report(runs, cpu_ratios_fresh())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
