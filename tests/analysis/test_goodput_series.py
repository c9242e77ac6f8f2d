"""Goodput over time (the report's figure): binned by completion time, drain included."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.measure.goodput import goodput_series
from analysis.sources.records import load_records
from core.manifest import Manifest
from tests.analysis.synth import rec, write_jsonl


def test_requests_completing_after_the_window_land_in_their_own_bins(tmp_path: Path, m: Manifest) -> None:
    # 100 requests sent at t = 0..99, 100 tokens each: the first 90 take 1 s (done at 1..90), the last
    # 10 take 30 s (done at 120..129, in the drain after the 100 s window).
    write_jsonl(tmp_path / "records-g6-w0.jsonl", [rec(m, "g6", i, e2e=1.0 if i < 90 else 30.0) for i in range(100)])
    series = goodput_series(
        load_records(tmp_path, m.digest), {"g6": (0.0, 100.0)}, m.slo.ttft_p95_s, m.slo.itl_p95_s, bins=10
    )["g6"]
    assert [x for x, _ in series] == pytest.approx(
        [10.0 * i for i in range(13)]
    )  # the 10 s bins run on to the last completion
    rates = [y for _, y in series]
    assert rates[0] == pytest.approx(9 * 100 / 10)  # done at 1..9
    assert rates[9] == pytest.approx(1 * 100 / 10)  # done at 90 only: the drain is not piled into the window's last bin
    assert rates[10] == rates[11] == 0.0
    assert rates[12] == pytest.approx(10 * 100 / 10)  # done at 120..129
    assert sum(rates) * 10 == pytest.approx(100 * 100)  # every successful token is counted once


def test_one_scan_bins_each_fleet_by_its_own_window(tmp_path: Path, m: Manifest) -> None:
    """Two fleets binned in one scan, each over its own window, give what each alone gives."""
    write_jsonl(tmp_path / "records-g6-w0.jsonl", [rec(m, "g6", i, e2e=1.0) for i in range(50)])
    write_jsonl(tmp_path / "records-inf2-w0.jsonl", [rec(m, "inf2", i, e2e=2.0 + i % 3) for i in range(80)])
    rs = load_records(tmp_path, m.digest)
    windows = {"g6": (0.0, 50.0), "inf2": (3.0, 83.0), "none": (5.0, 5.0)}
    both = goodput_series(rs, windows, m.slo.ttft_p95_s, m.slo.itl_p95_s, bins=7)
    for fleet, window in windows.items():
        assert both[fleet] == goodput_series(rs, {fleet: window}, m.slo.ttft_p95_s, m.slo.itl_p95_s, bins=7)[fleet]
    assert both["none"] == [] and len(both["g6"]) >= 7 and both["g6"] != both["inf2"]
