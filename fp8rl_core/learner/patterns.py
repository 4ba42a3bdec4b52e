"""Which layers are on the grid: the GEMM layers of a model, layer patterns and the presets.

Rule: a pattern matches whole dotted name components (``*`` one component, ``**`` any number, ``!``
excludes), never substrings — so ``mlp.gate`` is the router and never ``gate_proj`` (the W4 guard);
presets ``none`` / ``all`` (every GEMM in the decoder blocks but the router) / ``half`` (``all`` on every
other block of each block type, from the second). Specified in docs/library.md (Layers on the grid).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

import torch.nn as nn

__all__ = [
    "ALL_PATTERNS",
    "PRESETS",
    "gemm_layers",
    "matches",
    "resolve_layers",
    "resolve_names",
]

PRESETS = ("none", "all", "half")
#: the ``all`` preset as a pattern list (decoder-block GEMM layers minus the MoE router)
ALL_PATTERNS = ("layers.*.**", "!mlp.gate")

_BLOCK_RE = re.compile(r"^(?P<block>(?:.*\.)?layers\.(?P<idx>\d+))\.(?P<rest>.+)$")


# ----------------------------------------------------------------------------------------------------
# GEMM layers
# ----------------------------------------------------------------------------------------------------
def _direct_params(module: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in module.named_parameters(recurse=False) if p is not None}


def gemm_layers(model: nn.Module) -> list[str]:
    """Every weight ``model`` multiplies with, in model order (the naming rules: docs/library.md, Layers on the grid)."""
    names: list[str] = []
    for mod_name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            continue  # a lookup, not a GEMM (a tied lm_head is listed under its own module name)
        params = _direct_params(module)
        w = params.get("weight")
        if isinstance(module, nn.Linear) or (w is not None and w.dim() == 2):
            names.append(mod_name)
            continue
        for p_name, p in params.items():
            if p.dim() == 3:  # fused experts: [E, N, K] per projection
                names.append(f"{mod_name}.{p_name}" if mod_name else p_name)
    return names


# ----------------------------------------------------------------------------------------------------
# Patterns
# ----------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def _components(pattern: str) -> tuple[str, ...]:
    if not isinstance(pattern, str):
        raise TypeError(f"a layer pattern must be a string, got {type(pattern).__name__} {pattern!r}")
    body = pattern[1:] if pattern.startswith("!") else pattern
    comps = tuple(body.split("."))
    if not body or any(c == "" for c in comps):
        raise ValueError(
            f"layer pattern {pattern!r} is malformed: expected dotted components such as "
            f"'mlp.experts.*' or 'layers.0.**' (no empty components, no leading/trailing dots)"
        )
    return comps


def _match_from(pat: tuple[str, ...], comps: tuple[str, ...]) -> bool:
    """Does ``pat`` match ``comps`` exactly (all of it, from the start)? ``**`` = zero or more."""
    if not pat:
        return not comps
    head, rest = pat[0], pat[1:]
    if head == "**":
        return any(_match_from(rest, comps[i:]) for i in range(len(comps) + 1))
    if not comps or not fnmatch.fnmatchcase(comps[0], head):
        return False
    return _match_from(rest, comps[1:])


def matches(pattern: str, name: str) -> bool:
    """True when ``pattern`` (without a leading ``!``) occurs as a contiguous run of ``name``'s components.

    >>> matches("mlp.gate", "model.layers.3.mlp.gate"), matches("mlp.gate", "model.layers.3.mlp.gate_proj")
    (True, False)
    """
    pat = _components(pattern)
    comps = tuple(name.split("."))
    # contiguous run anywhere == the pattern with '**' on both sides matches the whole name
    return _match_from(("**",) + pat + ("**",), comps)


def _examples(names: Sequence[str], k: int = 6) -> str:
    shown = list(names[:k])
    more = f", … ({len(names)} in all)" if len(names) > k else ""
    return ", ".join(shown) + more


def _all_preset(names: Sequence[str]) -> list[str]:
    inside = [n for n in names if matches(ALL_PATTERNS[0], n)]
    return [n for n in inside if not matches(ALL_PATTERNS[1][1:], n)]


def _half_preset(names: Sequence[str]) -> list[str]:
    on = _all_preset(names)
    blocks: dict[str, list[str]] = {}  # block prefix -> relative names, in model order
    order: list[str] = []
    for n in on:
        m = _BLOCK_RE.match(n)
        if m is None:  # cannot happen: 'all' only keeps names inside layers.<i>
            continue
        if m["block"] not in blocks:
            blocks[m["block"]] = []
            order.append(m["block"])
        blocks[m["block"]].append(m["rest"])
    by_type: dict[tuple[str, ...], list[str]] = {}
    for b in order:
        by_type.setdefault(tuple(blocks[b]), []).append(b)
    chosen = {b for members in by_type.values() for b in members[1::2]}
    if not chosen:
        raise ValueError(
            f"preset 'half' selects no block: it takes every other block of each block type starting "
            f"with the second, and this model has {len(order)} decoder block(s) with on-grid layers "
            f"({', '.join(order) or 'none'}); use 'all', 'none' or a pattern list"
        )
    return [n for n in on if _BLOCK_RE.match(n)["block"] in chosen]


def _preset(name: str, names: Sequence[str]) -> list[str]:
    if name == "none":
        return []
    if name == "all":
        return _all_preset(names)
    return _half_preset(names)


def resolve_names(names: Sequence[str], selection: str | Iterable[str]) -> list[str]:
    """Resolve a preset name or a pattern list against GEMM layer ``names`` (kept in their order).

    Raises ValueError for an unknown preset, a malformed pattern, or a pattern (``!``-exclusions
    included) that matches none of ``names`` — a typo must never silently leave a layer off the grid.
    """
    names = list(names)
    if isinstance(selection, str):
        if selection not in PRESETS:
            raise ValueError(
                f"unknown layer preset {selection!r}; valid presets: {', '.join(PRESETS)}; or pass a "
                f"list of layer patterns such as ['mlp.experts.*', 'self_attn.q_proj'] "
                f"(layer names look like: {_examples(names)})"
            )
        return _preset(selection, names)
    try:
        entries = list(selection)
    except TypeError:
        raise TypeError(
            f"layer selection must be a preset name ({', '.join(PRESETS)}) or a list of patterns, "
            f"got {type(selection).__name__}"
        ) from None
    include: set[str] = set()
    exclude: set[str] = set()
    has_positive = False
    for entry in entries:
        if isinstance(entry, str) and entry in PRESETS:
            include.update(_preset(entry, names))
            has_positive = True
            continue
        _components(entry)  # validates type and syntax
        neg = entry.startswith("!")
        body = entry[1:] if neg else entry
        hit = {n for n in names if matches(body, n)}
        if not hit:
            raise ValueError(
                f"layer pattern {entry!r} matches no GEMM layer of this model; patterns match whole "
                f"dotted components ('mlp.gate' is the router, never 'gate_proj'); layer names look "
                f"like: {_examples(names)}; presets: {', '.join(PRESETS)}"
            )
        (exclude if neg else include).update(hit)
        has_positive |= not neg
    if entries and not has_positive:
        raise ValueError(
            f"layer selection {entries!r} only excludes ('!…') and so selects nothing; start from a "
            f"preset or a pattern, e.g. ['all', {entries[0]!r}]"
        )
    return [n for n in names if n in include and n not in exclude]


def resolve_layers(model: nn.Module, selection: str | Iterable[str]) -> list[str]:
    """The GEMM layers of ``model`` that ``selection`` (preset or pattern list) puts on the grid,
    in model order. The pattern language and the presets: docs/library.md (Layers on the grid)."""
    return resolve_names(gemm_layers(model), selection)
