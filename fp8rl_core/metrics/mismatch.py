"""Train–rollout mismatch: per-token estimators on sampled tokens, per-sequence tables, and exact
full-vocabulary divergences.

Rule: every token estimator is a function of ``log r = log l(y_t) − log s(y_t)`` on tokens sampled from
the sampler ``s`` and scored by the learner ``l`` with the same weights (:func:`_token_terms` gives the
formulas: Schulman's k1/k2/k3, http://joschu.net/blog/kl-approx.html, and their importance-weighted
reverses); token means are ratios of per-sequence sums, so intervals resample sequences
(:func:`metric_units`). Inputs are validated, arithmetic is float64. NeMo-RL's per-step
``token_mult_prob_error`` and ``gen_kl_error`` by its own definitions: :func:`token_mult_prob_error`,
:func:`gen_kl_error` (these check shapes only). The metric names, their definitions and how they map onto verl,
NeMo-RL and slime: docs/metrics.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fp8rl_core.vocabulary import LOGPROB_TOL

__all__ = [
    "SEQ_LOG_RATIO_CLAMP",
    "TOKEN_METRICS",
    "SEQUENCE_METRICS",
    "kl_estimators",
    "summarize_steps",
    "token_mismatch",
    "sequence_table",
    "metric_units",
    "from_padded",
    "full_vocab_divergence",
    "GEN_KL_TYPES",
    "NEMO_STEP_METRICS",
    "token_mult_prob_error",
    "gen_kl_error",
    "nemo_step_numbers",
]

#: |Σ_t log r_t| is clamped to this before exponentiating for ``chi2_seq`` (verl's SAFETY_BOUND).
SEQ_LOG_RATIO_CLAMP = 20.0

#: token-mean metrics: name → per-sequence sum column in :func:`sequence_table` (denominator: ``tokens``)
TOKEN_METRICS: dict[str, str] = {
    "k1": "sum_k1", "k2": "sum_k2", "k3": "sum_k3",
    "k1_rev": "sum_k1_rev", "k2_rev": "sum_k2_rev", "k3_rev": "sum_k3_rev",
    "mean_abs_logprob_diff": "sum_abs_logprob_diff", "mean_abs_prob_diff": "sum_abs_prob_diff",
    "token_mult_prob_error": "sum_token_mult_prob_error", "chi2_token": "sum_chi2_token",
}
#: sequence-mean metrics: name → per-sequence value column (each sequence weighs 1)
SEQUENCE_METRICS: dict[str, str] = {
    "chi2_seq": "chi2_seq", "log_ppl_diff": "log_ppl_diff", "log_ppl_abs_diff": "abs_log_ppl_diff",
}


# ---------------------------------------------------------------------------------------------- inputs

def _as_f64_1d(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        a = x.detach().to("cpu", torch.float64).numpy()
    else:
        a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be one log-prob per token (1-D), got shape {tuple(a.shape)}")
    return a


def _check_logprobs(a: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} has {int(bad.sum())} non-finite log-probs (first {a[i]} at token {i}): a sampled "
                         "token must have a finite log-prob under both sides")
    pos = a > LOGPROB_TOL
    if pos.any():
        i = int(np.flatnonzero(pos)[0])
        raise ValueError(f"{name} has {int(pos.sum())} positive log-probs (first {a[i]} at token {i}): "
                         "log-probs are ≤ 0 — were probabilities passed?")


def _token_pair(sampler_logprobs: Any, learner_logprobs: Any) -> tuple[np.ndarray, np.ndarray]:
    s = _as_f64_1d(sampler_logprobs, "sampler_logprobs")
    lrn = _as_f64_1d(learner_logprobs, "learner_logprobs")
    if s.size == 0:
        raise ValueError("sampler_logprobs is empty: no tokens to estimate the mismatch from")
    if lrn.size == 0:
        raise ValueError("learner_logprobs is empty: no tokens to estimate the mismatch from")
    if s.shape != lrn.shape:
        raise ValueError(f"log-prob columns differ in length: sampler_logprobs {s.size} vs learner_logprobs {lrn.size}")
    _check_logprobs(s, "sampler_logprobs")
    _check_logprobs(lrn, "learner_logprobs")
    return s, lrn


def _seq_index(seq_ids: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys [S] or [S, K], inverse [n]) for per-token sequence ids of shape [n] or [n, K]."""
    ids = seq_ids.detach().cpu().numpy() if isinstance(seq_ids, torch.Tensor) else np.asarray(seq_ids)
    if ids.size == 0:
        raise ValueError("seq_ids is empty: every token needs the id of its sequence")
    if ids.ndim not in (1, 2) or ids.shape[0] != n:
        raise ValueError(f"seq_ids must have shape [{n}] or [{n}, K] (one id or key row per token), "
                         f"got {tuple(ids.shape)}")
    if ids.dtype.kind not in "iub":
        raise ValueError(f"seq_ids must be integers (e.g. columns step, sequence), got dtype {ids.dtype}")
    keys, inv = np.unique(ids, axis=0, return_inverse=True)
    return keys, inv.reshape(-1)


