"""The capacity search's runner: spans resolved against the trace, and a real search against an emulator."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from analysis.capacity import SearchPath, StopRule, Verdict, read_search_path
from analysis.capacity_search import StepPlan, Stop, next_lifetime
from campaign.capacity_run import resolve_span, search_fleet
from campaign.local import start_emulator
from campaign.manifest import CapacitySearch, load_manifest
from campaign.processes import Supervisor
from loadgen.recording import read_records
from tests.loadgen.conftest import small_manifest_data, write


def test_resolve_span_lengthens_a_step_to_min_requests_and_names_a_short_trace() -> None:
    offsets = [float(i) for i in range(100)]  # one arrival a second at x1, for 99 s
    # at x2, 40 requests arrive within 19.5 s: the 40th at 39 / 2 = 19.5 s, so the span covers just past it
    plan = resolve_span(StepPlan(2.0, 5.0, "start"), offsets, 40)
    assert isinstance(plan, StepPlan) and plan.span_s == pytest.approx(19.501)
    # a span longer than that is kept
    plan = resolve_span(StepPlan(2.0, 30.0, "start"), offsets, 40)
    assert isinstance(plan, StepPlan) and plan.span_s == 30.0
    # at x0.25, 40 requests need 156 s but the trace gives 99 / 0.25 = 396 s: fine; a 500 s span is not
    stop = resolve_span(StepPlan(0.25, 500.0, "bracket down"), offsets, 40)
    assert isinstance(stop, Stop) and stop.rule is StopRule.TRACE_EXHAUSTED
    assert "needs 500.0 s of arrivals; at x0.25 the trace from the window's start gives 396.0 s" in stop.detail
    stop = resolve_span(StepPlan(1.0, 1.0, "start"), offsets[:10], 40)
    assert isinstance(stop, Stop) and "the trace has 10 requests" in stop.detail


def test_search_against_an_emulator_sizes_every_step_and_records_its_path(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    data = small_manifest_data(manifest_data)
    data["loadgen"]["request_timeout_s"] = 10.0
    cfg = {"start_multiplier": 1.0, "tolerance": 0.5, "min_requests": 20, "max_steps": 3, "time_budget_s": 90}
    data["workload"]["capacity_search"] = cfg
    path = write(tmp_path, data)
    m = load_manifest(path)
    fleet_dir = tmp_path / "capacity" / "g6"
    lines: list[str] = []
    with Supervisor(tmp_path / "logs") as sup:
        url = start_emulator(sup, path, "g6", tmp_path, [])
        result = search_fleet(m, path, "g6", url, fleet_dir, CapacitySearch(**cfg), 0.5, {}, threading.Event(), lines.append)
    assert read_search_path(fleet_dir) == result
    assert isinstance(result, SearchPath) and result.steps and result.stop_detail
    assert lines[-1].startswith(f"capacity search g6: stopped ({result.stop_rule})")
    first = result.steps[0]
    assert first.multiplier == 1.0 and first.why == "start"
    prev_life = 0.5
    for st in result.steps:
        recs = [r for r in read_records(sorted((fleet_dir / st.label).glob("records-g6-*.jsonl")))]
        # by construction: at least min_requests arrivals, all inside the planned span, which covers
        # 3 x 1.25 x the lifetime measured before it (a run that measured the client is run again)
        assert len(recs) == st.requests >= 20
        assert max(r.scheduled_s for r in recs) < st.planned_span_s
        assert st.planned_span_s >= 3 * 1.25 * prev_life - 1e-9
        assert st.verdict in (Verdict.HELD, Verdict.MISSED, Verdict.SHORT, Verdict.INVALID) and st.detail
        prev_life = next_lifetime(st, prev_life)  # after a miss: the lifetime of the requests that met their SLO
    if len(result.steps) > 1:  # the second step doubled or halved the first
        assert result.steps[1].multiplier in (2.0, 0.5)
