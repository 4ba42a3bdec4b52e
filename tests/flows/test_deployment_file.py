"""deployments/prefect.yaml as declared, without a Prefect server (tests/flows/test_verl.py deploys the
file for real): the nightly ``upstream-drift`` deployment's name, entrypoint (it loads, and is the flow
``upstream-drift``), parameters (the flow's own) and schedule (a valid cron, 04:00 UTC, after the nightly
correctness runs)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import yaml
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[2]


def test_the_upstream_drift_deployment_is_declared_nightly_on_its_flow():
    declared = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    (d,) = [d for d in declared if d["entrypoint"] == "flows/upstream_drift.py:upstream_drift"]
    assert d["name"] == "default" and "nightly" in d["tags"]
    here = os.getcwd()
    os.chdir(ROOT)  # entrypoints are relative to the project root (where `prefect deploy` runs)
    try:
        flow = load_flow_from_entrypoint(d["entrypoint"])
    finally:
        os.chdir(here)
    assert flow.name == "upstream-drift"  # `prefect deployment run upstream-drift/default`
    assert set(d["parameters"]) <= set(inspect.signature(flow.fn).parameters)
    assert d["parameters"]["mode"] == "latest"
    (schedule,) = d["schedules"]
    assert CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"]).cron == "0 4 * * *"
    assert schedule["timezone"] == "UTC" and schedule["active"]
    assert d["concurrency_limit"]["limit"] == 1
    assert d["work_pool"]["name"] == "{{ $FP8RL_WORK_POOL }}"


def test_the_verl_run_deployment_is_named_after_its_pool_and_the_verl_smoke_sweep_dispatches_to_it():
    """``verl-run/<pool>``: the flow ``verl-run`` (flows/pipelines.py ``verl_run``) on queue ``verl`` of the pool the
    deployment targets, named after it, so ``resources.work_pool`` finds it (adapters.pool.deployment_name); the
    ``verl-smoke`` sweep deployment passes the same pool as its ``work_pool`` parameter."""
    from adapters.pool import VERL_RUN, deployment_name

    declared = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]
    (d,) = [d for d in declared if d["entrypoint"] == "flows/pipelines.py:verl_run"]
    assert d["name"] == d["work_pool"]["name"] == "{{ $FP8RL_WORK_POOL }}" and d["work_pool"]["work_queue_name"] == "verl"
    assert deployment_name("fp8rl-b200") == "verl-run/fp8rl-b200"
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        flow = load_flow_from_entrypoint(d["entrypoint"])
    finally:
        os.chdir(here)
    assert flow.name == VERL_RUN
    assert {"config", "overrides", "run_id", "mlflow_run", "parent", "ray_address"} == set(inspect.signature(flow.fn).parameters)
    (s,) = [d for d in declared if d["name"] == "verl-smoke"]
    assert s["entrypoint"] == "flows/pipelines.py:mxfp8_sweep" and s["parameters"]["work_pool"] == "{{ $FP8RL_WORK_POOL }}"
    assert s["parameters"]["config"] == "configs/verl-smoke.yaml" and s["work_pool"]["work_queue_name"] == "default"