def _token_terms(s: np.ndarray, lrn: np.ndarray) -> dict[str, np.ndarray]:
    """Every per-token quantity, float64, one entry per token, with ``log r = lrn − s`` and ``r = l/s``.

    KL(sampler ‖ learner), Schulman's estimators with his ``q = s`` (the sampling distribution), ``p = l``::

        k1 = −log r                   unbiased, high variance, can be negative per token
        k2 = (log r)² / 2             biased (exact to second order in log r), low variance, ≥ 0
        k3 = (r − 1) − log r          unbiased (E_s[r] = 1), low variance, ≥ 0

    KL(learner ‖ sampler): the tokens still come from ``s``, so each is Schulman's estimator for samples
    from ``l`` (ratio ``1/r``) weighted by ``r`` (``E_l[f] = E_s[r·f]``)::

        k1_rev = r · log r                                   unbiased
        k2_rev = r · (log r)² / 2                            biased like k2, ≥ 0
        k3_rev = r·(1/r − 1 + log r) = r·log r − (r − 1)     unbiased, ≥ 0

    ``k3`` and ``k3_rev`` are the f-divergence integrands ``t − 1 − log t`` and ``t·log t − t + 1``
    (convex, minimum 0 at ``t = 1``), hence ≥ 0 per token; all six are 0 when the columns agree. Also
    ``|log r|``; ``|l − s|`` computed as ``s·|expm1(log r)|`` (no cancellation); ``exp(|log r|)``
    (NeMo-RL's multiplicative probability error); ``(r − 1)²`` (χ² per token, ``E_s[(r − 1)²]``, ≥ 0)."""
    lr = lrn - s
    em1 = np.expm1(lr)  # r − 1, exact for small log r
    r = em1 + 1.0
    r_lr = r * lr
    return {
        "k1": -lr,
        "k2": 0.5 * lr * lr,
        "k3": em1 - lr,
        "k1_rev": r_lr,
        "k2_rev": 0.5 * r_lr * lr,
        "k3_rev": r_lr - em1,
        "abs_logprob_diff": np.abs(lr),
        "abs_prob_diff": np.exp(s) * np.abs(em1),
        "token_mult_prob_error": np.exp(np.abs(lr)),
        "chi2_token": em1 * em1,
        "log_ratio": lr,
    }


# --------------------------------------------------------------------------------------------- metrics

def kl_estimators(sampler_logprobs: Sequence[float], learner_logprobs: Sequence[float]) -> dict[str, float]:
    """Token-mean k1, k2, k3 of KL(sampler‖learner) and mean/max |Δ log p| (formulas: :func:`_token_terms`).

    Keys: ``k1, k2, k3, mean_abs_logprob_diff, max_abs_logprob_diff, tokens`` (``tokens`` as a float).
    :func:`token_mismatch` gives these and the rest, per sequence as well."""
    s, lrn = _token_pair(sampler_logprobs, learner_logprobs)
    t = _token_terms(s, lrn)
    return {"k1": float(t["k1"].mean()), "k2": float(t["k2"].mean()), "k3": float(t["k3"].mean()),
            "mean_abs_logprob_diff": float(t["abs_logprob_diff"].mean()),
            "max_abs_logprob_diff": float(t["abs_logprob_diff"].max()), "tokens": float(s.size)}


