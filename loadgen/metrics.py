"""Client-side Prometheus histograms (TTFT, ITL, E2E) served by each worker.

Histograms, not summaries: fleet percentiles must come from merged buckets (docs/design.md), and
buckets are dense around the manifest's SLOs so "share under the SLO" is read off exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from core.records import Outcome, RequestRecord

_BASE_TTFT = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
_BASE_ITL = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.0,
    5.0,
)
_BASE_E2E = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0)
_AROUND_SLO = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 2.0)


def buckets_around(base: Sequence[float], slo: float) -> tuple[float, ...]:
    """The base ladder plus fine steps from 0.5x to 2x the SLO (the SLO itself is a bound)."""
    return tuple(sorted({round(b, 6) for b in base} | {round(slo * f, 6) for f in _AROUND_SLO}))


class ClientMetrics:
    LABELS = ("fleet", "campaign", "manifest_digest")

    def __init__(
        self,
        *,
        fleet: str,
        campaign: str,
        manifest_digest: str,
        ttft_slo_s: float,
        itl_slo_s: float,
        registry: CollectorRegistry | None = None,
    ):
        self.registry = registry or CollectorRegistry()
        labels = {"fleet": fleet, "campaign": campaign, "manifest_digest": manifest_digest}
        r = self.registry
        self.ttft = Histogram(
            "loadgen_ttft_seconds",
            "Scheduled send -> first token",
            self.LABELS,
            buckets=buckets_around(_BASE_TTFT, ttft_slo_s),
            registry=r,
        ).labels(**labels)
        self.itl = Histogram(
            "loadgen_itl_seconds",
            "Mean inter-token gap per request",
            self.LABELS,
            buckets=buckets_around(_BASE_ITL, itl_slo_s),
            registry=r,
        ).labels(**labels)
        self.e2e = Histogram(
            "loadgen_e2e_seconds", "Scheduled send -> last token", self.LABELS, buckets=_BASE_E2E, registry=r
        ).labels(**labels)
        self.lag = Histogram(
            "loadgen_schedule_lag_seconds",
            "Actual send - scheduled send",
            self.LABELS,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
            registry=r,
        ).labels(**labels)
        self._outcomes = Counter(
            "loadgen_requests", "Requests by outcome", (*self.LABELS, "outcome", "slo_ok"), registry=r
        )
        self._labels = labels
        self.good_tokens = Counter(
            "loadgen_successful_output_tokens",
            "Output tokens of ok, SLO-compliant, non-warmup requests",
            self.LABELS,
            registry=r,
        ).labels(**labels)

    def observe(self, rec: RequestRecord) -> None:
        self._outcomes.labels(**self._labels, outcome=rec.outcome, slo_ok=str(rec.slo_ok).lower()).inc()
        if rec.send_lag_s is not None:
            self.lag.observe(max(rec.send_lag_s, 0.0))
        # Warmup requests measure a system still warming up: counted above, never in the latencies.
        if rec.outcome != Outcome.OK.value or rec.warmup:
            return
        if rec.ttft_s is not None:
            self.ttft.observe(rec.ttft_s)
        if rec.itl_s is not None:
            self.itl.observe(rec.itl_s)
        if rec.e2e_s is not None:
            self.e2e.observe(rec.e2e_s)
        if rec.slo_ok:
            self.good_tokens.inc(rec.output_tokens)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
