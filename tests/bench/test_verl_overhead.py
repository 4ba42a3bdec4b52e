"""bench/verl_overhead.py's arithmetic: the fixed + per-byte fit with its intervals, the B200 projection and the
goal lines (the bench itself is not part of CI)."""

from __future__ import annotations

import math

import pytest

from bench.verl_overhead import B200, GPU_PASSES, fit_line, goal, projected_sync


def test_the_fit_recovers_a_line_and_its_interval_covers_it():
    x = [1e6, 4e6, 2e7, 1e8]
    noise = [0.01, -0.02, 0.015, -0.005]
    y = [0.5 + 3e-9 * a + e for a, e in zip(x, noise)]
    f = fit_line(x, y)
    assert f.n == 4 and f.fixed == pytest.approx(0.5, abs=0.03) and f.per_byte == pytest.approx(3e-9, rel=0.02)
    assert f.fixed_ci[0] < 0.5 < f.fixed_ci[1] and f.per_byte_ci[0] < 3e-9 < f.per_byte_ci[1]
    exact = fit_line([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])  # no residual: a zero-width interval
    assert (exact.fixed, exact.per_byte) == pytest.approx((0.0, 2.0)) and exact.per_byte_ci == pytest.approx((2.0, 2.0))
    two = fit_line([1.0, 3.0], [1.0, 2.0])  # two points: the line, no interval
    assert two.per_byte == 0.5 and all(math.isnan(v) for v in two.fixed_ci + two.per_byte_ci)
    with pytest.raises(ValueError, match="two different sizes; got 2 points, 1 sizes"):
        fit_line([1.0, 1.0], [1.0, 2.0])


def test_the_projection_is_bytes_over_the_stated_bandwidths():
    p = projected_sync(8e9, 16e9, 0.25)
    hbm, nvl, host = B200["hbm_bytes_s"][0], B200["nvlink_bytes_s"][0], B200["host_bytes_s"][0]
    assert p["export"] == pytest.approx(GPU_PASSES["export"] * 8e9 / hbm)
    assert p["transport"] == pytest.approx(8e9 / nvl) and p["bf16_update"] == pytest.approx(16e9 / nvl)
    assert p["cheap_tier"] == pytest.approx(2 * GPU_PASSES["fingerprint_side"] * 8e9 / hbm)
    assert p["masters_copy"] == pytest.approx(32e9 / host) and p["fixed"] == 0.25
    assert all(src for _, src in B200.values())  # every bandwidth names its source


def test_goal_lines_say_pass_or_miss():
    assert goal("x", 0.04, 0.05, True) == "goal x: ratio=0.040 (<= 0.05) pass"
    assert goal("y", 0.6, 0.8, False) == "goal y: ratio=0.600 (>= 0.8) miss"