def sequence_table(sampler_logprobs: Any, learner_logprobs: Any, seq_ids: Any, *,
                   seq_log_ratio_clamp: float = SEQ_LOG_RATIO_CLAMP) -> dict[str, np.ndarray]:
    """One row per sequence of the sums and values every mismatch metric is built from.

    ``sampler_logprobs``, ``learner_logprobs``: [N] log-probs of the N sampled tokens (same tokens, same
    weight version). ``seq_ids``: [N] integer sequence id per token, or [N, K] integer key rows (e.g.
    columns ``seed, step, sequence`` when tables of several steps are concatenated); tokens of one
    sequence need not be contiguous. Rows come in the sorted order of the unique ids.

    Returns float64 arrays of length S (except ``seq_id``, the unique ids, and the bool column):
    ``tokens``; ``sum_<x>`` for x in k1 k2 k3 k1_rev k2_rev k3_rev abs_logprob_diff abs_prob_diff
    token_mult_prob_error chi2_token (token sums; token mean = Σ sum / Σ tokens);
    ``max_abs_logprob_diff``, ``max_abs_prob_diff``; ``log_ratio_sum`` (Σ_t log r_t = log ρ);
    ``chi2_seq`` = expm1(clamp(log ρ, ±seq_log_ratio_clamp))² (ρ = Π_t r_t, the completion's ratio; the
    clamp keeps one long sequence from overflowing, so a clamped sequence contributes a lower bound);
    ``seq_log_ratio_clamped`` (bool); ``nll_sampler``, ``nll_learner`` (mean −log p per token);
    ``log_ppl_diff`` = nll_learner − nll_sampler (= the sequence's mean −log r: positive when the learner
    finds the text less likely; verl's sign) and ``abs_log_ppl_diff``. Per-token formulas:
    :func:`_token_terms`. Empty or mismatched columns, non-finite log-probs (a sampled token at −inf is a
    broken pipeline, not a large KL) and positive ones (probabilities passed by mistake) raise
    ``ValueError`` naming the argument.
    """
    if not seq_log_ratio_clamp > 0:
        raise ValueError(f"seq_log_ratio_clamp must be > 0, got {seq_log_ratio_clamp}")
    s, lrn = _token_pair(sampler_logprobs, learner_logprobs)
    keys, inv = _seq_index(seq_ids, s.size)
    n_seq = keys.shape[0]
    t = _token_terms(s, lrn)

    def per_seq_sum(x: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=x, minlength=n_seq)

    def per_seq_max(x: np.ndarray) -> np.ndarray:
        out = np.full(n_seq, -np.inf)
        np.maximum.at(out, inv, x)
        return out

    tokens = np.bincount(inv, minlength=n_seq).astype(np.float64)
    out: dict[str, np.ndarray] = {"seq_id": keys, "tokens": tokens}
    for name in ("k1", "k2", "k3", "k1_rev", "k2_rev", "k3_rev", "abs_logprob_diff", "abs_prob_diff",
                 "token_mult_prob_error", "chi2_token"):
        out[f"sum_{name}"] = per_seq_sum(t[name])
    out["max_abs_logprob_diff"] = per_seq_max(t["abs_logprob_diff"])
    out["max_abs_prob_diff"] = per_seq_max(t["abs_prob_diff"])
    lrs = per_seq_sum(t["log_ratio"])
    out["log_ratio_sum"] = lrs
    out["chi2_seq"] = np.expm1(np.clip(lrs, -seq_log_ratio_clamp, seq_log_ratio_clamp)) ** 2
    out["seq_log_ratio_clamped"] = np.abs(lrs) > seq_log_ratio_clamp
    out["nll_sampler"] = -per_seq_sum(s) / tokens
    out["nll_learner"] = -per_seq_sum(lrn) / tokens
    out["log_ppl_diff"] = out["nll_learner"] - out["nll_sampler"]
    out["abs_log_ppl_diff"] = np.abs(out["log_ppl_diff"])
    return out


