"""Checks of W1 coverage, W2 grid identity, W4 precision, W5 version and W6 derived state (docs/design.md,
"The seven conditions"); W3 layout is in :mod:`.layout`, W7 behaviour in :mod:`.behaviour`, the cadence
that runs them in :mod:`.runner`.

Every check reads the *live engine* — its snapshot (:meth:`fp8rl_core.sampler.seam.Sampler.state`:
per rank the version, which sync version last wrote each tensor, per-layer scheme and processing count,
a fingerprint and shape of every tensor it computes with; the engine core's prefix-cache blocks and
reset count) or its full read-back — and compares with what the *learner* holds (:mod:`.expected`),
never with the exporter's output. Two tiers per condition where it matters: fingerprints (cheap, every
sync) and full values (on the cadence, and whenever a fingerprint disagrees).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from fp8rl_core.grids.schemes import Sent, layer_scheme, scheme
from fp8rl_core.sync.layout import fused_group

__all__ = ["CheckResult", "byte_offenders", "check_compute_copies", "check_coverage", "check_derived_state", "check_grid_bytes", "check_grid_fingerprints",
           "check_precision", "check_precision_fingerprints", "check_version", "differing_bytes", "expected_grid_tensors",
           "expected_sync_names"]


@dataclass
class CheckResult:
    condition: str
    passed: bool
    measured: float
    bound: float
    offenders: list[str] = field(default_factory=list)
    count: int = 0
    seconds: float = 0.0
    detail: str = ""
    failing_ranks: list[int] = field(default_factory=list)  # tensor-parallel ranks a per-rank check failed on
    #: measured quantities that are not a verdict, logged as metrics under their names (W2 of a sampler that
    #: requantizes: :mod:`.requant`)
    quantities: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"condition": self.condition, "passed": self.passed, "measured": self.measured, "bound": self.bound,
                "offenders": self.offenders[:5], "count": self.count, "seconds": self.seconds, "detail": self.detail,
                "failing_ranks": list(self.failing_ranks), "quantities": dict(self.quantities)}


def _ranks(states: list[dict]) -> list[tuple[str, dict]]:
    """(label, rank snapshot) over every replica and rank; labels only when there is more than one."""
    flat = [(r, k, rank) for r, st in enumerate(states) for k, rank in enumerate(st["ranks"])]
    many = len(flat) > 1
    return [(f"replica {r} rank {k}: " if many else "", rank) for r, k, rank in flat]


def check_version(states: list[dict], learner_version: int, rollout_tags: list[tuple[int, int]] = (),
                  content_versions: list[int] | None = None) -> CheckResult:
    """W5: every rank of every replica reports the learner's version; every rollout since the last
    check was tagged with the version the learner held when it ran (``rollout_tags``: (tag, learner
    version) pairs); and the engine's *content* is that version — ``content_versions`` lists the
    recent learner versions whose fingerprints the primary engine matches entirely (None: not known);
    content that matches only an older version is that version's weights under a new tag."""
    t0 = time.perf_counter()
    wrong = [f"{lbl}version {rank['version']}" for lbl, rank in _ranks(states) if rank["version"] != learner_version]
    wrong += [f"rollout tagged {tag} while the learner was at {v}" for tag, v in rollout_tags if tag != v]
    if content_versions is not None and content_versions and learner_version not in content_versions:
        wrong.append(f"engine holds the weights of version {max(content_versions)} under tag {learner_version}")
    seen = sorted({rank["version"] for _, rank in _ranks(states)})
    return CheckResult("W5", not wrong and bool(states), float(len(wrong)), 0.0, wrong, len(wrong),
                       time.perf_counter() - t0, f"learner version {learner_version}; versions seen {seen}")


