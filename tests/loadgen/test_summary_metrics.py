from __future__ import annotations

import math
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from core.quantiles import interpolated_quantile, nearest_rank
from core.records import RequestRecord
from core.schedule import ScheduledRequest
from loadgen.metrics import ClientMetrics, buckets_around
from loadgen.recording import RecordContext, not_sent_record
from loadgen.summary import SummaryInputs, summarize

CTX = RecordContext("c", "d" * 64, "g6", "w0", 1000.0, 0.0, 0.5, 0.05)
INP = SummaryInputs("c", "d" * 64, "g6", max_lag_p99_s=0.01)


def rec(
    i: int,
    outcome: str = "ok",
    lag: float | None = 0.001,
    client: int = 4,
    server: int | None = 4,
    warmup: bool = False,
) -> RequestRecord:
    base = not_sent_record(CTX, ScheduledRequest(i, float(i), 10, 4, None, i, warmup), "")
    return replace(
        base,
        outcome=outcome,
        send_lag_s=lag,
        sent_s=None if lag is None else i + lag,
        client_output_tokens=client,
        server_output_tokens=server,
        ttft_s=0.1,
        itl_s=0.01,
        e2e_s=0.2,
        slo_ok=outcome == "ok",
        error=None,
    )


def test_invariant_and_counts() -> None:
    rs = [
        rec(0),
        rec(1, "quality_fail"),
        rec(2, "timeout"),
        rec(3, "not_sent", lag=None),
        rec(4, warmup=True),
        rec(5, "no_text"),
    ]
    s = summarize(INP, rs, range(6), client_cpu_percent=12.5, started_at=1.0, ended_at=2.0)
    # no_text came back whole (finish reason, [DONE], usage): completed, though not a success.
    assert (s.scheduled, s.completed, s.failed, s.not_sent, s.warmup_excluded) == (6, 4, 1, 1, 1)
    assert s.invariant_holds() and s.valid and s.client_cpu_percent == 12.5


def test_missing_record_breaks_validity() -> None:
    s = summarize(INP, [rec(0), rec(2)], range(3), client_cpu_percent=0, started_at=0, ended_at=1)
    assert not s.valid and not s.invariant_holds()
    assert any("no record" in r for r in s.invalid_reasons)


def test_lag_p99_over_bound_flags_run_invalid() -> None:
    rs = [rec(i, lag=0.001) for i in range(97)] + [rec(i, lag=0.5) for i in (97, 98, 99)]
    s = summarize(INP, rs, range(100), client_cpu_percent=0, started_at=0, ended_at=1)
    assert s.schedule_lag_p99_s > 0.01 and not s.valid
    assert "schedule lag p99" in s.invalid_reasons[0]
    ok = summarize(INP, rs[:97], range(97), client_cpu_percent=0, started_at=0, ended_at=1)
    assert ok.valid and ok.schedule_lag_p50_s == 0.001


def test_token_count_mismatch_rate() -> None:
    # Server usage against the requested output length (4), never against content chunks: vLLM
    # packs several tokens into one chunk, so 3 chunks carrying 4 tokens is no mismatch.
    rs = [
        rec(0),
        rec(1, client=3, server=4),
        rec(2, server=None),
        rec(3, server=3),
        rec(4, "timeout", client=1, server=9),
    ]
    s = summarize(INP, rs, range(5), client_cpu_percent=0, started_at=0, ended_at=1)
    assert s.token_count_mismatch_rate == 1 / 3  # of the 3 ok requests with server usage, #3 ended early


def test_prompt_token_mismatch_rate_shows_a_wrong_tokenizer_or_template() -> None:
    rs = [replace(rec(i), client_prompt_tokens=10, server_prompt_tokens=10 if i % 4 else 12) for i in range(8)]
    rs.append(replace(rec(8, "timeout"), client_prompt_tokens=10, server_prompt_tokens=None))  # no usage: not counted
    s = summarize(INP, rs, range(9), client_cpu_percent=0, started_at=0, ended_at=1)
    assert s.prompt_token_mismatch_rate == 0.25


def test_empty_schedule_is_not_a_valid_run() -> None:
    s = summarize(INP, [], [], client_cpu_percent=0, started_at=0, ended_at=1)
    assert s.invariant_holds() and not s.valid and "schedule is empty" in s.invalid_reasons[0]


def test_warmup_is_counted_but_kept_out_of_the_latency_histograms() -> None:
    cm = ClientMetrics(fleet="g6", campaign="c", manifest_digest="abc", ttft_slo_s=2.0, itl_slo_s=0.12)
    cm.observe(rec(0, warmup=True))
    cm.observe(rec(1))
    text = generate_latest(cm.registry).decode()
    for h in ("ttft", "itl", "e2e"):
        assert f'loadgen_{h}_seconds_count{{campaign="c",fleet="g6",manifest_digest="abc"}} 1.0' in text
    assert (
        'loadgen_requests_total{campaign="c",fleet="g6",manifest_digest="abc",outcome="ok",slo_ok="true"} 2.0' in text
    )


def test_interpolated_quantile() -> None:
    assert interpolated_quantile([], 0.99) == 0.0
    assert math.isnan(interpolated_quantile([], 0.99, empty=math.nan))
    assert interpolated_quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert interpolated_quantile([4.0, 1.0, 3.0, 2.0], 0.95) == pytest.approx(
        3.85
    )  # between ranks 3 and 4, unsorted input


def test_nearest_rank_is_an_observed_value_where_interpolation_is_not() -> None:
    xs = [float(i) for i in range(1, 21)]  # 1..20
    assert xs[nearest_rank(len(xs), 0.95) - 1] == 19.0  # ceil(0.95 x 20) = 19th, as duckdb's quantile_disc
    assert interpolated_quantile(xs, 0.95) == pytest.approx(19.05)
    assert nearest_rank(1, 0.95) == 1 and nearest_rank(3, 0.0) == 1 and nearest_rank(100, 1.0) == 100


def test_buckets_dense_around_slo() -> None:
    b = buckets_around((0.1, 1.0, 10.0), 2.0)
    assert 2.0 in b and 1.8 in b and 2.2 in b and list(b) == sorted(b)


def test_histograms_labelled() -> None:
    cm = ClientMetrics(fleet="g6", campaign="c", manifest_digest="abc", ttft_slo_s=2.0, itl_slo_s=0.12)
    cm.observe(rec(0))
    cm.observe(rec(1, "timeout"))
    text = generate_latest(cm.registry).decode()
    assert 'loadgen_ttft_seconds_count{campaign="c",fleet="g6",manifest_digest="abc"} 1.0' in text
    assert 'loadgen_ttft_seconds_bucket{campaign="c",fleet="g6",le="2.0",manifest_digest="abc"} 1.0' in text
    assert (
        'loadgen_requests_total{campaign="c",fleet="g6",manifest_digest="abc",outcome="timeout",slo_ok="false"} 1.0'
        in text
    )
    assert 'loadgen_successful_output_tokens_total{campaign="c",fleet="g6",manifest_digest="abc"} 4.0' in text
