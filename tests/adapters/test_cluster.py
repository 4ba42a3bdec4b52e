"""The cluster checks a sweep runs before dispatching (pure functions over node records) and the
resources section they read."""

from __future__ import annotations

import os

import pytest

from adapters.cluster import ClusterError, Node, capacity, fit_problem, loopback_problem, preflight, verl_fit_problem, where
from fp8rl_core.config.sweep import ResourcesSection

CPU_NODE = Node("a" * 56, "10.0.0.1", cpus=2, gpus=0, memory_gb=20.0)
GPU_NODE = Node("b" * 56, "10.0.0.2", cpus=32, gpus=8, memory_gb=900.0)


def test_resources_become_ray_options_with_memory_in_bytes():
    assert ResourcesSection().ray_options() == {"num_cpus": 1.0, "num_gpus": 0.0}
    r = ResourcesSection(num_cpus=16, num_gpus=8, memory_gb=512)
    assert r.ray_options() == {"num_cpus": 16.0, "num_gpus": 8.0, "memory": 512 * 2**30}
    assert r.describe() == "num_cpus=16, num_gpus=8, memory_gb=512"


def test_a_run_fits_when_one_node_has_every_resource_it_asks():
    assert fit_problem({"num_cpus": 2, "num_gpus": 0}, [CPU_NODE], "here") is None
    assert fit_problem({"num_cpus": 16, "num_gpus": 8, "memory": 512 * 2**30}, [CPU_NODE, GPU_NODE], "here") is None


def test_gpus_on_a_cpu_cluster_are_refused_saying_what_was_asked_and_what_is_there():
    msg = fit_problem({"num_cpus": 1, "num_gpus": 1}, [CPU_NODE], "the Ray cluster at 10.0.0.1:6379")
    assert msg.startswith("each run asks for num_cpus=1, num_gpus=1 (the sweep's `resources`), but no node of the "
                          "Ray cluster at 10.0.0.1:6379 has that much: 10.0.0.1 (aaaaaaaa): num_cpus=2, num_gpus=0, "
                          "memory_gb=20.0")
    assert "GPU nodes" in msg and msg.endswith("Nothing was run.")


@pytest.mark.parametrize(("ask", "why"), [({"num_cpus": 4}, "num_cpus=4"), ({"memory": 64 * 2**30}, "memory_gb=64")])
def test_resources_are_per_node_not_summed_over_the_cluster(ask, why):
    # two 2-CPU 20-GiB nodes have 4 CPUs and 40 GiB between them, but a run must fit on one node
    two = [CPU_NODE, Node("c" * 56, "10.0.0.3", cpus=2, gpus=0, memory_gb=20.0)]
    msg = fit_problem(ask, two, "c")
    assert msg is not None and why in msg and "GPU nodes" not in msg


def test_no_alive_node_is_a_problem_not_a_crash():
    assert "no alive node" in fit_problem({"num_cpus": 1}, [], "c")


def test_a_loopback_server_is_refused_only_when_nodes_are_on_other_hosts():
    here = {CPU_NODE.ip, "127.0.0.1"}
    same_host = [CPU_NODE, Node("d" * 56, CPU_NODE.ip, 1, 0, 1.0), Node("e" * 56, "127.0.0.1", 1, 0, 1.0)]
    assert loopback_problem("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000", same_host, here) is None
    assert loopback_problem("MLFLOW_TRACKING_URI", "http://10.0.0.1:5000", [CPU_NODE, GPU_NODE], here) is None
    msg = loopback_problem("the Prefect API (PREFECT_API_URL)", "http://localhost:4200/api", [CPU_NODE, GPU_NODE], here)
    assert msg.startswith("the Prefect API (PREFECT_API_URL) is http://localhost:4200/api, a loopback address, but the "
                          "Ray cluster has nodes on other hosts (10.0.0.2)")


def test_a_loopback_prefect_api_in_any_spelling_is_refused():
    here = {CPU_NODE.ip}
    for url in ("http://LOCALHOST:4200/api", "http://[::1]:4200/api", "http:///api", "http://app.localhost:4200/api"):
        assert "a loopback address" in loopback_problem("the Prefect API", url, [CPU_NODE, GPU_NODE], here), url


