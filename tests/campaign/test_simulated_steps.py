"""Capacity steps in simulated time (campaign plan's step runner) by the live search's rules."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from analysis.capacity.search import StepPlan
from analysis.capacity.steps import StopRule
from analysis.model import CapacityModel
from campaign.backends.simulated.fleets import SimulatedFleets, SimulatedSteps, simulate_requests
from campaign.stages.capacity import arrival_offsets, measure_step, planned_requests, search_fleet, settings_from
from campaign.stages.run import report_from_run_dir, run_stages
from core.manifest import CapacitySearch, load_manifest, manifest_from_data
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


def test_a_search_stopped_before_its_first_step_still_says_how_in_the_report(tmp_path: Path) -> None:
    # A time budget the replay alone spends: each fleet's search stops (time_budget) with no step
    # directory, only its search.json. The report read searches through step directories and
    # showed no capacity at all (both fleets' "capacity" null), hiding why none was measured.
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str((EXAMPLE_MANIFEST.parent / data["workload"]["trace"]["path"]).resolve())
    data["workload"].setdefault("capacity_search", {})["time_budget_s"] = 1.0
    m = manifest_from_data(data)
    run_dir = tmp_path / "run"
    run_stages(
        m, SimulatedFleets(m, overhead_s=60.0), run_dir, threading.Event(), full_report=False, log=lambda _: None
    )
    assert not [p for p in (run_dir / "capacity").rglob("step.json")]  # no search got to a step
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    for f in m.fleets:
        cap = report["fleets"][f.name]["capacity"]
        assert cap is not None and cap["search"] is not None, cap
        assert cap["search"]["stop_rule"] == StopRule.TIME_BUDGET.value
        assert [s["label"] for s in cap["search"]["steps"]] == ["replay"]  # judged, then no step fit
        assert [s["label"] for s in cap["steps"]] == ["replay"]
    rebuilt = report_from_run_dir(m, run_dir, tmp_path / "rebuilt")
    assert {f: v.capacity for f, v in rebuilt.fleets.items()} == {
        f: CapacityModel.model_validate(v["capacity"]) for f, v in report["fleets"].items()
    }
