"""Quantiles of cumulative histograms with Prometheus `histogram_quantile` semantics.

Fleet percentiles come from buckets merged across replicas (sum by le) first; a quantile
of the merged histogram is the fleet's, an average of per-replica quantiles is not.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping


def merge_buckets(replicas: Iterable[Mapping[float, float]]) -> dict[float, float]:
    """Sum cumulative bucket counts by upper bound (le) across replicas."""
    merged: dict[float, float] = defaultdict(float)
    for buckets in replicas:
        for le, count in buckets.items():
            merged[float(le)] += count
    return dict(merged)


# A bucket's (lower, upper) bounds: the quantile read in it lies in (lower, upper]; upper is inf
# for the +Inf bucket and lower -inf below a first bound <= 0.
Bucket = tuple[float, float]


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus semantics: linear interpolation inside the bucket holding rank q*count;
    the lowest bucket starts at 0; a rank in the +Inf bucket returns the highest finite bound.
    None when the histogram is empty or has no +Inf bucket."""
    located = quantile_in_bucket(q, buckets)
    return None if located is None else located[0]


def quantile_in_bucket(q: float, buckets: Mapping[float, float]) -> tuple[float, Bucket] | None:
    """histogram_quantile's figure and the bucket it was read in: the histogram places the
    quantile in that bucket and no closer (the interpolation inside it assumes the observations
    spread evenly, which nothing measures), so the bucket is the figure's resolution."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    pts = sorted(buckets.items())
    if not pts or not math.isinf(pts[-1][0]):
        return None
    # Counts are monotone in le by definition; increase() extrapolation can break that slightly.
    mono: list[tuple[float, float]] = []
    run = 0.0
    for le, c in pts:
        run = max(run, c)
        mono.append((le, run))
    total = mono[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for i, (le, c) in enumerate(mono):
        if c >= rank:
            if math.isinf(le):
                return (mono[i - 1][0], (mono[i - 1][0], math.inf)) if i > 0 else None
            if i == 0 and le <= 0:
                return le, (-math.inf, le)
            if c == prev_c:
                return le, (prev_le, le)
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c), (prev_le, le)
        prev_le, prev_c = le, c
    return None


def within_bucket(value: float, bucket: Bucket) -> bool:
    """Whether `value` lies in the bucket, its bounds included (a figure on a bound is as close as
    the histogram can tell)."""
    return bucket[0] <= value <= bucket[1]


def gap_at_resolution(exact: float | None, interpolated: float | None, bucket: Bucket | None) -> float | None:
    """exact - interpolated, where `interpolated` is a histogram quantile read in `bucket` and
    `exact` the same quantile from the per-request records; None where either is missing, or
    where `exact` lies inside that bucket: the histogram cannot tell the two apart there, and the
    signed figure would be the interpolation's, not a gap (issue 46: a -0.029 s "gap" read inside
    the 0.1-0.25 s bucket)."""
    if exact is None or interpolated is None:
        return None
    if bucket is not None and within_bucket(exact, bucket):
        return None
    return exact - interpolated


def bucket_cdf(buckets: Mapping[float, float]) -> list[tuple[float, float]]:
    """(upper bound, cumulative fraction) for the finite buckets, for a CDF plot."""
    pts = sorted(buckets.items())
    total = pts[-1][1] if pts else 0.0
    if total <= 0:
        return []
    return [(le, c / total) for le, c in pts if not math.isinf(le)]
