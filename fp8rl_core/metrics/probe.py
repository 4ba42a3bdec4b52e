"""The exact train–rollout divergence on a held-out probe batch, read from the live sampler and learner.

Where :mod:`.mismatch` estimates KL from the sampled tokens' log-probs, the probe measures it exactly:
the sampler's full-vocabulary prompt log-probs (from the live engine) against the learner's (from its
training forward) on the same fixed sequences, at the same weight version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from .mismatch import full_vocab_divergence
from .stats import cluster_bootstrap

if TYPE_CHECKING:
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.sampler.seam import Sampler

__all__ = ["probe_divergence", "probe_interval"]


def probe_divergence(sampler: Sampler, learner: Learner, sequences: torch.Tensor) -> dict:
    """Exact full-vocabulary KL(sampler‖learner), KL(learner‖sampler) and JS on a fixed probe batch
    (:func:`~fp8rl_core.metrics.mismatch.full_vocab_divergence`): the sampler's full prompt log-probs from
    the live engine vs the learner's from its training forward (:meth:`Learner.full_logprobs`) at the
    same weight version. Returns the means (nats), the number of positions and ``per_sequence``: one row
    per probe sequence (sequence index, positions, and the *sums* over its positions of kl, kl_rev, js — a
    (num, den) unit for bootstrap intervals and paired comparisons across presets)."""
    if sampler.version != learner.version:
        raise RuntimeError(f"probe KL: the sampler holds version {sampler.version}, the learner "
                           f"{learner.version}; sync first")
    s = sampler.prompt_logprobs(sequences, full=True)
    lrn = learner.full_logprobs(sequences)
    d = full_vocab_divergence(s, lrn)
    kl, kl_rev, js = (d[k].sum(dim=-1) for k in ("kl_sampler_learner", "kl_learner_sampler", "js"))
    rows = [{"sequence": i, "positions": int(s.shape[1]), "kl": float(kl[i]), "kl_rev": float(kl_rev[i]),
             "js": float(js[i])} for i in range(s.shape[0])]
    return {"full_kl": float(d["kl_sampler_learner_mean"]), "full_kl_rev": float(d["kl_learner_sampler_mean"]),
            "full_js": float(d["js_mean"]), "full_positions": int(d["positions"]), "per_sequence": rows}


def probe_interval(per_sequence: Sequence[Mapping], *, n_boot: int, level: float, seed: int) -> dict[str, float]:
    """What a run's exact probe KL rests on and its interval, from :func:`probe_divergence`'s ``per_sequence``
    rows: ``full_sequences`` (probe sequences) and, when ``n_boot`` > 0, ``full_kl_lo`` / ``full_kl_hi`` — the
    ``level`` percentile bootstrap interval over probe sequences of Σkl / Σpositions (the run's ``full_kl``)."""
    out = {"full_sequences": float(len(per_sequence))}
    if n_boot > 0 and per_sequence:
        iv = cluster_bootstrap([float(r["kl"]) for r in per_sequence], [float(r["positions"]) for r in per_sequence],
                               n_boot=n_boot, level=level, seed=seed)
        out |= {"full_kl_lo": float(iv.lo), "full_kl_hi": float(iv.hi)}
    return out
