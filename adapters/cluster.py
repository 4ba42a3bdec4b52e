"""The Ray cluster a sweep runs on, seen from the sweep: its nodes, whether one run fits on one of them,
whether the servers the runs report to are reachable from every node (together: :func:`preflight`),
and where a run ran.

Ray is imported inside the functions that talk to a running Ray (the CLI's quick commands never load
it). The checks are pure functions over :class:`Node` records, tested without a cluster; :func:`nodes`
reads them from the Ray this process is connected to.

Why these checks exist: a sweep that asks for a resource no node has would wait forever in Ray's queue
(Ray keeps an infeasible task pending and only warns), so the sweep stops *before* anything runs and
says what it asked for and what the cluster has. A run placed on another host writes to the tracking
store and reports to the Prefect API by URL: a loopback URL (``127.0.0.1``, ``localhost``) or a file on
the driver's disk means nothing there.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from .tracking import is_loopback, require_shared_store, this_host_ips

__all__ = ["ClusterError", "Node", "capacity", "fit_problem", "loopback_problem", "nodes", "preflight", "this_machine",
           "verl_fit_problem", "where"]

GIB = 2**30


@dataclass(frozen=True)
class Node:
    """One alive Ray node: its id, IP and total logical resources (CPU, GPU, memory in GiB)."""

    node_id: str
    ip: str
    cpus: float
    gpus: float
    memory_gb: float

    def describe(self) -> str:
        return f"{self.ip} ({self.node_id[:8]}): num_cpus={self.cpus:g}, num_gpus={self.gpus:g}, memory_gb={self.memory_gb:.1f}"


def this_machine() -> Node:
    """This host as one node, for runs that start a Ray of their own here: its cores and memory, no GPUs counted."""
    import psutil

    return Node("this-machine", "127.0.0.1", float(os.cpu_count() or 1), 0.0, psutil.virtual_memory().total / GIB)


def nodes() -> list[Node]:
    """The alive nodes of the Ray cluster this process is connected to (``ray.init`` first)."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        out.append(Node(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", "?"), cpus=float(res.get("CPU", 0)),
                        gpus=float(res.get("GPU", 0)), memory_gb=float(res.get("memory", 0)) / GIB))
    return out


def _asked(request: Mapping[str, float]) -> tuple[float, float, float]:
    """CPUs, GPUs and GiB of memory one run asks (Ray's option names; memory in bytes there)."""
    return (float(request.get("num_cpus", 1)), float(request.get("num_gpus", 0)),
            float(request.get("memory", 0)) / GIB)


def fit_problem(request: Mapping[str, float], cluster: Sequence[Node], where: str) -> str | None:
    """None when some node can host one run asking ``request`` (``num_cpus``, ``num_gpus``, ``memory`` in
    bytes — :meth:`fp8rl_core.config.sweep.ResourcesSection.ray_options`), else the message: what the run asks
    for and what every node of ``where`` (e.g. "the Ray cluster at host:6379") has. A run must fit on *one* node (its engine and learner share a process)."""
    cpus, gpus, mem = _asked(request)
    for n in cluster:
        if n.cpus >= cpus and n.gpus >= gpus and n.memory_gb >= mem:
            return None
    asked = f"num_cpus={cpus:g}, num_gpus={gpus:g}" + (f", memory_gb={mem:g}" if mem else "")
    have = "; ".join(n.describe() for n in cluster) or "no alive node"
    hint = " (resources.num_gpus > 0 needs GPU nodes: join a GPU cluster with --ray-address)" if gpus and not any(
        n.gpus for n in cluster) else ""
    return (f"each run asks for {asked} (the sweep's `resources`), but no node of {where} has that "
            f"much: {have}{hint}. Nothing was run.")


def capacity(request: Mapping[str, float], cluster: Sequence[Node]) -> int:
    """How many runs asking ``request`` (as :func:`fit_problem`) the cluster runs at once: per node, the
    fewest of its CPUs, GPUs and memory divided by what one run asks (a resource not asked for does not
    limit), summed over the nodes. The sweep keeps this many runs in flight and hands each worker that
    finishes the run it should take next (:func:`fp8rl_core.schedule.next_run`)."""
    cpus, gpus, mem = _asked(request)  # num_cpus > 0 (the config's rule): every node has a CPU limit

    def fits(n: Node) -> int:
        return min(math.floor(have / ask + 1e-9) for have, ask in ((n.cpus, cpus), (n.gpus, gpus), (n.memory_gb, mem))
                   if ask > 0)

    return sum(fits(n) for n in cluster)


