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

SLO-compliant capacity is a sum of per-request successful tokens over a fixed window. Its
interval (`sum_ci`) is chosen by the number of requests n:
- n <= BOOTSTRAP_MAX_N: a seeded percentile bootstrap of the sum (requests resampled with
  replacement, numpy, vectorized in blocks), which needs no normal approximation for the
  skewed output lengths of a capacity step's few dozen requests; seeded, so a report is
  reproducible;
- larger n: the normal interval sum +- z sqrt(n var), var the sample's population variance.
  That is the variance of the bootstrap's own resampled sums, and by n = 10,000 their
  distribution is normal to well within the bootstrap's Monte Carlo noise: the skewness of a
  sum falls as 1/sqrt(n) (a per-request skewness of 2 leaves 0.02, moving a 95% end by under
  1% of the half-width, while 1,000 resamples put about 4% of noise on each end). It needs only
  n, the sum and the variance, which duckdb computes over millions of records in one pass;
  the bootstrap would draw 1,000 x n values (tests/core/test_stats.py checks the two agree).

Order statistics of large samples: the binomial CDF is summed only over the window of +-12
standard deviations around n q, where all but 1e-30 of its mass lies, so the ranks of a P95
over millions of requests cost O(sqrt(n)), and the values at those ranks are found by
partial sorting (numpy.partition), not a full sort.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, TypeAlias

from core.quantiles import nearest_rank  # the report's quantile definition (why: core/quantiles.py)

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20260
BOOTSTRAP_MAX_N = 10_000  # above it, the normal interval of a sum (module docstring)
_BOOTSTRAP_BLOCK = 1 << 22  # resampled indices drawn at once (32 MiB of int64): bounds memory for any n
_CDF_WINDOW_SD = 12.0  # the binomial CDF's window, in standard deviations (module docstring)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# numpy is imported by the two functions that compute with it: core.manifest imports this module,
# and numpy would add ~0.2 s to the start of every process that reads a manifest (CLI, emulator).
FloatArray: TypeAlias = "npt.NDArray[np.float64]"


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
        return {
            "q": self.q,
            "n": self.n,
            "point": self.point,
            "ci": self.bounds,
            "ranks": [self.low_rank, self.high_rank],
            "coverage": self.coverage,
            "method": "order-statistic (binomial) interval, distribution-free",
        }


def binom_cdf_window(n: int, p: float) -> tuple[int, list[float]]:
    """(k0, [P(X <= k) for k = k0..k1]), X ~ Binomial(n, p), over the window of +-12 standard
    deviations around n p (clipped to 0..n): below k0 the CDF is under 1e-30, above k1 it is 1
    to within 1e-30. For small n the window is the whole of 0..n and equals binom_cdf_table."""
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"binomial needs n >= 0 and 0 <= p <= 1, got n={n}, p={p}")
    if p in (0.0, 1.0):
        return 0, binom_cdf_table(n, p)
    reach = _CDF_WINDOW_SD * math.sqrt(n * p * (1 - p)) + 10
    k0, k1 = max(0, math.floor(n * p - reach)), min(n, math.ceil(n * p + reach))
    odds = math.log(p) - math.log1p(-p)
    log_pmf = (
        math.lgamma(n + 1)
        - math.lgamma(k0 + 1)
        - math.lgamma(n - k0 + 1)
        + k0 * math.log(p)
        + (n - k0) * math.log1p(-p)
    )
    out, acc = [], 0.0
    for k in range(k0, k1 + 1):
        acc += math.exp(log_pmf)
        out.append(min(acc, 1.0))
        if k < n:
            log_pmf += math.log((n - k) / (k + 1)) + odds
    return k0, out


def quantile_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int, int, float]:
    """(l, u, coverage): the narrowest equal-tailed order-statistic ranks with coverage >= confidence.

    l = 0 / u = n + 1 mean the end is unbounded by a sample of n."""
    if n <= 0:
        return 0, n + 1, 1.0
    alpha = 1.0 - confidence
    k0, cdf = binom_cdf_window(n, q)
    k1 = k0 + len(cdf) - 1

    def F(k: int) -> float:  # the binomial CDF, F(-1) = 0; 0 below the window, 1 above it
        return 0.0 if k < k0 else 1.0 if k >= n or k > k1 else cdf[k - k0]

    low = k0 + bisect.bisect_right(cdf, alpha / 2)  # ranks r with F(r-1) <= alpha/2 are 1..low
    high = k0 + bisect.bisect_left(cdf, 1 - alpha / 2) + 1  # smallest r with F(r-1) >= 1 - alpha/2
    high = min(high, n + 1)
    return low, high, F(high - 1) - F(low - 1)


def quantile_ci(sorted_values: Sequence[float], q: float = 0.95, confidence: float = CONFIDENCE) -> QuantileCI:
    """The interval over an already sorted sample."""
    return quantile_ci_at(
        len(sorted_values), lambda ranks: {r: float(sorted_values[r - 1]) for r in ranks}, q, confidence
    )


def quantile_ci_unsorted(values: FloatArray, q: float = 0.95, confidence: float = CONFIDENCE) -> QuantileCI:
    """The same interval over an unsorted sample: only the three order statistics it reads are
    placed (numpy.partition, linear time), which is what makes millions of requests cheap."""

    import numpy as np

    def at(ranks: list[int]) -> dict[int, float]:
        part = np.partition(values, [r - 1 for r in ranks])
        return {r: float(part[r - 1]) for r in ranks}

    return quantile_ci_at(len(values), at, q, confidence)


