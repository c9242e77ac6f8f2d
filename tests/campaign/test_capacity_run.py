"""The capacity search's runner: spans resolved against the trace, and a search in simulated time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from analysis.capacity.search import StepPlan, Stop, next_lifetime
from analysis.capacity.steps import SearchPath, StopRule, Verdict, read_search_path
from campaign.backends.simulated.fleets import SimulatedSteps
from campaign.stages.capacity import (
    measure_step,
    planned_requests,
    resolve_span,
    running_miss,
    search_fleet,
    settings_from,
)
from campaign.stages.progress import RecordTail
from core.manifest import CapacitySearch, load_manifest
from loadgen.recording import read_records
from tests.analysis.synth import rec, write_jsonl
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


def test_planned_requests_counts_the_arrivals_inside_the_span() -> None:
    offsets = [float(i) for i in range(100)]
    assert planned_requests(StepPlan(2.0, 19.501, "start"), offsets) == 40  # offsets 0..39 arrive before 19.501 s at x2
    assert (
        planned_requests(StepPlan(0.5, 10.0, "start"), offsets) == 6
    )  # 0..5 (5 / 0.5 = 10 s is inside: an upper bound)


def test_a_running_step_is_a_certain_miss_once_its_records_decide_one(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = load_manifest(write(tmp_path, manifest_data))  # SLO: TTFT 2 s, ITL 0.12 s, errors 1%
    d = tmp_path / "x1"
    # 72 planned: 3 requests over the TTFT target are allowed (the P95 is the 69th), warmup rows
    # and not-sent rows do not count
    ok = [rec(m, "inf2", i) for i in range(30)]
    slow = [rec(m, "inf2", 100 + i, ttft=2.5) for i in range(3)]
    ignored = [
        rec(m, "inf2", 200, ttft=9.0, warmup=True),
        rec(m, "inf2", 201, ttft=None, itl=None, outcome="not_sent"),
        rec(m, "inf2", 202, ttft=None, itl=None, outcome="timeout", warmup=True),
    ]
    write_jsonl(d / "records-inf2-w0.jsonl", ok + slow + ignored)
    tail = RecordTail(d, "inf2", 72)
    assert running_miss(m, tail, 72) is None
    write_jsonl(d / "records-inf2-w1.jsonl", [rec(m, "inf2", 300, ttft=3.0)])  # a fourth, from the other worker
    assert running_miss(m, tail, 72) == "4 requests over the TTFT target, more than the 3 a P95 of 72 allows"
    assert running_miss(m, RecordTail(d, "g6", 72), 72) is None  # another fleet's records are not read
    # ITLs count the same way; a torn last line (the writer is mid-flush) waits for the next poll
    e = tmp_path / "x0.7"
    write_jsonl(e / "records-inf2-w0.jsonl", [*ok, *(rec(m, "inf2", 50 + i, itl=0.2) for i in range(4))])
    assert (
        running_miss(m, RecordTail(e, "inf2", 72), 72)
        == "4 requests over the ITL target, more than the 3 a P95 of 72 allows"
    )
    f = tmp_path / "x0.5"
    write_jsonl(f / "records-inf2-w0.jsonl", ok)
    with (f / "records-inf2-w0.jsonl").open("a") as fh:
        fh.write('{"campaign": "llama3')
    tail = RecordTail(f, "inf2", 72)
    assert running_miss(m, tail, 72) is None
    # one timeout decides a 72-request step (0.72 errors allowed)
    write_jsonl(f / "records-inf2-w1.jsonl", [rec(m, "inf2", 400, ttft=None, itl=None, outcome="timeout")])
    assert running_miss(m, tail, 72) == "1 errors > 0.01 x 72 planned requests"


def test_a_measured_step_carries_the_share_of_sent_requests_that_met_their_slo(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = load_manifest(write(tmp_path, manifest_data))
    d = tmp_path / "x1"
    # 10 sent: 6 within the SLO, 2 over the TTFT target, 2 aborted in flight when the step was stopped;
    # 5 never sent (the step stopped first) are not in the share
    recs = (
        [rec(m, "inf2", i) for i in range(6)]
        + [rec(m, "inf2", 10 + i, ttft=4.0) for i in range(2)]
        + [rec(m, "inf2", 20 + i, ttft=None, itl=None, outcome="connection_error") for i in range(2)]
        + [rec(m, "inf2", 30 + i, ttft=None, itl=None, outcome="not_sent") for i in range(5)]
    )
    write_jsonl(d / "records-inf2-w0.jsonl", recs)
    step = measure_step(m, "inf2", d, "x1", 1.0, "start", 30.0, settings_from(CapacitySearch()))
    assert step.verdict is Verdict.MISSED and step.met_share == pytest.approx(0.6)
    assert not step.itl_missed  # a TTFT miss: its share is the search's estimate
    # a miss on P95 ITL says so (its share estimates nothing: analysis.capacity.search.step_down)
    e = tmp_path / "x2"
    write_jsonl(e / "records-inf2-w0.jsonl", [rec(m, "inf2", i, itl=0.2 if i % 2 else 0.05) for i in range(20)])
    step = measure_step(m, "inf2", e, "x2", 2.0, "bracket up", 30.0, settings_from(CapacitySearch()))
    assert step.verdict is Verdict.MISSED and step.itl_missed and "P95 ITL" in step.detail


def test_search_in_simulated_time_sizes_every_step_and_records_its_path(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """The search's own rules (each step sized from the lifetime measured before it, its path
    recorded), run on `campaign plan`'s step runner: the emulator's engine in simulated time, the
    same records and judging as a live step. Until 2026-12-07 it ran against an emulator process
    and Locust in real time (about 40 s); the live runner (LocalSteps) keeps its end-to-end run in
    tests/campaign/test_local.py's capacity sweep."""
    data = small_manifest_data(manifest_data)
    data["loadgen"]["request_timeout_s"] = 10.0
    cfg: dict[str, Any] = {
        "start_multiplier": 1.0,
        "tolerance": 0.5,
        "min_requests": 20,
        "max_steps": 3,
        "time_budget_s": 90,
    }
    data["workload"]["capacity_search"] = cfg
    m = load_manifest(write(tmp_path, data))
    fleet_dir = tmp_path / "capacity" / "g6"
    lines: list[str] = []
    result = search_fleet(
        m,
        "g6",
        fleet_dir,
        CapacitySearch(**cfg),
        0.5,
        SimulatedSteps(m),
        threading.Event(),
        lines.append,
    )
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
    # A step too short for the lifetime it measured is repeated, longer, at its multiplier (here the
    # first: its requests lived 1.2 s against the 0.5 s assumed before it) ...
    for st, after in zip(result.steps, result.steps[1:], strict=False):
        if st.verdict is Verdict.SHORT:
            assert after.multiplier == st.multiplier and after.why.startswith("repeat longer"), after
    # ... and the step after the first judged one doubled it, or went down by 2 to 8 (the miss's estimate)
    judged = [i for i, st in enumerate(result.steps) if st.verdict in (Verdict.HELD, Verdict.MISSED)]
    assert judged, result.steps
    if judged[0] + 1 < len(result.steps):
        k = result.steps[judged[0] + 1].multiplier / result.steps[judged[0]].multiplier
        assert k == 2.0 or 1 / 8 - 1e-9 <= k <= 0.5
    assert all(st.took_s is not None and st.took_s > 0 for st in result.steps)


