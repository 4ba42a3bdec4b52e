"""The engine's other state: every tensor a rank's model computes with that no sync writes, and every plain
attribute of its modules, recorded at engine start and compared at every sync, on the rank that holds it.

Rule: the state is each module's buffers (persistent or not: rotary cos/sin caches, attention scales) and the
tensors it holds as plain attributes, less the model's parameters (the synced weights, W1–W5) and the tensors
:data:`CHANGES_AT_SYNC` declares; and each module's plain attributes (:func:`engine_attributes`: numbers,
booleans, strings, enums, None and short tuples or lists of those — a norm's eps, a rope base, an attention
scale, a router's top-k and renormalisation, a soft cap), less those :data:`ATTRIBUTES_CHANGING_AT_SYNC`
declares. A sync must leave every one of them as it was when the engine started (:func:`record` at the start,
:func:`compare` after each sync). Tensors are compared by 64-bit fingerprint
(:func:`fp8rl_core.sync.fingerprint.fingerprints`), shape and dtype, a difference named with the tensor and its
first differing element against the copy kept at the start; attributes by value (``repr``), a difference named
with the module, the attribute and both values. An engine's table of the attributes that have a counterpart in
the learner's config (its package's ``COUNTERPARTS``: module class, attribute → quantity) picks those out too,
with their values, for the check against the learner (:func:`fp8rl_core.checks.engine_state.check_engine_config`).
Only the verdict and those values leave the rank. docs/correctness.md (The engine's other state).
"""

from __future__ import annotations

import enum
import fnmatch
import re
import time
from collections.abc import Iterator, Mapping

import torch

from fp8rl_core.sync.fingerprint import fingerprints

__all__ = ["ATTRIBUTES_CHANGING_AT_SYNC", "CHANGES_AT_SYNC", "SHARED_COUNTERPARTS", "changes_at_sync", "compare", "counterpart_values",
           "engine_attributes", "engine_tensors", "record"]

#: the tensors of a model that legitimately change at a sync (attribute name patterns, ``fnmatch``), each with
#: why: the one place such a tensor is declared; every other non-parameter tensor must stay as it started
CHANGES_AT_SYNC: dict[str, str] = {
    "fp8rl_w": "compute copy of a layer on a grid, rebuilt from the held bytes at every sync (W6: the compute copy)",
    "fp8rl_w_*": "compute copies of MoE experts on a grid, rebuilt from the held bytes at every sync (W6: the compute copy)",
    "fp8rl_data*": "the bytes a layer that quantizes itself (requant, block128) computes at every sync (W2)",
    "fp8rl_scale*": "the scales a layer that quantizes itself (requant, block128) computes at every sync (W2)",
    "kv_cache": "the KV cache: written by every forward; what a sync must do to it is W6's prefix-cache reset",
}


#: the plain module attributes that legitimately change at a sync (attribute name patterns, ``fnmatch``), each with
#: why; every other plain attribute must stay as the engine started with it (measured: on vLLM's Qwen3 and Qwen3-MoE
#: modules the post-load count is the only one a sync changes)
ATTRIBUTES_CHANGING_AT_SYNC: dict[str, str] = {
    "fp8rl_processed": "the layer's post-load processing count, one more at every sync (W6 checks it: exactly one)",
    "fp8rl_emittable": "the vocabulary tail's limit, set for each run on a pooled engine (limit_vocabulary), not by a "
                       "sync; checked against the run's own limit instead (the counterpart 'emittable')",
}

#: the attributes with a counterpart in the learner's config that vLLM and SGLang name alike on their Qwen3 and
#: Qwen3-MoE modules ((module class name, a regular expression; attribute) → the learner's quantity); each engine's
#: table (its package's ``attributes.COUNTERPARTS``) is these and its own
SHARED_COUNTERPARTS: dict[tuple[str, str], str] = {
    ("RMSNorm", "variance_epsilon"): "rms_norm_eps",
    (r".*RotaryEmbedding", "base"): "rope_theta",
    (r".*RotaryEmbedding", "head_size"): "head_dim",
    (r"Qwen3(Moe)?Attention", "scaling"): "attention_scale",
    (r"Qwen3(Moe)?Attention", "head_dim"): "head_dim",
    (r"Qwen3(Moe)?Attention", "total_num_heads"): "num_attention_heads",
    (r"Qwen3(Moe)?Attention", "total_num_kv_heads"): "num_key_value_heads",
}

