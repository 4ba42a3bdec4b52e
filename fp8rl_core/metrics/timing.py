"""Timing fits: MXFP8's fixed cost per micro-batch, its per-token saving, and the break-even size.

Rule: ``seconds ≈ fixed + per_token · tokens`` per precision, fitted robustly (Huber M-estimator by IRLS,
:func:`fit_linear`) with pairs-bootstrap percentile intervals; the break-even is Δfixed / saving, with
joint intervals (:func:`cost_model`, which also says when there is none, as under CPU emulation). What
the cost model reports: docs/metrics.md (Cost model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["HUBER_K", "CostModel", "CostStatus", "LinearFit", "cost_model", "fit_linear"]

HUBER_K = 1.345  # 95% Gaussian efficiency (Huber 1964)
_MAD_NORMAL = 0.6745  # median |Z| of a standard normal: MAD / 0.6745 estimates sigma
_MAX_ITER = 200
_CPU_REASON = "quantization is extra work and there are no FP8 tensor cores"
_TOL = 1e-10
_CHUNK = 256  # bootstrap resamples refitted at once (bounds memory: chunk × n floats per array)


# --------------------------------------------------------------------------------------------- fitting


def _as_vector(values: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a sequence of numbers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size and not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or Inf")
    return arr


def _validate(tokens: Any, seconds: Any) -> tuple[np.ndarray, np.ndarray]:
    x = _as_vector(tokens, "tokens")
    y = _as_vector(seconds, "seconds")
    if x.size != y.size:
        raise ValueError(f"tokens and seconds differ in length: {x.size} vs {y.size}")
    if (x < 0).any():
        raise ValueError(f"tokens: must be non-negative, got min {x.min()}")
    if (y < 0).any():
        raise ValueError(f"seconds: must be non-negative, got min {y.min()}")
    distinct = np.unique(x).size
    if distinct < 2:
        shown = "none" if x.size == 0 else f"only {x[0]:g}"
        raise ValueError(
            f"tokens: need at least 2 distinct token budgets to separate the fixed cost from the per-token "
            f"cost, got {distinct} ({shown}; {x.size} observations)"
        )
    return x, y


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares line along the last axis (centred form); NaN where x has no spread."""
    sw = w.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        xm = (w * x).sum(-1) / sw
        ym = (w * y).sum(-1) / sw
        dx = x - xm[..., None]
        sxx = (w * dx * dx).sum(-1)
        sxy = (w * dx * (y - ym[..., None])).sum(-1)
        slope = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), np.nan)
    return ym - slope * xm, slope


