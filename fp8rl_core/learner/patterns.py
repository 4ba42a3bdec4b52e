"""Which layers are on the grid: the GEMM layers of a model, layer patterns and the presets.

GEMM layer names
----------------
:func:`gemm_layers` lists every weight the model *multiplies* with, in model order (the order of
``model.named_modules()``):

* each ``nn.Linear`` by module name (``model.layers.0.self_attn.q_proj``, ``lm_head`` — tied to the
  embeddings or not: with tied weights the embedding *lookup* is not a GEMM but the LM head is);
* each other module holding a 2-D ``weight`` of its own — in Hugging Face MoE models the router
  (``Qwen3MoeTopKRouter``: ``router_logits = F.linear(h, self.weight)``), and this package's
  ``MXFP8Linear`` / ``MXFP8Router`` after a swap — except embeddings (``nn.Embedding``: a lookup);
* each 3-D parameter of a fused-experts module, by *parameter* name: ``Qwen3MoeExperts`` holds
  ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I], so the names are
  ``model.layers.0.mlp.experts.gate_up_proj`` and ``model.layers.0.mlp.experts.down_proj``.

Norm weights (1-D) and rotary buffers are not GEMM operands and never listed.

Patterns (whole dotted components, never substrings)
----------------------------------------------------
A pattern is a dotted sequence of *component globs*. Each glob is matched against one whole name
component with :func:`fnmatch.fnmatchcase` (``*``, ``?``, ``[...]`` inside a component), the component
``*`` matches exactly one component and ``**`` any number (zero or more). A pattern matches a name when
it matches a *contiguous run* of the name's components anywhere in the name:

==========================  =============================================  ================================
pattern                     matches                                        does not match
==========================  =============================================  ================================
``mlp.gate``                ``model.layers.3.mlp.gate`` (the MoE router)   ``mlp.gate_proj``,
                                                                           ``mlp.experts.gate_up_proj``
``gate_proj``               ``model.layers.0.mlp.gate_proj``               ``mlp.gate``, ``gate_up_proj``
``mlp.experts.*``           ``…experts.gate_up_proj``, ``…experts.down_proj``  ``mlp.down_proj``
``layers.0.**``             everything in block 0                          ``model.layers.10.…``
``self_attn``               q/k/v/o projections of every block             ``mlp.…``
==========================  =============================================  ================================

This is the DESIGN's W4 guard: a substring rule (vLLM's ``ignored_layers``) would let ``gate`` select
the router *and* ``gate_proj`` *and* ``gate_up_proj``. A leading ``!`` excludes: a selection list is the
union of what its positive entries match minus what its ``!`` entries match, whatever their order.
A list entry may also be a preset name (``["all", "!mlp.experts.*"]``).

Presets
-------
``none``  no layer on the grid (a BF16 learner/sampler).
``all``   every GEMM layer inside a decoder block (``layers.<i>.…``) except the MoE router
          (``mlp.gate``): attention q/k/v/o, dense MLP gate/up/down, expert gate_up/down. The router
          and ``lm_head`` stay off the grid (BF16): router precision decides which experts a token
          reaches (routing stability), and Transformer Engine recipes keep the LM head and embeddings
          in BF16 (only ``te.Linear`` layers inside the blocks run under the FP8 recipe).
          On an MoE model the same as the pattern list ``["layers.*.**", "!mlp.gate"]``
          (``ALL_PATTERNS``; as a user list it fails on a dense model, where ``!mlp.gate`` matches
          nothing — exclusions must match too, since a mistyped exclusion would leave a layer on
          the grid).
``half``  the ``all`` set restricted to half of the decoder blocks: blocks are grouped by *type* (the
          set of on-grid layers they hold — e.g. dense-MLP blocks and MoE blocks when
          ``decoder_sparse_step`` or ``mlp_only_layers`` mixes them), and within each type every
          other block is taken, starting with the type's *second* block (positions 1, 3, 5, … of the
          type, 0-based). For a homogeneous model that is blocks 1, 3, 5, …; for a dense model with an
          even number of blocks it is exactly 50% of the ``all`` layers (a type with an odd count ``n``
          contributes ``n // 2`` blocks). Why this half: interleaving spreads the quantized layers
          evenly over depth (each contiguous half of the stack gets the same share, ±1 block), every
          block type keeps the same share on the grid, and block 0 — which sees the raw embeddings
          and is the block FP8 recipes most often keep in BF16 (Megatron-LM's
          ``--first-last-layers-bf16``) — stays off the grid.

The resolved list is sorted in model order (the order of :func:`gemm_layers`) and is what a run records.
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
    """Every weight ``model`` multiplies with, in model order (see the module docstring)."""
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
    in model order. See the module docstring for the pattern language and the presets."""
    return resolve_names(gemm_layers(model), selection)
