"""Mismatch metrics against values worked out by hand (the formula beside each literal), an exact
categorical identity (a sample whose token frequencies equal the sampler's probabilities reproduces the
exact divergences), torch's own kl_div as a second reference, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp8rl_core.metrics.mismatch import (
    SEQ_LOG_RATIO_CLAMP,
    SEQUENCE_METRICS,
    TOKEN_METRICS,
    GEN_KL_TYPES,
    NEMO_STEP_METRICS,
    from_padded,
    full_vocab_divergence,
    gen_kl_error,
    kl_estimators,
    metric_units,
    nemo_step_numbers,
    sequence_table,
    token_mismatch,
    token_mult_prob_error,
)

L = math.log
LN2 = math.log(2.0)

# four tokens, two sequences; r = l/s = [0.5, 2, 1, 0.8], log r = [−ln2, ln2, 0, ln0.8]
HAND_S = [L(0.5), L(0.25), L(0.8), L(0.5)]
HAND_L = [L(0.25), L(0.5), L(0.8), L(0.4)]
HAND_SEQ = [0, 0, 1, 1]
HAND = {
    "k1": 0.05578588782855243,              # mean(−log r) = −ln0.8 / 4
    "k2": 0.12633738404119002,              # mean((log r)²/2) = (2 ln²2 + ln²0.8) / 8
    "k3": 0.13078588782855244,              # mean(r − 1 − log r) = (0.3 − ln0.8) / 4
    "k1_rev": 0.21530148244713754,          # mean(r log r) = (1.5 ln2 + 0.8 ln0.8) / 4
    "k2_rev": 0.15512087129874969,          # mean(r (log r)²/2) = (0.5 ln²2 + 2 ln²2 + 0.8 ln²0.8) / 8
    "k3_rev": 0.14030148244713753,          # mean(r log r − r + 1) = (1.5 ln2 + 0.8 ln0.8 − 0.3) / 4
    "mean_abs_logprob_diff": 0.40235947810852507,  # (2 ln2 − ln0.8) / 4
    "max_abs_logprob_diff": 0.6931471805599453,    # ln 2
    "mean_abs_prob_diff": 0.15,             # |p_l − p_s| = [0.25, 0.25, 0, 0.1] → 0.6 / 4
    "max_abs_prob_diff": 0.25,
    "token_mult_prob_error": 1.5625,        # mean(exp|log r|) = (2 + 2 + 1 + 1.25) / 4
    "chi2_token": 0.3225,                   # mean((r − 1)²) = (0.25 + 1 + 0 + 0.04) / 4
    "chi2_seq": 0.02,                       # ρ = [0.5·2, 1·0.8] = [1, 0.8] → (0 + 0.04) / 2
    "log_ppl_diff": 0.05578588782855243,    # per sequence mean(−log r) = [0, −ln0.8/2] → mean
    "log_ppl_abs_diff": 0.05578588782855243,
    "tokens": 4.0, "sequences": 2.0, "chi2_seq_clamped": 0.0,
}


@pytest.mark.parametrize("key", sorted(HAND))
def test_token_mismatch_matches_hand_values(key):
    got = token_mismatch(HAND_S, HAND_L, HAND_SEQ)
    assert got[key] == pytest.approx(HAND[key], rel=1e-12, abs=1e-15)


def test_token_mismatch_returns_exactly_the_documented_keys():
    assert set(token_mismatch(HAND_S, HAND_L, HAND_SEQ)) == set(HAND)


def test_kl_estimators_keeps_its_keys_and_values():
    got = kl_estimators(HAND_S, HAND_L)
    assert set(got) == {"k1", "k2", "k3", "mean_abs_logprob_diff", "max_abs_logprob_diff", "tokens"}
    for k, v in got.items():
        assert v == pytest.approx(HAND[k], rel=1e-12)
        assert isinstance(v, float)


# s = [0.5, 0.3, 0.2], l = [0.4, 0.4, 0.2]; 10 tokens drawn in exact proportion 5 : 3 : 2
CAT_S = [0.5, 0.3, 0.2]
CAT_L = [0.4, 0.4, 0.2]
CAT_KL_SL = 0.02526715392157057   # 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4)
CAT_KL_LS = 0.025815408455028527  # 0.4 ln(0.4/0.5) + 0.4 ln(0.4/0.3)
CAT_JS = 0.006367198333995731     # m = [0.45, 0.35, 0.2]; ½Σ s ln(s/m) + ½Σ l ln(l/m)
CAT_CHI2 = 0.05333333333333335    # Σ (l − s)²/s = 0.01/0.5 + 0.01/0.3


def _logs(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()  # log 0 = −inf


def _stratified():
    counts = [5, 3, 2]
    s = [L(p) for p, c in zip(CAT_S, counts) for _ in range(c)]
    lrn = [L(p) for p, c in zip(CAT_L, counts) for _ in range(c)]
    return s, lrn, list(range(10))


@pytest.mark.parametrize("key,expected", [
    ("k1", CAT_KL_SL), ("k3", CAT_KL_SL),            # both unbiased for KL(s‖l)
    ("k1_rev", CAT_KL_LS), ("k3_rev", CAT_KL_LS),    # importance-weighted: unbiased for KL(l‖s)
    ("chi2_token", CAT_CHI2),                        # E_s[(r − 1)²] = χ²(l‖s)
    ("k2", 0.0248624073448021),                      # Σ s (ln(l/s))²/2 (biased: ≠ KL)
    ("k2_rev", 0.026510803860653825),                # Σ l (ln(l/s))²/2
    ("mean_abs_prob_diff", 0.08),                    # Σ s |l − s| = 0.5·0.1 + 0.3·0.1
    ("token_mult_prob_error", 1.225),                # 0.5·1.25 + 0.3·(4/3) + 0.2·1
])
def test_expectations_under_the_sampler_are_exact_on_a_stratified_sample(key, expected):
    s, lrn, seq = _stratified()
    assert token_mismatch(s, lrn, seq)[key] == pytest.approx(expected, rel=1e-12)


def test_stratified_sample_agrees_with_the_full_vocabulary_divergence():
    s, lrn, seq = _stratified()
    tok = token_mismatch(s, lrn, seq)
    full = full_vocab_divergence(_logs(CAT_S), _logs(CAT_L))
    assert full["kl_sampler_learner_mean"] == pytest.approx(tok["k3"], rel=1e-12)
    assert full["kl_learner_sampler_mean"] == pytest.approx(tok["k3_rev"], rel=1e-12)


def test_identical_columns_give_zero_divergence():
    s = [L(0.9), L(0.1), L(0.5), L(0.999)]
    got = token_mismatch(s, list(s), [0, 0, 1, 2])
    for k in ("k1", "k2", "k3", "k1_rev", "k2_rev", "k3_rev", "mean_abs_logprob_diff", "max_abs_logprob_diff",
              "mean_abs_prob_diff", "max_abs_prob_diff", "chi2_token", "chi2_seq", "log_ppl_diff",
              "log_ppl_abs_diff"):
        assert got[k] == 0.0, k
    assert got["token_mult_prob_error"] == 1.0  # multiplicative: 1 is agreement


def test_sequence_level_metrics_weigh_sequences_not_tokens():
    # seq 0: one token, r = 0.5; seq 1: three tokens r = [1, 2, 2/3]
    s = [L(0.5), L(0.5), L(0.2), L(0.9)]
    lrn = [L(0.25), L(0.5), L(0.4), L(0.6)]
    got = token_mismatch(s, lrn, [7, 3, 3, 3])
    # log_ppl_diff per sequence = mean(−log r): [ln2, (0 − ln2 + ln1.5)/3] → mean over the two sequences
    assert got["log_ppl_diff"] == pytest.approx(0.2986265782046758, rel=1e-12)
    assert got["log_ppl_abs_diff"] == pytest.approx(0.3945206023552695, rel=1e-12)
    assert got["k1"] == pytest.approx(0.1013662770270411, rel=1e-12)  # token mean: (ln2 − ln2 + ln1.5)/4
    # ρ = [0.5, 1·2·(2/3)] → ((−0.5)² + (1/3)²) / 2
    assert got["chi2_seq"] == pytest.approx((0.25 + 1 / 9) / 2, rel=1e-12)


def test_sequence_ratio_is_clamped_in_log_space():
    # one sequence, Σ log r = 3·10 = 30 > 20: (e^20 − 1)² and counted; one sequence with ρ = 1
    s = [-10.0, -10.0, -10.0, L(0.5)]
    lrn = [0.0, 0.0, 0.0, L(0.5)]
    got = token_mismatch(s, lrn, [0, 0, 0, 1])
    assert SEQ_LOG_RATIO_CLAMP == 20.0
    assert got["chi2_seq_clamped"] == 1.0
    assert got["chi2_seq"] == pytest.approx(2.353852658666896e17 / 2, rel=1e-12)
    assert math.isfinite(got["chi2_seq"])
    tab = sequence_table(s, lrn, [0, 0, 0, 1])
    assert tab["log_ratio_sum"].tolist() == pytest.approx([30.0, 0.0])
    assert tab["seq_log_ratio_clamped"].tolist() == [True, False]


def test_sequence_table_sums_rebuild_every_mean_metric():
    rng = np.random.default_rng(3)
    n = 200
    s = np.log(rng.uniform(0.05, 1.0, n))
    lrn = np.minimum(s + rng.normal(0, 0.05, n), 0.0)
    seq = rng.integers(0, 17, n)
    tab = sequence_table(s, lrn, seq)
    got = token_mismatch(s, lrn, seq)
    assert tab["tokens"].sum() == n and tab["seq_id"].tolist() == sorted(set(seq.tolist()))
    for metric in list(TOKEN_METRICS) + list(SEQUENCE_METRICS):
        num, den = metric_units(tab, metric)
        assert num.sum() / den.sum() == pytest.approx(got[metric], rel=1e-12), metric
    # token-level sums against a direct per-token loop
    lr = lrn - s
    assert got["k3"] == pytest.approx(np.mean(np.exp(lr) - 1 - lr), rel=1e-9)
    assert got["k1_rev"] == pytest.approx(np.mean(np.exp(lr) * lr), rel=1e-9)


def test_tokens_order_does_not_matter_and_keys_may_be_rows():
    s, lrn, seq = HAND_S, HAND_L, HAND_SEQ
    perm = [3, 0, 2, 1]
    a = token_mismatch(s, lrn, seq)
    b = token_mismatch([s[i] for i in perm], [lrn[i] for i in perm], [seq[i] for i in perm])
    assert a == pytest.approx(b, rel=1e-12)
    # (step, sequence) keys: sequence 0 of step 1 and of step 2 are different sequences
    keys = np.array([[1, 0], [1, 0], [2, 0], [2, 0]])
    assert token_mismatch(s, lrn, keys) == pytest.approx(a, rel=1e-12)
    merged = token_mismatch(s, lrn, np.array([[1, 0]] * 4))
    assert merged["sequences"] == 1.0
    assert merged["chi2_seq"] == pytest.approx((0.8 - 1.0) ** 2, rel=1e-12)  # ρ = 0.5·2·1·0.8


def test_torch_float32_inputs_and_from_padded():
    sp = torch.tensor([[L(0.5), L(0.25), 0.0], [L(0.8), L(0.5), 0.0]], dtype=torch.float32)
    lp = torch.tensor([[L(0.25), L(0.5), 0.0], [L(0.8), L(0.4), 0.0]], dtype=torch.float32)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    s, lrn, seq = from_padded(sp, lp, mask)
    assert seq.tolist() == [0, 0, 1, 1]
    got = token_mismatch(torch.as_tensor(s), torch.as_tensor(lrn), torch.as_tensor(seq))
    assert got["k3"] == pytest.approx(HAND["k3"], rel=1e-6)  # float32 rounding of the inputs
    with pytest.raises(ValueError, match="one shape"):
        from_padded(sp, lp, mask[:, :2])


BAD = [
    (([], [], []), "sampler_logprobs is empty"),
    (([-0.1], [], [0]), "learner_logprobs is empty"),
    (([-0.1, -0.2], [-0.1], [0, 0]), "differ in length"),
    (([-0.1, -0.2], [-0.1, -math.inf], [0, 0]), "learner_logprobs has 1 non-finite"),
    (([-0.1, math.nan], [-0.1, -0.2], [0, 0]), "sampler_logprobs has 1 non-finite"),
    (([-math.inf, -0.2], [-0.1, -0.2], [0, 0]), "sampler_logprobs has 1 non-finite"),
    (([0.5, 0.2], [-0.1, -0.2], [0, 0]), "sampler_logprobs has 2 positive log-probs"),
    (([-0.1, -0.2], [-0.1, -0.2], [0]), r"seq_ids must have shape \[2\]"),
    (([-0.1, -0.2], [-0.1, -0.2], []), "seq_ids is empty"),
    (([-0.1, -0.2], [-0.1, -0.2], [0.0, 1.5]), "seq_ids must be integers"),
    (([[-0.1, -0.2]], [[-0.1, -0.2]], [0]), "sampler_logprobs must be one log-prob per token"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_token_mismatch_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        token_mismatch(*args)


@pytest.mark.parametrize("args,message", [(a[:2], m) for a, m in BAD[:7]])
def test_kl_estimators_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        kl_estimators(*args)


def test_metric_units_refuses_max_metrics():
    tab = sequence_table(HAND_S, HAND_L, HAND_SEQ)
    with pytest.raises(ValueError, match="max_abs_logprob_diff"):
        metric_units(tab, "max_abs_logprob_diff")


def test_sequence_table_refuses_a_non_positive_clamp():
    with pytest.raises(ValueError, match="seq_log_ratio_clamp"):
        sequence_table(HAND_S, HAND_L, HAND_SEQ, seq_log_ratio_clamp=0.0)


# NeMo-RL's per-step numbers (NeMo-RL @ 7ea279a, nemo_rl/algorithms/loss/loss_functions.py, ClippedPGLossFn)

def test_nemo_step_numbers_match_hand_values():
    assert token_mult_prob_error(HAND_S, HAND_L) == pytest.approx(1.5625, rel=1e-15)  # (2 + 2 + 1 + 1.25) / 4
    assert gen_kl_error(HAND_S, HAND_L) == pytest.approx(0.13078588782855244, rel=1e-14)  # k3 = (0.3 − ln0.8) / 4
    assert gen_kl_error(HAND_S, HAND_L, "k1") == pytest.approx(0.05578588782855243, rel=1e-14)  # −ln0.8 / 4
    assert gen_kl_error(HAND_S, HAND_L, "k2") == pytest.approx(0.12633738404119002, rel=1e-14)  # (2ln²2 + ln²0.8)/8
    # one token, s = 1/2, l = 1/4: r = 1/2, exp|log r| = 2, k3 = 1/2 − 1 + ln 2
    assert token_mult_prob_error([L(0.5)], [L(0.25)]) == pytest.approx(2.0, rel=1e-15)
    assert gen_kl_error([L(0.5)], [L(0.25)]) == pytest.approx(LN2 - 0.5, rel=1e-14)
    assert token_mult_prob_error([-0.3, -2.0], [-0.3, -2.0]) == 1.0 and gen_kl_error([-0.3, -2.0], [-0.3, -2.0]) == 0.0


def test_nemo_step_numbers_are_the_run_metrics_of_one_step():
    """token_mult_prob_error is the same token mean as token_mismatch's; gen_kl_error with kl_type k1/k2/k3 is k1/k2/k3."""
    run = token_mismatch(HAND_S, HAND_L, HAND_SEQ)
    assert token_mult_prob_error(HAND_S, HAND_L) == pytest.approx(run["token_mult_prob_error"], rel=1e-14)
    for kl_type in GEN_KL_TYPES:
        assert gen_kl_error(HAND_S, HAND_L, kl_type) == pytest.approx(run[kl_type], rel=1e-14), kl_type


