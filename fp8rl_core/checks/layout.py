"""W3 layout: each tensor lands in the shape, orientation and order the sampler's kernel reads.

Rule: on the live engine's read-back, every tensor's shape and value class against the learner-derived
expectation, and every GEMM layer's effective weight cut into the slots the engine declares, each slot
matched by content to the learner's fp32 masters within a quarter of its block's amax — naming an order
fault ("slot k of qkv_proj holds v_proj") or an orientation/scale fault. In full on
:func:`check_layout`; docs/correctness.md (W3).
"""

from __future__ import annotations

import time

import torch

from fp8rl_core.grids.schemes import scheme as scheme_of

from .basic import CheckResult

__all__ = ["block_amax", "check_layout", "effective_weights", "match_error"]


def block_amax(m: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Per element, the amax of its (rows × cols) block over the last two dimensions (edge blocks
    partial)."""
    x = m.abs().float()
    *lead, n, k = x.shape
    pn, pk = -n % rows, -k % cols
    xp = torch.nn.functional.pad(x, (0, pk, 0, pn))
    b = xp.reshape(*lead, (n + pn) // rows, rows, (k + pk) // cols, cols).amax(dim=(-3, -1), keepdim=True)
    b = b.expand(*lead, (n + pn) // rows, rows, (k + pk) // cols, cols).reshape(*lead, n + pn, k + pk)
    return b[..., :n, :k]


def match_error(slot: torch.Tensor, master: torch.Tensor, rows: int = 1, cols: int = 32) -> float:
    """max |slot − master| / block amax(master): ≤ ``tolerance`` means the slot holds this master."""
    if slot.shape != master.shape:
        return float("inf")
    amax = block_amax(master, rows, cols).clamp_min(torch.finfo(torch.float32).tiny)
    return float(((slot.float() - master.float()).abs() / amax).max())


def effective_weights(readback: dict[str, torch.Tensor], prefix: str, scheme: str, mx_grid: str,
                      experts: bool) -> dict[str, torch.Tensor] | None:
    """The weight(s) a layer computes with, in fp32, from its read-back tensors (None: not readable): the held
    bytes dequantized on the scheme's grid (:attr:`~fp8rl_core.grids.schemes.Scheme.held`,
    :meth:`~fp8rl_core.grids.schemes.Scheme.dequantize_held`; ``mx_grid``: the learner's, for the learner's bytes),
    or the held weight of a BF16 layer."""
    s = scheme_of(scheme)
    names = ("w13", "w2") if experts else ("",)
    out: dict[str, torch.Tensor] = {}
    for w in names:
        base = f"{prefix}.{w}_" if w else f"{prefix}."
        try:
            if not s.quantized:
                out[w] = readback[f"{base}weight"].float()
                continue
            data_name, scale_name = s.held
            out[w] = s.dequantize_held(readback[f"{base}{data_name}"], readback[f"{base}{scale_name}"], s.grid(mx_grid))
        except KeyError:
            return None
    return out


def _slots(prefix: str, eff: dict[str, torch.Tensor], sizes: list[int] | None, members: list[str],
           masters: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor, str, torch.Tensor]]:
    """(slot label, engine slot, expected member label, member master) in the engine's own order."""
    if prefix.endswith(".experts"):
        gu, down = (masters[m] for m in members)  # learner: gate_up_proj [E, 2I, H], down_proj [E, H, I]
        i = gu.shape[1] // 2
        w13, w2 = eff["w13"], eff["w2"]
        out = []
        for e in range(w13.shape[0]):
            out.append((f"w13[{e}].gate", w13[e, :i], f"expert {e} gate", gu[e, :i] if e < gu.shape[0] else None))
            out.append((f"w13[{e}].up", w13[e, i:], f"expert {e} up", gu[e, i:] if e < gu.shape[0] else None))
            out.append((f"w2[{e}]", w2[e], f"expert {e} down", down[e] if e < down.shape[0] else None))
        return out
    w = eff[""]
    sizes = sizes or [w.shape[0]]
    parts = torch.split(w, sizes, 0) if sum(sizes) == w.shape[0] else [w]
    short = [m.rsplit(".", 1)[-1] for m in members]
    return [(f"slot {k}", part, short[k] if k < len(short) else "?", masters[members[k]] if k < len(members) else None)
            for k, part in enumerate(parts)]


