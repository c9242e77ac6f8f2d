"""Histograms read straight from a server's Prometheus text exposition (`GET /metrics`).

For checks that need a server's own view without a Prometheus in between: scrape before and
after a run, subtract, and the difference is exactly that run's observations (the server's
earlier requests, a warm-up or a quality gate, drop out). Series with the same name and `le`
are summed across their other labels, as `sum by (le)` would.
"""

from __future__ import annotations

import math
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Histogram:
    sum: float = 0.0
    count: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # cumulative count per upper bound (le)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def minus(self, before: Histogram) -> Histogram:
        return Histogram(
            self.sum - before.sum,
            self.count - before.count,
            {le: c - before.buckets.get(le, 0.0) for le, c in self.buckets.items()},
        )


def parse_histograms(text: str) -> dict[str, Histogram]:
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets[family.name][float(s.labels["le"])] += s.value
            elif s.name.endswith("_sum"):
                sums[family.name] += s.value
            elif s.name.endswith("_count"):
                counts[family.name] += s.value
    return {n: Histogram(sums[n], counts[n], dict(buckets[n])) for n in buckets}


def metric_names(text: str) -> set[str]:
    """Every family name exposed (histograms and counters under their base name, as
    prometheus_client reports them: `vllm:prompt_tokens` for `vllm:prompt_tokens_total`)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def scrape(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
        return str(resp.read().decode("utf-8"))


def bucket_index(value: float, bounds: list[float]) -> int:
    """Index of the bucket (sorted upper bounds, +Inf last) that holds `value`."""
    for i, le in enumerate(sorted(bounds)):
        if value <= le or math.isinf(le):
            return i
    return len(bounds)
