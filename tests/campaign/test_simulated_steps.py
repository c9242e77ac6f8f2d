"""Capacity steps in simulated time (campaign plan's step runner) by the live search's rules."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from analysis.capacity.search import StepPlan
from analysis.capacity.steps import StopRule
from campaign.backends.simulated.fleets import SimulatedSteps, simulate_requests
from campaign.stages.capacity import arrival_offsets, measure_step, planned_requests, search_fleet, settings_from
from core.manifest import CapacitySearch, load_manifest
from core.records import Outcome, slo_deadline_s
from core.schedule import build_schedule
from tests.conftest import EXAMPLE_MANIFEST


@pytest.fixture(scope="module")
def m():  # type: ignore[no-untyped-def]
    return load_manifest(EXAMPLE_MANIFEST, check_files=False)


def test_a_replay_records_every_request_with_engine_timings(m) -> None:  # type: ignore[no-untyped-def]
    schedule = build_schedule(m)
    run = simulate_requests(m, "inf2", schedule)
    assert [r.request_id for r in run.records] == sorted(r.request_id for r in schedule)
    ok = [r for r in run.records if r.outcome == Outcome.OK.value]
    assert len(ok) == len(schedule)  # no deadline: every request runs to its length
    for r in ok:
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert r.server_output_tokens == r.max_tokens
    assert run.duration_s == pytest.approx(max(r.scheduled_s + r.e2e_s for r in ok) - min(r.scheduled_s for r in ok))


def test_an_overloaded_step_abandons_at_the_deadline_and_stops_early(m, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = settings_from(CapacitySearch())
    plan = StepPlan(8.0, 40.0, "test: far above the boundary")
    planned = planned_requests(plan, arrival_offsets(m))
    took, early = SimulatedSteps(m).run("g6", plan, tmp_path / "x8", planned, threading.Event())
    assert (early is not None and "certain miss" not in early) or early  # a reason is given
    step = measure_step(m, "g6", tmp_path / "x8", "x8", 8.0, plan.why, plan.span_s, settings)
    assert str(step.verdict) == "missed"
    from analysis.sources.records import load_records

    rs = load_records(tmp_path / "x8", m.digest)
    rows = rs.con.execute("SELECT outcome, e2e_s, max_tokens FROM records").fetchall()
    abandoned = [(e2e, n) for outcome, e2e, n in rows if outcome == Outcome.SLO_ABANDONED.value]
    assert abandoned and all(
        e2e == pytest.approx(min(slo_deadline_s(m.slo, n), m.loadgen.request_timeout_s)) for e2e, n in abandoned
    )
    full = max(r[1] for r in rows)  # the last request's end: the early stop came before the step drained
    assert took < plan.span_s + full


def test_the_search_converges_in_simulated_time(m, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    path = search_fleet(
        m, "inf2", tmp_path / "inf2", CapacitySearch(), 20.0, SimulatedSteps(m), threading.Event(), lines.append
    )
    assert path.stop_rule is StopRule.CONVERGED, lines
    assert path.held_multiplier is not None and path.missed_multiplier is not None
    assert path.missed_multiplier <= path.held_multiplier * 1.1 + 1e-9
    for s in path.steps:  # every step's records are on disk, judged by measure_step
        assert any((tmp_path / "inf2" / s.label).glob("records-inf2-*.jsonl"))
        assert s.requests >= 72 or str(s.verdict) == "missed"
