"""95% intervals for the report's headline figures, and the sample size that would settle a call.

Percentiles (P95 TTFT, P95 ITL) get the distribution-free order-statistic interval: for a
sample of n independent requests, the number of them below the true q-quantile is
Binomial(n, q), so [X_(l), X_(u)] covers it with probability F(u-1) - F(l-1) (F the binomial
CDF), whatever the latency distribution. It is exact (never below the stated confidence for a
continuous distribution), needs no resampling and no assumption about the tail, which matters
for latencies; a bootstrap of an extreme quantile is known to under-cover at small n because
it can never reach past the sample maximum. When n is too small for a bounded upper end
(q^n > alpha/2: fewer than 72 requests for a P95 at 95%), the upper end is None, "not bounded
by this sample", and the report says how many requests would bound it.

SLO-compliant capacity is a sum of per-request successful tokens over a fixed window: its
interval is a seeded percentile bootstrap of that sum (requests resampled with replacement),
which needs no normal approximation for heavy-tailed output lengths; seeded, so a report is
reproducible.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from core.quantiles import nearest_rank  # the report's quantile definition (why: core/quantiles.py)

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20260


def binom_cdf_table(n: int, p: float) -> list[float]:
    """[P(X <= k) for k = 0..n], X ~ Binomial(n, p); log-space terms so large n does not overflow."""
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"binomial needs n >= 0 and 0 <= p <= 1, got n={n}, p={p}")
    if p in (0.0, 1.0):
        return [1.0 if (p == 0.0 or k == n) else 0.0 for k in range(n + 1)]
    odds = math.log(p) - math.log1p(-p)
    log_pmf = n * math.log1p(-p)  # k = 0; then pmf(k+1) = pmf(k) (n-k)/(k+1) p/(1-p)
    out, acc = [], 0.0
    for k in range(n + 1):
        acc += math.exp(log_pmf)
        out.append(min(acc, 1.0))
        if k < n:
            log_pmf += math.log((n - k) / (k + 1)) + odds
    return out


@dataclass(frozen=True)
class QuantileCI:
    q: float
    n: int
    point: float | None
    low: float | None  # None: below the sample (too few requests to bound it)
    high: float | None  # None: above the sample (too few requests to bound it)
    low_rank: int  # 1-based order statistic; 0 when unbounded
    high_rank: int  # 1-based order statistic; n + 1 when unbounded
    coverage: float  # exact coverage probability of [X_(low_rank), X_(high_rank)]

    @property
    def bounds(self) -> list[float | None]:
        return [self.low, self.high]

    def as_dict(self) -> dict[str, object]:
        return {"q": self.q, "n": self.n, "point": self.point, "ci": self.bounds, "ranks": [self.low_rank, self.high_rank],
                "coverage": self.coverage, "method": "order-statistic (binomial) interval, distribution-free"}


def quantile_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int, float]:
    """(l, u, coverage): the narrowest equal-tailed order-statistic ranks with coverage >= confidence.

    l = 0 / u = n + 1 mean the end is unbounded by a sample of n."""
    if n <= 0:
        return 0, n + 1, 1.0
    alpha = 1.0 - confidence
    cdf = binom_cdf_table(n, q)

    def F(k: int) -> float:  # the binomial CDF, F(-1) = 0
        return 0.0 if k < 0 else 1.0 if k >= n else cdf[k]

    low = bisect.bisect_right(cdf, alpha / 2)  # ranks r with F(r-1) <= alpha/2 are 1..low
    high = bisect.bisect_left(cdf, 1 - alpha / 2) + 1  # smallest r with F(r-1) >= 1 - alpha/2
    high = min(high, n + 1)
    return low, high, F(high - 1) - F(low - 1)


def quantile_ci(sorted_values: Sequence[float], q: float = 0.95, confidence: float = CONFIDENCE) -> QuantileCI:
    n = len(sorted_values)
    if n == 0:
        return QuantileCI(q, 0, None, None, None, 0, 1, 1.0)
    lo, hi, cov = quantile_ranks(n, q, confidence)
    return QuantileCI(
        q, n, sorted_values[nearest_rank(n, q) - 1],
        sorted_values[lo - 1] if lo >= 1 else None,
        sorted_values[hi - 1] if hi <= n else None,
        lo, hi, cov,
    )


def min_n_bounded_upper(q: float = 0.95, confidence: float = CONFIDENCE) -> int:
    """Fewest requests whose q-quantile interval has a finite upper end: q^n <= alpha / 2."""
    return math.ceil(math.log((1 - confidence) / 2) / math.log(q))


def n_to_settle(n: int, half_width: float, distance: float) -> int | None:
    """Requests an interval of half-width `half_width` from n requests needs to exclude a boundary
    `distance` away from the point, assuming the width shrinks as 1/sqrt(n); None: the point is on it."""
    if distance <= 0:
        return None
    if half_width <= distance:
        return n
    return math.ceil(n * (half_width / distance) ** 2)


def bootstrap_sum_ci(
    values: Sequence[float], confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of sum(values), requests resampled with replacement."""
    n = len(values)
    if n == 0:
        return None
    rng = random.Random(seed)
    sums = sorted(math.fsum(rng.choices(values, k=n)) for _ in range(resamples))
    alpha = 1.0 - confidence
    lo = sums[max(math.floor(alpha / 2 * resamples), 0)]
    hi = sums[min(math.ceil((1 - alpha / 2) * resamples) - 1, resamples - 1)]
    return lo, hi
