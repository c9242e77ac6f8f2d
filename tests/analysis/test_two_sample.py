"""The two-sample KS test against hand-computed values."""

from __future__ import annotations

import math
import random

import pytest

from analysis.measure.two_sample import kolmogorov_q, ks_2samp


def test_identical_samples_have_d_zero_and_p_one() -> None:
    r = ks_2samp([5, 5, 7, 9] * 10, [9, 7, 5, 5] * 10)
    assert r.statistic == 0.0 and r.p_value == 1.0 and (r.n, r.m) == (40, 40)


def test_disjoint_samples() -> None:
    # 30 values 1..30 against 30 values 101..130: D = 1; Ne = 15, lambda = (3.873 + 0.12 + 0.0284) = 4.0214
    # Q = 2 (e^(-2 x 16.172) - ...) = 2 e^(-32.344) = 1.8e-14
    r = ks_2samp(list(range(1, 31)), list(range(101, 131)))
    assert r.statistic == 1.0
    lam = math.sqrt(15) + 0.12 + 0.11 / math.sqrt(15)
    assert r.p_value == pytest.approx(2 * math.exp(-2 * lam * lam), rel=1e-6)


def test_half_shifted_samples() -> None:
    # a = 0..19, b = 10..29: at v = 9, F_a = 10/20 and F_b = 0: D = 0.5 (no larger gap)
    # Ne = 10, lambda = (3.1623 + 0.12 + 0.0348) x 0.5 = 1.6585; Q = 2 (e^-5.5015 - e^-22.01 + ...) = 0.008162
    r = ks_2samp(list(range(20)), list(range(10, 30)))
    assert r.statistic == 0.5
    assert r.p_value == pytest.approx(0.008162, abs=2e-6)


def test_kolmogorov_q_known_points() -> None:
    # Q(1.36) = 0.0494 and Q(1.63) = 0.0098: the familiar 5% and 1% critical values
    assert kolmogorov_q(1.36) == pytest.approx(0.0494, abs=5e-4)
    assert kolmogorov_q(1.63) == pytest.approx(0.0098, abs=5e-4)
    assert kolmogorov_q(0.0) == 1.0 and kolmogorov_q(0.1) == 1.0


def test_same_distribution_rarely_rejects_at_one_percent() -> None:
    rng = random.Random(3)
    rejects = sum(
        ks_2samp([rng.expovariate(1 / 200) for _ in range(60)], [rng.expovariate(1 / 200) for _ in range(60)]).p_value
        < 0.01
        for _ in range(200)
    )
    assert rejects <= 6  # about 1% expected (the test is conservative): 2 of 200, 6 leaves room


def test_empty_sample_is_an_error() -> None:
    with pytest.raises(ValueError, match="non-empty samples, got 0 and 3"):
        ks_2samp([], [1, 2, 3])
