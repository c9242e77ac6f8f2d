"""Invariant: a client that sees every answer no sooner than the server sent it is never reported
faster than the server (issue 47; guards issue 46's finding 11).

The server's P95 comes from its histogram (vLLM's bucket edges, Prometheus's histogram_quantile:
a figure interpolated inside the bucket that holds rank ceil(0.95 n)); the client's is the
nearest-rank P95 of its per-request records, the report's definition. For any latencies, with each
client latency the server's plus a delay >= 0, the reported gap (client - server) is either
positive or absent: the client's rank-ceil(0.95 n) value is at least the server's, which lies in
that bucket, so a negative figure could only be the interpolation's, not a measurement (on
17e73d2 the report printed -0.029 s read inside the 0.1-0.25 s bucket)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from analysis.measure.histogram import gap_at_resolution, quantile_in_bucket
from core.quantiles import nearest_rank
from runtime.emulator.metrics import ITL_BUCKETS, TTFT_BUCKETS
from tests.invariants import INVARIANT


def _cumulative(values: list[float], edges: tuple[float, ...]) -> dict[float, float]:
    """A Prometheus histogram's buckets: for each upper bound, how many values are <= it."""
    return {le: float(sum(v <= le for v in values)) for le in (*edges, math.inf)}


@st.composite
def served_then_read(draw: st.DrawFn) -> tuple[tuple[float, ...], list[float], list[float]]:
    edges = draw(st.sampled_from([TTFT_BUCKETS, ITL_BUCKETS]))
    n = draw(st.integers(1, 200))
    # log-uniform over the buckets' range, so every bucket and the +Inf one can hold the P95
    server = [10 ** draw(st.floats(-3.5, 1.5)) for _ in range(n)]
    late = st.one_of(st.just(0.0), st.floats(0.0, 0.02), st.floats(0.0, 2.0))
    client = [s + draw(late) for s in server]
    return edges, server, client


@INVARIANT
@given(served_then_read())
def test_a_client_never_earlier_than_the_server_is_never_reported_faster(
    case: tuple[tuple[float, ...], list[float], list[float]],
) -> None:
    edges, server, client = case
    located = quantile_in_bucket(0.95, _cumulative(server, edges))
    assert located is not None
    interpolated, bucket = located
    exact = sorted(client)[nearest_rank(len(client), 0.95) - 1]
    gap = gap_at_resolution(exact, interpolated, bucket)
    assert gap is None or gap >= 0, (gap, exact, interpolated, bucket)
