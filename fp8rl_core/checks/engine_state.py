"""W6, the engine's other state: on every rank of every replica, every tensor the model computes with that no
sync writes (buffers, caches built at load, tensor attributes) and every plain attribute of its modules is as it
was when the engine started; and the attributes that have a counterpart in the learner's config (a norm's eps,
the rope base, the attention scale and head dim, the heads, MoE top-k, renormalisation and experts, the
vocabulary, a logit soft cap or scale, the vocabulary tail's limit) equal the learner's (:func:`check_engine_config`).

Rule: each rank compares its own tensors with the fingerprints it recorded at the engine's start
(:mod:`fp8rl_core.sampler.engine_state`, in the cheap tier's snapshot: every sync) and sends only its verdict;
this module makes one result of the ranks' verdicts. The tensors that legitimately change at a sync are
declared in :data:`fp8rl_core.sampler.engine_state.CHANGES_AT_SYNC`. docs/correctness.md (The engine's other
state).
"""

from __future__ import annotations

import math
import time
from typing import Any

from .basic import CheckResult

__all__ = ["check_engine_config", "check_engine_state", "learner_counterparts"]


def check_engine_state(reports: list[dict | None]) -> CheckResult | None:
    """W6, the engine's other state, from the ranks' verdicts (``reports``: each rank's ``engine_state`` of its
    snapshot, :func:`fp8rl_core.sampler.engine_state.compare`; ``None`` for a rank that did not run it). Fails
    naming each rank, tensor and first differing element; ``count`` = offenders; ``failing_ranks`` the ranks
    with one. Ranks that did not run it are named in ``detail``; ``None`` when no rank ran it."""
    t0 = time.perf_counter()
    ran = [r for r in reports if r is not None]
    if not ran:
        return None
    offenders = [o for r in ran for o in r["offenders"]]
    detail = (f"engine's other state vs its engine start: {sum(r['checked'] for r in ran)} tensors (fingerprints) "
              f"and {sum(r.get('attributes', 0) for r in ran)} plain attributes (values) on {len(ran)} ranks")
    if len(ran) < len(reports):
        detail += f"; not run on {len(reports) - len(ran)} ranks"
    changing = sorted({p for r in ran for p in r.get("changing", {})})
    if changing:
        detail += f"; declared as changing at a sync: {', '.join(changing)}"
    return CheckResult("W6", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0 + sum(r["seconds"] for r in ran), detail,
                       sorted({int(r["rank"]) for r in ran if r["offenders"]}))


def learner_counterparts(config: Any, emittable: int | None = None) -> dict[str, Any]:
    """The quantities an engine's attributes are compared with, from the learner's Hugging Face ``config`` (the
    model the learner built from the same ``config.json``) and the run's vocabulary limit ``emittable``: what the
    learner computes with. A quantity the model does not have (a dense model's top-k) is absent."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if isinstance(rope.get("full_attention"), dict):  # per layer type: one for all
        rope = rope["full_attention"]
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    out = {"rms_norm_eps": float(config.rms_norm_eps), "head_dim": head_dim, "attention_scale": head_dim ** -0.5,
           "num_attention_heads": heads, "num_key_value_heads": int(config.num_key_value_heads),
           "vocab_size": int(config.vocab_size), "logit_soft_cap": getattr(config, "final_logit_softcapping", None),
           "logit_scale": 1.0, "emittable": emittable}
    if theta is not None:
        out["rope_theta"] = float(theta)
    experts = getattr(config, "num_experts", None)
    if experts:
        out |= {"num_experts": int(experts), "num_experts_per_tok": int(config.num_experts_per_tok),
                "norm_topk_prob": bool(getattr(config, "norm_topk_prob", False))}
    return out


def _same(engine: Any, learner: Any) -> bool:
    if isinstance(engine, float) or isinstance(learner, float):
        return engine is not None and learner is not None and math.isclose(float(engine), float(learner), rel_tol=1e-9)
    return engine == learner


def check_engine_config(reports: list[dict | None], expected: dict[str, Any]) -> CheckResult | None:
    """W6, the engine configured like its learner: every attribute each rank reported for a quantity of its engine's
    table (the ``config`` of its verdict, :func:`fp8rl_core.sampler.engine_state.compare`) equals the learner's
    ``expected`` value (:func:`learner_counterparts`; floats to 1e-9 relative). Fails naming rank, module,
    attribute and both values; ``None`` when no rank reported any."""
    t0 = time.perf_counter()
    ran = [r for r in reports if r is not None and "config" in r]
    if not ran:
        return None
    offenders, compared, quantities = [], 0, set()
    for r in ran:
        for quantity, values in r["config"].items():
            if quantity not in expected:
                continue
            quantities.add(quantity)
            for name, value in values:
                compared += 1
                if not _same(value, expected[quantity]):
                    offenders.append(f"tp rank {r['rank']}/{r['tp']}: {name} = {value!r}, the learner's {quantity} is "
                                     f"{expected[quantity]!r}")
    detail = (f"engine configuration vs the learner's: {compared} attributes of {len(quantities)} quantities "
              f"({', '.join(sorted(quantities))}) on {len(ran)} ranks")
    return CheckResult("W6", not offenders, float(len(offenders)), 0.0, offenders, len(offenders),
                       time.perf_counter() - t0, detail,
                       sorted({int(o.split("/")[0].removeprefix("tp rank ")) for o in offenders}))
