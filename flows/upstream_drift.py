"""The ``upstream-drift`` flow: fp8rl's upstream internals checked against a version set — PyPI's newest
releases by default, nightly as the deployment ``upstream-drift/default`` — and recorded in MLflow
(experiment ``upstream-drift``), one run per check.

A name that no longer holds on a path its release runs is a finding, not a failure of the check: the run ends
FINISHED with tag ``verdict = drift`` and the breakages recorded (the Prefect flow run COMPLETED). A name gone
only on paths the release does not run (not released for that version, removed upstream) is recorded with its
paths and leaves the verdict ``holds``. The run ends FAILED only
when the check could not read what it was asked to (PyPI out of reach, an unknown version set or folder),
with the one-line reason as its ``error`` tag. With ``gpu_set``, a second run (``gpu-set``) records ``make
check-gpu-set``: the GPU set's wheels installed on this host and every module a GPU run starts imported where it
can (docs/gpu.md, The GPU set installed on CPU), ending the same ways. Specified in docs/gpu.md (The nightly drift
check).
"""

from __future__ import annotations

from dataclasses import replace

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as runtime_flow_run

from adapters import cluster, notify, tracking, upstream
from tasks.upstream import UpstreamRecord, check_gpu_set, check_upstream, record_gpu_set, record_upstream

__all__ = ["EXPERIMENT", "upstream_drift"]

EXPERIMENT = "upstream-drift"


@flow(name="upstream-drift", log_prints=True)
def upstream_drift(mode: str = "latest", trees: dict[str, str] | None = None, index: str = upstream.INDEX,
                   experiment: str = EXPERIMENT, gpu_set: bool = False,
                   gpu_set_result: str | None = None) -> UpstreamRecord:
    """Check every internal of fp8rl_core/upstream.py in the sources of ``mode``'s versions — ``latest``
    (PyPI's newest release of verl, vLLM, Transformer Engine, SGLang), ``gpu`` (constraints-gpu.txt's) or
    ``installed`` (the CPU set here) — with the packages in ``trees`` (package → folder, e.g. a checkout of
    upstream's main branch) read from there, and record it as one MLflow run in ``experiment``; with
    ``gpu_set``, then ``make check-gpu-set`` (or the result file ``gpu_set_result`` it wrote) as a second run."""
    flow_run = str(runtime_flow_run.id or "none")
    # the night's MLflow link on its flow run: a failed night's message names it (adapters/notify.py)
    notify.mark_night(tracking.experiment_url(tracking.experiment_id(tracking.client(), experiment)))
    mlflow_run = tracking.open_check_run(experiment, f"upstream·{mode}", "upstream-drift",
                                         {"mode": mode, "index": index} | {f"tree.{p}": f for p, f in (trees or {}).items()},
                                         flow_run, f"fp8rl's upstream internals against the {mode} versions")
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run})
    with tracking.ending(mlflow_run):
        out = record_upstream(mlflow_run, check_upstream(mode, trees, index))
    logger = get_run_logger()
    logger.info("upstream %s: %s; %d names checked, %d do not hold, %d on a path the release runs (MLflow run %s)",
                mode, ", ".join(f"{p} {v}" for p, v in out.versions.items()), out.checked, len(out.breakages),
                len(out.failing), mlflow_run)
    for p in out.paths:
        (logger.warning if p.fails else logger.info)("%s path %s", p.path.package, p)
    for b in out.breakages:
        (logger.warning if b in out.failing else logger.info)("%s %s: %s [paths: %s]", b.package, b.version, b,
                                                               ", ".join(b.paths) or "none")
    if gpu_set or gpu_set_result:
        out = replace(out, gpu_set=_gpu_set(experiment, flow_run, gpu_set_result))
    return out


def _gpu_set(experiment: str, flow_run: str, result: str | None):
    mlflow_run = tracking.open_check_run(experiment, "gpu-set", "upstream-drift",
                                         {"mode": "gpu-set", "result": result or "make check-gpu-set"}, flow_run,
                                         "the GPU set's wheels installed on this host, every module a GPU run starts imported")
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run})
    with tracking.ending(mlflow_run):
        out = record_gpu_set(mlflow_run, check_gpu_set(result))
    logger = get_run_logger()
    c = out.check
    logger.info("GPU set: %d pins installed in %.0f s, %.1f GB; %d of %d modules import (MLflow run %s)", c.pins,
                c.install_s, c.disk_bytes / 1e9, c.count("ok"), len(c.imports), mlflow_run)
    for line in c.drift:
        logger.warning("GPU set: %s", line)
    return out