def test_nemo_step_numbers_are_the_two_functions_with_nemos_default_kl_type():
    got = nemo_step_numbers(HAND_S, HAND_L)
    assert tuple(got) == NEMO_STEP_METRICS == ("token_mult_prob_error", "gen_kl_error")
    assert got == {"token_mult_prob_error": token_mult_prob_error(HAND_S, HAND_L),
                   "gen_kl_error": gen_kl_error(HAND_S, HAND_L, "k3")}


def _nemo_reference(gen: torch.Tensor, prev: torch.Tensor, mask: torch.Tensor, kl_type: str) -> tuple[float, float]:
    """NeMo-RL's two lines transcribed (masked_mean over the batch's valid tokens; calculate_kl without clamps)."""
    n = mask.sum()
    mult = (torch.exp(torch.abs(gen - prev) * mask) * mask).sum() / (n + 1e-8)
    logr = prev - gen
    kl = {"k1": -logr, "k2": logr.square() / 2, "k3": torch.exp(logr) - 1 - logr}[kl_type]
    return float(mult), float((kl * mask).sum() / (n + 1e-8))


@pytest.mark.parametrize("kl_type", GEN_KL_TYPES)
def test_nemo_step_numbers_agree_with_nemos_masked_formula_on_a_padded_batch(kl_type):
    g = torch.Generator().manual_seed(3)
    gen = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    prev = (gen + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.2).clamp(max=0.0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]],
                        dtype=torch.float64)
    gen[mask == 0], prev[mask == 0] = 0.0, -50.0  # padding: whatever it holds must not count
    s, lrn, _ = from_padded(gen, prev, mask)
    mult, kl = _nemo_reference(gen, prev, mask, kl_type)
    assert token_mult_prob_error(s, lrn) == pytest.approx(mult, rel=1e-8)  # NeMo's + 1e-8 in the denominator
    assert gen_kl_error(s, lrn, kl_type) == pytest.approx(kl, rel=1e-8)


