"""Sample quantiles: the two definitions the harness uses, side by side, and why there are two.

- `nearest_rank` (the report): the q-quantile is an observed value, the ceil(n q)-th smallest,
  which is what duckdb's `quantile_disc` returns over the records, and what the order-statistic
  interval of `core.stats` is defined on (its ends are order statistics too). A P95 SLO
  verdict then speaks of a request that really happened.
- `interpolated_quantile` (the client's own summaries and the benchmarks): linear interpolation
  between the closest ranks, numpy's default and what vLLM's `bench serve` and AIPerf print, so
  the benchmarks compare our figures with theirs on the same definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(n: int, q: float) -> int:
    """1-based rank of the nearest-rank q-quantile of n values (what duckdb's quantile_disc returns)."""
    return min(max(math.ceil(n * q - 1e-12), 1), n)


def interpolated_quantile(values: Sequence[float], q: float, *, empty: float = 0.0) -> float:
    """Linear interpolation between the closest ranks (numpy's default); `empty` for no data."""
    if not values:
        return empty
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
