"""W2 on a sampler that requantizes: what a ``requant`` layer must hold, and how far that is from the learner.

Rule: a ``requant`` layer receives the BF16 view of the learner's fp32 masters and quantizes it itself with
vLLM's online MXFP8 rule (:data:`fp8rl_core.grids.schemes.REQUANT_GRID`). The bytes it must hold are
computed here from the learner — the rule applied to ``bf16(master)`` — and W2 compares the engine's bytes
with them exactly, so a fault on top of the requantization is still caught; how many of those bytes differ
from the learner's own quantization of the master (double rounding) is reported as a measured quantity,
overall and per layer kind, never as a failure. docs/correctness.md (W2).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fp8rl_core.grids import QuantizedTensor, bf16_view, quantize
from fp8rl_core.grids.schemes import REQUANT_GRID, scheme
from fp8rl_core.sync.layout import fused_group
from fp8rl_core.vocabulary import requant_column

from .basic import CheckResult, byte_offenders, differing_bytes

__all__ = ["LAYER_KINDS", "RequantDifference", "check_requant_bytes", "layer_kind", "requant_expected",
           "requant_measure"]

#: the layer kinds the byte differences are reported by
LAYER_KINDS: tuple[str, ...] = ("attention", "mlp", "experts")


def layer_kind(prefix: str) -> str:
    """The kind of a vLLM layer: ``experts`` (routed experts), ``attention`` (q/k/v, o), ``mlp`` (dense MLP)."""
    if prefix.endswith(".experts"):
        return "experts"
    return "attention" if ".self_attn." in prefix else "mlp"


@dataclass(frozen=True)
class RequantDifference:
    """Bytes of the requantized weights (the rule on the BF16 view) and how many differ from the learner's
    forward operand, per layer kind (``data``: E4M3 data bytes, ``scale``: E8M0 scale bytes)."""

    data: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind → (differing, total)
    scale: dict[str, tuple[int, int]] = field(default_factory=dict)

    @staticmethod
    def _fraction(counts: Mapping[str, tuple[int, int]], kind: str = "") -> float:
        pairs = [counts[kind]] if kind else list(counts.values())
        total = sum(t for _, t in pairs)
        return sum(d for d, _ in pairs) / total if total else 0.0

    def fraction(self, what: str, kind: str = "") -> float:
        """The differing fraction of ``what`` (``data`` or ``scale``) bytes, overall or of one kind."""
        return self._fraction(self.data if what == "data" else self.scale, kind)

    def metrics(self) -> dict[str, float]:
        """``requant/data_bytes_differ``, ``requant/scale_bytes_differ``, and per layer kind present."""
        if not self.data:
            return {}
        out = {requant_column("data_bytes_differ"): self.fraction("data"),
               requant_column("scale_bytes_differ"): self.fraction("scale")}
        for kind in (k for k in LAYER_KINDS if k in self.data):
            out[requant_column("data_bytes_differ", kind)] = self.fraction("data", kind)
            out[requant_column("scale_bytes_differ", kind)] = self.fraction("scale", kind)
        return out

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {self.fraction('data', k):.2%}/{self.fraction('scale', k):.2%}"
                          for k in LAYER_KINDS if k in self.data)
        return (f"requantized from BF16: {self.fraction('data'):.2%} of data bytes and {self.fraction('scale'):.2%} "
                f"of scale bytes differ from the learner's ({kinds})")


def _add(counts: dict[str, tuple[int, int]], kind: str, got: torch.Tensor, want: torch.Tensor) -> None:
    d, t = counts.get(kind, (0, 0))
    counts[kind] = (d + differing_bytes(got, want), t + got.numel())


def requant_expected(model: torch.nn.Module, forward_weights: Mapping[str, QuantizedTensor],
                     schemes: Mapping[str, str], learner_layers: list[str]
                     ) -> tuple[dict[str, torch.Tensor], RequantDifference]:
    """The bytes (uint8) every ``requant`` layer must hold, under the engine's read-back names
    (``<prefix>.mx_data`` / ``.mx_scale``; experts ``<prefix>.w13_mx_data`` …), and their difference
    from the learner's forward operands (members the learner keeps in BF16 are not compared)."""
    params = dict(model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    diff = RequantDifference()
    for prefix, name in sorted(schemes.items()):
        s = scheme(name)
        if not s.rule_checked:  # its own bytes are checked against its rule applied to the learner's BF16 view
            continue
        members = [m for m in fused_group(prefix, learner_layers) if (m if m in params else f"{m}.weight") in params]
        qts = {m: quantize(bf16_view(params[m if m in params else f"{m}.weight"].detach()).float(), s.rule,
                           axis=-1) for m in members}
        kind = layer_kind(prefix)
        for m, q in qts.items():
            own = forward_weights.get(m)
            if own is not None and own.data.shape == q.data.shape:
                _add(diff.data, kind, q.data, own.data)
                _add(diff.scale, kind, q.scale, own.scale)
        u8 = [(q.data.contiguous().view(torch.uint8), q.scale.contiguous().view(torch.uint8)) for q in qts.values()]
        data_name, scale_name = s.held
        if prefix.endswith(".experts"):
            (gu, gus), (down, downs) = u8
            out |= {f"{prefix}.w13_{data_name}": gu, f"{prefix}.w13_{scale_name}": gus,
                    f"{prefix}.w2_{data_name}": down, f"{prefix}.w2_{scale_name}": downs}
        else:
            out[f"{prefix}.{data_name}"] = torch.cat([d for d, _ in u8])
            out[f"{prefix}.{scale_name}"] = torch.cat([sc for _, sc in u8])
    return out, diff


def requant_measure(diff: RequantDifference) -> CheckResult:
    """W2's measured quantity on ``requant`` layers (a pass: the difference is what requantizing does; the
    engine's bytes against the computed ones are :func:`check_requant_bytes`' and the fingerprints')."""
    return CheckResult("W2", True, 0.0, 0.0, detail=diff.summary(), quantities=diff.metrics())


def check_requant_bytes(readback: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> CheckResult:
    """W2, full tier, ``requant`` layers: the engine's own data and scale bytes equal the rule applied to
    the learner's BF16 view (``expected``: :func:`requant_expected`), byte for byte. ``measured`` =
    differing bytes."""
    t0 = time.perf_counter()
    offenders, differing = byte_offenders(
        readback, expected,
        lambda name, n, total: f"{name} ({n} of {total} bytes differ from {REQUANT_GRID} of the learner's BF16 view)")
    return CheckResult("W2", not offenders, float(differing), 0.0, offenders, len(offenders), time.perf_counter() - t0,
                       f"differing bytes between the engine's requantization and {REQUANT_GRID} of the learner's "
                       "BF16 view")
