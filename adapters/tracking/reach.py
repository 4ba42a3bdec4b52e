"""Whether the tracking store is reachable from, and shareable by, every host of a sweep.

:func:`is_loopback` is the one rule for a URL that reaches this host only (also used for the Prefect
API: :func:`adapters.cluster.loopback_problem`); :func:`require_shared_store` refuses a store several hosts
cannot share (docs/deploy.md, Tracking server).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from .store import tracking_uri

__all__ = ["SHARED_STORE_HINT", "is_loopback", "require_shared_store", "this_host_ips"]

#: what a user does when a sweep on several hosts has no shared store (the tracking server's command)
SHARED_STORE_HINT = ("start `fp8rl tracking-server --host 0.0.0.0` on one host and export "
                     "MLFLOW_TRACKING_URI=http://<host>:<port> on every host (docs/deploy.md, Tracking server)")
#: host names that always name this host (RFC 6761 reserves ``localhost`` and every name under it)
LOOPBACK_HOSTS = ("localhost", "ip6-localhost", "ip6-loopback")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a URL's host name or an address) reaches this host only: no host at all, a loopback
    name (:data:`LOOPBACK_HOSTS` or ``*.localhost``, any case, a trailing dot allowed), or a loopback
    address (``127.0.0.0/8``, ``::1``, ``::ffff:127.x.y.z``; brackets and an IPv6 zone ignored)."""
    name = host.strip().strip("[]").split("%", 1)[0].rstrip(".").lower()
    if not name or name in LOOPBACK_HOSTS or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def this_host_ips() -> set[str]:
    """The addresses of this host's interfaces (``psutil``), loopback included."""
    import psutil

    return {a.address.split("%", 1)[0] for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def require_shared_store(nodes: int, uri: str | None = None, node_ips: Iterable[str] | None = None,
                         local_ips: Iterable[str] | None = None) -> None:
    """Raise ``ValueError`` when runs on ``nodes`` machines (Ray nodes) cannot share the tracking store
    ``uri`` (default :func:`tracking_uri`). One node: any store. Several: the store must be an MLflow
    tracking server (``http(s)://``, or Databricks) — a SQLite file (``sqlite://``), a folder (``file:``
    or a bare path) would be corrupted by concurrent hosts or scattered over their disks, and a database
    URI shares runs but leaves each host's artifacts on its own disk. A loopback server
    (``http://127.0.0.1:…``, ``localhost``) is reachable only from this host: it is accepted only when
    ``node_ips`` (the nodes' addresses, e.g. ``ray.nodes()[i]["NodeManagerAddress"]``) are all addresses
    of this host (``local_ips``, default :func:`this_host_ips`)."""
    from urllib.parse import urlsplit

    uri = tracking_uri() if uri is None else uri
    if nodes <= 1:
        return
    if uri.startswith("databricks"):  # "databricks" or "databricks://<profile>": a hosted server
        return
    scheme = urlsplit(uri).scheme.lower() if "://" in uri or uri.startswith("file:") else ""
    where = f"a sweep on {nodes} nodes with MLFLOW_TRACKING_URI={uri}"
    if scheme in ("", "file", "sqlite"):
        kind = "a SQLite file" if scheme == "sqlite" else "a local folder"
        raise ValueError(f"{where}: {kind} as the tracking store would corrupt or scatter the store "
                         f"(each node writes its own copy, or all of them one file); {SHARED_STORE_HINT}")
    if scheme not in ("http", "https"):
        raise ValueError(f"{where}: a database URI shares the runs but each node would keep its artifacts "
                         f"(tables, logs) on its own disk; {SHARED_STORE_HINT}")
    host = urlsplit(uri).hostname or ""
    if is_loopback(host):
        ips = None if node_ips is None else set(node_ips)
        mine = set(this_host_ips() if local_ips is None else local_ips)
        if not ips:
            raise ValueError(f"{where}: {host} reaches this host only, and the nodes' addresses were not given "
                             f"to check that they all run here; {SHARED_STORE_HINT}")
        if others := sorted(ip for ip in ips if ip not in mine and not is_loopback(ip)):
            raise ValueError(f"{where}: {host} reaches this host only, and nodes run elsewhere "
                             f"({', '.join(others)}); {SHARED_STORE_HINT}")

