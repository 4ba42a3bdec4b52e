"""Driver programs run on a Ray cluster as Ray Jobs (a verl sweep's runs: ``python -m verl.trainer.main_ppo``
each): the cluster's job server (a local Ray started with its dashboard, or a cluster's own), one job per
program — its entrypoint on a node with a free CPU (``entrypoint_num_cpus``), its environment the job's
runtime env — watched to its end: its output re-read into a file every :data:`LOG_EVERY_S` seconds, the nodes
its driver and actors ran on, its exit status, or why it has none (stopped, its node lost).

Ray is imported inside the functions. The job server is the dashboard's (``ray[default]``; a cluster started
with ``--include-dashboard=false`` has none and is refused). Specified in docs/deploy.md (verl sweeps on Ray).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from adapters import cluster

__all__ = ["JobEnd", "JobsStopped", "LOG_EVERY_S", "RayJobs", "job_server"]

#: seconds between two reads of a running job's output into its log file (and the caller's ``on_log``)
LOG_EVERY_S = 30.0
#: how long a submission waits for a fresh Ray's dashboard agent ("No available agent to submit job")
_AGENT_WAIT_S = 180.0
#: how often a job's status is polled; how long a stopped job is given to end
_POLL_S = 1.0
_STOP_WAIT_S = 60.0


@dataclass(frozen=True)
class JobEnd:
    """How a job ended: Ray's ``status`` (SUCCEEDED, FAILED, STOPPED) and ``message``; the entrypoint's exit
    status (None when it has none: the job was stopped before it ran, or its node was lost); ``cause``: None when
    the entrypoint exited by itself, else ``"stopped"`` or ``"node lost"``; the IPs of the nodes its driver and
    actors ran on; its whole output."""

    submission_id: str
    status: str
    returncode: int | None
    message: str
    cause: str | None
    nodes: tuple[str, ...]
    output: str


class JobsStopped(RuntimeError):
    """The jobs were stopped by their sweep (interrupted): raised in each thread watching one."""


class RayJobs:
    """The job server of the Ray cluster this process is connected to (yielded by :func:`job_server`): how
    messages name the cluster (``where``), its alive nodes (:attr:`nodes`, read afresh), and :meth:`run`."""

    def __init__(self, client, where: str) -> None:
        self._client = client
        self.where = where
        self._stopping = threading.Event()

    @property
    def nodes(self) -> list[cluster.Node]:
        return cluster.nodes()

    def stop_all(self) -> None:
        """Every job :meth:`run` is watching is stopped, and its :meth:`run` raises :class:`JobsStopped`."""
        self._stopping.set()

    def run(self, name: str, entrypoint: str, env: Mapping[str, str], log: Path,
            on_log: Callable[[tuple[str, ...]], None] = lambda nodes: None, every: float = LOG_EVERY_S,
            num_cpus: float = 1) -> JobEnd:
        """Run the shell command ``entrypoint`` as a job (submission id ``<name>-<random>``; ``env``: its runtime
        env's variables; ``num_cpus``: what its entrypoint holds), wait for its end and return it. While it
        runs, its output is written to ``log`` every ``every`` seconds and ``on_log(nodes)`` called (the nodes
        seen so far); at its end once more. :meth:`stop_all` or an exception in this thread stops the job."""
        from ray.job_submission import JobStatus

        sid = f"{name}-{uuid.uuid4().hex[:8]}"
        self._submit(sid, entrypoint, dict(env), num_cpus)
        nodes: dict[str, str] = {}
        output = ""
        last = 0.0
        try:
            while True:
                if self._stopping.is_set():
                    raise JobsStopped(f"job {sid} stopped: its sweep was interrupted")
                info = self._client.get_job_info(sid)
                done = JobStatus(info.status).is_terminal()
                if done or time.monotonic() - last >= every:
                    nodes |= self._nodes_of(info)
                    output = self._logs(sid, output)
                    log.write_text(output)
                    on_log(tuple(sorted(set(nodes.values()))))
                    last = time.monotonic()
                if done:
                    break
                time.sleep(_POLL_S)
        except BaseException:
            self._stop(sid)
            log.write_text(self._logs(sid, output))
            raise
        status = JobStatus(info.status).value
        cause = None
        if status == "STOPPED":
            cause = "stopped"
        elif status == "FAILED" and info.driver_exit_code is None:
            cause = "node lost" if info.driver_node_id and not _alive(info.driver_node_id) else None
        return JobEnd(sid, status, info.driver_exit_code, info.message or "", cause, tuple(sorted(set(nodes.values()))),
                      output)

    def _submit(self, sid: str, entrypoint: str, env: dict[str, str], num_cpus: float) -> None:
        deadline = time.monotonic() + _AGENT_WAIT_S
        while True:
            try:
                self._client.submit_job(entrypoint=entrypoint, submission_id=sid, runtime_env={"env_vars": env},
                                        entrypoint_num_cpus=num_cpus, metadata={"fp8rl": sid})
                return
            except RuntimeError as e:  # a fresh Ray's dashboard agent takes a while to register
                if "No available agent" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def _logs(self, sid: str, last: str) -> str:
        """The job's output so far; ``last`` when it cannot be read (its node is gone)."""
        try:
            return self._client.get_job_logs(sid)
        except Exception:  # noqa: BLE001 — what was read before stays
            return last

    def _stop(self, sid: str) -> None:
        from ray.job_submission import JobStatus

        try:
            self._client.stop_job(sid)
            deadline = time.monotonic() + _STOP_WAIT_S
            while not JobStatus(self._client.get_job_status(sid)).is_terminal() and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        except Exception as e:  # noqa: BLE001 — the cluster may be gone with the interrupt
            logging.getLogger(__name__).warning("could not stop Ray job %s: %s", sid, e)

    @staticmethod
    def _nodes_of(info) -> dict[str, str]:
        """node id → IP of the job's driver and of every actor of its Ray job (Ray's state API)."""
        ids = {info.driver_node_id} if info.driver_node_id else set()
        if info.job_id:
            try:
                from ray.util.state import list_actors

                ids |= {a.node_id for a in list_actors(filters=[("job_id", "=", info.job_id)], limit=10_000,
                                                       raise_on_missing_output=False) if a.node_id}
            except Exception:  # noqa: BLE001 — the driver's node is still known
                pass
        return {i: ip for i, ip in _node_ips().items() if i in ids}


def _node_ips() -> dict[str, str]:
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}


