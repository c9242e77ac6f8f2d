"""95% intervals: hand-computed cases and coverage over many seeded synthetic samples."""

from __future__ import annotations

import math
import random

import pytest

from core import stats


def test_binomial_cdf_by_hand() -> None:
    # Binomial(2, 0.95): P(X=0) = 0.0025, P(X<=1) = 1 - 0.9025
    assert stats.binom_cdf_table(2, 0.95) == pytest.approx([0.0025, 0.0975, 1.0])


def test_order_statistic_ranks_by_hand() -> None:
    # n = 2: F(0) = 0.0025 <= 0.025 < F(1) = 0.0975, so l = 1; F(1) < 0.975, so the upper end is unbounded.
    assert stats.quantile_ranks(2, 0.95) == (1, 3, pytest.approx(1 - 0.0025))
    # n = 20: P(X >= 17) = 0.3585 + 0.3774 + 0.1887 + 0.0596 = 0.9841, so F(16) = 0.0159 <= 0.025 < F(17);
    # F(19) = 1 - 0.95^20 = 0.6415 < 0.975: unbounded above.
    lo, hi, cov = stats.quantile_ranks(20, 0.95)
    assert (lo, hi) == (17, 21) and cov == pytest.approx(1 - 0.0159, abs=1e-4)


def test_quantile_ci_on_a_known_sample() -> None:
    ci = stats.quantile_ci([float(i) for i in range(1, 21)])
    # nearest rank ceil(0.95 * 20) = 19 (duckdb's quantile_disc), interval [X_(17), unbounded]
    assert (ci.point, ci.low, ci.high, ci.n) == (19.0, 17.0, None, 20)
    big = stats.quantile_ci([float(i) for i in range(1, 101)])
    # n = 100: F(89) <= 0.025 < F(90), F(99) = 1 - 0.95^100 = 0.9941 >= 0.975 > F(98)
    assert (big.point, big.low, big.high) == (95.0, 90.0, 100.0)


def test_fewest_requests_for_a_bounded_p95() -> None:
    # 0.95^72 = 0.0249 <= 0.025 < 0.95^71 = 0.0262
    assert stats.min_n_bounded_upper() == 72
    assert stats.quantile_ranks(71, 0.95)[1] == 72 and stats.quantile_ranks(72, 0.95)[1] == 72


def test_sample_size_to_settle_by_hand() -> None:
    # half-width 2 around a point 1 from the boundary: the width must halve, so 4x the requests
    assert stats.n_to_settle(100, 2.0, 1.0) == 400
    assert stats.n_to_settle(100, 0.5, 1.0) == 100  # already settled
    assert stats.n_to_settle(100, 0.5, 0.0) is None  # on the boundary: nothing settles it


@pytest.mark.parametrize("n", [80, 300])
def test_p95_interval_covers_the_true_p95_at_its_stated_rate(n: int) -> None:
    rng = random.Random(7)
    true_p95 = -math.log(0.05)  # Exp(1)
    trials = 2000
    hits = 0
    for _ in range(trials):
        ci = stats.quantile_ci(sorted(rng.expovariate(1.0) for _ in range(n)))
        assert ci.low is not None and ci.high is not None
        hits += ci.low <= true_p95 <= ci.high
    exact = stats.quantile_ranks(n, 0.95)[2]
    assert exact >= 0.95
    tol = 4 * math.sqrt(exact * (1 - exact) / trials)  # binomial tolerance on the observed rate
    assert abs(hits / trials - exact) <= tol, (hits / trials, exact, tol)


def test_bootstrap_interval_of_a_sum_covers_about_95_percent() -> None:
    rng = random.Random(11)
    n, trials = 100, 300
    hits = 0
    for seed in range(trials):
        values = [rng.expovariate(1 / 200) for _ in range(n)]  # mean 200 tokens per request
        ci = stats.bootstrap_sum_ci(values, resamples=400, seed=seed)
        assert ci is not None
        hits += ci[0] <= n * 200 <= ci[1]
    tol = 4 * math.sqrt(0.95 * 0.05 / trials)  # plus a percentile bootstrap's small-n under-coverage on a skewed sum
    assert 0.95 - tol - 0.02 <= hits / trials <= 0.95 + tol


def test_bootstrap_is_reproducible() -> None:
    values = [float(i % 7) for i in range(50)]
    assert stats.bootstrap_sum_ci(values) == stats.bootstrap_sum_ci(values)
    assert stats.bootstrap_sum_ci([]) is None


def test_requests_for_a_step_to_hold_its_p95_by_hand() -> None:
    # nothing over the target: 72 requests already bound the P95 at the sample maximum, within it
    assert stats.n_to_hold(72, 0) == 72
    # one of 72 over: at N the bound is X_(u(N)), within the target while N - u(N) >= ceil(N/72);
    # N = 142: u = 140, 2 above it, ceil(142/72) = 2 over: holds; N = 141: u = 140, 1 above, 2 over: does not
    n = stats.n_to_hold(72, 1)
    assert n == 142
    u = stats.quantile_ranks(n, 0.95)[1]
    assert n - u >= -(-n // 72)
    u1 = stats.quantile_ranks(n - 1, 0.95)[1]
    assert (n - 1) - u1 < -(-(n - 1) // 72)
    # the more requests missed, the more it takes; at 5% or more no sample size makes the point hold
    assert stats.n_to_hold(72, 1) < stats.n_to_hold(72, 2) < stats.n_to_hold(72, 3)  # type: ignore[operator]
    assert stats.n_to_hold(72, 4) is None and stats.n_to_hold(100, 5) is None
