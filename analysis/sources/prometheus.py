"""Fleet latency histograms over the Prometheus HTTP API (`/api/v1/query`, `/api/v1/query_range`).

Buckets are merged across every replica and worker with `sum by (le)` of `increase` over the
campaign window, and only then turned into a quantile (histogram_quantile); per-replica
quantiles are fetched only to show how far their average would have been off.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from analysis.errors import SourceUnavailable


@dataclass(frozen=True)
class HistogramNames:
    """Metric base names (without `_bucket`); each serving stack names them its own way (`for_stack`)."""

    client_ttft: str = "loadgen_ttft_seconds"
    client_itl: str = "loadgen_itl_seconds"
    # None: the stack exports no such histogram (TGI has no time-to-first-token series).
    server_ttft: str | None = "vllm:time_to_first_token_seconds"
    server_itl: str | None = "vllm:inter_token_latency_seconds"
    server_itl_fallback: str | None = "vllm:time_per_output_token_seconds"  # older vLLM releases
    fleet_label: str = "fleet"
    replica_label: str = "instance"

    @classmethod
    def for_stack(cls, stack: str) -> HistogramNames:
        """The serving stack's own series, as core.serving declares them for its fleets."""
        from core.serving import METRICS_BY_STACK, VLLM_METRICS

        names = METRICS_BY_STACK.get(stack)
        if names is None:
            raise ValueError(f"unknown serving stack {stack!r}; known: {sorted(METRICS_BY_STACK)}")
        fallback = cls.server_itl_fallback if names is VLLM_METRICS else None
        return cls(server_ttft=names.get("ttft"), server_itl=names.get("itl"), server_itl_fallback=fallback)


def _selector(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in sorted(labels.items())
    )
    return "{" + inner + "}"


def _range(start: float, end: float) -> str:
    return f"{max(math.ceil(end - start), 1)}s"


class PrometheusSource:
    def __init__(self, url: str, *, timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str]) -> Any:
        full = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout_s) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            try:
                detail = json.load(exc).get("error", "")
            except ValueError:
                detail = ""
            raise SourceUnavailable(
                f"Prometheus at {self.url} answered HTTP {exc.code} to {params.get('query')!r}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceUnavailable(f"Prometheus at {self.url} is unreachable: {reason}") from None
        if body.get("status") != "success":
            raise SourceUnavailable(f"Prometheus at {self.url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        return list(data.get("result", []))

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        data = self._get(
            "/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        )
        return list(data.get("result", []))

    def has_series(self, metric: str, labels: dict[str, str], start: float, end: float) -> bool:
        expr = f"count(count_over_time({metric}_bucket{_selector(labels)}[{_range(start, end)}]))"
        return bool(self.query(expr, end))

    def merged_buckets(self, metric: str, labels: dict[str, str], start: float, end: float) -> dict[float, float]:
        """Cumulative counts per le over the window, summed across replicas and workers."""
        expr = f"sum by (le) (increase({metric}_bucket{_selector(labels)}[{_range(start, end)}]))"
        return {float(s["metric"]["le"]): float(s["value"][1]) for s in self.query(expr, end)}

    def merged_quantile(self, q: float, metric: str, labels: dict[str, str], start: float, end: float) -> float | None:
        """Prometheus's own histogram_quantile of the merged buckets: the fleet percentile."""
        expr = (
            f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket{_selector(labels)}[{_range(start, end)}])))"
        )
        res = self.query(expr, end)
        if not res:
            return None
        v = float(res[0]["value"][1])
        return None if math.isnan(v) else v

    def per_replica_quantiles(
        self, q: float, metric: str, labels: dict[str, str], start: float, end: float, by: str = "instance"
    ) -> dict[str, float]:
        """Diagnostics only: each replica's own quantile. Never average these into a fleet figure."""
        expr = f"histogram_quantile({q}, sum by (le, {by}) (increase({metric}_bucket{_selector(labels)}[{_range(start, end)}])))"
        out = {}
        for s in self.query(expr, end):
            v = float(s["value"][1])
            if not math.isnan(v):
                out[s["metric"].get(by, "?")] = v
        return out