#: how long a tuple or list may be and still count as a plain attribute (longer ones are tables, not settings)
_SHORT = 16


def _plain(v) -> bool:
    if isinstance(v, (bool, int, float, str, enum.Enum)) or v is None:
        return True
    return isinstance(v, (tuple, list)) and len(v) <= _SHORT and all(
        isinstance(x, (bool, int, float, str, enum.Enum)) or x is None for x in v)


def engine_attributes(model: torch.nn.Module) -> dict[str, str]:
    """``module.attribute`` → ``repr(value)`` of every plain attribute of every module of ``model`` (public names,
    :func:`_plain` values) but those :data:`ATTRIBUTES_CHANGING_AT_SYNC` declares."""
    out = {}
    for prefix, module in model.named_modules():
        for k, v in vars(module).items():
            if k.startswith("_") or not _plain(v) or any(fnmatch.fnmatchcase(k, p) for p in ATTRIBUTES_CHANGING_AT_SYNC):
                continue
            out[f"{prefix}.{k}" if prefix else k] = repr(v)
    return out


def counterpart_values(model: torch.nn.Module, counterparts: Mapping[tuple[str, str], str]) -> dict[str, list]:
    """quantity → [[``module.attribute``, value], …] of ``model``'s attributes that an engine's table
    ``counterparts`` ((module class name pattern, attribute) → quantity of the learner's config) names."""
    out: dict[str, list] = {}
    for prefix, module in model.named_modules():
        cls = type(module).__name__
        for (pattern, attr), quantity in counterparts.items():
            if re.fullmatch(pattern, cls) and attr in vars(module) and _plain(vars(module)[attr]):
                v = vars(module)[attr]
                out.setdefault(quantity, []).append([f"{prefix}.{attr}" if prefix else attr,
                                                     v.value if isinstance(v, enum.Enum) else v])
    return out


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
    the device it lives on (to name the first differing element later); per plain attribute its value."""
    named = list(engine_tensors(model))
    return {"hashes": fingerprints(named), "shapes": {n: _describe(t) for n, t in named},
            "copies": {n: t.detach().clone() for n, t in named}, "attributes": engine_attributes(model)}


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


def compare(model: torch.nn.Module, start: dict, rank: int, tp: int,
            counterparts: Mapping[tuple[str, str], str] | None = None) -> dict:
    """``model``'s other state now against its engine-start ``start`` (:func:`record`): a tensor whose fingerprint,
    shape or dtype changed (named with its first differing element), one gone, one not there at the start; a plain
    attribute whose value changed, one gone, one new. Returns the rank's verdict: ``rank``, ``tp``, ``checked``
    (tensors), ``attributes`` (plain attributes compared), ``offenders`` (each ``tp rank r/tp: name: …``),
    ``changing`` (the declared patterns and why), ``config`` (the values of the attributes the engine's
    ``counterparts`` table names, :func:`counterpart_values`; absent without a table), ``seconds``."""
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
    before, now = start.get("attributes", {}), engine_attributes(model)
    for n in sorted(set(before) | set(now)):
        if n not in now:
            out.append(f"{n}: attribute {before[n]} at the engine start, gone now")
        elif n not in before:
            out.append(f"{n}: attribute not there at the engine start, now {now[n]}")
        elif now[n] != before[n]:
            out.append(f"{n}: attribute {before[n]} at the engine start, now {now[n]}")
    verdict = {"rank": int(rank), "tp": int(tp), "checked": len(named), "attributes": len(now),
               "offenders": [f"tp rank {rank}/{tp}: {o}" for o in out],
               "changing": dict(CHANGES_AT_SYNC) | dict(ATTRIBUTES_CHANGING_AT_SYNC), "seconds": 0.0}
    if counterparts is not None:
        verdict["config"] = counterpart_values(model, counterparts)
    verdict["seconds"] = time.perf_counter() - t0
    return verdict
