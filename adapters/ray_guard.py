"""One verl run per Ray cluster: the guard a run passes before verl's trainer starts on a cluster it did not start.

Rule: verl 0.9.1's default trainer starts TransferQueue's controller as a named actor in a fixed namespace
(:data:`CONTROLLER`, :data:`NAMESPACE`; transferqueue 0.1.11 ``transfer_queue/interface.py``), and a second
trainer on the same cluster attaches to it instead of starting its own — the two runs then share one
controller and one storage (docs/deploy.md, "verl runs side by side"). So a run pointed at a cluster
(``--ray-address``, ``RAY_ADDRESS``, a deployment's ``ray_address``) first looks the name up through Ray's
public API (``ray.util.list_named_actors(all_namespaces=True)``) and refuses when it is there; a run
without an address starts a Ray of its own and needs no look-up. Nothing of TransferQueue is imported:
the two strings are the names its controller is created under, checked against the installed sources
by tests/adapters/test_ray_guard.py.
"""

from __future__ import annotations

import logging

__all__ = ["CONTROLLER", "NAMESPACE", "SharedControllerError", "controller_on", "refuse_shared_controller"]

#: the name and namespace TransferQueue 0.1.11 creates its controller actor under (``tq.init``)
CONTROLLER = "TransferQueueController"
NAMESPACE = "transfer_queue"


class SharedControllerError(RuntimeError):
    """The Ray cluster a verl run would use already holds a TransferQueue controller (another run's)."""


def controller_on(address: str) -> bool:
    """Whether the Ray cluster at ``address`` holds an actor named :data:`CONTROLLER` in :data:`NAMESPACE`
    (connects as a driver for the look-up, then disconnects)."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        return any(a.get("name") == CONTROLLER and a.get("namespace") == NAMESPACE
                   for a in ray.util.list_named_actors(all_namespaces=True))
    finally:
        ray.shutdown()


def refuse_shared_controller(address: str) -> None:
    """Raise :class:`SharedControllerError` in one line when the cluster at ``address`` already holds a
    TransferQueue controller: the run did not create it (it has not started), so another verl run is on it."""
    if controller_on(address):
        raise SharedControllerError(
            f"the Ray cluster at {address} already holds a {CONTROLLER} (namespace {NAMESPACE}) of another verl run: "
            "verl's trainer would attach to it and share its data with that run, so this run does not start; "
            "give each verl run a Ray of its own (no --ray-address / ray_address, or a cluster per run)")
