"""The engine's other state: every tensor a rank's model computes with that no sync writes, fingerprinted at
engine start and compared at every sync, on the rank that holds it.

Rule: the state is each module's buffers (persistent or not: rotary cos/sin caches, attention scales) and the
tensors it holds as plain attributes, less the model's parameters (the synced weights, W1–W5) and the tensors
:data:`CHANGES_AT_SYNC` declares; a sync must leave every one of them as it was when the engine started
(:func:`record` at the start, :func:`compare` after each sync). Compared by 64-bit fingerprint
(:func:`fp8rl_core.sync.fingerprint.fingerprints`), shape and dtype; a difference is named with the tensor and
its first differing element against the copy kept at the start. Only the verdict leaves the rank.
docs/correctness.md (The engine's other state).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterator

import torch

from fp8rl_core.sync.fingerprint import fingerprints

__all__ = ["CHANGES_AT_SYNC", "changes_at_sync", "compare", "engine_tensors", "record"]

#: the tensors of a model that legitimately change at a sync (attribute name patterns, ``fnmatch``), each with
#: why: the one place such a tensor is declared; every other non-parameter tensor must stay as it started
CHANGES_AT_SYNC: dict[str, str] = {
    "fp8rl_w": "compute copy of a layer on a grid, rebuilt from the held bytes at every sync (W6: the compute copy)",
    "fp8rl_w_*": "compute copies of MoE experts on a grid, rebuilt from the held bytes at every sync (W6: the compute copy)",
    "fp8rl_data*": "the bytes a layer that quantizes itself (requant, block128) computes at every sync (W2)",
    "fp8rl_scale*": "the scales a layer that quantizes itself (requant, block128) computes at every sync (W2)",
    "kv_cache": "the KV cache: written by every forward; what a sync must do to it is W6's prefix-cache reset",
}


def changes_at_sync(attribute: str) -> str | None:
    """Why the tensor a module holds under ``attribute`` may change at a sync (:data:`CHANGES_AT_SYNC`), or
    None: it must not."""
    return next((why for pattern, why in CHANGES_AT_SYNC.items() if fnmatch.fnmatchcase(attribute, pattern)), None)


def engine_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(``module.attribute``, tensor) of every tensor ``model`` computes with that is not a parameter nor
    declared in :data:`CHANGES_AT_SYNC`: each module's buffers and plain tensor attributes, each tensor once
    (a buffer the layers share is named by its first module)."""
    seen = {id(p) for p in model.parameters()}
    for prefix, module in model.named_modules():
        held = [(n, b) for n, b in module.named_buffers(recurse=False)]
        held += [(k, v) for k, v in vars(module).items()
                 if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]
        for attr, t in held:
            if t is None or id(t) in seen or changes_at_sync(attr) is not None:
                continue
            seen.add(id(t))
            yield (f"{prefix}.{attr}" if prefix else attr), t


def _describe(t: torch.Tensor) -> list:
    return [list(t.shape), str(t.dtype).removeprefix("torch.")]


def record(model: torch.nn.Module) -> dict:
    """The engine-start record of ``model``'s other state: per tensor its fingerprint, shape and dtype and a copy on
    the device it lives on (to name the first differing element later)."""
    named = list(engine_tensors(model))
    return {"hashes": fingerprints(named), "shapes": {n: _describe(t) for n, t in named},
            "copies": {n: t.detach().clone() for n, t in named}}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers of its element size (-0.0 differs from 0.0, a NaN equals itself)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    t = t.detach().contiguous()
    return t.view(ints[t.element_size()]) if t.dim() else t.reshape(1).view(ints[t.element_size()])


def _first_difference(name: str, before: torch.Tensor, now: torch.Tensor) -> str:
    diff = (_bits(before) != _bits(now)).reshape(before.shape if before.dim() else (1,)).nonzero()
    if diff.numel() == 0:  # equal bits, another fingerprint: cannot happen for a deterministic one
        return f"{name}: fingerprint differs from the engine start's"
    idx = [int(i) for i in diff[0]]
    at = tuple(idx) if before.dim() else ()
    return (f"{name}: changed since the engine started, first at {idx if before.dim() else '[]'} "
            f"({before[at].item():.9g} → {now[at].item():.9g}; {int(diff.shape[0])} of {before.numel()} elements differ)")


def compare(model: torch.nn.Module, start: dict, rank: int, tp: int) -> dict:
    """``model``'s other state now against its engine-start ``start`` (:func:`record`): a tensor whose fingerprint,
    shape or dtype changed (named with its first differing element), one gone, one not there at the start.
    Returns the rank's verdict: ``rank``, ``tp``, ``checked`` (tensors), ``offenders`` (each ``tp rank r/tp:
    name: …``), ``changing`` (the declared patterns and why), ``seconds``."""
    t0 = time.perf_counter()
    named = dict(engine_tensors(model))
    hashes = fingerprints(named)
    out = []
    for n in sorted(set(start["hashes"]) | set(named)):
        if n not in named:
            out.append(f"{n}: held at the engine start, gone now")
        elif n not in start["hashes"]:
            out.append(f"{n}: not held at the engine start, now {_describe(named[n])}")
        elif _describe(named[n]) != start["shapes"][n]:
            out.append(f"{n}: shape/dtype {start['shapes'][n]} at the engine start, now {_describe(named[n])}")
        elif hashes[n] != start["hashes"][n]:
            out.append(_first_difference(n, start["copies"][n], named[n]))
    return {"rank": int(rank), "tp": int(tp), "checked": len(named), "offenders": [f"tp rank {rank}/{tp}: {o}" for o in out],
            "changing": dict(CHANGES_AT_SYNC), "seconds": time.perf_counter() - t0}
