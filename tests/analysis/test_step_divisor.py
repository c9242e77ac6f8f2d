"""What a capacity step's goodput is divided by: the time-weighted mean of the healthy targets
over its load window, each settle segment by its own polls (issue 46, findings 3 and 4).

On 17e73d2 a step was divided by the fewest healthy targets seen at any poll (a target missing
from one 10 s poll of a 300 s step divided the whole step by 3 instead of 4: +33% per instance,
and `choose()` takes the largest per-instance figure), and a settle segment's own count
(settle-<n>/instances.json) was written and never read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.capacity.steps import load_sweep, measure_capacity
from analysis.errors import AnalysisError
from analysis.sources.instances import read_counted
from campaign.stages.capacity import measure_step, settings_from
from core.manifest import CapacitySearch, Manifest
from core.records import INSTANCES_FILE
from tests.analysis.synth import steady, write_jsonl

T0 = 1_700_000_000.0  # synth.rec's wall_start: request i is sent at T0 + i and ends at T0 + i + 1


def _polls(d: Path, fleet: str, polls: list[tuple[float, int]]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / INSTANCES_FILE).write_text(
        json.dumps(
            {
                fleet: {
                    "instances": min(n for _, n in polls),  # the fewest, as 17e73d2 read it
                    "source": "measured",
                    "polls": [[T0 + t, n] for t, n in polls],
                    "detail": "test polls",
                }
            }
        )
    )


def _step(m: Manifest, d: Path, n: int = 300) -> Path:
    write_jsonl(d / "records-g6-w0.jsonl", steady(m, "g6", n, 100))  # 300 s window, 100 tok/s
    return d


def _capacity(m: Manifest, d: Path):  # type: ignore[no-untyped-def]
    sweep = load_sweep({"g6/x1": d}, m.digest, {f.name for f in m.fleets})
    caps = measure_capacity(sweep, ["g6"], {"g6": 4}, m.slo.ttft_p95_s, m.slo.itl_p95_s, m.slo.max_error_rate)
    return caps["g6"].steps[0]


def test_the_step_function_of_polls_is_averaged_over_the_window() -> None:
    from analysis.sources.instances import time_weighted  # new in issue 46: the other tests run on 17e73d2

    polls = [(0.0, 4), (100.0, 3), (110.0, 4)]
    assert time_weighted(polls, 0.0, 300.0) == pytest.approx((4 * 100 + 3 * 10 + 4 * 190) / 300)
    assert time_weighted(polls, 105.0, 115.0) == pytest.approx((3 * 5 + 4 * 5) / 10)
    assert time_weighted(polls, -50.0, 50.0) == pytest.approx(4.0)  # before the first poll: its value
    assert time_weighted(polls, 105.0, 105.0) == 3.0  # a point: the count there


def test_a_target_gone_for_one_poll_takes_its_seconds_not_an_instance(tmp_path: Path, m: Manifest) -> None:
    d = _step(m, tmp_path / "x1")
    # 4 healthy, one target missing from one 10 s poll; the load window is T0 .. T0 + 300
    _polls(d, "g6", [(t, 3 if t == 95 else 4) for t in range(-5, 305, 10)])
    step = _capacity(m, d)
    mean = (4 * 290 + 3 * 10) / 300  # healthy 3 from +95 s to +105 s (polls at -5, 5, ..., 95, 105)
    assert step.instances == pytest.approx(mean, rel=1e-9)
    # On 17e73d2: instances 3 and 33.33 tok/s per instance (the whole step divided by 3).
    assert step.per_instance_goodput_tok_s == pytest.approx(100.0 / mean, rel=1e-9)
    assert "time-weighted mean" in (step.instances_detail or "") and "3 from +95 s" in (step.instances_detail or "")


def test_each_settle_segment_is_divided_by_its_own_polls(tmp_path: Path, m: Manifest) -> None:
    d = _step(m, tmp_path / "x1", 200)  # load window T0 .. T0 + 200
    _polls(d, "g6", [(0.0, 4), (200.0, 4)])
    seg = d / "settle-1"
    # the segment's records 100 requests, sent from T0 + 1000 (its own timeline from 0)
    recs = [replace(r, wall_start=T0 + 1000.0, request_id=1000 + r.request_id) for r in steady(m, "g6", 100, 100)]
    write_jsonl(seg / "records-g6-w0.jsonl", recs)
    (seg / "segment.json").write_text(json.dumps({"span_s": 100.0, "skip_s": 200.0, "multiplier": 1.0}))
    _polls(seg, "g6", [(1000.0, 2), (1100.0, 2)])  # two of the four served the segment
    step = _capacity(m, d)
    # 200 s at 4 and 100 s at 2: 3.333 instances over the 300 s of load. On 17e73d2: 4 (the step's count).
    assert step.instances == pytest.approx((4 * 200 + 2 * 100) / 300, rel=1e-9)
    assert step.per_instance_goodput_tok_s == pytest.approx(100.0 / ((4 * 200 + 2 * 100) / 300), rel=1e-9)


def test_a_step_with_no_healthy_target_is_invalid_and_run_again(tmp_path: Path, m: Manifest) -> None:
    d = _step(m, tmp_path / "x1")
    _polls(d, "g6", [(0.0, 0), (300.0, 0)])
    step = _capacity(m, d)
    assert step.valid is False and step.per_instance_goodput_tok_s is None
    verdict = measure_step(
        m, "g6", d, "x1", 1.0, "test", 300.0, settings_from(m.workload.capacity_search or CapacitySearch())
    )
    # On 17e73d2: "held" (its records are whatever the emulator wrote; the count was never read).
    assert verdict.verdict.value == "invalid"
    assert "no target of the fleet was healthy" in verdict.detail


def test_a_bad_poll_names_the_file_and_field(tmp_path: Path) -> None:
    (tmp_path / INSTANCES_FILE).write_text(json.dumps({"g6": {"instances": 4, "polls": [[1.0, 4], [2.0, "x"]]}}))
    with pytest.raises(AnalysisError, match=r"instances\.json: g6\.polls\[1\]: expected"):
        read_counted(tmp_path)


def test_the_simulated_fleets_write_their_constant_count(tmp_path: Path, example_manifest_path: Path) -> None:
    """A runner whose instances cannot drop out writes the same count polled at the step's start and
    end, so every backend's step shows its divisor and how it was counted the same way."""
    import threading

    from analysis.capacity.search import StepPlan
    from campaign.backends.simulated.fleets import SimulatedSteps
    from core.manifest import load_manifest

    m = load_manifest(example_manifest_path)
    fleet = m.fleets[0]
    d = tmp_path / fleet.name / "x0.5"
    SimulatedSteps(m).run(fleet.name, StepPlan(0.5, 60.0, "test"), d, 100, threading.Event())
    counted = read_counted(d)[fleet.name]
    assert {n for _, n in counted.polls} == {fleet.instances_measured}
    sweep = load_sweep({f"{fleet.name}/x0.5": d}, m.digest, {f.name for f in m.fleets})
    step = measure_capacity(sweep, [fleet.name], {}, m.slo.ttft_p95_s, m.slo.itl_p95_s, m.slo.max_error_rate)[
        fleet.name
    ].steps[0]
    assert step.instances == fleet.instances_measured
    assert "time-weighted mean" in (step.instances_detail or "") and "all in service" in (step.instances_detail or "")
