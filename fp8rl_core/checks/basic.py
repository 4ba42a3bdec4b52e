"""The first checks: coverage (W1), the learner's FP8 bytes in the engine (W2), precision (W4), one
weight version everywhere (W5), derived state (W6). Issue 6 adds W3 (layout by content), W7 (probe
behaviour), the cadence and the fault matrix.

Both read the *live engine* (the worker's reported version, the bytes it holds, read back) and compare
with what the *learner* holds — never with the exporter's output. The fused order used to line the
learner's layers up with a vLLM layer comes from :func:`fp8rl_core.sampler.layout.fused_group`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from fp8rl_core.sampler.layout import fused_group

__all__ = ["CheckResult", "check_coverage", "check_derived_state", "check_grid_bytes", "check_precision",
           "check_version", "expected_sync_names"]


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

    def as_dict(self) -> dict:
        return {"condition": self.condition, "passed": self.passed, "measured": self.measured, "bound": self.bound,
                "offenders": self.offenders[:5], "count": self.count, "seconds": self.seconds, "detail": self.detail}


def check_version(engine_versions: list[int], learner_version: int) -> CheckResult:
    """W5: every worker of the engine reports the learner's version."""
    t0 = time.perf_counter()
    wrong = [f"rank{i}={v}" for i, v in enumerate(engine_versions) if v != learner_version]
    return CheckResult("W5", not wrong and bool(engine_versions), float(len(wrong)), 0.0, wrong, len(wrong),
                       time.perf_counter() - t0, f"learner version {learner_version}, engine {engine_versions}")


def check_grid_bytes(readback: dict[str, torch.Tensor], forward_weights: dict, schemes: dict[str, str],
                     learner_layers: list[str]) -> CheckResult:
    """W2: for every vLLM layer on the learner's grid, the engine's data and scale bytes equal the
    learner's rowwise forward operand, byte for byte. ``measured`` = number of differing bytes."""
    t0 = time.perf_counter()
    offenders: list[str] = []
    differing = 0
    for prefix, scheme in sorted(schemes.items()):
        if scheme != "mxfp8":
            continue
        members = fused_group(prefix, learner_layers)
        qts = [forward_weights[m] for m in members]
        if prefix.endswith(".experts"):
            pairs = [(f"{prefix}.w13_weight", qts[0].data), (f"{prefix}.w13_weight_scale", qts[0].scale),
                     (f"{prefix}.w2_weight", qts[1].data), (f"{prefix}.w2_weight_scale", qts[1].scale)]
        else:
            pairs = [(f"{prefix}.weight", torch.cat([q.data for q in qts])),
                     (f"{prefix}.weight_scale", torch.cat([q.scale for q in qts]))]
        for name, want in pairs:
            want = want.contiguous().view(torch.uint8)
            got = readback.get(name)
            if got is None or got.shape != want.shape:
                offenders.append(name)
                differing += want.numel()
                continue
            n = int((got.view(torch.uint8) != want).sum())
            if n:
                offenders.append(name)
                differing += n
    return CheckResult("W2", not offenders, float(differing), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, "differing bytes between engine and learner forward operands")


# ----------------------------------------------------------------------------------------------------
# W1 coverage, W4 precision, W6 derived state
# ----------------------------------------------------------------------------------------------------
#: read-back entries that are derived in the engine (not written by a sync)
DERIVED_SUFFIXES = (".fp8_data", ".fp8_scale_inv", ".w13_fp8_data", ".w13_fp8_scale_inv", ".w2_fp8_data",
                    ".w2_fp8_scale_inv", ".effective")


def expected_sync_names(learner_params: list[str], gemm_layers: list[str], schemes: dict[str, str]) -> set[str]:
    """The tensor names a complete sync must write, derived from the learner's parameters and the
    sampler's schemes (vLLM layer prefixes via :func:`fp8rl_core.sampler.layout.sampler_layer`)."""
    from fp8rl_core.sampler.layout import sampler_layer

    params = set(learner_params)
    names: set[str] = set()
    covered: set[str] = set()
    for layer in gemm_layers:
        pname = layer if layer in params else f"{layer}.weight"
        if pname not in params:  # a tied lm_head: written as the embedding
            continue
        covered.add(pname)
        prefix = sampler_layer(layer)
        on = schemes.get(prefix) == "mxfp8"
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


def check_coverage(engine_names: list[str], expected: set[str], engine_versions: list[int],
                   learner_version: int) -> CheckResult:
    """W1: the engine computes with exactly the tensors a sync writes (none missing, none extra), all
    at the learner's version. ``measured`` = missing + extra tensors."""
    t0 = time.perf_counter()
    held = {n for n in engine_names if not n.endswith(DERIVED_SUFFIXES)}
    missing = sorted(expected - held)
    extra = sorted(held - expected)
    stale = engine_versions != [learner_version] * len(engine_versions) or not engine_versions
    offenders = [f"missing {n}" for n in missing] + [f"extra {n}" for n in extra]
    if stale:
        offenders.append(f"versions {engine_versions} != {learner_version}")
    return CheckResult("W1", not offenders, float(len(missing) + len(extra)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, f"{len(held)} engine tensors vs {len(expected)} expected")


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
        n = int((got.float() != want.float()).sum())
        if n:
            offenders.append(name)
            differing += n
    on_engine = {p: s for p, s in engine_schemes.items() if s != "bf16"}
    wrong = sorted(set(on_engine.items()) ^ set(configured.items()))
    offenders += [f"grid of {p}: engine {on_engine.get(p, 'bf16')}, configured {configured.get(p, 'bf16')}"
                  for p in sorted({p for p, _ in wrong})]
    return CheckResult("W4", not offenders, float(differing + len(wrong)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, "off-grid tensors vs BF16 view; on-grid layer set vs config")


def check_derived_state(prefix_cache_blocks: int, processed_before: dict[str, int],
                        processed_after: dict[str, int]) -> CheckResult:
    """W6: after a sync the prefix cache is empty and post-load processing ran exactly once per layer."""
    t0 = time.perf_counter()
    offenders = [f"{p}: processed {processed_after.get(p, 0) - n} times" for p, n in sorted(processed_before.items())
                 if processed_after.get(p, 0) - n != 1]
    if prefix_cache_blocks:
        offenders.append(f"prefix cache holds {prefix_cache_blocks} blocks")
    return CheckResult("W6", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, "prefix cache blocks after the sync; processings per layer per sync")