def _fit_lines(x: np.ndarray, y: np.ndarray, robust: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fit ``y = a + b·x`` along the last axis (one line per leading index): (a, b, final weights)."""
    w = np.ones_like(x)
    a, b = _wls(x, y, w)
    if not robust:
        return a, b, w
    for _ in range(_MAX_ITER):
        r = y - a[..., None] - b[..., None] * x
        absr = np.abs(r)
        # floor the scale at rounding level, so that exact data (residuals ~1e-19) keeps weight 1 everywhere
        floor = 64 * np.finfo(np.float64).eps * np.abs(y).max(axis=-1)
        s = np.maximum(np.median(absr, axis=-1) / _MAD_NORMAL, floor)
        cut = (HUBER_K * s)[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(absr <= cut, 1.0, cut / np.where(absr > 0, absr, 1.0))
        a_new, b_new = _wls(x, y, w)
        done = np.isclose(a_new, a, rtol=_TOL, atol=0.0) & np.isclose(b_new, b, rtol=_TOL, atol=0.0)
        a, b = a_new, b_new
        if np.all(done | np.isnan(a) | np.isnan(b)):
            break
    return a, b, w


def _bootstrap(x: np.ndarray, y: np.ndarray, robust: bool, n_boot: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """Intercepts and slopes of ``n_boot`` case resamples (NaN where a resample is degenerate)."""
    n = x.size
    fixed = np.empty(n_boot)
    slope = np.empty(n_boot)
    for start in range(0, n_boot, _CHUNK):
        m = min(_CHUNK, n_boot - start)
        idx = rng.integers(0, n, size=(m, n))
        a, b, _ = _fit_lines(x[idx], y[idx], robust)
        fixed[start:start + m] = a
        slope[start:start + m] = b
    return fixed, slope


def _quantile_ci(samples: np.ndarray, level: float) -> tuple[float, float] | None:
    """Central ``level`` percentile interval (linear interpolation; +inf stays +inf). None if empty."""
    s = np.sort(samples[~np.isnan(samples)])
    if s.size == 0:
        return None

    def q(p: float) -> float:
        pos = p * (s.size - 1)
        lo, hi = int(math.floor(pos)), int(math.ceil(pos))
        frac = pos - lo
        if frac == 0.0:
            return float(s[lo])
        if math.isinf(s[hi]):  # only +inf occurs (a break-even that never comes); interpolating to it is +inf
            return math.inf
        return float(s[lo] + (s[hi] - s[lo]) * frac)

    alpha = (1.0 - level) / 2.0
    return q(alpha), q(1.0 - alpha)


def _check_boot_args(level: float, n_boot: int) -> None:
    if not (0.0 < level < 1.0):
        raise ValueError(f"level: must be in (0, 1), got {level}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0:
        raise ValueError(f"n_boot: must be a non-negative integer, got {n_boot!r}")


@dataclass(frozen=True)
class LinearFit:
    """A fitted cost line ``seconds ≈ fixed + per_token · tokens`` (:func:`fit_linear`).

    ``fixed`` (s per micro-batch, the intercept), ``per_token`` (s/token, the slope), ``fixed_ci`` /
    ``per_token_ci`` (``level`` percentile-bootstrap intervals, None when ``n_boot=0``), ``method``
    ("huber" or "ols"), ``n`` observations, ``token_budgets`` (distinct token counts), ``tokens_range``,
    ``residual_scale`` (MAD/0.6745 of the residuals, s), ``downweighted`` (observations the Huber fit gave
    weight < 1, i.e. flagged as outlying), ``level``, ``n_boot``, ``n_boot_used``."""

    fixed: float
    per_token: float
    fixed_ci: tuple[float, float] | None
    per_token_ci: tuple[float, float] | None
    method: Literal["huber", "ols"]
    n: int
    token_budgets: int
    tokens_range: tuple[float, float]
    residual_scale: float
    downweighted: int
    level: float
    n_boot: int
    n_boot_used: int


def _fit_with_draws(tokens: Any, seconds: Any, *, robust: bool, level: float, n_boot: int,
                    rng: np.random.Generator) -> tuple[LinearFit, np.ndarray, np.ndarray]:
    x, y = _validate(tokens, seconds)
    a, b, w = _fit_lines(x, y, robust)
    fixed_draws, slope_draws = _bootstrap(x, y, robust, n_boot, rng)
    ok = ~(np.isnan(fixed_draws) | np.isnan(slope_draws))
    resid = y - float(a) - float(b) * x
    result = LinearFit(
        fixed=float(a),
        per_token=float(b),
        fixed_ci=_quantile_ci(fixed_draws[ok], level) if n_boot else None,
        per_token_ci=_quantile_ci(slope_draws[ok], level) if n_boot else None,
        method="huber" if robust else "ols",
        n=int(x.size),
        token_budgets=int(np.unique(x).size),
        tokens_range=(float(x.min()), float(x.max())),
        residual_scale=float(np.median(np.abs(resid)) / _MAD_NORMAL),
        downweighted=int((w < 1.0).sum()),
        level=level,
        n_boot=int(n_boot),
        n_boot_used=int(ok.sum()),
    )
    return result, fixed_draws, slope_draws


def fit_linear(tokens: Sequence[float], seconds: Sequence[float], *, robust: bool = True, level: float = 0.95,
               n_boot: int = 2000, seed: int = 0) -> LinearFit:
    """Fit ``seconds ≈ fixed + per_token · tokens`` (the model: :func:`cost_model`); returns a
    :class:`LinearFit`.

    Method. Timings have one-sided spikes (a garbage collection, a first-step warm-up, a noisy neighbour) that
    drag an ordinary least-squares line. The robust fit is Huber's M-estimator (Huber 1964, "Robust
    estimation of a location parameter"; regression form: Huber 1973) computed by iteratively reweighted
    least squares (Holland & Welsch 1977): with residuals ``r_i`` and scale ``s``, weight
    ``w_i = min(1, k·s/|r_i|)``, refit weighted least squares, repeat. ``k = 1.345`` gives 95% of OLS's
    efficiency under Gaussian noise; ``s`` is re-estimated every iteration as the normalised median
    absolute residual ``median|r| / 0.6745`` (Hampel's MAD; statsmodels' RLM default). Observations far
    from the line get bounded influence. Why Huber rather than Theil–Sen: a sweep holds thousands of
    micro-batches and each bootstrap resample refits, so an O(n) fit that vectorises over resamples beats
    Theil–Sen's O(n²) pairwise slopes; the design points (token budgets) are chosen by the experiment, so
    there are no leverage outliers for Theil–Sen's extra protection to guard against. On noise-free data
    the fit is exact: the OLS start has zero residuals and the iteration stops there. ``robust=False``
    gives plain OLS.

    Intervals. ``B`` resamples (default 2000) of the (tokens, seconds) observations with replacement, seeded
    (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 9.5 resampling cases and ch. 13
    percentile intervals). Each resample is refitted; the ``level`` interval is the central percentile
    range of the refits. Resamples that hold fewer than two distinct token budgets cannot separate fixed
    from per-token cost and are dropped (``n_boot_used`` counts the rest).

    >>> fit = fit_linear([1000, 2000, 4000], [0.003, 0.004, 0.006], n_boot=0)
    >>> round(fit.fixed * 1e3, 9), round(fit.per_token * 1e6, 9)  # 2 ms + 1 µs per token
    (2.0, 1.0)

    Raises ValueError naming the argument for ragged, non-finite or negative inputs and when
    ``tokens`` holds fewer than two distinct budgets (no slope can be separated from the intercept).
    """
    _check_boot_args(level, n_boot)
    result, _, _ = _fit_with_draws(tokens, seconds, robust=robust, level=level, n_boot=n_boot,
                                   rng=np.random.default_rng(seed))
    return result


# ------------------------------------------------------------------------------------------ cost model


def _columns(data: Any, cols: Sequence[str]) -> dict[str, list[Any]]:
    """Columns of a DataFrame-like object (has ``.columns``) or of an iterable of row mappings."""
    if hasattr(data, "columns"):
        missing = [c for c in cols if c not in data.columns]
        if missing:
            raise ValueError(f"data: missing column(s) {missing}; has {list(data.columns)}")
        return {c: list(data[c]) for c in cols}
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise ValueError(f"data: expected a DataFrame or an iterable of row mappings, got {type(data).__name__}")
    out: dict[str, list[Any]] = {c: [] for c in cols}
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise ValueError(f"data: row {i} is a {type(row).__name__}, expected a mapping with keys {list(cols)}")
        for c in cols:
            if c not in row:
                raise ValueError(f"data: row {i} lacks column {c!r}")
            out[c].append(row[c])
    return out


def _quantity(text: str, ci: tuple[float, float] | None, fmt: str, level: float, scale: float = 1.0,
              extra: str = "", inline: bool = False) -> str:
    """``"2.03 ms (95% CI [1.97, 2.08]; extra)"`` (``inline``: ``"2.03 ms, 95% CI [1.97, 2.08]; extra"``,
    for use inside parentheses), or just the text when there is no CI."""
    inner = [f"{level:.0%} CI [{ci[0] * scale:{fmt}}, {ci[1] * scale:{fmt}}]"] if ci is not None else []
    inner += [extra] if extra else []
    if not inner:
        return text
    return f"{text}, {'; '.join(inner)}" if inline else f"{text} ({'; '.join(inner)})"


#: what the cost model found (see :class:`CostModel`)
CostStatus = Literal["break_even", "always_faster", "no_break_even", "unresolved", "out_of_range"]


@dataclass(frozen=True)
class CostModel:
    """The two precisions' cost lines and where they cross (:func:`cost_model`).

    ``fits``: {baseline: fit, candidate: fit} (:class:`LinearFit`); ``delta_fixed`` / ``delta_fixed_ci``:
    fixed_candidate − fixed_baseline (s per micro-batch); ``per_token_saving`` / ``per_token_saving_ci``:
    per_token_baseline − per_token_candidate (s/token); ``saving_positive_fraction``: share of joint
    resamples with a positive saving (None if n_boot=0); ``break_even_estimate``: max(Δfixed/saving, 0)
    whenever the saving is positive, else None — the bare ratio, for the record; trust ``break_even``;
    ``break_even`` / ``break_even_ci``: tokens per micro-batch above which the candidate is faster, given
    only when ``status`` is "break_even" or "always_faster" (0 tokens), else None.

    ``status``, one of:

    - "break_even"    saving > 0 with its CI above 0, Δfixed > 0, and the crossing within
      [min tokens / extrapolation, max tokens × extrapolation] of the measurements;
    - "always_faster" saving > 0 (CI above 0) and Δfixed ≤ 0: faster at every size, break-even 0;
    - "no_break_even" saving ≤ 0: the candidate costs more per token, the lines never cross above 0;
    - "unresolved"    saving > 0 but its CI reaches 0: the data cannot tell;
    - "out_of_range"  a crossing exists but lies far outside the measured token range.

    ``headline``: the finding in a few words (e.g. "no break-even"); ``verdict``: the headline and the
    numbers behind it, one sentence; ``tokens_range``, ``level``, ``n_boot``, ``n_boot_used`` (joint
    resamples valid for both fits)."""

    fits: dict[str, LinearFit]
    delta_fixed: float
    delta_fixed_ci: tuple[float, float] | None
    per_token_saving: float
    per_token_saving_ci: tuple[float, float] | None
    saving_positive_fraction: float | None
    break_even_estimate: float | None
    break_even: float | None
    break_even_ci: tuple[float, float] | None
    status: CostStatus
    headline: str
    verdict: str
    tokens_range: tuple[float, float]
    level: float
    n_boot: int
    n_boot_used: int


def cost_model(
    data: Any,
    *,
    baseline: str = "bf16",
    candidate: str = "mxfp8",
    precision_col: str = "precision",
    tokens_col: str = "tokens",
    seconds_col: str = "seconds",
    robust: bool = True,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    extrapolation: float = 2.0,
    emulated: bool | None = None,
) -> CostModel:
    """Per-precision cost lines, MXFP8's extra fixed cost, its per-token saving, and the break-even.

    ``data``: a DataFrame or an iterable of row mappings with columns ``precision`` ("bf16"/"mxfp8";
    other values are ignored), ``tokens`` (per micro-batch) and ``seconds``. Each precision is fitted
    with :func:`fit_linear`.

    The wall time of one learner micro-batch is modelled as affine in the tokens it processes (the
    learner's padded ``rows × max_len``, :class:`~fp8rl_core.learner.grpo.MicroBatchTiming.tokens`)::

        seconds ≈ fixed + per_token · tokens

    ``fixed`` is what a micro-batch pays whatever its size (kernel launches, host-side Python, weight
    quantization — it scales with the parameters, not the tokens — allocator work); ``per_token`` is what
    grows with the activations (GEMM FLOPs, activation quantization, element-wise work). MXFP8 training
    adds fixed work (more kernels, scale handling, weight casts) and, on hardware with FP8 tensor cores,
    saves per-token work (FP8 GEMMs run at about twice the BF16 rate). With

        Δfixed = fixed_mxfp8 − fixed_bf16          (s per micro-batch, > 0 when MXFP8 adds overhead)
        saving = per_token_bf16 − per_token_mxfp8  (s per token,       > 0 when MXFP8 is cheaper per token)

    the two cost lines cross at ``break_even = Δfixed / saving`` tokens per micro-batch; MXFP8 is faster
    above it. This is the analysis behind the reference result in docs/design.md ("Reference results": dense
    break-even ≈ 4.5k tokens per micro-batch on B200). On CPU emulation the saving is expected to be
    negative — quantizing is extra work and there are no FP8 tensor cores — and the analysis then says so
    instead of printing a meaningless ratio.

    :func:`cost_model` resamples
    each precision independently (they are independent runs) and pairs resample ``b`` of one with
    resample ``b`` of the other, so Δfixed, the saving and the break-even get intervals from the same
    joint draws; ``saving_positive_fraction`` is the share of joint resamples with a positive saving.

    Returns a :class:`CostModel`. ``emulated=True`` adds to a no-break-even verdict that this is expected on
    CPU emulation; ``None`` (default) says it conditionally; ``False`` omits it. With ``n_boot=0`` there
    are no CIs and the status is decided on the point estimates alone.
    """
    _check_boot_args(level, n_boot)
    if not (extrapolation >= 1.0):
        raise ValueError(f"extrapolation: must be ≥ 1 (a factor around the measured range), got {extrapolation}")
    if baseline == candidate:
        raise ValueError(f"baseline and candidate: must differ, both are {baseline!r}")
    cols = _columns(data, [precision_col, tokens_col, seconds_col])
    prec = [str(p) for p in cols[precision_col]]
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)]
    fits: dict[str, LinearFit] = {}
    draws: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, rng in zip((baseline, candidate), rngs):
        sel = [i for i, p in enumerate(prec) if p == name]
        if not sel:
            raise ValueError(f"{precision_col}: no rows for {name!r}; found {sorted(set(prec))}")
        try:
            fit, a, b = _fit_with_draws([cols[tokens_col][i] for i in sel], [cols[seconds_col][i] for i in sel],
                                        robust=robust, level=level, n_boot=n_boot, rng=rng)
        except ValueError as exc:
            raise ValueError(f"{name} rows: {exc}") from None
        fits[name], draws[name] = fit, (a, b)

    fb, fc = fits[baseline], fits[candidate]
    delta = fc.fixed - fb.fixed
    saving = fb.per_token - fc.per_token
    d_draws = draws[candidate][0] - draws[baseline][0]
    s_draws = draws[baseline][1] - draws[candidate][1]
    ok = ~(np.isnan(d_draws) | np.isnan(s_draws))
    d_draws, s_draws = d_draws[ok], s_draws[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        be_draws = np.where(s_draws > 0, np.maximum(d_draws / np.where(s_draws > 0, s_draws, 1.0), 0.0), np.inf)
    have_ci = n_boot > 0 and d_draws.size > 0
    delta_ci = _quantile_ci(d_draws, level) if have_ci else None
    saving_ci = _quantile_ci(s_draws, level) if have_ci else None
    pos_frac = float((s_draws > 0).mean()) if have_ci else None
    t_lo = min(fb.tokens_range[0], fc.tokens_range[0])
    t_hi = max(fb.tokens_range[1], fc.tokens_range[1])
    estimate = max(delta / saving, 0.0) if saving > 0 else None

    pos_txt = f"positive in {pos_frac:.1%} of bootstrap resamples" if pos_frac is not None else ""
    saving_txt = _quantity(f"{saving:.3g} s/token", saving_ci, ".3g", level, extra=pos_txt)
    delta_txt = _quantity(f"{delta * 1e3:.3g} ms per micro-batch", delta_ci, ".3g", level, scale=1e3)
    saving_inline = _quantity(f"{saving:.3g} s/token", saving_ci, ".3g", level, extra=pos_txt, inline=True)
    delta_inline = _quantity(f"{delta * 1e3:.3g} ms per micro-batch", delta_ci, ".3g", level, scale=1e3, inline=True)
    break_even = break_even_ci = None
    status: CostStatus
    if saving <= 0:
        status = "no_break_even"
        headline = "no break-even"
        detail = f"{candidate} costs more per token here (saving {saving_inline})"
        if emulated:
            detail += f"; expected for CPU emulation, where {_CPU_REASON}"
        elif emulated is None:
            detail += f"; expected if this ran as CPU emulation, where {_CPU_REASON}"
    elif saving_ci is not None and saving_ci[0] <= 0:
        status = "unresolved"
        headline = "break-even not resolved"
        detail = (f"the per-token saving of {candidate}, {saving_txt}, is not distinguishable from zero; measure "
                  "more token budgets or more repeats")
    elif delta <= 0:
        status = "always_faster"
        break_even = 0.0
        break_even_ci = _quantile_ci(be_draws, level) if have_ci else None
        headline = f"{candidate} is faster at every micro-batch size"
        detail = f"no extra fixed cost (Δfixed {delta_inline}) and a per-token saving of {saving_txt}"
    elif not (t_lo / extrapolation <= estimate <= t_hi * extrapolation):
        status = "out_of_range"
        headline = "break-even outside the measured range"
        detail = (f"the fit puts it at ≈{estimate:.3g} tokens per micro-batch, but the budgets span "
                  f"{t_lo:.0f}–{t_hi:.0f} tokens (extrapolation beyond ×{extrapolation:g} is not trusted); measure "
                  "budgets around it")
    else:
        status = "break_even"
        break_even = float(estimate)
        break_even_ci = _quantile_ci(be_draws, level) if have_ci else None
        be_txt = _quantity(f"≈{break_even:.0f} tokens per micro-batch", break_even_ci, ".0f", level)
        headline = f"{candidate} pays off above {be_txt}"
        detail = f"it adds {delta_txt} and saves {saving_txt}"
    verdict = f"{headline}: {detail}"
    if not have_ci:
        verdict += f" (no CI: {'n_boot=0' if n_boot == 0 else 'no valid bootstrap resample'})"
    return CostModel(
        fits=fits,
        delta_fixed=float(delta),
        delta_fixed_ci=delta_ci,
        per_token_saving=float(saving),
        per_token_saving_ci=saving_ci,
        saving_positive_fraction=pos_frac,
        break_even_estimate=None if estimate is None else float(estimate),
        break_even=break_even,
        break_even_ci=break_even_ci,
        status=status,
        headline=headline,
        verdict=verdict,
        tokens_range=(t_lo, t_hi),
        level=level,
        n_boot=int(n_boot),
        n_boot_used=int(d_draws.size),
    )
