"""Two-sample Kolmogorov-Smirnov test: do two fleets' output lengths come from one distribution?

D = the largest gap between the two empirical CDFs. The p-value is the asymptotic Kolmogorov
distribution Q(lambda) = 2 sum_{j>=1} (-1)^(j-1) exp(-2 j^2 lambda^2) at
lambda = (sqrt(Ne) + 0.12 + 0.11 / sqrt(Ne)) D, Ne = n m / (n + m) (Stephens' small-sample
correction; Press et al., Numerical Recipes, 3rd ed., section 14.3.3). It is approximate for
small samples and conservative with ties (token counts are integers), so the quality layer
asks for a minimum sample size before it reads the p-value.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KsResult:
    statistic: float  # D
    p_value: float
    n: int
    m: int


def kolmogorov_q(lam: float) -> float:
    """P(K > lam) for the Kolmogorov distribution; 1 at lam <= 0."""
    if lam <= 0:
        return 1.0
    if lam < 0.2:  # the alternating series converges slowly here, and Q is 1 to 15 digits
        return 1.0
    total, sign = 0.0, 1.0
    for j in range(1, 101):
        term = math.exp(-2.0 * j * j * lam * lam)
        total += sign * term
        if term < 1e-16:
            break
        sign = -sign
    return min(1.0, max(0.0, 2.0 * total))


def ks_2samp(a: Sequence[float], b: Sequence[float]) -> KsResult:
    if not a or not b:
        raise ValueError(f"two-sample test needs two non-empty samples, got {len(a)} and {len(b)}")
    xs, ys = sorted(a), sorted(b)
    n, m = len(xs), len(ys)
    d = 0.0
    for v in sorted(set(xs) | set(ys)):  # the CDFs only change at sample values
        d = max(d, abs(bisect.bisect_right(xs, v) / n - bisect.bisect_right(ys, v) / m))
    ne = math.sqrt(n * m / (n + m))
    return KsResult(d, kolmogorov_q((ne + 0.12 + 0.11 / ne) * d), n, m)