def test_nemo_step_numbers_pass_a_non_finite_log_prob_through():
    """Shapes are checked, values are not: a sampled token at −inf shows as an infinite step number (the steps
    table's FINITE rule and the alarm judge it), not as an error inside the loop."""
    assert token_mult_prob_error([-0.1, -0.2], [-0.1, -math.inf]) == math.inf
    assert gen_kl_error([-0.1, -0.2], [-0.1, -math.inf]) == math.inf
    assert math.isnan(token_mult_prob_error([-0.1, math.nan], [-0.1, -0.2]))


@pytest.mark.parametrize("args,message", [
    (([], []), "no sampled tokens"),
    (([-0.1], []), "no sampled tokens"),
    (([-0.1, -0.2], [-0.1]), "differ in length"),
    (([[-0.1, -0.2]], [[-0.1, -0.2]]), "sampler_logprobs must be one log-prob per token"),
])
def test_nemo_step_numbers_refuse_bad_shapes(args, message):
    for fn in (token_mult_prob_error, gen_kl_error):
        with pytest.raises(ValueError, match=message):
            fn(*args)


def test_gen_kl_error_refuses_a_kl_type_nemo_does_not_have():
    with pytest.raises(ValueError, match=r"kl_type must be one of \('k1', 'k2', 'k3'\)"):
        gen_kl_error(HAND_S, HAND_L, "k4")