def metric_units(table: Mapping[str, np.ndarray], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) per sequence of one metric of :func:`token_mismatch`, for the bootstrap.

    Token-mean metrics (:data:`TOKEN_METRICS`): (per-sequence token sum, token count) — the estimate
    Σnum/Σden is the token mean. Sequence-mean metrics (:data:`SEQUENCE_METRICS`): (per-sequence value,
    1). Max metrics have no such form and are refused."""
    if metric in TOKEN_METRICS:
        return np.asarray(table[TOKEN_METRICS[metric]], np.float64), np.asarray(table["tokens"], np.float64)
    if metric in SEQUENCE_METRICS:
        num = np.asarray(table[SEQUENCE_METRICS[metric]], np.float64)
        return num, np.ones_like(num)
    raise ValueError(f"metric {metric!r} is not a token or sequence mean; choose one of "
                     f"{sorted(TOKEN_METRICS) + sorted(SEQUENCE_METRICS)}")


def token_mismatch(sampler_logprobs: Any, learner_logprobs: Any, seq_ids: Any, *,
                   seq_log_ratio_clamp: float = SEQ_LOG_RATIO_CLAMP) -> dict[str, float]:
    """Every mismatch metric over the sampled tokens of one or more sequences (sequence means weigh each
    sequence equally, so ``log_ppl_diff`` differs from the token-mean ``k1`` when lengths differ).

    Arguments as :func:`sequence_table`. Returns floats: ``tokens``, ``sequences``; token means ``k1 k2
    k3`` (KL(sampler‖learner)), ``k1_rev k2_rev k3_rev`` (KL(learner‖sampler), importance-weighted),
    ``mean_abs_logprob_diff``, ``mean_abs_prob_diff``, ``token_mult_prob_error``, ``chi2_token``; maxima
    ``max_abs_logprob_diff``, ``max_abs_prob_diff``; sequence means ``chi2_seq``, ``log_ppl_diff``,
    ``log_ppl_abs_diff``; and ``chi2_seq_clamped`` (sequences whose |Σ log r| hit the clamp)."""
    tab = sequence_table(sampler_logprobs, learner_logprobs, seq_ids, seq_log_ratio_clamp=seq_log_ratio_clamp)
    n_tok = float(tab["tokens"].sum())
    out = {"tokens": n_tok, "sequences": float(tab["tokens"].size)}
    for metric, col in TOKEN_METRICS.items():
        out[metric] = float(tab[col].sum() / n_tok)
    out["max_abs_logprob_diff"] = float(tab["max_abs_logprob_diff"].max())
    out["max_abs_prob_diff"] = float(tab["max_abs_prob_diff"].max())
    for metric, col in SEQUENCE_METRICS.items():
        out[metric] = float(tab[col].mean())
    out["chi2_seq_clamped"] = float(tab["seq_log_ratio_clamped"].sum())
    return out


def from_padded(sampler_logprobs: torch.Tensor, learner_logprobs: torch.Tensor,
                mask: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flatten [B, T] log-prob tensors and a completion mask to the (sampler, learner, seq_ids) columns
    the functions above take: the masked tokens in row-major order, the row index as sequence id."""
    if sampler_logprobs.shape != learner_logprobs.shape or sampler_logprobs.shape != mask.shape:
        raise ValueError(f"sampler_logprobs {tuple(sampler_logprobs.shape)}, learner_logprobs "
                         f"{tuple(learner_logprobs.shape)} and mask {tuple(mask.shape)} must have one shape")
    if sampler_logprobs.dim() != 2:
        raise ValueError(f"expected [B, T] tensors, got {sampler_logprobs.dim()} dimensions")
    m = mask.bool()
    rows = torch.nonzero(m, as_tuple=True)[0]
    return (sampler_logprobs[m].detach().to("cpu", torch.float64).numpy(),
            learner_logprobs[m].detach().to("cpu", torch.float64).numpy(), rows.cpu().numpy())


# ------------------------------------------------------------------------- NeMo-RL's per-step numbers

#: the ``kl_type`` values of NeMo-RL's ``calculate_kl`` (its ``ClippedPGLossConfig.reference_policy_kl_type``,
#: default ``"k3"``), which its ``gen_kl_error`` follows
GEN_KL_TYPES = ("k1", "k2", "k3")


