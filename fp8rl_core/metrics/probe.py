"""The exact train–rollout divergence on a held-out probe batch, read from the live sampler and learner.

Where :mod:`.mismatch` estimates KL from the sampled tokens' log-probs, the probe measures it exactly:
the sampler's full-vocabulary prompt log-probs (from the live engine) against the learner's (from its
training forward) on the same fixed sequences, at the same weight version. Both restricted to the ids the
sampler can emit (the vocabulary tail's rule, :mod:`fp8rl_core.learner.vocab_tail`): the KL is the grid's, the
learner's mass beyond them is reported beside it (``tail_mass``), with the KL the learner's unrestricted
distribution gives (``full_kl_with_tail``: what verl's token KL, taken against the unrestricted actor, holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from fp8rl_core.learner.vocab_tail import restrict, tail_mass

from .mismatch import full_vocab_divergence
from .stats import cluster_bootstrap

if TYPE_CHECKING:
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.sampler.seam import Sampler

__all__ = ["probe_divergence", "probe_interval"]


def probe_divergence(sampler: Sampler, learner: Learner, sequences: torch.Tensor, emittable: int | None = None) -> dict:
    """Exact full-vocabulary KL(sampler‖learner), KL(learner‖sampler) and JS on a fixed probe batch
    (:func:`~fp8rl_core.metrics.mismatch.full_vocab_divergence`): the sampler's full prompt log-probs from
    the live engine vs the learner's from its training forward (:meth:`Learner.full_logprobs`) at the
    same weight version, both restricted to the ``emittable`` ids (None: the whole vocabulary). Returns the
    means (nats), the number of positions, ``tail_mass`` (the learner's mean probability beyond ``emittable``),
    ``full_kl_with_tail`` (KL(sampler‖learner) against the learner's unrestricted distribution; = ``full_kl``
    without a tail) and ``per_sequence``: one row per probe sequence (sequence index, positions, and the *sums*
    over its positions of kl, kl_rev, js — a (num, den) unit for bootstrap intervals and paired comparisons
    across presets)."""
    if sampler.version != learner.version:
        raise RuntimeError(f"probe KL: the sampler holds version {sampler.version}, the learner "
                           f"{learner.version}; sync first")
    s = sampler.prompt_logprobs(sequences, full=True)
    full = learner.full_logprobs(sequences)
    lrn = restrict(full, emittable)
    if emittable is not None:
        s = restrict(s, emittable)  # the engine's own mass beyond them is 0 (masked); renormalised for rounding
    d = full_vocab_divergence(s, lrn)
    with_tail = d["kl_sampler_learner_mean"]
    if emittable is not None:  # Σ p_s (log p_s − log q): the learner's log-probs over the head, unrestricted
        with_tail = with_tail - float(torch.log1p(-tail_mass(full, emittable).double()).mean())
    kl, kl_rev, js = (d[k].sum(dim=-1) for k in ("kl_sampler_learner", "kl_learner_sampler", "js"))
    rows = [{"sequence": i, "positions": int(s.shape[1]), "kl": float(kl[i]), "kl_rev": float(kl_rev[i]),
             "js": float(js[i])} for i in range(s.shape[0])]
    return {"full_kl": float(d["kl_sampler_learner_mean"]), "full_kl_rev": float(d["kl_learner_sampler_mean"]),
            "full_js": float(d["js_mean"]), "full_positions": int(d["positions"]),
            "tail_mass": float(tail_mass(full, emittable).mean()), "full_kl_with_tail": float(with_tail),
            "per_sequence": rows}


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