def check_grid_fingerprints(states: list[dict], expected: dict[str, str]) -> CheckResult:
    """W2, cheap tier: the fingerprint of every on-grid tensor (FP8 data and scale bytes) on every rank
    and replica equals the fingerprint of the learner's forward operand. ``expected``: name →
    fingerprint. ``measured`` = tensors whose fingerprint differs."""
    t0 = time.perf_counter()
    off = [f"{lbl}{n}" for lbl, rank in _ranks(states) for n, fp in sorted(expected.items())
           if rank["fingerprints"].get(n) != fp]
    return CheckResult("W2", not off, float(len(off)), 0.0, off, len(off), time.perf_counter() - t0,
                       f"fingerprints of {len(expected)} on-grid tensors per rank")


def expected_grid_tensors(forward_weights: dict, schemes: dict[str, str], learner_layers: list[str]) -> dict[str, torch.Tensor]:
    """The bytes (uint8) every on-grid engine tensor must hold: the learner's rowwise forward operands,
    lined up with the vLLM layer (fused members in the engine's order)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, name in sorted(schemes.items()):
        if not scheme(name).on_learner_grid:
            continue
        qts = [forward_weights[m] for m in fused_group(prefix, learner_layers)]
        if prefix.endswith(".experts"):
            pairs = [(f"{prefix}.w13_weight", qts[0].data), (f"{prefix}.w13_weight_scale", qts[0].scale),
                     (f"{prefix}.w2_weight", qts[1].data), (f"{prefix}.w2_weight_scale", qts[1].scale)]
        else:
            pairs = [(f"{prefix}.weight", torch.cat([q.data for q in qts])),
                     (f"{prefix}.weight_scale", torch.cat([q.scale for q in qts]))]
        out.update({n: t.contiguous().view(torch.uint8) for n, t in pairs})
    return out


def _widest_words(a: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as the widest integer words its size and offset allow (int64 … uint8)."""
    b = a.reshape(-1).view(torch.uint8)
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if b.numel() % size == 0 and b.storage_offset() % size == 0:
            return b.view(dtype)
    return b


