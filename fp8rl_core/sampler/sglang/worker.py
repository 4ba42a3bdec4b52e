"""fp8rl's per-rank operations inside one SGLang scheduler: load a sync in place, version, read back, checks.

Rule: run only inside an SGLang scheduler process, on its model, called by :func:`.compat.rpc` (the one way in,
documented there) through :func:`call`; answers are JSON-able (tensors travel as files). Loads go through
fp8rl's SGLang loader (:func:`.loader.load_into`), which cuts the full sync tensors for this rank. What each
rank holds is read from the model's own parameters under fp8rl's sync names. Described in docs/library.md
(The sampler and the weight sync).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from fp8rl_core.sampler import engine_state
from fp8rl_core.sampler.sglang.loader import fp8rl_name, load_into
from fp8rl_core.sync.fingerprint import fingerprints
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import check_rank_tensors
from fp8rl_core.sync.transport import read_manifest, read_sync

__all__ = ["OPS", "call"]


def _state(model: torch.nn.Module) -> dict:
    """fp8rl's record on the model: weight version, which version last wrote each sync tensor, loads."""
    return model.__dict__.setdefault("_fp8rl", {"version": 0, "written": {}, "loads": 0})


def _layout(model: torch.nn.Module) -> ModelLayout:
    return ModelLayout.from_hf_config(model.config)


def _tensors(model: torch.nn.Module):
    """(sync name, tensor) of everything this rank computes with: SGLang's parameters (BF16/FP32 layers compute
    from them directly on CPU), tied ones once."""
    for name, p in model.named_parameters():
        yield fp8rl_name(name), p


@torch.no_grad()
def load(model, rank: int, tp: int, manifest: str) -> dict:
    """Load the sync at ``manifest`` in place through fp8rl's SGLang loader (cut for this rank); the rank's
    version becomes the sync's and every tensor read is tagged with it (W1)."""
    t0 = time.perf_counter()
    version = int(read_manifest(manifest)["version"])
    named = list(read_sync(manifest))
    load_into(model, named, layout=_layout(model) if tp > 1 else None, rank=rank, tp=tp)
    st = _state(model)
    st["written"].update({n: version for n, _ in named})
    st["version"], st["loads"] = version, st["loads"] + 1
    return {"version": version, "tensors": len(named), "seconds": time.perf_counter() - t0}


def set_version(model, rank: int, tp: int, version: int, names: list[str] | None = None) -> int:
    st = _state(model)
    st["version"] = int(version)
    if names is not None:
        st["written"] = {n: int(version) for n in names}
        _engine_start(model)
    return st["version"]


def version(model, rank: int, tp: int) -> int:
    return int(_state(model)["version"])


def tp_rank(model, rank: int, tp: int) -> dict:
    return {"rank": rank, "tp": tp, "expert_parallel": False}


@torch.no_grad()
def read(model, rank: int, tp: int, path: str, names: list[str] | None = None) -> dict:
    """Write this rank's tensors (sync names; ``names``: only those) to ``path`` (safetensors)."""
    wanted = None if names is None else set(names)
    out = {n: t.detach().cpu().contiguous().clone() for n, t in _tensors(model) if wanted is None or n in wanted}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(out, path, metadata={"version": str(_state(model)["version"])})
    return {"version": _state(model)["version"], "tensors": len(out)}


def compute_check(model, rank: int, tp: int, full: bool = False) -> dict:
    """No second compute copy exists here: SGLang's BF16/FP32 layers compute from the held parameters."""
    skipped = {fp8rl_name(n).rpartition(".")[0]: "BF16: SGLang computes from the held weight"
               for n, p in model.named_parameters() if p.dim() == 2}
    return {"rank": rank, "tp": tp, "tier": "bytes" if full else "fingerprints", "checked": 0, "experts": 0,
            "offenders": [], "not_checked": skipped, "seconds": 0.0}


def _engine_start(model) -> dict:
    """This rank's record of its model's other state at the engine's start (:mod:`fp8rl_core.sampler.engine_state`):
    taken at the start's ``set_version`` or the first snapshot, kept after."""
    st = _state(model)
    if "engine_start" not in st:
        st["engine_start"] = engine_state.record(model)
    return st["engine_start"]


@torch.no_grad()
def engine_state_check(model, rank: int, tp: int) -> dict:
    """This rank's other state (buffers, tensor and plain attributes no sync writes) against its engine start: the
    verdict, with the attributes that have a counterpart in the learner's config (:mod:`.attributes`)."""
    from fp8rl_core.sampler.sglang.attributes import COUNTERPARTS

    return engine_state.compare(model, _engine_start(model), rank, tp, COUNTERPARTS)


@torch.no_grad()
def state(model, rank: int, tp: int, fingerprints_too: bool = True) -> dict:
    """The cheap-tier snapshot of this rank: version, written versions, shapes, fingerprints, compute check,
    the engine's other state."""
    tensors = list(_tensors(model))
    st = _state(model)
    _engine_start(model)
    return {"rank": rank, "tp": tp, "version": st["version"], "written": dict(st["written"]), "layers": {},
            "fingerprints": fingerprints(tensors) if fingerprints_too else {},
            "shapes": {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in tensors},
            "compute": compute_check(model, rank, tp) if fingerprints_too else None,
            "engine_state": engine_state_check(model, rank, tp) if fingerprints_too else None}


@torch.no_grad()
def check_rank(model, rank: int, tp: int, fingerprints_by_rank: dict | None = None,
               manifest: str | None = None) -> dict:
    """This rank's live tensors against its slice of the sync: by the fingerprints the caller cut for every
    rank, or (``manifest``) byte for byte against the full expected tensors cut here."""
    return check_rank_tensors(_tensors(model), _layout(model), rank, tp, fingerprints_by_rank=fingerprints_by_rank,
                              manifest=manifest).as_dict()


#: the operations a request may name
OPS = {f.__name__: f for f in (load, set_version, version, tp_rank, read, compute_check, engine_state_check, state,
                               check_rank)}


def call(model, rank: int, tp: int, op: str, args: dict):
    """Run operation ``op`` with keyword ``args`` on this rank's ``model``."""
    if op not in OPS:
        raise ValueError(f"unknown fp8rl SGLang operation {op!r}; known: {', '.join(sorted(OPS))}")
    return OPS[op](model, rank, tp, **args)
