"""The attributes of SGLang's Qwen3 and Qwen3-MoE modules that have a counterpart in the learner's config (as
:mod:`fp8rl_core.sampler.vllm.attributes` for vLLM; SGLang 0.5.12's names, read in its sources: ``RMSNorm``
(``layers/layernorm.py``), the rotary embedding (``layers/rotary_embedding/base.py``), ``Qwen3Attention``
(``models/qwen3.py``), ``LogitsProcessor`` (``layers/logits_processor.py``)). SGLang keeps an MoE router's top-k
and renormalisation in a dataclass (``TopK.topk_config``), not as plain attributes: not compared here.
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
    ("LogitsProcessor", "vocab_size"): "vocab_size",
    ("LogitsProcessor", "final_logit_softcapping"): "logit_soft_cap",
}