# ------------------------------------------------------------------------------------ full vocabulary

@pytest.mark.parametrize("s,lrn,kl_sl,kl_ls,js", [
    (CAT_S, CAT_L, CAT_KL_SL, CAT_KL_LS, CAT_JS),
    # s puts no mass on token 2: that term is 0 in KL(s‖l); l does, so KL(l‖s) = +inf; JS finite
    ([0.5, 0.5, 0.0], [0.5, 0.25, 0.25], 0.34657359027997264, math.inf, 0.10788077716941782),
    # disjoint supports: both KLs infinite, JS at its bound ln 2
    ([1.0, 0.0], [0.0, 1.0], math.inf, math.inf, LN2),
    ([0.2, 0.8], [0.2, 0.8], 0.0, 0.0, 0.0),
])
def test_full_vocab_divergence_matches_hand_values(s, lrn, kl_sl, kl_ls, js):
    got = full_vocab_divergence(_logs(s), _logs(lrn))
    assert got["kl_sampler_learner_mean"] == pytest.approx(kl_sl, rel=1e-12, abs=1e-15)
    assert got["kl_learner_sampler_mean"] == pytest.approx(kl_ls, rel=1e-12, abs=1e-15)
    assert got["js_mean"] == pytest.approx(js, rel=1e-12, abs=1e-15)
    assert got["js_mean"] <= LN2
    assert got["kl_sampler_learner_inf_positions"] == int(math.isinf(kl_sl))
    assert got["kl_learner_sampler_inf_positions"] == int(math.isinf(kl_ls))
    assert got["positions"] == 1


