"""The attributes of SGLang's Qwen3 and Qwen3-MoE modules that have a counterpart in the learner's config (as
:mod:`fp8rl_core.sampler.vllm.attributes` for vLLM; SGLang 0.5.12's names, read in its sources: ``RMSNorm``
(``layers/layernorm.py``), the rotary embedding (``layers/rotary_embedding/base.py``), ``Qwen3Attention``
(``models/qwen3.py``), ``LogitsProcessor`` (``layers/logits_processor.py``)). SGLang keeps an MoE router's top-k
and renormalisation in a dataclass (``TopK.topk_config``), not as plain attributes: not compared here.
"""

from __future__ import annotations

from fp8rl_core.sampler.engine_state import SHARED_COUNTERPARTS

__all__ = ["COUNTERPARTS"]

#: (module class name, a regular expression; attribute) → the learner's quantity it must equal: the names vLLM and
#: SGLang share (:data:`~fp8rl_core.sampler.engine_state.SHARED_COUNTERPARTS`) and this engine's own
COUNTERPARTS: dict[tuple[str, str], str] = SHARED_COUNTERPARTS | {
    ("LogitsProcessor", "vocab_size"): "vocab_size",
    ("LogitsProcessor", "final_logit_softcapping"): "logit_soft_cap",
}
