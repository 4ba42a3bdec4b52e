"""The vLLM naming of the learner's weights: learner layers → vLLM layers, fused tensors ↔ checkpoint shards.

Rule: vLLM's Qwen3 / Qwen3-MoE fuse q|k|v, gate|up and each expert's gate|up (``w13``, gate rows first)
in the order of their weight loaders; a sync tensor is named by the vLLM layer prefix plus the parameter,
and :func:`to_checkpoint` splits it back into the shards vLLM's ``load_weights`` reads. Shared by the
exporter, the sampler's engine and worker and the checks, so it lives below all of them. Specified in
docs/library.md (Learner → vLLM names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

__all__ = [
    "ModelLayout",
    "fused_group",
    "sampler_layer",
    "sync_name",
    "to_checkpoint",
]

_FUSE = (
    (re.compile(r"^(.*\.self_attn)\.[qkv]_proj$"), r"\1.qkv_proj"),
    (re.compile(r"^(.*\.mlp)\.(gate|up)_proj$"), r"\1.gate_up_proj"),
    (re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$"), r"\1"),
)


def sampler_layer(learner_layer: str) -> str:
    """The vLLM layer prefix that computes with the learner GEMM layer ``learner_layer``."""
    for pat, repl in _FUSE:
        if pat.match(learner_layer):
            return pat.sub(repl, learner_layer)
    return learner_layer


def fused_group(sampler_prefix: str, learner_layers: Iterable[str]) -> list[str]:
    """The learner layers that make up one vLLM layer, in the fused order."""
    members = [n for n in learner_layers if sampler_layer(n) == sampler_prefix]
    order = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1, "gate_up_proj": 0, "down_proj": 1}
    return sorted(members, key=lambda n: order.get(n.rsplit(".", 1)[-1], 0))


@dataclass(frozen=True)
class ModelLayout:
    """The sizes that split fused tensors, from a Hugging Face config (dict or object)."""

    q_size: int
    kv_size: int
    intermediate_size: int
    moe_intermediate_size: int | None
    num_experts: int | None
    tie_word_embeddings: bool
    #: per-head size and vocabulary: what tensor-parallel slicing needs (:mod:`fp8rl_core.sync.ranks`)
    head_dim: int | None = None
    vocab_size: int | None = None

    @classmethod
    def from_hf_config(cls, cfg: Mapping | object) -> "ModelLayout":
        get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d=None: getattr(cfg, k, d))
        head_dim = get("head_dim") or get("hidden_size") // get("num_attention_heads")
        return cls(
            q_size=get("num_attention_heads") * head_dim,
            kv_size=get("num_key_value_heads") * head_dim,
            intermediate_size=get("intermediate_size"),
            moe_intermediate_size=get("moe_intermediate_size"),
            num_experts=get("num_experts"),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            head_dim=head_dim,
            vocab_size=get("vocab_size"),
        )


def _split_rows(name: str, t: torch.Tensor, sizes: list[int], dim: int) -> list[torch.Tensor]:
    if t.shape[dim] != sum(sizes):
        raise ValueError(
            f"sync tensor {name!r} has {t.shape[dim]} rows along dim {dim}, but the model config's "
            f"fused sizes are {sizes} (sum {sum(sizes)})"
        )
    return list(torch.split(t, sizes, dim=dim))


def to_checkpoint(name: str, tensor: torch.Tensor, layout: ModelLayout) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint-format shards (HF names) of one sync tensor; unfused tensors pass through unchanged."""
    prefix, _, param = name.rpartition(".")
    if param.startswith(("w13_", "w2_")) and prefix.endswith(".experts"):
        w, suffix = param.split("_", 1)  # suffix: weight | weight_scale
        i = layout.moe_intermediate_size
        for e in range(tensor.shape[0]):
            if w == "w13":
                gate, up = _split_rows(name, tensor[e], [i, i], 0)
                yield f"{prefix}.{e}.gate_proj.{suffix}", gate
                yield f"{prefix}.{e}.up_proj.{suffix}", up
            else:
                yield f"{prefix}.{e}.down_proj.{suffix}", tensor[e]
        return
    # the parameter may itself contain a dot-free suffix such as weight_scale
    m = re.match(r"^(.*)\.(qkv_proj|gate_up_proj)\.(\w+)$", name)
    if m is None:
        yield name, tensor
        return
    base, fused, suffix = m.groups()
    if fused == "qkv_proj":
        parts = _split_rows(name, tensor, [layout.q_size, layout.kv_size, layout.kv_size], 0)
        for shard, t in zip(("q_proj", "k_proj", "v_proj"), parts):
            yield f"{base}.{shard}.{suffix}", t
    else:
        parts = _split_rows(name, tensor, [layout.intermediate_size] * 2, 0)
        for shard, t in zip(("gate_proj", "up_proj"), parts):
            yield f"{base}.{shard}.{suffix}", t


_TO_SYNC = (
    (re.compile(r"^(.*\.mlp\.experts)\.\d+\.(?:gate|up)_proj\.(\w+)$"), r"\1.w13_\2"),
    (re.compile(r"^(.*\.mlp\.experts)\.\d+\.down_proj\.(\w+)$"), r"\1.w2_\2"),
    (re.compile(r"^(.*\.self_attn)\.[qkv]_proj\.(\w+)$"), r"\1.qkv_proj.\2"),
    (re.compile(r"^(.*\.mlp)\.(?:gate|up)_proj\.(\w+)$"), r"\1.gate_up_proj.\2"),
)


def sync_name(checkpoint_name: str) -> str:
    """The sync tensor a checkpoint-format shard belongs to (the names :func:`to_checkpoint` maps back):
    ``…self_attn.k_proj.weight_scale`` → ``…self_attn.qkv_proj.weight_scale``,
    ``…mlp.experts.3.up_proj.weight`` → ``…mlp.experts.w13_weight``; unfused names stay."""
    for pat, repl in _TO_SYNC:
        if pat.match(checkpoint_name):
            return pat.sub(repl, checkpoint_name)
    return checkpoint_name
