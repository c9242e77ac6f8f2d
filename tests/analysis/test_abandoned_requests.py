"""A request a capacity step abandoned on its SLO deadline is an SLO miss, not an error: it
enters the latency percentiles at a lower bound over its target, and never the error rate.

Before the outcome existed such a request was a 'timeout', an error: one of 72 broke the 1%
error ceiling and failed the step, where the P95 allows 3 of 72 over their target (the example's
g6 search missed at x1 on one such request).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.measure import goodput, intervals
from analysis.sources.records import load_records
from core.records import Outcome, latency_values
from tests.analysis.synth import manifest, rec, write_jsonl

ABANDONED = Outcome.SLO_ABANDONED.value


def _step(tmp_path: Path, manifest_data: dict[str, Any], abandoned: list[dict[str, Any]]) -> tuple[Any, Any]:
    m = manifest(manifest_data)
    ok = [rec(m, "g6", i, ttft=0.1 + i * 0.001, itl=0.01, e2e=2.0) for i in range(72 - len(abandoned))]
    gone = [
        replace(rec(m, "g6", 100 + j), outcome=ABANDONED, http_status=200, slo_ok=False, **kw)
        for j, kw in enumerate(abandoned)
    ]
    write_jsonl(tmp_path / "records-g6-w0.jsonl", ok + gone)
    return m, load_records(tmp_path, m.digest)


def test_abandoned_requests_are_slo_misses_not_errors(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # 72 requests, 3 abandoned (the most a P95 of 72 lets over its target): no first token after
    # 30 s; a first token in time (0.2 s) then given up at 30 s owing 512 tokens; a late first token
    m, rs = _step(
        tmp_path,
        manifest_data,
        [
            {"ttft_s": None, "itl_s": None, "e2e_s": 30.0},
            {"ttft_s": 0.2, "itl_s": 0.01, "e2e_s": 30.0},
            {"ttft_s": 25.0, "itl_s": 0.01, "e2e_s": 30.0},
        ],
    )
    slo = m.slo
    fm = goodput.measure_fleets(rs, slo.ttft_p95_s, slo.itl_p95_s)["g6"]
    assert fm.errors == 0 and fm.error_rate == 0.0
    assert fm.successful_requests == 69
    ttfts = intervals.latency_sample(rs, "g6", "ttft_s")
    itls = intervals.latency_sample(rs, "g6", "itl_s")
    assert len(ttfts) == 72 and ttfts[-2:] == [25.0, 30.0]  # the one with no first token enters at 30 s
    # (30 - 0.2) / 511 = 0.0583 s: over the rest of its deadline, more than its measured 0.01
    assert max(itls) == pytest.approx(29.8 / 511)
    # the P95 (69th of 72) is a request that completed: exact, within target, so the step holds
    assert fm.p95_ttft_s == pytest.approx(0.1 + 68 * 0.001)
    assert fm.slo_pass(slo.ttft_p95_s, slo.itl_p95_s, slo.max_error_rate)


def test_a_fourth_abandoned_request_fails_the_p95_not_the_error_rate(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m, rs = _step(tmp_path, manifest_data, [{"ttft_s": None, "itl_s": None, "e2e_s": 30.0}] * 4)
    slo = m.slo
    fm = goodput.measure_fleets(rs, slo.ttft_p95_s, slo.itl_p95_s)["g6"]
    assert fm.error_rate == 0.0
    assert fm.p95_ttft_s == 30.0  # a lower bound of the true P95, over the target either way
    assert not fm.slo_pass(slo.ttft_p95_s, slo.itl_p95_s, slo.max_error_rate)


@pytest.mark.parametrize(
    "kw",
    [
        {"outcome": ABANDONED, "ttft_s": None, "itl_s": None, "e2e_s": 12.5, "max_tokens": 100},
        {"outcome": ABANDONED, "ttft_s": 0.4, "itl_s": 0.02, "e2e_s": 12.5, "max_tokens": 100},
        {
            "outcome": ABANDONED,
            "ttft_s": 0.4,
            "itl_s": 0.5,
            "e2e_s": 12.5,
            "max_tokens": 100,
        },  # measured ITL above the bound
        {"outcome": ABANDONED, "ttft_s": 0.4, "itl_s": None, "e2e_s": 12.5, "max_tokens": 1},
        {"outcome": "ok", "ttft_s": 0.4, "itl_s": 0.02, "e2e_s": 2.5, "max_tokens": 100},
        {"outcome": "timeout", "ttft_s": 0.4, "itl_s": 0.02, "e2e_s": 2.5, "max_tokens": 100},
    ],
)
def test_the_followers_rule_is_the_analysis_rule(
    tmp_path: Path, manifest_data: dict[str, Any], kw: dict[str, Any]
) -> None:
    """core.records.latency_values (what the capacity search's early stop reads as records are
    written) gives the values analysis.measure.goodput.LATENCY_SQL does."""
    m = manifest(manifest_data)
    r = replace(rec(m, "g6", 0), **kw)
    write_jsonl(tmp_path / "records-g6-w0.jsonl", [r])
    rs = load_records(tmp_path, m.digest)
    sql = tuple(next(iter(intervals.latency_sample(rs, "g6", c)), None) for c in ("ttft_s", "itl_s"))
    assert sql == pytest.approx(latency_values(r.outcome, r.ttft_s, r.itl_s, r.e2e_s, r.max_tokens))