def test_full_vocab_agrees_with_torch_kl_div_and_bounds_js():
    g = torch.Generator().manual_seed(0)
    s = torch.log_softmax(torch.randn(3, 5, 50, generator=g) * 3, -1)
    lrn = torch.log_softmax(torch.randn(3, 5, 50, generator=g) * 3, -1)
    got = full_vocab_divergence(s, lrn)
    ref_sl = torch.nn.functional.kl_div(lrn.double(), s.double(), log_target=True, reduction="none").sum(-1)
    ref_ls = torch.nn.functional.kl_div(s.double(), lrn.double(), log_target=True, reduction="none").sum(-1)
    assert torch.allclose(got["kl_sampler_learner"], ref_sl, rtol=1e-10, atol=1e-12)
    assert torch.allclose(got["kl_learner_sampler"], ref_ls, rtol=1e-10, atol=1e-12)
    assert got["js"].shape == (3, 5)
    assert bool((got["js"] >= 0).all()) and bool((got["js"] <= LN2).all())
    assert got["kl_sampler_learner_mean"] == pytest.approx(float(ref_sl.mean()), rel=1e-10)
    # chunking does not change anything
    one = full_vocab_divergence(s, lrn, chunk_rows=1)
    assert torch.equal(one["js"], got["js"]) and torch.equal(one["kl_learner_sampler"], got["kl_learner_sampler"])


