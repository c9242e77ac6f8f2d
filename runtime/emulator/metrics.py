"""Prometheus series under vLLM's own names, labels and bucket edges (vllm/v1/metrics/loggers.py),
so the same dashboards and queries read the emulator and a real vLLM fleet."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.serving import VLLM_METRICS

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
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
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
STEP_LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)


def _base(name: str) -> str:
    # prometheus_client appends _total to counters itself.
    return name.removesuffix("_total")


class EmulatorMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, lbl, n = self.registry, ["model_name"], VLLM_METRICS
        self.ttft = Histogram(
            n["ttft"], "Histogram of time to first token in seconds.", lbl, registry=r, buckets=TTFT_BUCKETS
        ).labels(model_name)
        self.itl = Histogram(
            n["itl"], "Histogram of inter-token latency in seconds.", lbl, registry=r, buckets=ITL_BUCKETS
        ).labels(model_name)
        self.e2e = Histogram(
            n["e2e"], "Histogram of e2e request latency in seconds.", lbl, registry=r, buckets=REQUEST_LATENCY_BUCKETS
        ).labels(model_name)
        self.queue = Histogram(
            n["queue_time"],
            "Histogram of time spent in WAITING phase for request.",
            lbl,
            registry=r,
            buckets=REQUEST_LATENCY_BUCKETS,
        ).labels(model_name)
        self.prompt_tokens = Counter(
            _base(n["prompt_tokens"]), "Number of prefill tokens processed.", lbl, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            _base(n["generation_tokens"]), "Number of generation tokens processed.", lbl, registry=r
        ).labels(model_name)
        self._success = Counter(
            _base(n["request_success"]),
            "Count of successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.success = {reason: self._success.labels(model_name, reason) for reason in ("stop", "length", "abort")}
        self.running = Gauge(n["running"], "Number of requests in model execution batches.", lbl, registry=r).labels(
            model_name
        )
        self.waiting = Gauge(n["waiting"], "Number of requests waiting to be processed.", lbl, registry=r).labels(
            model_name
        )
        self.prefix_queries = Counter(
            _base(n["prefix_cache_queries"]),
            "Prefix cache queries, in terms of number of queried tokens.",
            lbl,
            registry=r,
        ).labels(model_name)
        self.prefix_hits = Counter(
            _base(n["prefix_cache_hits"]), "Prefix cache hits, in terms of number of cached tokens.", lbl, registry=r
        ).labels(model_name)
        self.kv_usage = Gauge(
            n["kv_cache_usage"], "KV-cache usage. 1 means 100 percent usage.", lbl, registry=r
        ).labels(model_name)
        # Emulator-only: instances behind this endpoint, whose sums the series above are (app.py).
        self.instances = Gauge(
            "emulator_instances", "Emulated instances behind this endpoint.", lbl, registry=r
        ).labels(model_name)
        self.instances.set(1)
        # Emulator-only: how late the scheduler woke against the model's step schedule.
        self.step_lag = Histogram(
            "emulator_step_lag_seconds", "Actual minus scheduled step end.", lbl, registry=r, buckets=STEP_LAG_BUCKETS
        ).labels(model_name)