def test_the_preflight_passes_a_cluster_that_can_run_the_sweep():
    preflight([CPU_NODE], [None], prefect_api="http://127.0.0.1:4200/api", store="sqlite:///x.db", local_ips={CPU_NODE.ip})
    preflight([CPU_NODE, GPU_NODE], [None, None], prefect_api="http://10.0.0.1:4200/api", store="http://10.0.0.1:5000",
              local_ips={CPU_NODE.ip})


def test_the_preflight_names_every_problem_once_in_order():
    nodes = [CPU_NODE, GPU_NODE]
    fit = fit_problem({"num_cpus": 64}, nodes, "c")
    with pytest.raises(ClusterError) as e:
        preflight(nodes, [fit, None, fit], prefect_api="http://localhost:4200/api", store="sqlite:///x.db",
                  local_ips={CPU_NODE.ip})
    lines = str(e.value).splitlines()
    assert len(lines) == 3 and lines[0] == fit
    assert lines[1].startswith("the Prefect API (PREFECT_API_URL) is http://localhost:4200/api, a loopback address")
    assert lines[2].startswith("a sweep on 2 nodes with MLFLOW_TRACKING_URI=sqlite:///x.db: a SQLite file")


def test_the_preflight_of_a_verl_sweep_checks_no_prefect_api():
    gpu = verl_fit_problem(1, 16, [GPU_NODE], "c")
    with pytest.raises(ClusterError) as e:
        preflight([GPU_NODE], [gpu, gpu], store="sqlite:///x.db", local_ips=set())
    assert str(e.value) == gpu  # one node: any store; the same problem of two runs said once


def test_where_names_this_process_outside_ray():
    tags = where()
    assert tags["fp8rl.pid"] == str(os.getpid()) and tags["fp8rl.host"]


def test_verl_needs_its_gpus_per_node_on_enough_nodes():
    from adapters.cluster import verl_fit_problem

    assert verl_fit_problem(1, 8, [CPU_NODE, GPU_NODE], "here") is None
    msg = verl_fit_problem(1, 8, [CPU_NODE], "a local Ray (this machine)")
    assert msg.startswith("backend verl needs 8 GPUs per node on 1 node (verl.gpus_per_node, verl.nnodes); a local "
                          "Ray (this machine) has 0 GPUs, 0 node(s) with 8: 10.0.0.1 (aaaaaaaa): num_cpus=2, num_gpus=0")
    assert msg.endswith("Nothing was run.")
    # GPUs are per node: two 4-GPU nodes do not make one 8-GPU node; two nodes need two 8-GPU nodes
    four = [Node(c * 56, f"10.0.0.{i}", cpus=32, gpus=4, memory_gb=900.0) for i, c in ((5, "d"), (6, "e"))]
    assert "has 8 GPUs, 0 node(s) with 8" in verl_fit_problem(1, 8, four, "c")
    assert "on 2 nodes" in verl_fit_problem(2, 8, [GPU_NODE], "c") and verl_fit_problem(2, 4, four, "c") is None
    assert "no alive node" in verl_fit_problem(1, 8, [], "c")


def test_capacity_counts_the_runs_each_node_fits_at_once():
    two = [Node("a" * 16, "10.0.0.1", cpus=2, gpus=0, memory_gb=24), Node("b" * 16, "10.0.0.2", cpus=16, gpus=8, memory_gb=512)]
    assert capacity({"num_cpus": 1, "num_gpus": 0}, two) == 18
    assert capacity({"num_cpus": 1, "num_gpus": 1}, two) == 8  # the CPU node fits none
    assert capacity({"num_cpus": 4, "num_gpus": 0.5}, two) == 4  # CPUs are the limit there
    assert capacity({"num_cpus": 0.3, "num_gpus": 0}, two[:1]) == 6  # fractions: no float round-down
    assert capacity({"num_cpus": 1, "num_gpus": 0, "memory": 10 * 2**30}, two) == 2 + 16
    assert capacity({"num_cpus": 1, "num_gpus": 0, "memory": 100 * 2**30}, two) == 5
    assert capacity({"num_cpus": 1}, []) == 0