def test_full_vocab_mask_excludes_positions_and_ignores_their_contents():
    s = _logs([0.5, 0.3, 0.2], [0.2, 0.8, 0.0]).unsqueeze(0)  # [1, 2, 3]
    lrn = _logs([0.4, 0.4, 0.2], [0.2, 0.8, 0.0]).unsqueeze(0)
    s[0, 1] = math.nan  # padding garbage at an excluded position
    got = full_vocab_divergence(s, lrn, mask=torch.tensor([[True, False]]))
    assert got["positions"] == 1
    assert got["kl_sampler_learner"].shape == (1, 2)
    assert got["kl_sampler_learner"][0].tolist() == pytest.approx([CAT_KL_SL, 0.0], rel=1e-12)
    assert got["kl_sampler_learner_mean"] == pytest.approx(CAT_KL_SL, rel=1e-12)


@pytest.mark.parametrize("s,lrn,mask,message", [
    (torch.empty(0, 3), torch.empty(0, 3), None, "sampler_logp_full is empty"),
    (_logs([0.5, 0.5]), _logs([0.2, 0.3, 0.5]), None, "must have one shape"),
    (_logs([0.5, 0.5]), _logs([0.2, 0.8]), torch.tensor([True, True]), "mask has shape"),
    (_logs([0.5, 0.5]), _logs([0.2, 0.8]), torch.tensor([False]), "selects no positions"),
    (torch.tensor([[1.0, 2.0]]), _logs([0.2, 0.8]), None, "sampler_logp_full is not a normalised"),
    (_logs([0.5, 0.5]), torch.tensor([[math.nan, 0.0]]), None, "learner_logp_full has NaN"),
    (_logs([0.5, 0.5]), torch.tensor([[-math.inf, -math.inf]]), None, "learner_logp_full is not a normalised"),
])
def test_full_vocab_refuses_bad_input(s, lrn, mask, message):
    with pytest.raises(ValueError, match=message):
        full_vocab_divergence(s, lrn, mask)
