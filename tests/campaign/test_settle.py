"""The settle phase: segments that continue a sizing step with the trace's next requests, pooled
with it by the analysis, until the decision settles or the budget is spent."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from analysis.capacity.search import StepPlan
from analysis.capacity.settle_record import SETTLE_FILE, SETTLE_PROGRESS_FILE, Reopened
from analysis.capacity.steps import SearchPath, SearchStep, StopRule, Verdict, read_search_path, write_search_path
from analysis.measure import goodput
from analysis.sources.records import load_records
from campaign.stages.capacity import arrival_offsets, resume_search
from campaign.stages.settle import settle
from core.manifest import Manifest, load_manifest
from tests.analysis.synth import rec, write_jsonl
from tests.conftest import write_manifest

STEP_SPAN_S = 120.0


class FakeRunner:
    """Records what it was asked to run and writes one record per planned request."""

    def __init__(self, m: Manifest):
        self.m = m
        self.calls: list[tuple[str, StepPlan, Path, int]] = []

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        self.calls.append((fleet, plan, step_dir, planned))
        write_jsonl(
            step_dir / f"records-{fleet}-w0.jsonl", [rec(self.m, fleet, i, scheduled=i * 2.0) for i in range(planned)]
        )
        return plan.span_s + 5.0, None

    def abort(self) -> None:
        pass


# What the phase prices a segment from (analysis.economics.to_settle.report_hourly_usd): the report's
# provenance and instances measured. inf2: 1 instance x 0.7582 + 3 tasks x 0.04937 = 0.90631 USD/h.
PROVENANCE = {
    "prices.instance.inf2.xlarge": SimpleNamespace(value=0.7582),
    "prices.instance.g6.xlarge": SimpleNamespace(value=0.8048),
    "prices.fargate_vcpu_hour": SimpleNamespace(value=0.04048),
    "prices.fargate_gb_hour": SimpleNamespace(value=0.004445),
}
INF2_HOURLY_USD = 0.7582 + 3 * (0.04048 + 2 * 0.004445)


def _row(basis: str) -> Any:
    return SimpleNamespace(intervals=SimpleNamespace(basis=basis), capacity=None, instances_measured=1)


def _report(more: int | None, state: str = "defer", ci: tuple[float | None, float | None] = (None, 5000.0)) -> Any:
    """The parts of a Report the settle phase reads."""
    ts = (
        None
        if more is None
        else SimpleNamespace(
            by_fleet={"inf2": SimpleNamespace(more_requests=more, usd=1.0, minutes=10.0)}, usd=1.0, minutes=10.0
        )
    )
    return SimpleNamespace(
        decision=SimpleNamespace(to_settle=ts, state=state),
        monthly_delta_ci_usd=list(ci),
        fleets={"inf2": _row("inf2/x0.5")},
        provenance=PROVENANCE,
    )


def _search(root: Path, overhead_s: float | None = None) -> dict[str, Path]:
    step = SearchStep(
        "x0.5",
        0.5,
        "bisect",
        STEP_SPAN_S,
        Verdict.HELD,
        72,
        STEP_SPAN_S,
        0.6,
        20.0,
        1.5,
        0.08,
        0.0,
        overhead_s=overhead_s,
    )
    write_search_path(SearchPath("inf2", (step,), 0.5, 0.55, StopRule.CONVERGED, "within 10%", 0.1), root / "inf2")
    (root / "inf2" / "x0.5").mkdir(parents=True, exist_ok=True)
    return {"inf2/x0.5": root / "inf2" / "x0.5"}


@pytest.fixture
def m(tmp_path: Path, manifest_data: dict[str, Any]) -> Manifest:
    # The settle phase at its default budget (the example's is shorter, so `make demo` stays short).
    manifest_data["workload"]["capacity_search"].pop("settle_budget_s", None)
    return load_manifest(write_manifest(tmp_path, manifest_data, "settle.yaml"), check_files=False)


def test_a_segment_continues_the_sizing_step_with_the_next_requests(tmp_path: Path, m: Manifest) -> None:
    dirs = _search(tmp_path)
    reports = iter([_report(10), _report(None, "go", (3500.0, 5000.0))])
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path, dirs, lambda: next(reports), threading.Event(), lambda _: None)
    assert out.stopped == "settled" and out.decision_before == "defer" and out.decision_after == "go"
    assert out.delta_ci_before == [None, 5000.0] and out.delta_ci_after == [3500.0, 5000.0]
    [(fleet, plan, seg_dir, planned)] = runner.calls
    assert fleet == "inf2" and seg_dir == tmp_path / "inf2" / "x0.5" / "settle-1"
    # the step replayed STEP_SPAN_S x 0.5 of x1 offsets: the segment skips exactly those
    assert plan.multiplier == 0.5 and plan.skip_s == pytest.approx(STEP_SPAN_S * 0.5)
    offsets = arrival_offsets(m)
    assert planned == 10 == sum(1 for o in offsets if plan.skip_s <= o < plan.skip_s + plan.span_s * plan.multiplier)
    # Its USD: the fleet's instances and load-generator tasks for the segment's whole wall time
    # (FakeRunner: its arrivals + 5 s), 0.0029 USD. Before 2026-12-07: to_settle's USD (this fake's
    # 1.0 for 10 min) prorated over the segment's arrivals, 0.0108 USD, whatever the fleet costs.
    assert out.usd == pytest.approx(INF2_HOURLY_USD * (plan.span_s + 5.0) / 3600, rel=1e-9)
    saved = json.loads((tmp_path / SETTLE_FILE).read_text())
    assert saved["stopped"] == "settled" and saved["segments"][0]["directory"] == "inf2/x0.5/settle-1"


def test_a_second_segment_skips_the_first_one_too(tmp_path: Path, m: Manifest) -> None:
    dirs = _search(tmp_path)
    reports = iter([_report(10), _report(6, ci=(None, 4800.0)), _report(None)])
    runner = FakeRunner(m)
    settle(m, runner, tmp_path, dirs, lambda: next(reports), threading.Event(), lambda _: None)
    (_, first, _, _), (_, second, seg2, _) = runner.calls
    assert seg2.name == "settle-2"
    assert second.skip_s == pytest.approx(first.skip_s + first.span_s * first.multiplier)


def test_a_round_that_moves_no_end_of_the_interval_ends_the_phase(tmp_path: Path, m: Manifest) -> None:
    # The example's demo: to_settle asked 2-3 requests a round, four rounds, and the interval never moved.
    dirs = _search(tmp_path)
    reports = iter([_report(3), _report(3), _report(3)])
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path, dirs, lambda: next(reports), threading.Event(), lambda _: None)
    assert out.stopped == "stalled" and len(runner.calls) == 1 and "bracket" in out.detail


def test_a_round_that_bounds_a_fleets_capacity_is_progress_though_the_delta_stays_unknown(
    tmp_path: Path, m: Manifest
) -> None:
    # The Azure code trace: inf2's interval got its low end in round 1 while g6 kept the delta's
    # ends unknown; g6's second segment then bounded it. The rule must not call round 1 a stall.
    dirs = _search(tmp_path)

    def report(more: int | None, low: float | None) -> Any:
        r = _report(more, ci=(None, None))
        r.fleets["inf2"].capacity_ci_tok_s = [low, 9.0]
        return r

    reports = iter([report(3, None), report(3, 4.9), report(None, 4.9)])
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path, dirs, lambda: next(reports), threading.Event(), lambda _: None)
    assert len(runner.calls) == 2 and out.stopped == "settled"
    # A known end that merely shifts (the segment pooled into the step) is no progress.
    reports = iter([report(3, 4.9), report(3, 5.1), report(None, 5.1)])
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path, dirs, lambda: next(reports), threading.Event(), lambda _: None)
    assert len(runner.calls) == 1 and out.stopped == "stalled"


def test_the_budget_stops_a_round_before_it_starts(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["workload"]["capacity_search"] = {
        **manifest_data["workload"].get("capacity_search", {}),
        "settle_budget_s": 5,
    }
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    dirs = _search(tmp_path / "cap")
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path / "cap", dirs, lambda: _report(10), threading.Event(), lambda _: None)
    assert out.stopped == "budget" and "5 s settle budget" in out.detail and not runner.calls


def test_a_segment_fits_the_budget_with_its_drain(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    # The budget counts a round's wall time, arrivals and drain: the demo's segments each fit by
    # arrivals and left the phase at 154 s of its 120 s. The sizing step's requests lived 20 s (_search): a segment whose
    # arrivals fit with 10 s to spare does not fit once it drains.
    m0 = load_manifest(write_manifest(tmp_path, manifest_data, "probe.yaml"), check_files=False)
    probe = FakeRunner(m0)
    settle(m0, probe, tmp_path / "probe", _search(tmp_path / "probe"), lambda: _report(10), threading.Event())
    span = probe.calls[0][1].span_s
    manifest_data["workload"]["capacity_search"] = {
        **manifest_data["workload"].get("capacity_search", {}),
        "settle_budget_s": span + 10.0,
    }
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path / "cap", _search(tmp_path / "cap"), lambda: _report(10), threading.Event())
    assert out.stopped == "budget" and not runner.calls
    assert f"needs about {span:.0f} s of arrivals, 20 s to drain" in out.detail


def test_a_segment_fits_the_budget_with_the_load_generators_start_and_stop(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    # On Fargate a step's tasks take a minute or more to start and stop, billed on every measured
    # instance: a segment whose arrivals and drain fit with 10 s to spare does not fit once the
    # 30 s overhead its search's steps measured is counted.
    m0 = load_manifest(write_manifest(tmp_path, manifest_data, "probe.yaml"), check_files=False)
    probe = FakeRunner(m0)
    settle(m0, probe, tmp_path / "probe", _search(tmp_path / "probe"), lambda: _report(10), threading.Event())
    span = probe.calls[0][1].span_s
    manifest_data["workload"]["capacity_search"] = {
        **manifest_data["workload"].get("capacity_search", {}),
        "settle_budget_s": span + 20.0 + 10.0,
    }
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path / "a", _search(tmp_path / "a"), lambda: _report(10), threading.Event())
    assert runner.calls  # no overhead measured: arrivals and drain fit
    runner = FakeRunner(m)
    out = settle(
        m, runner, tmp_path / "b", _search(tmp_path / "b", overhead_s=30.0), lambda: _report(10), threading.Event()
    )
    assert out.stopped == "budget" and not runner.calls
    assert "20 s to drain and 30 s to start and stop the load generator" in out.detail


def test_a_fleet_whose_segment_exceeds_the_budget_does_not_hold_back_the_other(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    # Seen on the Azure code trace: g6's P95 ITL sat just under its target at every load, so its
    # interval needed about 2,600 more requests, inf2's 70; the whole round stopped on the budget.
    manifest_data["workload"]["capacity_search"] = {
        **manifest_data["workload"].get("capacity_search", {}),
        "settle_budget_s": 120,
    }
    m = load_manifest(write_manifest(tmp_path, manifest_data), check_files=False)
    dirs = _search(tmp_path / "cap")
    step = SearchStep("x0.5", 0.5, "bisect", STEP_SPAN_S, Verdict.HELD, 72, STEP_SPAN_S, 0.6, 20.0, 1.5, 0.08, 0.0)
    write_search_path(
        SearchPath("g6", (step,), 0.5, 0.55, StopRule.CONVERGED, "within 10%", 0.1), tmp_path / "cap" / "g6"
    )
    (tmp_path / "cap" / "g6" / "x0.5").mkdir(parents=True)
    dirs["g6/x0.5"] = tmp_path / "cap" / "g6" / "x0.5"

    def report(fleets: dict[str, int], upper: float = 5000.0) -> Any:
        need = {n: SimpleNamespace(more_requests=k, usd=0.5, minutes=k / 60) for n, k in fleets.items()}
        return SimpleNamespace(
            decision=SimpleNamespace(to_settle=SimpleNamespace(by_fleet=need, usd=1.0, minutes=1.0), state="defer"),
            monthly_delta_ci_usd=[None, upper],
            fleets={n: _row(f"{n}/x0.5") for n in ("inf2", "g6")},
            provenance=PROVENANCE,
        )

    reports = iter([report({"inf2": 10, "g6": 5000}), report({"g6": 5000}, upper=4000.0)])
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path / "cap", dirs, lambda: next(reports), threading.Event(), lambda _: None)
    assert [c[0] for c in runner.calls] == ["inf2"]  # g6 sat out; inf2 got its 10 requests
    assert out.stopped == "budget" and out.detail.startswith("g6: its next segment needs about")
    assert out.over_budget == [out.detail] and [s.fleet for s in out.segments] == ["inf2"]

    # A fleet dropped for the USD budget says so, with its own cost (not a seconds figure that fits):
    # inf2's segment, as above, holds its fleet for its arrivals and 20 s of drain (about 0.006 USD).
    cost = INF2_HOURLY_USD * (runner.calls[0][1].span_s + 20.0) / 3600
    manifest_data["workload"]["capacity_search"]["settle_budget_usd"] = 0.005
    m = load_manifest(write_manifest(tmp_path, manifest_data, "usd.yaml"), check_files=False)
    fresh = _search(tmp_path / "usd")  # inf2's first segment again, as above
    out = settle(m, FakeRunner(m), tmp_path / "usd", fresh, lambda: report({"inf2": 10}), threading.Event())
    assert out.stopped == "budget" and not out.segments
    inf2_why = next(w for w in out.over_budget if w.startswith("inf2:"))
    assert f"would cost about {cost:.3g} USD on the cloud fleets; 0.005 of the 0.005 USD settle" in inf2_why, inf2_why


def test_the_analysis_pools_a_step_with_its_segments(tmp_path: Path, m: Manifest) -> None:
    """Each segment's schedule starts at 0: the step's window is the sum of their windows, not the
    widest one, and every request counts once."""
    step = tmp_path / "x0.5"
    write_jsonl(step / "records-inf2-w0.jsonl", [rec(m, "inf2", i, scheduled=i * 2.0) for i in range(72)])  # 72 x 2 s
    write_jsonl(step / "settle-1" / "records-inf2-w0.jsonl", [rec(m, "inf2", i, scheduled=i * 2.0) for i in range(36)])
    fm = goodput.measure_fleets(load_records(step, m.digest), m.slo.ttft_p95_s, m.slo.itl_p95_s)["inf2"]
    assert fm.requests == 108
    # windows: 71 gaps x 2 s x 72/71 = 144 s, and 35 x 2 x 36/35 = 72 s
    assert fm.window_s == pytest.approx(144.0 + 72.0)


def test_a_sizing_step_that_misses_pooled_with_its_segment_reopens_the_search(tmp_path: Path, m: Manifest) -> None:
    """The example's demo (2026-12-05): inf2/x0.7071 held over its 95 requests; pooled with a
    143-request segment it missed, so the fleet had no capacity step left. The phase stops
    ("reopened") naming the step, and the fleet's search resumes just below it."""
    dirs = _search(tmp_path)
    after = _report(10)
    after.fleets["inf2"].capacity = SimpleNamespace(
        steps=[SimpleNamespace(label="inf2/x0.5", slo_pass=False, requests=82, p95_ttft_s=2.6, p95_itl_s=0.08)]
    )
    reports = iter([_report(10), after])
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path, dirs, lambda: next(reports), threading.Event(), lambda _: None)
    assert out.stopped == "reopened" and len(runner.calls) == 1
    assert out.reopened == {
        "inf2": Reopened(
            step="inf2/x0.5", why="inf2/x0.5 missed over 82 requests with its segments (P95 TTFT 2.6 s, P95 ITL 0.08 s)"
        )
    }
    # the phase is not finished (its search reopens): no settle.json, which would mark it so and
    # send a run cut off in the reopened search to its report (on 17e73d2 it was written)
    assert not (tmp_path / SETTLE_FILE).exists()
    saved = json.loads((tmp_path / SETTLE_PROGRESS_FILE).read_text())["outcome"]
    assert saved["reopened"]["inf2"]["step"] == "inf2/x0.5" and saved["stopped"] == "reopened"
    # The search resumes from its recorded steps with x0.5 a miss: the next step is just below it.
    runner = FakeRunner(m)
    resume_search(m, "inf2", tmp_path, "inf2/x0.5", out.reopened["inf2"].why, runner, threading.Event(), lambda _: None)
    first = runner.calls[0][1]
    assert first.multiplier == pytest.approx(0.5 / (1 + m.workload.capacity_search.tolerance))  # type: ignore[union-attr]
    assert first.why.startswith("just below x0.5: it held over its own requests but missed pooled")
    path = read_search_path(tmp_path / "inf2")
    assert path is not None and path.steps[0].verdict is Verdict.MISSED
    assert path.steps[0].detail.startswith("missed pooled with its settle segments: inf2/x0.5 missed over 82")