def check_layout(readback: dict[str, torch.Tensor], engine_shapes: dict[str, tuple[list[int], str]],
                 expected_shapes: dict[str, tuple[tuple[int, ...], bool]], layers: dict[str, dict],
                 groups: dict[str, list[str]], masters: dict[str, torch.Tensor], mx_grid: str,
                 tolerance: float = 0.25) -> CheckResult:
    """W3: shapes, value classes, and slot content against the learner's masters (the method below).

    engine_shapes:   engine tensor name → (shape, dtype name), from the engine's snapshot
    expected_shapes: sync tensor name → (shape, is_bytes) derived from the learner
    layers:          the engine's per-layer metadata (scheme, fused ``sizes``)
    groups:          vLLM layer prefix → learner members in the engine's documented order (q, k, v;
                     gate, up; experts gate_up, down)
    masters:         learner member → fp32 master weight
    ``measured`` = misshapen tensors + misplaced or mismatching slots; ``bound`` = the tolerance.

    Two angles, both on what the live engine holds (its read-back) against the learner's masters:

    1. **Shapes and value classes** of every engine tensor against the learner-derived expectation (FP8 data
       and E8M0 scales are bytes, off-grid tensors are floating point): a transposed or padded tensor, or
       scales of the wrong orientation ([N/32, K] columnwise instead of [N, K/32] rowwise), differs here —
       reported with both shapes.
    2. **Order and orientation by content**, independent of any name or layout table: every GEMM layer's
       *effective* weight (on the learner's grid: the engine's data bytes × its scale bytes, dequantized;
       requantized MXFP8: its own data × scales; block FP8: its own data × scale_inv; BF16: the probed weight) is cut into the *slots* the engine itself
       declares — the fused output sizes vLLM reports for the layer (``output_partition_sizes``: q | k | v,
       gate | up), and for experts expert × (gate | up) rows of ``w13`` and expert rows of ``w2`` — and
       each slot is matched against the learner's fp32 masters. A slot *matches* a member when every element
       is within ``tolerance`` × the amax of its block (1×32 along K; 128×128 tiles for block FP8) — a
       quarter by default: twice the worst legal FP8 rounding (E4M3: 16/448 of amax below saturation; FLOOR
       saturation: 1/8), far below what a misplacement produces (another matrix: ~the amax itself) and below
       one wrong scale binade (×2 or ×½: half the amax or more). W3 asks *where* content landed, not whether
       it is exact (W2 and W4 do that), so stale-but-placed weights (one optimizer step behind) still match.

    A slot that does not match its own member is searched among the layer's other members of the same
    shape: found → an order fault ("slot k of qkv_proj holds v_proj"); not found → an orientation/scale
    fault with the measured error in units of the tolerance.
    """
    t0 = time.perf_counter()
    offenders: list[str] = []
    for name, (shape, is_bytes) in sorted(expected_shapes.items()):
        got = engine_shapes.get(name)
        if got is None:
            continue  # absent tensors are W1's
        gshape, gdtype = tuple(got[0]), got[1]
        if gshape != tuple(shape) or (gdtype == "uint8") != is_bytes:
            offenders.append(f"{name}: engine {list(gshape)} {gdtype}, expected {list(shape)} "
                             f"{'bytes' if is_bytes else 'floating point'}")
    worst = 0.0
    for prefix, meta in sorted(layers.items()):
        members = groups.get(prefix)
        if not members or any(m not in masters for m in members):
            continue
        experts = prefix.endswith(".experts")
        eff = effective_weights(readback, prefix, meta["scheme"], mx_grid, experts)
        if eff is None or (experts and not scheme_of(meta["scheme"]).quantized):
            continue  # prepacked BF16 experts are not readable as values (covered by W7)
        rows, cols = scheme_of(meta["scheme"]).block
        slots = _slots(prefix, eff, meta.get("sizes"), members, masters)
        for label, slot, want, master in slots:
            err = match_error(slot, master, rows, cols) / tolerance if master is not None else float("inf")
            if err <= 1.0:
                continue
            holds = [w for _, _, w, m in slots if m is not None and w != want
                     and match_error(slot, m, rows, cols) <= tolerance]
            if holds:
                offenders.append(f"{prefix} {label} holds {holds[0]}, expected {want}")
            else:
                worst = max(worst, err)
                offenders.append(f"{prefix} {label} ({want}) matches no member: max error {err:.3g} × tolerance "
                                 f"(wrong orientation or scales?)")
    return CheckResult("W3", not offenders, float(len(offenders)), tolerance, offenders, len(offenders),
                       time.perf_counter() - t0,
                       f"shapes; slot content vs learner masters within {tolerance} × block amax"
                       + (f"; worst unmatched slot {worst:.3g} × tolerance" if worst else ""))
