"""A step continued by settle segments is measured as one step over the same records.

Issue 46, finding 1: each part's window was its own arrival span widened by n/(n-1), which a
one-request segment does not have, so the pooled goodput became None and `choose()` dropped
the step. The segments' plans (segment.json) place them on the step's timeline instead."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.errors import AnalysisError
from analysis.measure.goodput import measure_fleets
from analysis.sources.records import load_records
from core.manifest import Manifest
from core.records import RequestRecord
from tests.analysis.synth import rec, write_jsonl

K = 2.0  # the step's rate multiplier: arrivals every 0.5 s of its timeline


def _arrivals(m: Manifest, n: int, start: float = 0.0, first_id: int = 0) -> list[RequestRecord]:
    return [rec(m, "g6", first_id + i, scheduled=start + i / K, tokens=100) for i in range(n)]


def _segment(step_dir: Path, n: int, seg: int, recs: list[RequestRecord], skip_s: float, span_s: float) -> None:
    d = step_dir / f"settle-{seg}"
    write_jsonl(d / "records-g6-w0.jsonl", recs)
    (d / "segment.json").write_text(json.dumps({"span_s": span_s, "skip_s": skip_s, "multiplier": K}))


def _measure(d: Path, m: Manifest):  # type: ignore[no-untyped-def]
    return measure_fleets(load_records(d, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]


def test_a_one_request_segment_keeps_its_steps_goodput(tmp_path: Path, m: Manifest) -> None:
    # One step of 11 arrivals, 0 to 5 s: window 5 x 11/10 = 5.5 s, 1,100 tokens -> 200 tok/s.
    whole = tmp_path / "whole"
    write_jsonl(whole / "records-g6-w0.jsonl", _arrivals(m, 11))
    one = _measure(whole, m)
    assert one.window_s == pytest.approx(5.5) and one.goodput_tok_s == pytest.approx(200.0)
    # The same arrivals as a step of 10 (planned span 5 s, so its segment skips 10 trace s at x2)
    # and a settle segment of one request, scheduled at its own 0.
    parts = tmp_path / "parts"
    write_jsonl(parts / "records-g6-w0.jsonl", _arrivals(m, 10))
    _segment(parts, 1, 1, [replace(_arrivals(m, 1, first_id=10)[0], scheduled_s=0.0)], skip_s=5.0 * K, span_s=0.5)
    pooled = _measure(parts, m)
    # On 17e73d2: window_s 0.0 and goodput None (the segment had no window of its own).
    assert pooled.goodput_tok_s == pytest.approx(one.goodput_tok_s, rel=1e-9)
    assert pooled.window_s == pytest.approx(one.window_s, rel=1e-9)
    assert pooled.successful_output_tokens == one.successful_output_tokens == 1100


def test_segments_of_any_size_pool_to_the_unsplit_step(tmp_path: Path, m: Manifest) -> None:
    whole = tmp_path / "whole"
    write_jsonl(whole / "records-g6-w0.jsonl", _arrivals(m, 40))
    one = _measure(whole, m)
    parts = tmp_path / "parts"
    write_jsonl(parts / "records-g6-w0.jsonl", _arrivals(m, 12))
    at = 12
    for seg, n in enumerate((1, 2, 25), start=1):
        recs = [replace(r, scheduled_s=r.scheduled_s - at / K) for r in _arrivals(m, n, start=at / K, first_id=at)]
        _segment(parts, n, seg, recs, skip_s=at, span_s=n / K)
        at += n
    pooled = _measure(parts, m)
    assert (pooled.requests, pooled.successful_requests) == (one.requests, one.successful_requests) == (40, 40)
    assert pooled.window_s == pytest.approx(one.window_s, rel=1e-9)
    assert pooled.goodput_tok_s == pytest.approx(one.goodput_tok_s, rel=1e-9)


def test_a_malformed_segment_plan_names_the_file(tmp_path: Path, m: Manifest) -> None:
    write_jsonl(tmp_path / "records-g6-w0.jsonl", _arrivals(m, 4))
    seg = tmp_path / "settle-1"
    write_jsonl(seg / "records-g6-w0.jsonl", _arrivals(m, 1, first_id=4))
    (seg / "segment.json").write_text(json.dumps({"span_s": 1.0, "skip_s": 4.0}))
    with pytest.raises(AnalysisError, match=r"settle-1/segment\.json: not a settle segment's plan"):
        load_records(tmp_path, m.digest)
