"""The order a sweep's runs go to a cluster's workers: warm starts side by side first
(:func:`dispatch_order`), then each worker kept on its engine group (:func:`engine_group`,
:func:`next_run`) so its live engine is reused. Pure: the dispatcher (adapters/dispatch.py) applies it;
docs/deploy.md (Sweeps on Ray, dispatch) says what it saves."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from fp8rl_core.config.runs import Run
from fp8rl_core.learner.spec import spec_hash
from fp8rl_core.sampler.config import engine_key

__all__ = ["dispatch_order", "engine_group", "next_run"]


def _warm_start_of(run: Run) -> list:
    """What a run's warm-start checkpoint is made from: the model spec's contents and the warm-start settings."""
    return [spec_hash(run.spec), run.config.warmstart.model_dump(mode="json")]


def dispatch_order(runs: Sequence[Run]) -> list[int]:
    """The order in which a cluster should start ``runs`` (indices into it): round-robin over the runs'
    warm starts (model spec + warm-start settings), each warm start's runs in their sweep order.

    Why: a sweep lists its runs model by model, so the first free workers would all take the first model's
    runs and train its warm start side by side (each its own copy; the checkpoint is published atomically),
    then all wait on the next model's. Interleaved, the first workers train *different* warm starts at once.
    A preset's seeds stay consecutive within their warm start's runs; which worker takes which run after the
    first ones is :func:`next_run`'s choice (a worker stays on its engine group)."""
    groups: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        groups.setdefault(json.dumps(_warm_start_of(run), sort_keys=True), []).append(i)
    queues = list(groups.values())
    order: list[int] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return order


def engine_group(run: Run) -> str:
    """The runs that can share one live sampler engine: same model spec and warm start (the checkpoint
    the engine loads), same preset (the engine's grid schemes) and same engine settings — what
    :func:`fp8rl_core.sampler.config.engine_key` keys the pool by, read from the run's config (two
    presets that happen to build identical engines count as two groups: a missed reuse, never a wrong one). The
    same identity: :func:`~fp8rl_core.sampler.config.engine_key` of what the engine's model is made from."""
    return engine_key({"warm_start": _warm_start_of(run), "preset": run.config.preset}, run.config.sampler)


def next_run(queued: Sequence[str], finished: str | None, running: Iterable[str]) -> int | None:
    """Which queued run a worker that just finished a run of group ``finished`` should take next
    (``queued``: the waiting runs' :func:`engine_group`, in dispatch order; ``running``: the groups of the
    runs still running elsewhere). Returns an index into ``queued`` (None when it is empty).

    The rule: (1) the next run of the group it just finished — its engine is still live in that worker
    (an in-process engine starts in ~0.5 s but closes in ~1.4 s; a spawned one takes ~25 s), so the run
    skips both; (2) else the first run of a group no other worker is on, so two workers do not start the
    same engine side by side; (3) else the first queued run (the sweep's tail: better a second engine
    than an idle worker)."""
    if not queued:
        return None
    if finished is not None and finished in queued:
        return queued.index(finished)
    busy = set(running)
    return next((i for i, g in enumerate(queued) if g not in busy), 0)
