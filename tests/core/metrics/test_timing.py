"""Timing fits on planted data: exact recovery without noise, robustness to timing spikes, the joint
bootstrap, and every break-even verdict."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8rl_core.metrics.timing import cost_model, fit_linear

BUDGETS = np.repeat([512, 1024, 2048, 4096, 8192], 20)


def timings(fixed: float, per_token: float, *, noise: float = 0.0, spikes: float = 0.0, seed: int = 0,
            tokens: np.ndarray = BUDGETS) -> np.ndarray:
    """Planted ``fixed + per_token·tokens`` + Gaussian noise + one-sided spikes (10–30 ms, a share ``spikes``)."""
    rng = np.random.default_rng(seed)
    y = fixed + per_token * tokens + rng.normal(0.0, noise, tokens.size)
    return y + (rng.random(tokens.size) < spikes) * rng.uniform(0.010, 0.030, tokens.size)


def rows(precision: str, seconds: np.ndarray, tokens: np.ndarray = BUDGETS) -> list[dict]:
    return [{"precision": precision, "tokens": int(t), "seconds": float(s)} for t, s in zip(tokens, seconds)]


# ------------------------------------------------------------------------------------------ fit_linear


@pytest.mark.parametrize("robust", [True, False])
@pytest.mark.parametrize(
    "fixed, per_token, tokens",
    [
        (2e-3, 1e-6, [1000, 2000, 4000]),
        (0.0, 5e-7, [256, 8192]),
        (0.05, 0.0, [1, 2, 3, 10, 10, 1]),
        (1.5e-3, 2.5e-7, list(BUDGETS)),
    ],
)
def test_noise_free_timings_are_recovered_exactly(robust, fixed, per_token, tokens):
    x = np.asarray(tokens, dtype=float)
    fit = fit_linear(x, fixed + per_token * x, robust=robust, n_boot=200)
    assert fit.fixed == pytest.approx(fixed, rel=1e-9, abs=1e-15)
    assert fit.per_token == pytest.approx(per_token, rel=1e-9, abs=1e-18)
    lo, hi = fit.per_token_ci  # every resample refits the same line
    assert lo == pytest.approx(per_token, rel=1e-9, abs=1e-18) and hi == pytest.approx(per_token, rel=1e-9, abs=1e-18)
    assert fit.downweighted == 0 and fit.method == ("huber" if robust else "ols")


def test_ols_matches_a_hand_computed_line():
    # x̄ = ȳ = 2.5, Sxy = 2.25 − 0.25 − 0.25 + 2.25 = 4, Sxx = 5 → slope 0.8, intercept 2.5 − 0.8·2.5 = 0.5
    fit = fit_linear([1, 2, 3, 4], [1, 3, 2, 4], robust=False, n_boot=0)
    assert fit.per_token == pytest.approx(0.8) and fit.fixed == pytest.approx(0.5)
    assert fit.fixed_ci is None and fit.per_token_ci is None and fit.n_boot_used == 0


def test_one_planted_outlier_gets_no_pull():
    x = np.arange(1.0, 7.0)
    y = 2.0 + 3.0 * x
    y[2] += 100.0
    fit = fit_linear(x, y, n_boot=0)
    assert fit.fixed == pytest.approx(2.0, rel=1e-9) and fit.per_token == pytest.approx(3.0, rel=1e-9)
    assert fit.downweighted == 1
    assert fit_linear(x, y, robust=False, n_boot=0).fixed > 10  # OLS is dragged by +100/6 and more


def test_robust_fit_survives_spikes_where_ols_fails():
    y = timings(2e-3, 1e-6, noise=1e-4, spikes=0.15, seed=3)
    huber = fit_linear(BUDGETS, y, seed=1)
    ols = fit_linear(BUDGETS, y, robust=False, seed=1)
    assert abs(huber.fixed - 2e-3) < 1e-4 and abs(huber.per_token / 1e-6 - 1) < 0.03
    assert huber.fixed_ci[0] <= 2e-3 <= huber.fixed_ci[1]
    assert abs(ols.fixed - 2e-3) > 1e-3  # off by more than half the planted fixed cost
    assert huber.downweighted >= 10


def test_bootstrap_is_seeded():
    y = timings(2e-3, 1e-6, noise=2e-4, seed=5)
    a, b, c = (fit_linear(BUDGETS, y, n_boot=300, seed=s) for s in (7, 7, 8))
    assert a.per_token_ci == b.per_token_ci != c.per_token_ci
    assert a.fixed_ci[0] < a.fixed < a.fixed_ci[1]


@pytest.mark.parametrize(
    "tokens, seconds, kwargs, words",
    [
        ([1024, 1024, 1024], [0.01, 0.011, 0.012], {}, "tokens: need at least 2 distinct token budgets"),
        ([], [], {}, "tokens: need at least 2 distinct"),
        ([1, 2], [0.1], {}, "differ in length"),
        ([1, float("nan")], [0.1, 0.2], {}, "tokens: contains NaN"),
        ([1, 2], [0.1, -0.2], {}, "seconds: must be non-negative"),
        ([-1, 2], [0.1, 0.2], {}, "tokens: must be non-negative"),
        ([[1, 2]], [[0.1, 0.2]], {}, "tokens: expected a 1-D"),
        ([1, 2], [0.1, 0.2], {"level": 1.0}, "level"),
        ([1, 2], [0.1, 0.2], {"n_boot": -1}, "n_boot"),
        ([1, 2], [0.1, 0.2], {"n_boot": 2.5}, "n_boot"),
    ],
)
def test_bad_fit_inputs_are_named(tokens, seconds, kwargs, words):
    with pytest.raises(ValueError, match=words):
        fit_linear(tokens, seconds, **kwargs)


# ------------------------------------------------------------------------------------------ cost_model


def test_planted_break_even_noise_free():
    # MXFP8: +2 ms fixed, 1e-6 s/token cheaper → lines cross at 2e-3 / 1e-6 = 2000 tokens
    data = rows("bf16", timings(1e-3, 3e-6)) + rows("mxfp8", timings(3e-3, 2e-6))
    r = cost_model(data, n_boot=200)
    assert r.status == "break_even"
    assert r.delta_fixed == pytest.approx(2e-3, rel=1e-9)
    assert r.per_token_saving == pytest.approx(1e-6, rel=1e-9)
    assert r.break_even == pytest.approx(2000, rel=1e-9)
    assert r.break_even_ci == pytest.approx((2000, 2000), rel=1e-6)
    assert r.saving_positive_fraction == 1.0
    assert r.fits["mxfp8"].fixed == pytest.approx(3e-3, rel=1e-9)


def test_planted_break_even_with_noise_and_spikes():
    data = (rows("bf16", timings(1e-3, 3e-6, noise=1e-4, spikes=0.1, seed=1))
            + rows("mxfp8", timings(3e-3, 2e-6, noise=1e-4, spikes=0.1, seed=2)))
    r = cost_model(data)
    assert r.status == "break_even" and r.n_boot_used == 2000
    lo, hi = r.break_even_ci
    assert lo <= 2000 <= hi and hi - lo < 400
    assert r.break_even == pytest.approx(2000, rel=0.05)
    assert r.delta_fixed_ci[0] <= 2e-3 <= r.delta_fixed_ci[1]
    assert r.per_token_saving_ci[0] <= 1e-6 <= r.per_token_saving_ci[1]
    assert r.verdict.startswith("mxfp8 pays off above ≈")


def test_dataframe_and_rows_agree():
    data = (rows("bf16", timings(1e-3, 3e-6, noise=1e-4, seed=1))
            + rows("mxfp8", timings(3e-3, 2e-6, noise=1e-4, seed=2)))
    a = cost_model(data, n_boot=100)
    b = cost_model(pd.DataFrame(data + [{"precision": "fp32", "tokens": 1, "seconds": 9.0}]), n_boot=100)
    assert a.break_even == b.break_even and a.break_even_ci == b.break_even_ci


@pytest.mark.parametrize(
    "emulated, tail",
    [
        (True, "; expected for CPU emulation, where quantization is extra work and there are no FP8 tensor cores"),
        (None, "; expected if this ran as CPU emulation, where quantization is extra work and there are no FP8 "
               "tensor cores"),
        (False, "positive in 0.0% of bootstrap resamples)"),
    ],
)
def test_negative_saving_has_no_break_even(emulated, tail):
    # CPU emulation: MXFP8 costs +2 ms fixed and 3e-7 s/token *more*
    data = (rows("bf16", timings(1e-3, 2e-6, noise=1e-5, seed=1))
            + rows("mxfp8", timings(3e-3, 2.3e-6, noise=1e-5, seed=2)))
    r = cost_model(data, n_boot=300, emulated=emulated)
    assert r.status == "no_break_even" and r.headline == "no break-even"
    assert r.break_even is None and r.break_even_ci is None and r.break_even_estimate is None
    assert r.per_token_saving == pytest.approx(-3e-7, rel=0.05)
    assert r.saving_positive_fraction == 0.0
    assert r.verdict.startswith("no break-even: mxfp8 costs more per token here (saving -3e-07 s/token, 95% CI [")
    assert r.verdict.endswith(tail)


def test_saving_indistinguishable_from_zero_is_unresolved():
    # identical noise in both runs and a tiny planted saving: the point estimate is exactly +1e-10 s/token
    # (M-estimation is regression-equivariant), but independent resamples straddle zero
    noisy = timings(1e-3, 2e-6, noise=5e-4, seed=4)
    data = rows("bf16", noisy) + rows("mxfp8", noisy + 2e-3 - 1e-10 * BUDGETS)
    r = cost_model(data, n_boot=500)
    assert r.per_token_saving == pytest.approx(1e-10, rel=1e-3)
    assert r.status == "unresolved" and r.break_even is None
    assert r.per_token_saving_ci[0] < 0 < r.per_token_saving_ci[1]
    assert 0.05 < r.saving_positive_fraction < 0.95
    assert r.headline == "break-even not resolved" and r.verdict.startswith(r.headline + ": ")


def test_break_even_far_outside_the_measured_range():
    # +2 ms fixed, 1e-9 s/token saving → 2e6 tokens, but budgets stop at 8192 (×2 → 16384)
    data = rows("bf16", timings(1e-3, 3e-6)) + rows("mxfp8", timings(3e-3, 3e-6 - 1e-9))
    r = cost_model(data, n_boot=100)
    assert r.status == "out_of_range" and r.break_even is None
    assert r.headline == "break-even outside the measured range"
    assert r.break_even_estimate == pytest.approx(2e6, rel=1e-5)
    assert "outside the measured range" in r.verdict and "512–8192" in r.verdict
    assert cost_model(data, n_boot=100, extrapolation=500).status == "break_even"


def test_no_extra_fixed_cost_means_faster_everywhere():
    data = rows("bf16", timings(2e-3, 3e-6)) + rows("mxfp8", timings(1e-3, 2e-6))
    r = cost_model(data, n_boot=100)
    assert r.status == "always_faster" and r.break_even == 0.0
    assert r.delta_fixed == pytest.approx(-1e-3, rel=1e-9)
    assert r.headline == "mxfp8 is faster at every micro-batch size" and r.verdict.startswith(r.headline + ": ")


def test_without_bootstrap_status_comes_from_points():
    data = rows("bf16", timings(1e-3, 3e-6)) + rows("mxfp8", timings(3e-3, 2e-6))
    r = cost_model(data, n_boot=0)
    assert r.status == "break_even" and r.break_even == pytest.approx(2000)
    assert r.break_even_ci is None and r.saving_positive_fraction is None and "no CI" in r.verdict


@pytest.mark.parametrize(
    "data, kwargs, words",
    [
        (rows("bf16", timings(1e-3, 3e-6)), {}, "precision: no rows for 'mxfp8'"),
        (rows("bf16", timings(1e-3, 3e-6)) + rows("mxfp8", np.full(3, 0.01), np.full(3, 1024)), {},
         "mxfp8 rows: tokens: need at least 2 distinct token budgets"),
        ([{"precision": "bf16", "tokens": 1}], {}, "data: row 0 lacks column 'seconds'"),
        (pd.DataFrame({"precision": ["bf16"], "tok": [1]}), {}, "data: missing column"),
        ("bf16", {}, "data: expected a DataFrame"),
        (rows("bf16", timings(1e-3, 3e-6)), {"candidate": "bf16"}, "baseline and candidate"),
        (rows("bf16", timings(1e-3, 3e-6)), {"extrapolation": 0.5}, "extrapolation"),
    ],
)
def test_bad_cost_model_inputs_are_named(data, kwargs, words):
    with pytest.raises(ValueError, match=words):
        cost_model(data, **kwargs)
