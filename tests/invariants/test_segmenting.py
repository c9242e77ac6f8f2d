"""Invariant: splitting a step changes nothing (issue 47, 1).

The same records measured as one capacity step, or as a step plus settle segments of any sizes
(one request included), give exactly the same successful tokens, requests and SLO verdict, and
the same window within 1e-9 relative. Each segment is written as the settle phase writes it: its
records' scheduled_s counted from its own start, its plan (segment.json) saying where that start
lies in trace seconds at x1 (skip_s) and at what multiplier."""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from analysis.measure.goodput import measure_fleets
from analysis.sources.records import load_records
from core.manifest import Manifest
from core.records import RequestRecord
from tests.analysis.synth import rec, write_jsonl
from tests.invariants import INVARIANT


@st.composite
def split_step(draw: st.DrawFn) -> tuple[float, list[tuple[float, float, float, int]], list[int], list[float]]:
    """A step's arrivals (scheduled_s, ttft, itl, tokens), its multiplier, where it is cut into
    parts (indices of each segment's first arrival) and where between two arrivals each cut lies."""
    k = draw(st.sampled_from([0.25, 0.5, 0.7071, 1.0, 1.41, 3.0]))
    n = draw(st.integers(2, 60))
    gaps = draw(st.lists(st.floats(0.001, 5.0), min_size=n - 1, max_size=n - 1))
    t, times = 0.0, [0.0]
    for g in gaps:
        t += g
        times.append(t)
    lat = st.tuples(st.floats(0.01, 2.0), st.floats(0.005, 0.2), st.integers(1, 400))
    rows = [(s, *draw(lat)) for s in times]
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=5))))
    at = [draw(st.floats(0.0, 1.0, exclude_max=True)) for _ in cuts]  # 0: at the arrival before
    return k, rows, cuts, at


def _rec(m: Manifest, i: int, row: tuple[float, float, float, int]) -> RequestRecord:
    s, ttft, itl, tokens = row
    return rec(m, "g6", i, scheduled=s, ttft=ttft, itl=itl, tokens=tokens, e2e=ttft + itl * tokens)


@INVARIANT
@given(split_step())
def test_a_step_split_into_settle_segments_measures_as_the_unsplit_step(
    m: Manifest, case: tuple[float, list[tuple[float, float, float, int]], list[int], list[float]]
) -> None:
    k, rows, cuts, at = case
    root = Path(tempfile.mkdtemp(prefix="segmenting-"))
    try:
        whole = root / "whole"
        write_jsonl(whole / "records-g6-w0.jsonl", [_rec(m, i, r) for i, r in enumerate(rows)])
        parts = root / "parts"
        bounds = [0, *cuts, len(rows)]
        for seg, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            recs = [_rec(m, i, rows[i]) for i in range(lo, hi)]
            if seg == 0:
                write_jsonl(parts / "records-g6-w0.jsonl", recs)
                continue
            # the segment starts somewhere after the previous part's last arrival, at or before its first
            prev, first = rows[lo - 1][0], rows[lo][0]
            start = prev + at[seg - 1] * (first - prev) if first > prev else first
            d = parts / f"settle-{seg}"
            write_jsonl(d / "records-g6-w0.jsonl", [replace(r, scheduled_s=r.scheduled_s - start) for r in recs])
            (d / "segment.json").write_text(json.dumps({"span_s": 1.0, "skip_s": start * k, "multiplier": k}))
        slo = (m.slo.ttft_p95_s, m.slo.itl_p95_s)
        one = measure_fleets(load_records(whole, m.digest), *slo)["g6"]
        pooled = measure_fleets(load_records(parts, m.digest), *slo)["g6"]
        assert (pooled.requests, pooled.successful_requests, pooled.successful_output_tokens) == (
            one.requests,
            one.successful_requests,
            one.successful_output_tokens,
        )
        assert pooled.slo_pass(*slo, m.slo.max_error_rate) == one.slo_pass(*slo, m.slo.max_error_rate)
        assert abs(pooled.window_s - one.window_s) <= 1e-9 * max(one.window_s, 1e-12), (pooled.window_s, one.window_s)
        assert (pooled.goodput_tok_s is None) == (one.goodput_tok_s is None)
    finally:
        shutil.rmtree(root, ignore_errors=True)