def differing_bytes(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many bytes of ``got`` differ from ``want`` (same shape, 1-byte elements). Equal tensors —
    every sync that passes — cost one :func:`torch.equal` over 64-bit words (~4× the speed of
    ``torch.equal`` on the bytes themselves on a CPU); bytes are counted only when they differ."""
    got, want = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    if torch.equal(_widest_words(got), _widest_words(want)):
        return 0
    return int((got != want).sum())


def byte_offenders(readback: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                   why: Callable[[str, int, int], str] = lambda name, n, total: name) -> tuple[list[str], int]:
    """Every tensor of ``expected`` (one-byte elements) against the engine's ``readback``: the offenders — a
    missing tensor or one of another shape or element size, named with both; a tensor whose bytes differ,
    as ``why(name, differing, total)`` — and the number of differing bytes (all of a missing tensor's)."""
    offenders: list[str] = []
    differing = 0
    for name, want in expected.items():
        got = readback.get(name)
        if got is None or got.shape != want.shape or got.element_size() != 1:
            what = "missing" if got is None else f"{tuple(got.shape)} {str(got.dtype).removeprefix('torch.')}"
            offenders.append(f"{name} (engine {what}, expected {tuple(want.shape)} bytes)")
            differing += want.numel()
            continue
        n = differing_bytes(got, want)
        if n:
            offenders.append(why(name, n, want.numel()))
            differing += n
    return offenders, differing


def check_grid_bytes(readback: dict[str, torch.Tensor], forward_weights: dict, schemes: dict[str, str],
                     learner_layers: list[str]) -> CheckResult:
    """W2, full tier: for every vLLM layer on the learner's grid, the engine's data and scale bytes equal
    the learner's rowwise forward operand, byte for byte. ``measured`` = number of differing bytes."""
    t0 = time.perf_counter()
    offenders, differing = byte_offenders(readback, expected_grid_tensors(forward_weights, schemes, learner_layers))
    return CheckResult("W2", not offenders, float(differing), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, "differing bytes between engine and learner forward operands")


# ----------------------------------------------------------------------------------------------------
# W1 coverage, W4 precision, W6 derived state
# ----------------------------------------------------------------------------------------------------
#: read-back entries that are derived in the engine (not written by a sync)
DERIVED_SUFFIXES = (".fp8_data", ".fp8_scale_inv", ".w13_fp8_data", ".w13_fp8_scale_inv", ".w2_fp8_data",
                    ".w2_fp8_scale_inv", ".mx_data", ".mx_scale", ".w13_mx_data", ".w13_mx_scale", ".w2_mx_data",
                    ".w2_mx_scale", ".effective")


def expected_sync_names(learner_params: list[str], gemm_layers: list[str], schemes: dict[str, str]) -> set[str]:
    """The tensor names a complete sync must write, derived from the learner's parameters and the
    sampler's schemes (vLLM layer prefixes via :func:`fp8rl_core.sync.layout.sampler_layer`)."""
    from fp8rl_core.sync.layout import sampler_layer

    params = set(learner_params)
    names: set[str] = set()
    covered: set[str] = set()
    for layer in gemm_layers:
        pname = layer if layer in params else f"{layer}.weight"
        if pname not in params:  # a tied lm_head: written as the embedding
            continue
        covered.add(pname)
        prefix = sampler_layer(layer)
        on = layer_scheme(schemes, prefix).sent is Sent.BYTES
        if prefix.endswith(".experts"):
            for w in ("w13", "w2"):
                names.add(f"{prefix}.{w}_weight")
                if on:
                    names.add(f"{prefix}.{w}_weight_scale")
        else:
            names.add(f"{prefix}.weight")
            if on:
                names.add(f"{prefix}.weight_scale")
    return names | (params - covered)


def check_coverage(states: list[dict], expected: set[str], learner_version: int) -> CheckResult:
    """W1: on every rank of every replica the engine computes with exactly the tensors a sync writes
    (none missing, none extra), and the engine's own record says each was written by the sync of the
    learner's version. ``measured`` = missing + extra + not-written tensors."""
    t0 = time.perf_counter()
    offenders: list[str] = []
    n = 0
    for lbl, rank in _ranks(states):
        held = {t for t in rank["shapes"] if not t.endswith(DERIVED_SUFFIXES)}
        missing, extra = sorted(expected - held), sorted(held - expected)
        stale = sorted(t for t in expected & held if rank["written"].get(t) != learner_version)
        n += len(missing) + len(extra) + len(stale)
        offenders += [f"{lbl}missing {t}" for t in missing] + [f"{lbl}extra {t}" for t in extra]
        offenders += [f"{lbl}{t} last written by sync {rank['written'].get(t, 'none')}" for t in stale]
    return CheckResult("W1", not offenders, float(n), 0.0, offenders, len(offenders), time.perf_counter() - t0,
                       f"{len(expected)} expected tensors per rank, written at version {learner_version}")


def check_precision_fingerprints(states: list[dict], expected: dict[str, str], configured: dict[str, str],
                                 skip: tuple[str, ...] = ()) -> CheckResult:
    """W4, cheap tier: every off-grid tensor's fingerprint equals that of the learner's BF16 view
    (``expected``: name → fingerprint), and every rank's on-grid layer set equals the configured one."""
    t0 = time.perf_counter()
    offenders: list[str] = []
    for lbl, rank in _ranks(states):
        offenders += [f"{lbl}{n}" for n, fp in sorted(expected.items())
                      if n not in skip and rank["fingerprints"].get(n) != fp]
        offenders += [f"{lbl}{w}" for w in _grid_set_diff({p: v["scheme"] for p, v in rank["layers"].items()}, configured)]
    return CheckResult("W4", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, "off-grid fingerprints vs BF16 views; on-grid layer set vs config")


def _grid_set_diff(engine_schemes: dict[str, str], configured: dict[str, str]) -> list[str]:
    on_engine = {p: s for p, s in engine_schemes.items() if scheme(s).quantized}
    wrong = {p for p, _ in set(on_engine.items()) ^ set(configured.items())}
    return [f"grid of {p}: engine {layer_scheme(on_engine, p).name}, configured {layer_scheme(configured, p).name}"
            for p in sorted(wrong)]


def check_precision(readback: dict[str, torch.Tensor], bf16_views: dict[str, torch.Tensor],
                    engine_schemes: dict[str, str], configured: dict[str, str],
                    skip: tuple[str, ...] = ()) -> CheckResult:
    """W4: every off-grid tensor the engine holds equals the learner's BF16 view exactly (no FP8 round
    trip, no silent cast), and the engine's on-grid layer set equals the configured one.
    ``bf16_views`` are keyed by engine tensor name; ``skip`` names tensors the engine cannot return
    as values (prepacked BF16 experts). ``measured`` = differing elements + mis-gridded layers."""
    t0 = time.perf_counter()
    offenders: list[str] = []
    differing = 0
    for name, want in bf16_views.items():
        if name in skip:
            continue
        got = readback.get(name)
        if got is None or got.shape != want.shape:
            offenders.append(f"{name} (missing or shape {None if got is None else tuple(got.shape)})")
            differing += want.numel()
            continue
        n = 0 if got.dtype == want.dtype and torch.equal(got, want) else int((got.float() != want.float()).sum())
        if n:
            offenders.append(name)
            differing += n
    wrong = _grid_set_diff(engine_schemes, configured)
    offenders += wrong
    return CheckResult("W4", not offenders, float(differing + len(wrong)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, "off-grid tensors vs BF16 view; on-grid layer set vs config")


def check_derived_state(prefix_cache_blocks: int, resets: int, processed_before: dict[str, int],
                        processed_after: dict[str, int], stale_effective: list[str] = ()) -> CheckResult:
    """W6: after a sync the prefix cache holds no block and the engine reset it (``resets``: resets the
    engine core counted since the previous check, ≥ 1), post-load processing ran exactly once per layer,
    and (full tier) no layer computes with a stale derived copy (``stale_effective``: layers whose
    effective weight, probed, differs from the weight they hold)."""
    t0 = time.perf_counter()
    offenders = [f"{p}: processed {processed_after.get(p, 0) - n} times" for p, n in sorted(processed_before.items())
                 if processed_after.get(p, 0) - n != 1]
    if prefix_cache_blocks:
        offenders.append(f"prefix cache holds {prefix_cache_blocks} blocks")
    if resets < 1:
        offenders.append("the prefix cache was not reset since the previous sync")
    offenders += [f"{p}: effective weight differs from the held weight (stale derived copy)" for p in stale_effective]
    return CheckResult("W6", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0,
                       "cache blocks and resets after the sync; processings per layer per sync; effective weights")


def check_compute_copies(reports: list[dict | None]) -> CheckResult | None:
    """W6, the compute copy: on every rank of every replica, what each quantized tensor's layer computes with
    (experts included) equals the dequantization of the bytes that rank holds. ``reports``: the ranks'
    ``fp8rl_compute_check`` results (:mod:`fp8rl_core.sampler.vllm.worker`; by fingerprint in the cheap tier, bit
    for bit in the full tier), ``None`` for a rank that did not run it. ``count`` = offenders. Layers
    with no second copy (docs/correctness.md, The compute copy) and ranks that did not run it are named in
    ``detail`` as not checked, never counted as passed; ``None`` when no rank ran it."""
    t0 = time.perf_counter()
    ran = [r for r in reports if r is not None]
    if not ran:
        return None
    offenders = [o for r in ran for o in r["offenders"]]
    reasons: dict[str, set[str]] = {}
    for r in ran:
        for layer, why in r["not_checked"].items():
            reasons.setdefault(why, set()).add(layer)
    detail = (f"compute copy vs dequantized held bytes ({'/'.join(sorted({r['tier'] for r in ran}))}): "
              f"{sum(r['checked'] for r in ran)} tensors ({sum(r['experts'] for r in ran)} experts) on {len(ran)} ranks")
    if len(ran) < len(reports):
        detail += f"; not run on {len(reports) - len(ran)} ranks"
    detail += "".join(f"; not checked, {len(layers)} layers: {why}" for why, layers in sorted(reasons.items()))
    return CheckResult("W6", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, detail, sorted({int(r["rank"]) for r in ran if r["offenders"]}))
