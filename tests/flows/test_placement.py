"""Where a verl sweep's runs go without a work pool (flows/pipelines.py ``_side_by_side``): on CPU, each on a Ray
of its own, as many at once as this machine's cores and memory fit the sweep's ``resources`` (at least one); with
a cluster address, or GPU runs, one at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import cluster
from fp8rl_core.config.runs import Sweep

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "verl-smoke.yaml")


def machine(cpus: float, memory_gb: float = 64.0) -> cluster.Node:
    return cluster.Node("this-machine", "127.0.0.1", cpus, 0.0, memory_gb)


@pytest.mark.parametrize("cpus, extra, expected", [
    (2, [], 1),  # verl-smoke asks 2 cores a run: this machine runs one at a time
    (16, [], 8),
    (16, ["resources.memory_gb=20"], 3),  # 64 GiB / 20
    (3, [], 1),
    (1, [], 1),  # too small for one: still one at a time
])
def test_cpu_runs_start_together_as_far_as_the_machine_fits_them(monkeypatch, cpus, extra, expected):
    from flows.pipelines import _side_by_side

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "this_machine", lambda: machine(cpus))
    assert _side_by_side(Sweep.load(SMOKE, extra), None) == expected


def test_a_cluster_address_or_gpu_runs_go_one_at_a_time(monkeypatch):
    from flows.pipelines import _side_by_side

    monkeypatch.setattr(cluster, "this_machine", lambda: machine(64))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert _side_by_side(Sweep.load(SMOKE), "10.0.0.1:6379") == 1
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert _side_by_side(Sweep.load(SMOKE), None) == 1
    monkeypatch.delenv("RAY_ADDRESS")
    assert _side_by_side(Sweep.load(SMOKE, ["verl.hardware=hopper", "model_path=Qwen/Qwen3-8B"]), None) == 1


def test_this_machine_is_its_cores_and_memory():
    import os

    import psutil

    m = cluster.this_machine()
    assert m.cpus == os.cpu_count() and m.gpus == 0 and m.memory_gb == pytest.approx(psutil.virtual_memory().total / 2**30)
