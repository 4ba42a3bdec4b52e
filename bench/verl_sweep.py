"""What running a verl sweep's runs side by side buys: the same two-run ``backend: verl`` sweep (CPU, the dense
mini, presets ``all`` and ``half``) run twice in this invocation on a one-node Ray this script starts — once with
room for one run at a time (its "GPU" slots: one run's), once with room for both — and the ratio of the walls.

Both passes take the same path (``fp8rl run --ray-address``: each run a Ray job, as many at once as the
cluster's GPUs hold, docs/deploy.md "verl sweeps on Ray"), each on a fresh MLflow store and work folder; the
warm start is trained before either (both reuse the cached checkpoint). On CPU the runs share the machine's
cores, so the ratio says how much of a run is waiting (process starts, Ray, verl's set-up) rather than
computing; on a GPU cluster each run has GPUs of its own.

    .venv/bin/python bench/verl_sweep.py                           # verl-smoke's dense mini, two presets
    .venv/bin/python bench/verl_sweep.py loop.steps=1              # quicker

The last line is ``concurrent_vs_sequential=<wall with both at once / wall one at a time>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = ["axes.model=[qwen3-dense-mini]", "axes.preset=[all,half]", "axes.seed=[0]"]


def _head(slots: int, cpus: int, tmp: Path) -> tuple[subprocess.Popen, str]:
    """A one-node Ray (``ray start --head --block``, its dashboard on: the job server) with ``slots`` "GPU"s."""
    from adapters.tracking_server import free_port

    port = free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray = str(Path(sys.executable).parent / "ray")
    log = tmp / f"head-{slots}.log"
    proc = subprocess.Popen([ray, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                             f"--num-gpus={slots}", f"--num-cpus={cpus}", "--include-dashboard=true",
                             "--dashboard-host=127.0.0.1", f"--dashboard-port={free_port()}",
                             f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                             f"--temp-dir={tempfile.mkdtemp(prefix='r', dir='/tmp')}", "--block",
                             "--disable-usage-stats"],
                            cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"ray start failed:\n{log.read_text()[-2000:]}")
        time.sleep(1)
    return proc, f"127.0.0.1:{port}"


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _pass(config: str, overrides: list[str], side_by_side: int, slots: int, work: Path, cache: Path) -> float:
    """The sweep's wall on a fresh Ray with room for ``side_by_side`` runs, as ``fp8rl run`` in its own process."""
    from fp8rl_core.verl.overrides import RAY_CPUS

    here = work / f"pass-{side_by_side}"
    here.mkdir()
    head, address = _head(side_by_side * slots, side_by_side * (RAY_CPUS + 1), here)
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{here / 'mlflow.db'}", "FP8RL_ARTIFACTS": str(here / "art"),
                        "FP8RL_VERL_WORK": str(here / "verl"), "FP8RL_CACHE": str(cache), "FP8RL_LOGS": str(here / "logs"),
                        "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    try:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "flows.cli", "run", config, *overrides, "--ray-address", address],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    finally:
        _stop(head)
    if out.returncode != 0:
        raise SystemExit(f"the sweep failed (room for {side_by_side}):\n{(out.stdout + out.stderr)[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the sweep config")
    ap.add_argument("--config", default=str(ROOT / "configs" / "verl-smoke.yaml"))
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "warmstart"), help="warm-start checkpoints (shared)")
    args = ap.parse_args()

    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.learner.warmstart import warm_start

    overrides = [*RUNS, *args.overrides]
    runs = Sweep.load(args.config, overrides).runs
    if len(runs) != 2 or any(r.config.backend != "verl" for r in runs):
        raise SystemExit(f"{args.config} with {overrides}: {len(runs)} runs; this measures two verl runs")
    cache = Path(args.cache).resolve()
    warm_start(runs[0].spec, runs[0].config.warmstart, cache, progress=True)
    slots = max(r.config.verl.nnodes * r.config.verl.gpus_per_node for r in runs)
    work = Path(tempfile.mkdtemp(prefix="fp8rl-verl-sweep-", dir="/tmp"))
    try:
        one = _pass(args.config, overrides, 1, slots, work, cache)
        both = _pass(args.config, overrides, 2, slots, work, cache)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'room for':<22}{'wall s':>10}")
    print(f"{'one run at a time':<22}{one:>10.1f}")
    print(f"{'both runs at once':<22}{both:>10.1f}")
    print(f"concurrent_vs_sequential={both / one:.4f}")


if __name__ == "__main__":
    main()
