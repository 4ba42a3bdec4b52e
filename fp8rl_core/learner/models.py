"""The learner's policies: tiny Qwen3 dense and Qwen3-MoE models built from a :class:`ModelSpec`.

Rule: models cannot be downloaded here, so every policy is *built* — :func:`build_model` turns a YAML
spec (``configs/models/*.yaml``, rules in :mod:`fp8rl_core.learner.spec`) into a Hugging Face
``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` in float32 with weights drawn from a seed; what it sets
beyond the spec and the parameter names in memory and in the checkpoint are on :func:`build_model`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .spec import ModelSpec

if TYPE_CHECKING:  # transformers is imported where a model is built: a process that only drives runs never loads it
    from transformers import PreTrainedModel

__all__ = ["build_model"]


def build_model(spec: ModelSpec, seed: int) -> PreTrainedModel:
    """A freshly initialised float32 ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` for ``spec``.

    Weights follow transformers' own initialisation (normal(0, 0.02) for linear, embedding, expert and
    router weights; ones for RMSNorm) drawn from ``torch.manual_seed(seed)`` inside ``fork_rng``: the same
    seed gives bit-identical weights and the caller's global RNG state is left untouched. The model is
    returned in eval mode; ``save_pretrained`` writes a checkpoint transformers and vLLM can load.

    What the builder sets beyond the spec: eager attention (deterministic on CPU), float32, RoPE
    ``{"rope_type": "default", "rope_theta": spec.rope_theta}``, the task's special ids (PAD 0, BOS 1, EOS 2)
    and, for MoE, ``decoder_sparse_step=1``, ``mlp_only_layers=[]`` (every layer sparse),
    ``norm_topk_prob=True`` and ``output_router_logits=False`` (no auxiliary loss).

    Parameter names (transformers 5.x). In memory a MoE layer holds fused 3-D expert tensors::

        model.layers.N.mlp.experts.gate_up_proj   [E, 2·I, H]   (gate rows first, then up)
        model.layers.N.mlp.experts.down_proj      [E, H, I]
        model.layers.N.mlp.gate.weight            [E, H]        (the router)

    while ``save_pretrained`` writes the checkpoint names a Qwen3-MoE checkpoint (and vLLM) uses:
    ``model.layers.N.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight``. With
    ``tie_word_embeddings: true``, ``lm_head.weight`` *is* ``model.embed_tokens.weight`` (one storage) and
    the checkpoint holds only the embedding.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    config = spec.hf_config()
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    cls = Qwen3ForCausalLM if spec.kind == "dense" else Qwen3MoeForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.to(torch.float32)
    model.eval()
    return model
