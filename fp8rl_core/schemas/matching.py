"""The fixed-weights matching tables, each rule naming what it protects (docs/metrics.md, tables).

``matching``: one row per (checkpoint, variant, probe source, sequence), the sums over the sequence's counted
positions of the exact KL both ways and JS (:func:`fp8rl_core.matching.measure`). ``matching_checks``: one row
per (checkpoint, variant) sync with W1–W7's verdicts (``check/W…``: 1 passed, 0 failed) and a requant
sampler's measured byte fractions. ``matching_engines``: one row per (checkpoint, variant on another engine than
vLLM, probe source, sequence) the same sums between that engine's and its vLLM twin's distributions.
"""

from __future__ import annotations

import math

from fp8rl_core.sampler.config import SAMPLER_ENGINES

from .dsl import (CHECK_COLUMNS, FINITE, NONEMPTY, REQUANT_COLUMNS, Table, between, col, constant_per, ge, isin, num,
                  pattern, rule, unique)

__all__ = ["MATCHING", "MATCHING_CHECKS", "MATCHING_ENGINES", "SOURCES"]

#: where a probe sequence comes from: the task's held-out split (shared by every variant) or the variant's
#: own engine (one completion per probe prompt, one sampling seed)
SOURCES = ("held-out", "sampled")

_WHERE = {
    "run_id": col("str", NONEMPTY, required=False, doc="the matching run's id (added when read back)"),
    "checkpoint": col("str", NONEMPTY, doc="which weights: seed<k>/step<n>, or a named checkpoint's name "
                      "(<verl run folder>/step<n>, an HF directory's name)"),
    "seed": col("int", ge(0, "a seed"), doc="the warm start's seed (a named checkpoint: the run's, which draws the probes)"),
    "step": col("int", ge(0, "RL steps from the warm start"), doc="RL steps from the warm start (0: the warm start); a "
                "named checkpoint's verl global step (0: a plain HF directory)"),
    "variant": col("str", NONEMPTY, doc="the sampler configuration (fp8rl_core.matching.Variant.name)"),
    "preset": col("str", NONEMPTY, doc="its preset"),
    "ablation": col("bool", doc="a switch differs from the preset as runs configure it"),
}


def _divergences(p: str, q: str) -> dict:
    """A probe sequence's columns: its row, counted positions, and the sums over them of KL(p‖q), KL(q‖p), JS."""
    return {
        "sequence": col("int", ge(0, "a row index"), doc="row of the probe set (of its source)"),
        "positions": col("int", ge(1, "a probe sequence scores at least one next token"), doc="counted positions"),
        "kl": col("float", ge(0, "an exact KL divergence (a sum of them)"), FINITE, doc=f"Σ of KL({p}‖{q})"),
        "kl_rev": col("float", ge(0, "an exact KL divergence (a sum of them)"), doc=f"Σ of KL({q}‖{p})"),
        "js": col("float", ge(0, "a Jensen–Shannon divergence (a sum of them)"), FINITE, doc="Σ of JS"),
    }


#: the rules of a table of per-sequence divergences
_PER_SEQUENCE = (
    unique("checkpoint", "variant", "source", "sequence", optional=("run_id",), what="one row per sequence"),
    rule("js ≤ ln 2 per position", "'js' must be ≤ ln 2 × 'positions' (JS is bounded by ln 2 nats per position)",
         ("js", "positions"), lambda d: num(d, "js") > math.log(2) * num(d, "positions") + 1e-9),
)

MATCHING = Table("matching", {
    **_WHERE,
    "engine_dtype": col("str", isin(("bfloat16", "float32")), doc="the engine's compute dtype"),
    "learner_forward": col("str", isin(("training", "fp32")), doc="the learner side: training forward or fp32"),
    "activation_rule": col("str", doc="the sampler's activation E8M0 rule ('': the learner's)"),
    "source": col("str", isin(SOURCES), doc="held-out task sequence or the variant's own rollout"),
    **_divergences("sampler", "learner"),
}, (
    *_PER_SEQUENCE,
    constant_per(["variant"], "preset", "a variant has one preset"),
    constant_per(["checkpoint"], "step", "a checkpoint has one step"),
), "exact full-vocabulary divergences per probe sequence, variant and checkpoint (matching.measure)")

MATCHING_CHECKS = Table("matching_checks", {
    **_WHERE,
    "version": col("int", ge(1, "a weight version"), doc="the version the sync carried"),
    "passed": col("bool", doc="every condition held"),
    "failed": col("str", doc="the conditions that failed, comma-joined ('' when none)"),
    "detail": col("str", doc="what failed, in words ('' when none)"),
    CHECK_COLUMNS: pattern("float", between(0, 1, "a verdict: 1 passed, 0 failed"), doc="each condition's verdict"),
    REQUANT_COLUMNS: pattern("float", between(0, 1, "a fraction of bytes"), doc="a requant sampler's W2 fractions"),
    "tail_mass": col("float", between(0, 1, "a probability"), required=False,
                     doc="the learner's mass beyond the sampler's tokenizer on W7's probe batch (0: no tail)"),
}, (
    unique("checkpoint", "variant", optional=("run_id",), what="one sync per checkpoint and variant"),
    rule("passed ⇔ nothing failed", "'passed' must be True exactly when 'failed' is empty", ("passed", "failed"),
         lambda d: d["passed"].astype(bool) != (d["failed"].fillna("").astype(str).str.len() == 0)),
), "W1–W7 of every fixed-weights sync (matching.measure)")

MATCHING_ENGINES = Table("matching_engines", {
    **{k: v for k, v in _WHERE.items() if k != "ablation"},
    "variant": col("str", NONEMPTY, doc="the variant on another engine (fp8rl_core.matching.Variant.name: bf16-sampler@sglang)"),
    "reference": col("str", NONEMPTY, doc="its twin on vLLM: the same variant, engine vllm"),
    "engine": col("str", isin(SAMPLER_ENGINES[1:]), doc="the variant's engine"),
    "reference_engine": col("str", isin(SAMPLER_ENGINES[:1]), doc="the twin's engine"),
    "rollouts": col("str", NONEMPTY, doc="whose rollouts the sampled rows score: the one of the two measured first"),
    "source": col("str", isin(SOURCES), doc="held-out task sequence or the rollouts of 'rollouts'"),
    **_divergences("variant's engine", "vLLM"),
}, (
    *_PER_SEQUENCE,
    constant_per(["variant"], "reference", "a variant has one vLLM twin"),
    constant_per(["checkpoint"], "step", "a checkpoint has one step"),
), "exact full-vocabulary divergences between two engines serving one variant, per probe sequence and checkpoint "
   "(matching.measure)")