def quantile_ci_at(
    n: int, at: Callable[[list[int]], dict[int, float]], q: float = 0.95, confidence: float = CONFIDENCE
) -> QuantileCI:
    """The interval of a sample of n values, given `at(ranks)`: the sample's order statistics at
    those 1-based ranks (its point and its bounded ends; `at` is called once, and not for n = 0)."""
    if n == 0:
        return QuantileCI(q, 0, None, None, None, 0, 1, 1.0)
    lo, hi, cov = quantile_ranks(n, q, confidence)
    point = nearest_rank(n, q)
    v = at(quantile_ci_ranks(n, q, confidence))
    return QuantileCI(q, n, v[point], v.get(lo), v.get(hi), lo, hi, cov)


def quantile_ci_ranks(n: int, q: float = 0.95, confidence: float = CONFIDENCE) -> list[int]:
    """The 1-based ranks quantile_ci_at reads of a sample of n values (n >= 1), sorted: for a
    caller that finds the order statistics before it asks for the interval."""
    lo, hi, _ = quantile_ranks(n, q, confidence)
    return sorted({nearest_rank(n, q)} | {r for r in (lo, hi) if 1 <= r <= n})


def min_n_bounded_upper(q: float = 0.95, confidence: float = CONFIDENCE) -> int:
    """Fewest requests whose q-quantile interval has a finite upper end: q^n <= alpha / 2."""
    return math.ceil(math.log((1 - confidence) / 2) / math.log(q))


def n_to_hold(
    n: int, over: int, q: float = 0.95, confidence: float = CONFIDENCE, limit: int = 10_000_000
) -> int | None:
    """Fewest requests at which a step whose n requests had `over` of them above the target would
    bound its q-quantile within the target at `confidence`, if requests keep missing at that
    share: the interval's high end X_(u) is within the target when at most N - u of N requests
    are over it. None: the share is q's complement or more (the point estimate itself misses, and
    no sample size makes it hold), or more than `limit` requests would be needed."""
    if n <= 0 or over < 0 or over / n >= 1 - q:
        return None
    share = over / n

    def holds(size: int) -> bool:
        u = quantile_ranks(size, q, confidence)[1]
        return u <= size and size - u >= math.ceil(share * size - 1e-9)

    lo = max(n, min_n_bounded_upper(q, confidence))
    if holds(lo):
        return lo
    hi = lo
    while not holds(hi):  # the bound's rank nears q n as n grows; the misses stay at share n < (1 - q) n
        if hi >= limit:
            return None
        lo, hi = hi, min(limit, hi * 2)
    while hi - lo > 1:  # the smallest size that holds, to within the ranks' own steps
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    return hi


def n_to_settle(n: int, half_width: float, distance: float) -> int | None:
    """Requests an interval of half-width `half_width` from n requests needs to exclude a boundary
    `distance` away from the point, assuming the width shrinks as 1/sqrt(n); None: the point is on it."""
    if distance <= 0:
        return None
    if half_width <= distance:
        return n
    return math.ceil(n * (half_width / distance) ** 2)


def bootstrap_sum_ci(
    values: Sequence[float] | FloatArray,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of sum(values), requests resampled with replacement.

    Vectorized: each block of resamples is one (k, n) array of indices drawn by numpy's seeded
    generator, so the same values and seed always give the same interval."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        return None
    rng = np.random.default_rng(seed)
    sums = np.empty(resamples, dtype=np.float64)
    block = max(1, min(resamples, _BOOTSTRAP_BLOCK // n))
    for start in range(0, resamples, block):
        k = min(block, resamples - start)
        sums[start : start + k] = x[rng.integers(0, n, size=(k, n))].sum(axis=1)
    sums.sort()
    alpha = 1.0 - confidence
    lo = sums[max(math.floor(alpha / 2 * resamples), 0)]
    hi = sums[min(math.ceil((1 - alpha / 2) * resamples) - 1, resamples - 1)]
    return float(lo), float(hi)


def normal_sum_ci(n: int, total: float, variance: float, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """total +- z sqrt(n variance): the interval of a sum of n requests whose values have
    population variance `variance` (the bootstrap's own variance of the sum)."""
    if n == 0:
        return None
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    half = z * math.sqrt(n * max(variance, 0.0))
    return total - half, total + half


@dataclass(frozen=True)
class SumInterval:
    low: float
    high: float
    method: str  # how it was computed, for the report


def sum_ci(
    n: int, total: float, variance: float, sample: Callable[[], Sequence[float] | FloatArray]
) -> SumInterval | None:
    """The 95% interval of a sum of n per-request values: bootstrapped up to BOOTSTRAP_MAX_N
    requests (`sample()` is read only then), the normal interval above (module docstring)."""
    if n == 0:
        return None
    if n <= BOOTSTRAP_MAX_N:
        ci = bootstrap_sum_ci(sample())
        method = f"percentile bootstrap, {BOOTSTRAP_RESAMPLES:,} seeded resamples of {n:,} requests"
    else:
        ci = normal_sum_ci(n, total, variance)
        method = f"normal interval of a sum of {n:,} requests (over {BOOTSTRAP_MAX_N:,}: agrees with the bootstrap)"
    return None if ci is None else SumInterval(ci[0], ci[1], method)
