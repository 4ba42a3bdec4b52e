"""vLLM's own weight checksums as a second opinion on the held bytes (W2 on-grid, W4 BF16 views).

Rule: the engine answers with vLLM's code — its weight checker's SHA-256 of each parameter's raw bytes, keyed
``dp:pp:pcp:tp:name`` (:meth:`fp8rl_core.sampler.seam.Sampler.engine_checksums`); fp8rl computes the digests
those parameters must have from the *learner's* export (:class:`~.expected.Expected`: the learner's on-grid
bytes, its BF16 views in the engine's dtype, each rank's slice under tensor parallelism) and never from what
the engine holds. A disagreement names the parameter and the rank. Parameters fp8rl has no expectation for
(a BF16 layer the CPU kernel prepacks) are named as not compared, never counted as agreeing. Run by the
nightly correctness stage (:mod:`fp8rl_core.correctness`); docs/correctness.md (What runs at each sync).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

import torch

from fp8rl_core.grids.schemes import scheme
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.sync.ranks import slice_for_rank
from fp8rl_core.vocabulary import ENGINE_CHECKSUM

from .basic import CheckResult
from .expected import Expected

__all__ = ["check_engine_checksums", "check_vllm_checksums", "engine_name", "expected_checksums", "sha256"]


def sha256(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's raw bytes in row-major order (what vLLM's weight checker hashes)."""
    return hashlib.sha256(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def engine_name(key: str) -> tuple[int, str]:
    """(tensor-parallel rank, sync name) of a weight-checker key ``dp0:pp0:pcp0:tp1:model.….w13_weight``
    (vLLM's routed-experts module, ``….experts.routed_experts.…``, is the sync's ``….experts.…``)."""
    *where, name = key.split(":", 4)
    tp = next((int(w[2:]) for w in where if w.startswith("tp")), 0)
    return tp, name.replace(".routed_experts.", ".")


def expected_checksums(exp: Expected, dtypes: Mapping[str, str], ranks: list[int], layout: ModelLayout,
                       bf16_layers: tuple[str, ...] = ()) -> tuple[dict[tuple[int, str], str], dict[str, str]]:
    """The digests each rank's parameters must have, by (rank, sync name), from the learner's bytes (``exp.grid``)
    and BF16 views (``exp.views``, cast to the engine's dtype of that tensor: ``dtypes``, sync name → dtype name),
    each rank's slice under tensor parallelism (``ranks``: every rank ``0 … tp-1``); and {name: why not compared}
    for the sync tensors with no byte expectation: BF16 GEMM layers (``bf16_layers``: their prefixes; the CPU
    kernel prepacks the weight) and ``exp.skip``."""
    tp = len(ranks)
    skipped = {n: "BF16 layer: the CPU kernel's prepacked weight (read by probe, W4)"
               for n in exp.views if any(n.startswith(p + ".") for p in bf16_layers)}
    skipped |= {n: "BF16 experts: packed by vLLM's CPU MoE kernel" for n in exp.skip}
    full = {n: t for n, t in exp.grid.items()}
    for n, t in exp.views.items():
        if n in skipped:
            continue
        dtype = getattr(torch, dtypes.get(n, "bfloat16"))
        full[n] = t.to(dtype)
    out: dict[tuple[int, str], str] = {}
    for rank in ranks:
        tensors = full if tp == 1 else slice_for_rank(full, layout, rank, tp).tensors
        out |= {(rank, n): sha256(t) for n, t in tensors.items()}
    return out, skipped


def check_engine_checksums(engine: Mapping[str, str] | None, expected: Mapping[tuple[int, str], str],
                           skipped: Mapping[str, str] = {}) -> CheckResult | None:
    """vLLM's digests (``engine``: weight-checker key → SHA-256) against the learner's (``expected``,
    :func:`expected_checksums`): passes when every expected parameter is there with the expected digest;
    offenders name the rank and the parameter (a missing one too). Engine parameters with no expectation are
    counted in ``detail`` as not compared. ``None`` when the engine gave no checksums (not run)."""
    if engine is None:
        return None
    t0 = time.perf_counter()
    tp = 1 + max((r for r, _ in expected), default=0)
    got = {engine_name(k): v for k, v in engine.items()}
    offenders = [f"tp rank {r}/{tp}: {n}: vLLM's SHA-256 {got[(r, n)][:12]}… ≠ the learner's {d[:12]}…"
                 for (r, n), d in sorted(expected.items()) if (r, n) in got and got[(r, n)] != d]
    offenders += [f"tp rank {r}/{tp}: {n}: not among vLLM's checksummed parameters"
                  for (r, n) in sorted(expected) if (r, n) not in got]
    extra = sorted({n for (r, n) in got if (r, n) not in expected})
    agreed = sum(1 for k, d in expected.items() if got.get(k) == d)
    detail = (f"vLLM's weight checker (SHA-256 per parameter) vs the learner's bytes: {agreed} of {len(expected)} "
              f"parameters agree on {tp} ranks")
    if extra:
        unexplained = [n for n in extra if n not in skipped]
        detail += f"; not compared, {len(extra)} parameters"
        if unexplained:
            detail += f" without a learner expectation (e.g. {unexplained[0]})"
        for why in sorted({skipped[n] for n in extra if n in skipped}):
            detail += f"; {why}"
    failing = sorted({int(o.split("/", 1)[0].removeprefix("tp rank ")) for o in offenders})
    return CheckResult(ENGINE_CHECKSUM, not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, detail, failing)


def check_vllm_checksums(samplers, exp: Expected, states: list[dict], layout: ModelLayout) -> CheckResult | None:
    """Every replica's vLLM checksums (:meth:`~fp8rl_core.sampler.seam.Sampler.engine_checksums`) against the
    digests of ``exp`` (the learner's expectation at this sync; ``states``: the replicas' snapshots of the same
    sync, for each tensor's dtype, the ranks and the BF16 layers). One result over the replicas (offenders
    prefixed ``replica i:`` when there are several; ``seconds``: the whole, both sides' hashing and the round
    trip); ``None`` when no engine has a checker (not run)."""
    t0 = time.perf_counter()
    parts = []
    for i, (sampler, st) in enumerate(zip(samplers, states)):
        dtypes = {n: dt for rank in st["ranks"] for n, (_, dt) in rank.get("shapes", {}).items()}
        bf16 = tuple(p for rank in st["ranks"][:1] for p, v in rank["layers"].items() if not scheme(v["scheme"]).quantized)
        want, skipped = expected_checksums(exp, dtypes, list(range(len(st["ranks"]))), layout, bf16)
        res = check_engine_checksums(sampler.engine_checksums(), want, skipped)
        if res is None:
            continue
        if len(samplers) > 1:
            res.offenders = [f"replica {i}: {o}" for o in res.offenders]
        parts.append(res)
    if not parts:
        return None
    return CheckResult(ENGINE_CHECKSUM, all(p.passed for p in parts), sum(p.measured for p in parts), 0.0,
                       [o for p in parts for o in p.offenders], sum(p.count for p in parts),
                       time.perf_counter() - t0, " | ".join(p.detail for p in parts),
                       sorted({k for p in parts for k in p.failing_ranks}))
