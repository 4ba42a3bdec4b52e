"""What scale-out costs: the same sweep run twice in this invocation — in-process (``inline``: no Ray,
SQLite, the path before runs went to Ray) and on Ray with an MLflow tracking server on PostgreSQL — and
the difference per run and as a fraction of the sweep (goal: <= 5%).

Both passes run one run at a time (the Ray pass asks ``resources.num_cpus`` = this machine's cores), so
the difference is orchestration — starting Ray, shipping each run to a worker, task runs reported to the
Prefect API from the worker, logging over HTTP to the server and through it into PostgreSQL — not
parallelism. Warm starts are trained before either pass (both reuse the same cached checkpoints); the
tracking server's start-up is timed and printed apart (a cluster starts it once, not per sweep).

    .venv/bin/python bench/orchestration.py                       # the whole smoke sweep (30 runs)
    .venv/bin/python bench/orchestration.py axes.seed=[0] loop.steps=1   # a quicker subset

The last line is ``overhead_fraction=<ray+server wall / inline wall - 1>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adapters.logs import quiet_process  # noqa: E402

quiet_process()  # at import: vLLM's spawned engine processes re-import this module first


def _warm(config: str, overrides: list[str], cache: Path) -> int:
    from fp8rl_core.config import load_sweep
    from fp8rl_core.learner.warmstart import warm_start

    _, runs = load_sweep(config, overrides)
    seen = {}
    for r in runs:
        seen[(r.spec.model_dump_json(), r.config.warmstart.model_dump_json())] = r
    for r in seen.values():
        warm_start(r.spec, r.config.warmstart, cache.resolve(), progress=True)
    return len(runs)


def _timed_sweep(config: str, overrides: list[str], **kw) -> float:
    from flows.pipelines import mxfp8_sweep

    t0 = time.perf_counter()
    rows = mxfp8_sweep(config, overrides, report=False, **kw)
    wall = time.perf_counter() - t0
    bad = [r.name for r in rows if r.status != "FINISHED"]
    if bad:
        raise SystemExit(f"runs did not finish: {bad}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the sweep config")
    ap.add_argument("--config", default=str(ROOT / "configs" / "smoke.yaml"))
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "warmstart"), help="warm-start checkpoints (shared)")
    args = ap.parse_args()

    from adapters import tracking_server as ts

    os.environ.pop("RAY_ADDRESS", None)
    os.environ["FP8RL_CACHE"] = str(Path(args.cache).resolve())
    import flows.pipelines as pipelines

    pipelines.WARMSTART_CACHE = os.environ["FP8RL_CACHE"]
    work = Path(tempfile.mkdtemp(prefix="fp8rl-orch-", dir="/tmp"))
    work.chmod(0o711)  # PostgreSQL runs as its own user when we are root
    try:
        n = _warm(args.config, args.overrides, Path(args.cache))
        print(f"{n} runs; warm starts ready", flush=True)

        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        os.environ["FP8RL_ARTIFACTS"] = str(work / "mlartifacts")
        inline = _timed_sweep(args.config, [*args.overrides, "sweep=orch-inline"], inline=True)

        t0 = time.perf_counter()
        with ts.Postgres(work) as db, \
                ts.TrackingServer(db.uri, None, work, port=ts.free_port(), workers=1) as server:
            server_s = time.perf_counter() - t0
            os.environ["MLFLOW_TRACKING_URI"] = server.url
            cores = os.cpu_count() or 1
            ray = _timed_sweep(args.config, [*args.overrides, "sweep=orch-ray", f"resources.num_cpus={cores}"])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    over = ray - inline
    print(f"\n{'path':<34}{'wall s':>10}{'s per run':>12}")
    print(f"{'inline (one process, SQLite)':<34}{inline:>10.1f}{inline / n:>12.2f}")
    print(f"{'Ray + MLflow server on PostgreSQL':<34}{ray:>10.1f}{ray / n:>12.2f}")
    print(f"tracking server start-up (once per cluster, not in the sweep): {server_s:.1f} s")
    print(f"overhead: {over:+.1f} s in all, {over / n:+.2f} s per run, {over / inline:+.1%} of the sweep (goal <= 5%)")
    print(f"overhead_fraction={over / inline:.4f}")


if __name__ == "__main__":
    main()
