"""The ``upstream-drift`` flow: fp8rl's upstream internals checked against a version set — PyPI's newest
releases by default, nightly as the deployment ``upstream-drift/default`` — and recorded in MLflow
(experiment ``upstream-drift``), one run per check.

A name that no longer holds is a finding, not a failure of the check: the run ends FINISHED with tag
``verdict = drift`` and the breakages recorded (the Prefect flow run COMPLETED). The run ends FAILED only
when the check could not read what it was asked to (PyPI out of reach, an unknown version set or folder),
with the one-line reason as its ``error`` tag. Specified in docs/gpu.md (The nightly drift check).
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.runtime import flow_run as runtime_flow_run

from adapters import cluster, tracking, upstream
from tasks.upstream import UpstreamRecord, check_upstream, record_upstream

__all__ = ["EXPERIMENT", "upstream_drift"]

EXPERIMENT = "upstream-drift"


@flow(name="upstream-drift", log_prints=True)
def upstream_drift(mode: str = "latest", trees: dict[str, str] | None = None, index: str = upstream.INDEX,
                   experiment: str = EXPERIMENT) -> UpstreamRecord:
    """Check every internal of fp8rl_core/upstream.py in the sources of ``mode``'s versions — ``latest``
    (PyPI's newest release of verl, vLLM, Transformer Engine, SGLang), ``gpu`` (constraints-gpu.txt's) or
    ``installed`` (the CPU set here) — with the packages in ``trees`` (package → folder, e.g. a checkout of
    upstream's main branch) read from there, and record it as one MLflow run in ``experiment``."""
    flow_run = str(runtime_flow_run.id or "none")
    mlflow_run = tracking.open_check_run(experiment, f"upstream·{mode}", "upstream-drift",
                                         {"mode": mode, "index": index} | {f"tree.{p}": f for p, f in (trees or {}).items()},
                                         flow_run, f"fp8rl's upstream internals against the {mode} versions")
    tracking.start(mlflow_run, cluster.where() | {"prefect.flow_run_id": flow_run})
    with tracking.ending(mlflow_run):
        out = record_upstream(mlflow_run, check_upstream(mode, trees, index))
    logger = get_run_logger()
    logger.info("upstream %s: %s; %d names checked, %d do not hold (MLflow run %s)", mode,
                ", ".join(f"{p} {v}" for p, v in out.versions.items()), out.checked, len(out.breakages), mlflow_run)
    for b in out.breakages:
        logger.warning("%s %s: %s", b.package, b.version, b)
    return out