def _alive(node_id: str) -> bool:
    import ray

    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


@contextmanager
def _local_head(resources: Mapping[str, float] | None) -> Iterator[str]:
    """A local Ray head, ``ray start --head --block`` in a process of its own, its dashboard (the job server),
    dashboard agent, GCS and Ray Client server on free ports — so it runs beside other local Rays (``ray.init``
    gives a local Ray's dashboard agent the fixed port 52365: a second one on the machine has no job server) —
    with ``resources`` (``num_cpus``, ``num_gpus``; none: what the machine has); yields its address; stopped,
    with every process it started, after the block."""
    from adapters.tracking_server import free_port

    sessions = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths stay < 108 bytes
    port = free_port()
    sized = [f"--{k.replace('_', '-')}={int(v)}" for k, v in (resources or {}).items()]
    argv = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--ray-client-server-port={free_port()}", f"--object-store-memory={256 * 2**20}", f"--temp-dir={sessions}",
            *sized, "--block", "--disable-usage-stats"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = sessions / "head.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + _AGENT_WAIT_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise cluster.ClusterError(f"a local Ray did not start (`{' '.join(argv)}`): "
                                           f"{log.read_text(errors='replace')[-1500:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
            try:
                proc.wait(timeout=_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it
        except ProcessLookupError:
            pass
        shutil.rmtree(sessions, ignore_errors=True)


@contextmanager
def job_server(address: str | None, local: Mapping[str, float] | None = None) -> Iterator[RayJobs]:
    """Connected to Ray for the length of the block — ``address`` as :func:`adapters.dispatch.target`: a
    cluster, else a local Ray on this machine (:func:`_local_head`, with ``local``'s resources: ``num_cpus``,
    ``num_gpus``; none: what the machine has) — yielding its job server. A cluster without a dashboard is a
    :class:`adapters.cluster.ClusterError`."""
    import ray
    from ray.job_submission import JobSubmissionClient

    from adapters.dispatch import target

    is_local, where = target(address)
    with ExitStack() as stack:
        if is_local:
            address = stack.enter_context(_local_head(local))
        ctx = ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        stack.callback(ray.shutdown)
        url = getattr(ctx, "dashboard_url", None)
        if not url:
            raise cluster.ClusterError(f"{where} runs no dashboard, where Ray's job server lives: start its head "
                                       "with it (ray start --head, the default, with ray[default]). Nothing was run.")
        yield RayJobs(JobSubmissionClient(url if "://" in url else f"http://{url}"), where)
