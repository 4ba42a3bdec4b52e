"""W6's engine's-other-state result from the ranks' verdicts: passes when no rank names an offender, fails naming
each rank's offenders and the failing ranks, says which ranks did not run it, and is None when none did."""

from __future__ import annotations

import math

from transformers import Qwen3Config, Qwen3MoeConfig

from fp8rl_core.checks.engine_state import check_engine_config, check_engine_state, learner_counterparts


def _rank(rank: int, offenders=(), checked: int = 5) -> dict:
    return {"rank": rank, "tp": 2, "checked": checked, "offenders": list(offenders), "changing": {"kv_cache": "why"},
            "seconds": 0.25}


def test_the_ranks_verdicts_make_one_w6_result():
    assert check_engine_state([None, None]) is None
    ok = check_engine_state([_rank(0), _rank(1)])
    assert (ok.condition, ok.passed, ok.count, ok.failing_ranks) == ("W6", True, 0, [])
    assert ok.detail == ("engine's other state vs its engine start: 10 tensors (fingerprints) and 0 plain attributes "
                         "(values) on 2 ranks; declared as changing at a sync: kv_cache")
    assert ok.seconds >= 0.5
    bad = check_engine_state([_rank(0), _rank(1, ["tp rank 1/2: x.cos_sin_cache: changed …"]), None])
    assert (bad.passed, bad.measured, bad.offenders, bad.failing_ranks) == (
        False, 1.0, ["tp rank 1/2: x.cos_sin_cache: changed …"], [1])
    assert "; not run on 1 ranks" in bad.detail


DENSE = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6)


def test_the_learners_counterparts_are_what_its_config_json_says_dense_and_moe():
    dense = learner_counterparts(Qwen3Config(**DENSE, rope_parameters={"rope_type": "default", "rope_theta": 5e5}), 338)
    assert dense == {"rms_norm_eps": 1e-6, "head_dim": 32, "attention_scale": 32 ** -0.5, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 1024, "logit_soft_cap": None, "logit_scale": 1.0,
                     "emittable": 338, "rope_theta": 5e5}
    moe = learner_counterparts(Qwen3MoeConfig(**DENSE, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
                                              moe_intermediate_size=64))
    assert (moe["num_experts"], moe["num_experts_per_tok"], moe["norm_topk_prob"], moe["emittable"]) == (4, 2, False, None)


def _configured(rank: int, eps: float = 1e-6, top_k: int = 2) -> dict:
    return _rank(rank) | {"config": {"rms_norm_eps": [["model.layers.0.input_layernorm.variance_epsilon", 1e-6],
                                                      ["model.layers.1.input_layernorm.variance_epsilon", eps]],
                                     "num_experts_per_tok": [["model.layers.0.mlp.experts.top_k", top_k]],
                                     "attention_scale": [["model.layers.0.self_attn.scaling", 32 ** -0.5]],
                                     "not_a_learner_quantity": [["x.y", 3]]}}


def test_an_engine_attribute_unlike_the_learners_is_named_with_rank_module_attribute_and_both_values():
    want = learner_counterparts(Qwen3MoeConfig(**DENSE, num_experts=4, num_experts_per_tok=2,
                                               moe_intermediate_size=64))
    assert check_engine_config([_rank(0), None], want) is None  # no rank reported its configuration
    ok = check_engine_config([_configured(0), _configured(1)], want)
    assert (ok.condition, ok.passed, ok.failing_ranks) == ("W6", True, [])
    assert ok.detail == ("engine configuration vs the learner's: 8 attributes of 3 quantities (attention_scale, "
                         "num_experts_per_tok, rms_norm_eps) on 2 ranks")
    bad = check_engine_config([_configured(0), _configured(1, eps=1e-5, top_k=8)], want)
    assert (bad.passed, bad.failing_ranks, bad.offenders) == (False, [1], [
        "tp rank 1/2: model.layers.1.input_layernorm.variance_epsilon = 1e-05, the learner's rms_norm_eps is 1e-06",
        "tp rank 1/2: model.layers.0.mlp.experts.top_k = 8, the learner's num_experts_per_tok is 2"])
    # floats to 1e-9 relative: the same number computed another way is the same configuration
    near = _configured(0) | {"config": {"attention_scale": [["s", 1 / math.sqrt(32)]]}}
    assert check_engine_config([near], want).passed