def _step_pair(sampler_logprobs: Any, learner_logprobs: Any) -> tuple[np.ndarray, np.ndarray]:
    """One step's two log-prob columns as float64, checked for shape and emptiness only: a non-finite or positive
    log-prob is passed through (the number then shows it; the steps table's rules and the alarm judge it)."""
    s = _as_f64_1d(sampler_logprobs, "sampler_logprobs")
    lrn = _as_f64_1d(learner_logprobs, "learner_logprobs")
    if s.size == 0 or lrn.size == 0:
        raise ValueError("no sampled tokens: a step's mismatch needs at least one token on both sides")
    if s.shape != lrn.shape:
        raise ValueError(f"log-prob columns differ in length: sampler_logprobs {s.size} vs learner_logprobs {lrn.size}")
    return s, lrn


def token_mult_prob_error(sampler_logprobs: Any, learner_logprobs: Any) -> float:
    """NeMo-RL's ``token_mult_prob_error`` of one step: the token mean of ``exp(|log l − log s|)`` over the step's
    sampled tokens (≥ 1; 1 when the sides agree on every token). The same per-token term as the run-level
    ``token_mult_prob_error`` of :func:`token_mismatch`.

    ``sampler_logprobs``, ``learner_logprobs``: [N] log-probs of the step's N sampled tokens (same tokens, same
    weight version), e.g. the masked columns of :func:`from_padded`.

    Source: NeMo-RL @ 7ea279a (github.com/NVIDIA-NeMo/RL), nemo_rl/algorithms/loss/loss_functions.py,
    ``ClippedPGLossFn.__call__``: ``masked_mean(exp(|generation_logprobs − prev_logprobs| · mask), mask,
    global_normalization_factor=global_valid_toks)``, per micro-batch, summed over the step's micro-batches.
    Where this differs: NeMo's ``mask`` is ``token_mask × sample_mask`` (its sample mask can drop whole
    sequences), here every sampled token counts; NeMo divides by ``global_valid_toks + 1e-8``, here by N; NeMo
    sums the means of a step's global batches (one per step in its example configs, ``train_global_batch_size``
    = prompts × generations per step); NeMo's ``prev_logprobs`` are over the vocabulary its sampler filters to
    (top-k/top-p, a −inf there set to 0), fp8rl's learner is restricted to the ids the sampler can emit. Float64
    here. A non-finite log-prob gives a non-finite value (no masking)."""
    s, lrn = _step_pair(sampler_logprobs, learner_logprobs)
    return float(np.exp(np.abs(lrn - s)).mean())


def gen_kl_error(sampler_logprobs: Any, learner_logprobs: Any, kl_type: str = "k3") -> float:
    """NeMo-RL's ``gen_kl_error`` of one step: the token mean over the step's sampled tokens of Schulman's
    ``kl_type`` estimator of KL(sampler ‖ learner) (NeMo's KL(P_gen ‖ P_policy)), with ``log r = log l − log s``::

        k1 = −log r        k2 = (log r)² / 2        k3 = exp(log r) − 1 − log r   (default)

    (k3 computed as ``expm1(log r) − log r``, the same value without cancellation.) With the default ``k3`` it is
    the same number as fp8rl's ``k3`` of the same tokens (:func:`_token_terms`); ``k1`` is ``k1``, ``k2`` is ``k2``.
    Arguments as :func:`token_mult_prob_error`.

    Source: NeMo-RL @ 7ea279a (github.com/NVIDIA-NeMo/RL), nemo_rl/algorithms/loss/loss_functions.py,
    ``ClippedPGLossFn.__call__``: ``masked_mean(calculate_kl(logprobs=generation_logprobs,
    logprobs_reference=prev_logprobs, kl_type=reference_policy_kl_type, input_clamp_value=None,
    output_clamp_value=None), mask, global_normalization_factor=global_valid_toks)``; ``calculate_kl`` in
    nemo_rl/algorithms/utils.py takes ``logr = logprobs_reference − logprobs`` (= log r here) and the formulas
    above; ``reference_policy_kl_type`` defaults to ``"k3"`` (:data:`GEN_KL_TYPES`). No clamps, as in NeMo's
    call. Where this differs from NeMo: as :func:`token_mult_prob_error` (mask, denominator, global batches,
    vocabulary, float64)."""
    if kl_type not in GEN_KL_TYPES:
        raise ValueError(f"kl_type must be one of {GEN_KL_TYPES} (NeMo-RL's calculate_kl), got {kl_type!r}")
    s, lrn = _step_pair(sampler_logprobs, learner_logprobs)
    lr = lrn - s
    if kl_type == "k1":
        per_token = -lr
    elif kl_type == "k2":
        per_token = 0.5 * lr * lr
    else:
        per_token = np.expm1(lr) - lr
    return float(per_token.mean())


