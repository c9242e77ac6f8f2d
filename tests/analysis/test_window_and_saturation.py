"""Measured window of a cut-short run, and the saturation check on per-instance throughput."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.measure.goodput import Saturation, measure_fleets, peak_in_flight
from analysis.report.build import ReportInputs, build_report
from analysis.sources.records import load_records
from core.manifest import Manifest
from core.records import RequestRecord
from tests.analysis.synth import manifest, rec, steady, write_jsonl
from tests.quality import quality_results

PASS = quality_results(
    {
        "inf2": {"passed": True, "pass_rate": 1.0, "failures": []},
        "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
    }
)


def _at(r: RequestRecord, scheduled: float, sent: float | None, e2e: float | None) -> RequestRecord:
    return replace(
        r, scheduled_s=scheduled, sent_s=sent, send_lag_s=None if sent is None else sent - scheduled, e2e_s=e2e
    )


def test_window_spans_only_sent_requests_when_the_run_was_cut_short(tmp_path: Path, m: Manifest) -> None:
    recs = [
        _at(rec(m, "g6", 0, warmup=True), 0.0, 0.0, 3.0),  # warmup: outside the window
        _at(rec(m, "g6", 1, tokens=300), 10.0, 10.0, 2.0),  # first sent: window starts at 10
        _at(rec(m, "g6", 2, tokens=300), 11.0, 11.1, 5.0),  # completes at 16
        # timeout with no E2E: still an arrival, at 17
        _at(rec(m, "g6", 3, outcome="timeout", ttft=None, itl=None, e2e=None), 17.0, 18.0, None),
    ]
    # a --duration cut: scheduled, never sent, up to t = 100
    recs += [
        _at(rec(m, "g6", 4 + i, outcome="not_sent", ttft=None, itl=None, e2e=None, tokens=0), t, None, None)
        for i, t in enumerate((20.0, 50.0, 100.0))
    ]
    write_jsonl(tmp_path / "records-g6-w0.jsonl", recs)
    fm = measure_fleets(load_records(tmp_path, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    assert fm.not_sent == 3 and fm.requests == 6
    # arrivals at 10, 11, 17: span 7 s over 2 gaps, widened to 3 gaps = 10.5 s (not 100 - 10 = 90 s)
    assert fm.window_start_s == pytest.approx(10.0) and fm.window_end_s == pytest.approx(20.5)
    assert fm.window_s == pytest.approx(10.5)
    assert fm.goodput_tok_s == pytest.approx(600 / 10.5)  # 57 tok/s, not 6.7
    assert fm.error_rate == pytest.approx(1 / 3)


def test_window_of_a_run_where_nothing_was_sent_is_empty(tmp_path: Path, m: Manifest) -> None:
    write_jsonl(
        tmp_path / "records-g6-w0.jsonl",
        [rec(m, "g6", i, outcome="not_sent", ttft=None, itl=None, e2e=None, tokens=0) for i in range(3)],
    )
    fm = measure_fleets(load_records(tmp_path, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    assert fm.window_start_s is None and fm.window_s == 0.0 and fm.goodput_tok_s is None


def test_peak_in_flight_sweep_by_hand(tmp_path: Path, m: Manifest) -> None:
    # in flight [0,4], [1,3], [2,5], [3,6]: 3 at t=2; at t=3 one ends as another starts (still 3, not 4)
    recs = [
        _at(rec(m, "inf2", i), s, s, e) for i, (s, e) in enumerate(((0.0, 4.0), (1.0, 2.0), (2.0, 3.0), (3.0, 3.0)))
    ]
    recs.append(_at(rec(m, "inf2", 4, warmup=True), 2.0, 2.0, 10.0))  # warmup: not counted
    recs.append(_at(rec(m, "inf2", 5, outcome="not_sent", e2e=None), 2.0, None, None))
    recs.append(
        _at(rec(m, "inf2", 6, outcome="http_error", ttft=None, itl=None, e2e=None), 2.0, 2.0, None)
    )  # end unknown
    # send lag: scheduled 1.5, sent 4.5, last token at 1.5 + 4.0 = 5.5 -> in flight [4.5, 5.5], overlapping [2,5] and [3,6]
    recs.append(_at(rec(m, "inf2", 7), 1.5, 4.5, 4.0))
    write_jsonl(tmp_path / "records-inf2-w0.jsonl", recs)
    write_jsonl(tmp_path / "records-g6-w0.jsonl", steady(m, "g6", 10, 100))  # back to back: 1 in flight
    peaks = peak_in_flight(load_records(tmp_path, m.digest))
    assert peaks == {"g6": 1, "inf2": 3}
    assert Saturation("inf2", 3, 1, 3).saturated and not Saturation("inf2", 3, 1, 4).saturated
    assert Saturation("inf2", 6, 2, 3).peak_in_flight_per_instance == 3.0 and Saturation("inf2", 6, 2, 3).saturated
    assert Saturation("inf2", 6, 0, 3).peak_in_flight_per_instance is None and not Saturation("inf2", 6, 0, 3).saturated


def _overlapping(m: Manifest, fleet: str, n: int, tokens: int, depth: int) -> list[RequestRecord]:
    """One request per second, each in flight `depth` seconds: exactly `depth` in flight at the peak."""
    return [rec(m, fleet, i, tokens=tokens, e2e=float(depth)) for i in range(n)]


def _go_manifest(manifest_data: dict[str, Any], max_concurrency: int) -> Manifest:
    manifest_data["workload"]["demand"]["peak_requests_per_s"] = 20.0
    for f in manifest_data["fleets"]:
        f["asg"]["max"] = 40
        f["max_concurrency"] = max_concurrency
    return manifest(manifest_data)


def test_unsaturated_fleet_gets_a_blocking_gap_and_no_go(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _go_manifest(manifest_data, 4)
    sat_dir, unsat_dir = tmp_path / "sat", tmp_path / "unsat"
    # both saturated: 4 in flight on one instance, max_concurrency 4
    write_jsonl(sat_dir / "records-inf2-w0.jsonl", _overlapping(m, "inf2", 100, 900, 4))
    write_jsonl(sat_dir / "records-g6-w0.jsonl", _overlapping(m, "g6", 100, 300, 4))
    # g6 replayed at low load: 2 in flight of 4
    write_jsonl(unsat_dir / "records-inf2-w0.jsonl", _overlapping(m, "inf2", 100, 900, 4))
    write_jsonl(unsat_dir / "records-g6-w0.jsonl", _overlapping(m, "g6", 100, 300, 2))
    kw: dict[str, Any] = {"quality": PASS, "instances_measured": {"inf2": 1, "g6": 1}, "with_sensitivity": False}

    ok = build_report(ReportInputs(m, sat_dir, out_dir=tmp_path / "o1", with_pages=False, **kw)).model_dump(mode="json")
    assert not any(g["what"].startswith("saturation.") for g in ok["gaps"])
    for name in ("inf2", "g6"):
        f = ok["fleets"][name]
        assert f["saturated"] is True and f["peak_in_flight_per_instance"] == 4 and f["max_concurrency"] == 4
        assert f["per_instance_goodput_bound"] == "capacity"
    assert ok["decision"]["state"] == "go", ok["decision"]

    r = build_report(ReportInputs(m, unsat_dir, out_dir=tmp_path / "o2", **kw)).model_dump(mode="json")
    sat_gaps = [g for g in r["gaps"] if g["what"].startswith("saturation.")]
    assert [g["what"] for g in sat_gaps] == ["saturation.g6"]
    gap = sat_gaps[0]
    assert gap["blocks_go"]
    assert gap["reason"] == (
        "g6: per-instance goodput measured below saturation (peak 2 of 4 concurrent sequences): throughput "
        "is a lower bound, fleet size an upper bound; raise workload.rate_scale until one instance saturates"
    )
    g6 = r["fleets"]["g6"]
    assert g6["saturated"] is False and g6["peak_in_flight_per_instance"] == 2 and g6["max_concurrency"] == 4
    assert g6["per_instance_goodput_bound"] == "lower_bound"
    assert r["fleets"]["inf2"]["saturated"] is True
    assert r["decision"]["state"] == "defer"
    assert any("saturation.g6" in x for x in r["decision"]["reasons"])
    assert r["provenance"]["saturation.g6"]["value"]["saturated"] is False
    md = (tmp_path / "o2" / "report.md").read_text()
    assert "| peak in flight / instance | max concurrency | saturated |" in md
    assert "| 2.0 | 4 | NO |" in md and "| 4.0 | 4 | yes |" in md
    # the fleet sizes rest on a blocking gap: not headlined (an upper bound is not a fleet size)
    assert "| NO | not decided | not decided |" in md and "saturation.g6" in md
    page = (tmp_path / "o2" / "report.html").read_text()
    assert "<th>saturated</th>" in page and "<td>NO</td>" in page and "<td>yes</td>" in page


def test_saturation_is_per_instance(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # 4 in flight over the fleet but 2 instances measured: 2 per instance, below max_concurrency 4
    m = _go_manifest(manifest_data, 4)
    write_jsonl(tmp_path / "r" / "records-inf2-w0.jsonl", _overlapping(m, "inf2", 50, 900, 4))
    write_jsonl(tmp_path / "r" / "records-g6-w0.jsonl", _overlapping(m, "g6", 50, 300, 4))
    r = build_report(
        ReportInputs(
            m,
            tmp_path / "r",
            quality=PASS,
            out_dir=tmp_path / "o",
            instances_measured={"inf2": 2, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert r["fleets"]["inf2"]["peak_in_flight_per_instance"] == 2 and not r["fleets"]["inf2"]["saturated"]
    assert [g["what"] for g in r["gaps"] if g["what"].startswith("saturation.")] == ["saturation.inf2"]
    assert r["decision"]["state"] != "go"


def test_fleet_measured_in_overload_gets_a_blocking_gap(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _go_manifest(manifest_data, 4)
    write_jsonl(tmp_path / "r" / "records-inf2-w0.jsonl", _overlapping(m, "inf2", 100, 900, 4))
    # g6: saturated, but every request waits 5 s for its first token (SLO 2 s): queueing, i.e. overload
    write_jsonl(
        tmp_path / "r" / "records-g6-w0.jsonl", [rec(m, "g6", i, tokens=300, e2e=4.0, ttft=5.0) for i in range(100)]
    )
    r = build_report(
        ReportInputs(
            m,
            tmp_path / "r",
            quality=PASS,
            out_dir=tmp_path / "o",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    over = [g for g in r["gaps"] if g["what"].startswith("overload.")]
    assert [g["what"] for g in over] == ["overload.g6"]
    assert over[0]["blocks_go"] and "P95 TTFT 5 s > 2 s" in over[0]["reason"]
    assert r["decision"]["state"] != "go"


def test_an_overloaded_candidate_defers_instead_of_rejecting_on_semantics(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    # inf2 (the candidate) saturated and overloaded: every answer late, every other request
    # abandoned. The old rule read that as "no successful output tokens; the model or API
    # semantics failed" and an error rate above the ceiling: Reject.
    m = _go_manifest(manifest_data, 4)
    write_jsonl(
        tmp_path / "r" / "records-inf2-w0.jsonl",
        [rec(m, "inf2", i, tokens=300, e2e=4.0, ttft=5.0, outcome="ok" if i % 2 else "timeout") for i in range(100)],
    )
    write_jsonl(tmp_path / "r" / "records-g6-w0.jsonl", _overlapping(m, "g6", 100, 300, 4))
    r = build_report(
        ReportInputs(
            m,
            tmp_path / "r",
            quality=PASS,
            out_dir=tmp_path / "o",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert r["fleets"]["inf2"]["saturated"] is True
    assert r["decision"]["state"] == "defer", r["decision"]
    assert not any("semantics" in x or "error rate" in x for x in r["decision"]["reasons"]), r["decision"]["reasons"]
    assert any(g["what"] == "overload.inf2" and g["blocks_go"] for g in r["gaps"])


def test_an_instance_of_several_replicas_saturates_at_all_their_slots(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    # inf2.48xlarge as 3 x TP=8 with max_concurrency 4: one instance runs 12 sequences at once,
    # so 4 in flight on it is a third of its capacity, not saturation.
    manifest_data["fleets"][0].update(instance_type="inf2.48xlarge", tensor_parallel=8, replicas_per_instance=3)
    m = _go_manifest(manifest_data, 4)
    write_jsonl(tmp_path / "r" / "records-inf2-w0.jsonl", _overlapping(m, "inf2", 50, 900, 4))
    write_jsonl(tmp_path / "r" / "records-g6-w0.jsonl", _overlapping(m, "g6", 50, 300, 4))
    r = build_report(
        ReportInputs(
            m,
            tmp_path / "r",
            quality=PASS,
            out_dir=tmp_path / "o",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert r["fleets"]["inf2"]["max_concurrency"] == 12 and not r["fleets"]["inf2"]["saturated"]
    gap = next(g for g in r["gaps"] if g["what"] == "saturation.inf2")
    assert "peak 4 of 12 concurrent sequences" in gap["reason"]