def verl_fit_problem(nnodes: int, gpus_per_node: int, cluster: Sequence[Node], where: str) -> str | None:
    """None when ``nnodes`` nodes of the cluster have ``gpus_per_node`` GPUs each (what verl's trainer asks
    of Ray: its resource pool is ``trainer.nnodes × trainer.n_gpus_per_node`` GPUs, and without them Ray
    keeps its workers pending forever), else the message: what the run needs, what ``where`` has."""
    enough = [n for n in cluster if n.gpus >= gpus_per_node]
    if len(enough) >= nnodes:
        return None
    total = sum(n.gpus for n in cluster)
    have = "; ".join(n.describe() for n in cluster) or "no alive node"
    plural = "s" if nnodes > 1 else ""
    return (f"backend verl needs {gpus_per_node} GPUs per node on {nnodes} node{plural} (verl.gpus_per_node, "
            f"verl.nnodes); {where} has {total:g} GPUs, {len(enough)} node(s) with {gpus_per_node}: {have}. "
            "Run on the GPU cluster (--ray-address, or from its head node). Nothing was run.")


def loopback_problem(what: str, url: str, cluster: Sequence[Node], local_ips: Iterable[str]) -> str | None:
    """None when ``url`` (a server the runs report to, e.g. the Prefect API) is reachable from every node
    as far as the URL says; a message when it is a loopback address and some node is on another host
    (an IP not among ``local_ips``, this machine's addresses: :func:`adapters.tracking.this_host_ips`); the
    loopback rule is :func:`adapters.tracking.is_loopback`. The tracking store has its own, stricter check
    (:func:`adapters.tracking.require_shared_store`)."""
    host = urlparse(url).hostname or ""
    if not is_loopback(host):
        return None
    mine = set(local_ips)
    away = sorted({n.ip for n in cluster if n.ip not in mine and not is_loopback(n.ip)})
    if not away:
        return None
    return (f"{what} is {url}, a loopback address, but the Ray cluster has nodes on other hosts ({', '.join(away)}): "
            "runs there could not reach it. Run the server on an address every node reaches and point to it "
            "(README, Scale out).")


class ClusterError(RuntimeError):
    """The sweep cannot run on this cluster as configured (nothing was run). The command line prints its
    message alone (adapters.logs keeps the flow engine's report of it off the terminal)."""


def preflight(cluster: Sequence[Node], fit: Iterable[str | None], *, prefect_api: str | None = None,
              store: str | None = None, local_ips: Iterable[str] | None = None) -> None:
    """The check of a sweep before anything runs: raise :class:`ClusterError` naming every problem, each
    once, in this order — ``fit``'s (whether its runs fit a node: :func:`fit_problem`,
    :func:`verl_fit_problem`; None where they do), the Prefect API ``prefect_api`` (when the runs report
    to it from the nodes) behind a loopback address, and a tracking store ``store`` (default
    :func:`adapters.tracking.tracking_uri`) that the nodes cannot share. ``local_ips``: this host's
    addresses (default :func:`adapters.tracking.this_host_ips`)."""
    mine = set(this_host_ips() if local_ips is None else local_ips)
    problems = list(fit)
    if prefect_api is not None:
        problems.append(loopback_problem("the Prefect API (PREFECT_API_URL)", prefect_api, cluster, mine))
    try:
        require_shared_store(len(cluster), store, node_ips=[n.ip for n in cluster], local_ips=mine)
    except ValueError as e:
        problems.append(str(e))
    problems = list(dict.fromkeys(p for p in problems if p))
    if problems:
        raise ClusterError("\n".join(problems))


def where() -> dict[str, str]:
    """Where this process runs, as MLflow tags: host name and pid, and — inside a Ray worker — the Ray node
    id and IP (``ray.node_id``, ``ray.node_ip``) and the worker id."""
    out = {"fp8rl.host": socket.gethostname(), "fp8rl.pid": str(os.getpid())}
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            out |= {"ray.node_id": ctx.get_node_id(), "ray.node_ip": ray.util.get_node_ip_address(),
                    "ray.worker_id": ctx.get_worker_id()}
    except ImportError:
        pass
    return out