#: NeMo-RL's per-step numbers as fp8rl records them (steps-table columns; ``mismatch/<name>`` in MLflow)
NEMO_STEP_METRICS = ("token_mult_prob_error", "gen_kl_error")


def nemo_step_numbers(sampler_logprobs: Any, learner_logprobs: Any) -> dict[str, float]:
    """:data:`NEMO_STEP_METRICS` of one step: :func:`token_mult_prob_error` and :func:`gen_kl_error` (NeMo-RL's
    default ``kl_type`` ``k3``) of the step's sampled tokens, arguments as theirs."""
    return {"token_mult_prob_error": token_mult_prob_error(sampler_logprobs, learner_logprobs),
            "gen_kl_error": gen_kl_error(sampler_logprobs, learner_logprobs)}


# ------------------------------------------------------------------------------------ full vocabulary

def _kl_rows(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) = Σ_v p_v (log p_v − log q_v) per row; terms with p_v = 0 are 0, p_v > 0 = q_v → +inf."""
    support = lp > -math.inf
    term = torch.where(support, lp.exp() * (lp - lq), torch.zeros((), dtype=lp.dtype))
    term = torch.where(support & (lq == -math.inf), torch.full((), math.inf, dtype=lp.dtype), term)
    return term.sum(-1).clamp_min(0.0)  # rounding can leave −1e-17 where p ≈ q


def full_vocab_divergence(sampler_logp_full: torch.Tensor, learner_logp_full: torch.Tensor,
                          mask: torch.Tensor | None = None, *, chunk_rows: int = 64,
                          normalisation_tol: float = 1e-3) -> dict[str, Any]:
    """Exact KL(sampler‖learner), KL(learner‖sampler) and Jensen–Shannon divergence per position.

    ``sampler_logp_full``, ``learner_logp_full``: [..., V] normalised log-probabilities (log_softmax
    output, −inf allowed for tokens a side cannot emit, e.g. after top-k/top-p masking) over the whole
    vocabulary at each position, e.g. [B, T, V]. ``mask``: optional bool [...] (e.g. [B, T]) of the
    positions to include; others are neither checked nor counted and get 0 in the per-position outputs.

    Definitions (natural log, so nats), with p, q the two rows and m = (p + q)/2::

        KL(p‖q) = Σ_v p_v (log p_v − log q_v)      terms with p_v = 0 contribute 0;
                                                   p_v > 0 where q_v = 0 makes it +inf
        JS(p, q) = ½ KL(p‖m) + ½ KL(q‖m)            0 ≤ JS ≤ ln 2, always finite

    (Cover & Thomas, Elements of Information Theory, §2.3; Lin 1991 for JS.) An infinite KL is
    returned as ``inf``, not raised: ``*_inf_positions`` counts positions where one side puts mass on a
    token the other cannot emit, and the mean is then ``inf``.

    Returns per-position float64 tensors ``kl_sampler_learner``, ``kl_learner_sampler``, ``js`` (shape
    [...]), their means over the included positions ``kl_sampler_learner_mean``,
    ``kl_learner_sampler_mean``, ``js_mean``, and ``positions``, ``kl_sampler_learner_inf_positions``,
    ``kl_learner_sampler_inf_positions``. Rows are processed ``chunk_rows`` at a time in float64, so
    memory stays bounded for large vocabularies. A row whose probabilities do not sum to 1 within
    ``normalisation_tol`` (logits passed by mistake), NaN or +inf entries raise ``ValueError``.
    """
    s_full = torch.as_tensor(sampler_logp_full)
    l_full = torch.as_tensor(learner_logp_full)
    if s_full.numel() == 0:
        raise ValueError("sampler_logp_full is empty")
    if l_full.numel() == 0:
        raise ValueError("learner_logp_full is empty")
    if s_full.shape != l_full.shape:
        raise ValueError(f"sampler_logp_full {tuple(s_full.shape)} and learner_logp_full {tuple(l_full.shape)} "
                         "must have one shape [..., V]")
    if s_full.dim() < 1:
        raise ValueError("sampler_logp_full must have a vocabulary dimension [..., V]")
    lead = s_full.shape[:-1]
    vocab = s_full.shape[-1]
    if mask is None:
        m = torch.ones(lead, dtype=torch.bool)
    else:
        m = torch.as_tensor(mask).bool().cpu()
        if m.shape != lead:
            raise ValueError(f"mask has shape {tuple(m.shape)}, expected the leading shape {tuple(lead)} "
                             "of the log-probs")
    rows = torch.nonzero(m.reshape(-1), as_tuple=True)[0]
    if rows.numel() == 0:
        raise ValueError("mask selects no positions: nothing to compare")
    s2 = s_full.detach().reshape(-1, vocab)
    l2 = l_full.detach().reshape(-1, vocab)

    kl_sl = torch.zeros(rows.numel(), dtype=torch.float64)
    kl_ls = torch.zeros_like(kl_sl)
    js = torch.zeros_like(kl_sl)
    ln2 = math.log(2.0)
    for start in range(0, rows.numel(), max(1, int(chunk_rows))):
        idx = rows[start:start + max(1, int(chunk_rows))]
        ls = s2[idx.to(s2.device)].to("cpu", torch.float64)
        ll = l2[idx.to(l2.device)].to("cpu", torch.float64)
        for name, x in (("sampler_logp_full", ls), ("learner_logp_full", ll)):
            if torch.isnan(x).any() or (x == math.inf).any():
                raise ValueError(f"{name} has NaN or +inf entries at included positions")
            total = torch.logsumexp(x, dim=-1)
            off = (total.abs() > normalisation_tol) | ~torch.isfinite(total)
            if off.any():
                i = int(torch.nonzero(off)[0, 0])
                raise ValueError(f"{name} is not a normalised log-distribution at included position "
                                 f"{int(idx[i])} (log Σ exp = {float(total[i]):.3g}); pass log_softmax output")
        sl = slice(start, start + idx.numel())
        kl_sl[sl] = _kl_rows(ls, ll)
        kl_ls[sl] = _kl_rows(ll, ls)
        lm = torch.logaddexp(ls, ll) - ln2  # log of the mixture; > −inf wherever either side is
        js[sl] = 0.5 * _kl_rows(ls, lm) + 0.5 * _kl_rows(ll, lm)

    def scatter(v: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(m.numel(), dtype=torch.float64)
        full[rows] = v
        return full.reshape(lead)

    return {
        "kl_sampler_learner": scatter(kl_sl), "kl_learner_sampler": scatter(kl_ls), "js": scatter(js),
        "kl_sampler_learner_mean": float(kl_sl.mean()), "kl_learner_sampler_mean": float(kl_ls.mean()),
        "js_mean": float(js.mean()), "positions": int(rows.numel()),
        "kl_sampler_learner_inf_positions": int(torch.isinf(kl_sl).sum()),
        "kl_learner_sampler_inf_positions": int(torch.isinf(kl_ls).sum()),
    }


# -------------------------------------------------------------------------------------------- timing

def summarize_steps(steps: Iterable[Mapping[str, float]], columns: Sequence[str]) -> dict[str, float]:
    """Mean of each timing column over the steps, and the total of ``total_s``."""
    rows = list(steps)
    if not rows:
        raise ValueError("no steps to summarize")
    out = {f"{c}_mean": sum(float(r[c]) for r in rows) / len(rows) for c in columns}
    out["total_s"] = sum(float(r["total_s"]) for r in rows)
    return out