class _TimedSteps:
    """A StepRunner that only records when each fleet's step ran. Real time on purpose: the
    subject is whether the fleets' threads overlap, read off the clock (0.2 s a step, 1 to 2 s a test)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.lock = threading.Lock()

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        import time

        t0 = time.monotonic()
        time.sleep(0.2)
        with self.lock:
            self.spans.append((fleet, t0, time.monotonic()))
        return 0.2, None

    def abort(self) -> None:
        pass


@pytest.mark.parametrize("concurrent", [None, 1])
def test_fleets_are_measured_side_by_side_or_one_after_another(
    tmp_path: Path, manifest_data: dict[str, Any], concurrent: int | None
) -> None:
    from campaign.stages.capacity import run_sweep
    from tests.conftest import write_manifest

    manifest_data["workload"].pop("capacity_search", None)
    manifest_data["workload"]["capacity_sweep"] = {"multipliers": [1.0, 2.0], "step_s": 5}
    m = load_manifest(write_manifest(tmp_path, manifest_data))
    runner = _TimedSteps()
    dirs = run_sweep(
        m, ["inf2", "g6"], runner, tmp_path / "capacity", threading.Event(), log=lambda _: None, concurrent=concurrent
    )
    assert set(dirs) == {"x1", "x2"} and len(runner.spans) == 4
    overlaps = sum(a[1] < b[2] and b[1] < a[2] for i, a in enumerate(runner.spans) for b in runner.spans[i + 1 :])
    assert overlaps == (0 if concurrent == 1 else 2)  # side by side: each multiplier's two steps overlap
