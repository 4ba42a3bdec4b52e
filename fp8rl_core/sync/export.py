"""Export: the learner's state in the sampler's names and layout, per the sampler's grid of each layer.

Rule: an ``mxfp8`` layer gets the learner's forward weights (rowwise MXFP8 bytes and E8M0 scales, never
requantized: W2), every other tensor the learner's BF16 view (round-to-nearest-even of the fp32 master:
W4); names and fused order from :mod:`fp8rl_core.sync.layout`; a tied ``lm_head`` is sent once. In full
on :func:`export_weights`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn as nn

from fp8rl_core.grids import QuantizedTensor, bf16_view
from fp8rl_core.grids.schemes import Sent, layer_scheme
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.sync.layout import fused_group, sampler_layer

__all__ = ["export_weights", "SyncError"]


class SyncError(ValueError):
    """The learner's state cannot be exported for this sampler (wrong layer set, missing operands)."""


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def export_weights(
    model: nn.Module,
    forward_weights: Mapping[str, QuantizedTensor],
    schemes: Mapping[str, str],
) -> dict[str, torch.Tensor]:
    """Sync tensors (name → CPU tensor) for a sampler with ``schemes`` (vLLM prefix → scheme).

    ``forward_weights`` is the learner's rowwise MXFP8 operand per on-grid learner layer. A layer the
    sampler wants on the learner's grid must be on it in the learner (else :class:`SyncError`: the
    sampler would have to quantize it itself, which is a different grid).

    For every vLLM layer (see :mod:`fp8rl_core.sync.layout`) the sampler's scheme decides what is sent
    (:attr:`fp8rl_core.grids.schemes.Scheme.sent`):

    ``mxfp8`` (on the learner's grid)
        the learner's *forward weights* — the rowwise MXFP8 operand of the fprop GEMM
        (:meth:`Learner.forward_weights`), as uint8 views: ``weight`` = E4M3 bit patterns, ``weight_scale``
        = E8M0 bytes (1×32 blocks along K). Fused layers concatenate their members' rows in vLLM's order
        (rowwise 1×32 blocks never straddle rows, so concatenating the quantized members is byte-equal to
        quantizing the concatenation). W2: never requantized on the way.
    ``bf16``, ``requant`` and ``block128``
        the learner's BF16 view: round-to-nearest-even BF16 of each fp32 master weight (``requant`` and ``block128``
        samplers requantize it themselves, in the plugin, as verl's FP8 rollout does).

    Everything that is not a GEMM layer — embeddings, norms, and the MoE router unless a sampler puts it
    on a grid — goes as the BF16 view. A tied ``lm_head`` is the embedding and is sent once, as
    ``model.embed_tokens.weight`` (vLLM ties the two the same way).
    """
    params = dict(model.named_parameters())  # shared (tied) parameters appear once
    gemms = gemm_layers(model)
    by_prefix: dict[str, list[str]] = {}
    for layer in gemms:
        if _param_name(params, layer) not in params:  # a tied lm_head: the embedding, sent as such
            if layer_scheme(schemes, layer).quantized:
                raise SyncError(f"{layer!r} is tied to the embeddings and stays BF16; it cannot be on a grid")
            continue
        by_prefix.setdefault(sampler_layer(layer), []).append(layer)
    unknown = sorted(set(schemes) - set(by_prefix))
    if unknown:
        raise SyncError(f"sampler layers {unknown} are not layers of this model; valid: {sorted(by_prefix)[:6]} …")

    out: dict[str, torch.Tensor] = {}
    covered: set[str] = set()
    for prefix, members in by_prefix.items():
        members = fused_group(prefix, members)
        experts = prefix.endswith(".experts")
        if layer_scheme(schemes, prefix).sent is Sent.BYTES:
            missing = [m for m in members if m not in forward_weights]
            if missing:
                raise SyncError(
                    f"sampler layer {prefix!r} is on the learner's grid, but the learner keeps {missing} in BF16; "
                    f"put them on the learner's grid too, or give the sampler another scheme (bf16, block128)"
                )
            qts = [forward_weights[m] for m in members]
            if experts:
                gu, down = qts
                out[f"{prefix}.w13_weight"], out[f"{prefix}.w13_weight_scale"] = _u8(gu.data), gu.scale.contiguous()
                out[f"{prefix}.w2_weight"], out[f"{prefix}.w2_weight_scale"] = _u8(down.data), down.scale.contiguous()
            else:
                out[f"{prefix}.weight"] = torch.cat([_u8(q.data) for q in qts], 0)
                out[f"{prefix}.weight_scale"] = torch.cat([q.scale for q in qts], 0).contiguous()
        else:
            views = [bf16_view(_param(params, m).detach()) for m in members]
            if experts:
                out[f"{prefix}.w13_weight"], out[f"{prefix}.w2_weight"] = views
            else:
                out[f"{prefix}.weight"] = torch.cat(views, 0) if len(views) > 1 else views[0]
        covered.update(_param_name(params, m) for m in members)
    for name, p in params.items():
        if name not in covered:
            out[name] = bf16_view(p.detach())
    return out


def _param_name(params: Mapping[str, nn.Parameter], layer: str) -> str:
    return layer if layer in params else f"{layer}.weight"


def _param(params: Mapping[str, nn.Parameter], layer: str) -> torch.Tensor:
    name = _param_name(params, layer)
    if name not in params:
        raise SyncError(f"learner layer {layer!r} has no parameter {name!r}")
    return params[name]
