"""The first checks: one weight version everywhere (W5) and the learner's FP8 bytes in the engine (W2).

Both read the *live engine* (the worker's reported version, the bytes it holds, read back) and compare
with what the *learner* holds — never with the exporter's output. The fused order used to line the
learner's layers up with a vLLM layer comes from :func:`fp8rl_core.sampler.layout.fused_group`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from fp8rl_core.sampler.layout import fused_group

__all__ = ["CheckResult", "check_grid_bytes", "check_version"]


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