def test_a_segment_with_no_price_does_not_run_under_a_usd_budget(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    """A report with no instance price (a price gap) priced every segment 0 USD, so a USD budget
    let the phase run unbounded: with a budget such a segment sits out, saying why; without one
    it runs, at 0 USD as nothing can price it."""
    unpriced = _report(10)
    unpriced.provenance = {}
    manifest_data["workload"]["capacity_search"]["settle_budget_usd"] = 5.0
    m = load_manifest(write_manifest(tmp_path, manifest_data, "usd.yaml"), check_files=False)
    runner = FakeRunner(m)
    out = settle(m, runner, tmp_path / "a", _search(tmp_path / "a"), lambda: unpriced, threading.Event())
    assert out.stopped == "budget" and not runner.calls
    assert out.detail == (
        "inf2: its segment has no price (the report has no On-Demand price for the fleet's instances), "
        "so the 5 USD settle budget cannot bound it"
    )
    manifest_data["workload"]["capacity_search"].pop("settle_budget_usd")
    m = load_manifest(write_manifest(tmp_path, manifest_data, "free.yaml"), check_files=False)
    runner = FakeRunner(m)
    reports = iter([unpriced, _report(None, "go", (3500.0, 5000.0))])
    out = settle(m, runner, tmp_path / "b", _search(tmp_path / "b"), lambda: next(reports), threading.Event())
    assert [c[0] for c in runner.calls] == ["inf2"] and out.usd == 0.0


def test_fleets_measured_one_after_another_spend_the_sum_of_their_segments(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """`concurrent` 1 (locally, a CPU engine per fleet, measured one at a time): a round takes its
    segments' times added up, and they fit the budget together. Until 2026-12-07 a round counted
    its longest segment, so such a phase spent about twice the seconds its budget allowed."""

    def two_fleets(root: Path) -> dict[str, Path]:
        dirs = _search(root)
        step = SearchStep("x0.5", 0.5, "bisect", STEP_SPAN_S, Verdict.HELD, 72, STEP_SPAN_S, 0.6, 20.0, 1.5, 0.08, 0.0)
        write_search_path(SearchPath("g6", (step,), 0.5, 0.55, StopRule.CONVERGED, "within 10%", 0.1), root / "g6")
        (root / "g6" / "x0.5").mkdir(parents=True)
        dirs["g6/x0.5"] = root / "g6" / "x0.5"
        return dirs

    both = _report(10)
    both.decision.to_settle.by_fleet = {
        n: SimpleNamespace(more_requests=n_more) for n, n_more in (("inf2", 10), ("g6", 20))
    }
    both.fleets = {n: _row(f"{n}/x0.5") for n in ("inf2", "g6")}
    manifest_data["workload"]["capacity_search"].pop("settle_budget_s", None)  # the default, 600 s: both fit
    m = load_manifest(write_manifest(tmp_path, manifest_data, "seq.yaml"), check_files=False)
    runner = FakeRunner(m)
    reports = iter([both, _report(None, "go", (3500.0, 5000.0))])
    out = settle(
        m, runner, tmp_path / "a", two_fleets(tmp_path / "a"), lambda: next(reports), threading.Event(), concurrent=1
    )
    took = {c[0]: c[1].span_s + 5.0 for c in runner.calls}  # FakeRunner: arrivals + 5 s
    assert sorted(took) == ["g6", "inf2"] and out.seconds == pytest.approx(sum(took.values()))
    # A budget that holds either segment alone (its arrivals and the step's 20 s drain) but not both:
    # the shorter runs, the other sits out, saying it comes after it.
    need = {n: t - 5.0 + 20.0 for n, t in took.items()}
    manifest_data["workload"]["capacity_search"]["settle_budget_s"] = max(need.values()) + 1.0
    m = load_manifest(write_manifest(tmp_path, manifest_data, "tight.yaml"), check_files=False)
    runner = FakeRunner(m)
    reports = iter([both, _report(None, "go", (3500.0, 5000.0))])
    out = settle(
        m, runner, tmp_path / "b", two_fleets(tmp_path / "b"), lambda: next(reports), threading.Event(), concurrent=1
    )
    shorter, longer = sorted(need, key=lambda n: need[n])
    assert [c[0] for c in runner.calls] == [shorter], out.over_budget
    assert (
        out.over_budget[0].startswith(f"{longer}: its next segment needs about")
        and "round's segments before it" in out.over_budget[0]
    )
