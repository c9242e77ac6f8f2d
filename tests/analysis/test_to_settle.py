"""decision.to_settle by hand: the evidence aimed at the threshold that decides the action, in requests, minutes and USD."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from analysis.economics.decision import Economics
from analysis.economics.to_settle import FleetBasis, requests_to_move_end, settle_text, to_settle

MIG, HORIZON = 33_297.0, 12.0
GO = MIG / HORIZON  # 2,774.75 USD/month
TASK = 0.04048 + 2 * 0.004445  # one 1 vCPU / 2 GiB Fargate task, USD/h (the snapshot's us-east-1 rates)
SRC = "snapshot Fargate rates"


def _fleets(n: int = 72, known: bool = True) -> dict[str, FleetBasis]:
    return {
        "inf2": FleetBasis(n, 0.2, 1, 0.7582, 3, TASK, known),  # 72 requests at 0.2 req/s on one inf2.xlarge
        "g6": FleetBasis(n, 0.3, 2, 0.8048, 3, TASK, True),  # 72 requests at 0.3 req/s on two g6.xlarge
    }


def _econ(delta: float, low: float | None, high: float | None) -> Economics:
    return Economics(delta, low, high, GO, GO, GO, MIG, HORIZON)


def test_the_issues_example_needs_about_2_4x_the_requests_not_54x() -> None:
    # 476 USD/month, 95% CI [-3,033, +4,053]: the high end must come down below 2,774.75. Its reach above the
    # point is 4,053 - 476 = 3,577; the point's distance below the threshold 2,774.75 - 476 = 2,298.75;
    # the half-width shrinks as 1/sqrt(n): (3,577 / 2,298.75)^2 = 2.421 x the 72 requests = 174.3 -> 175.
    # (Aimed at 0 instead: ((476 + 3,033) / 476)^2 = 54.3 x, the old "3,909 requests per step".)
    ts = to_settle(_econ(476.0, -3_033.0, 4_053.0), "go", _fleets(), SRC)
    factor = (3_577 / 2_298.75) ** 2
    assert ts.threshold == "go" and ts.threshold_usd_per_month == pytest.approx(2_774.75)
    assert ts.factor == pytest.approx(factor) and 2.4 < factor < 2.45
    assert ts.requests == {"inf2": 175, "g6": 175} and not ts.lower_bound
    # 103 more requests: 8.583 min at 0.2 req/s (inf2), 5.722 min at 0.3 req/s (g6); side by side, the longer
    inf2_min, g6_min = 103 / 0.2 / 60, 103 / 0.3 / 60
    assert ts.by_fleet["inf2"].more_requests == 103
    assert ts.by_fleet["inf2"].minutes == pytest.approx(inf2_min) and ts.by_fleet["g6"].minutes == pytest.approx(g6_min)
    assert ts.minutes == pytest.approx(inf2_min)
    # instances as measured at their On-Demand price + one master and two workers per fleet, for each fleet's own minutes
    inf2_usd = inf2_min / 60 * (1 * 0.7582 + 3 * TASK)
    g6_usd = g6_min / 60 * (2 * 0.8048 + 3 * TASK)
    assert ts.by_fleet["inf2"].usd == pytest.approx(inf2_usd) and ts.usd == pytest.approx(inf2_usd + g6_usd)
    assert SRC in ts.basis
    text = settle_text(ts)
    assert text.startswith(
        "about 2.4x the requests at each capacity boundary would settle it: inf2 175 (now 72), g6 175 (now 72)"
    )
    assert f"about {inf2_min:,.1f} min and {inf2_usd + g6_usd:,.2f} USD" in text


def test_a_point_above_the_go_threshold_settles_by_raising_the_low_end() -> None:
    # 4,000 [2,000, 6,000]: reach down 2,000, distance 1,225.25: (2,000 / 1,225.25)^2 = 2.664 x 72 = 191.8 -> 192
    ts = to_settle(_econ(4_000.0, 2_000.0, 6_000.0), "go", _fleets(), SRC)
    assert ts.factor == pytest.approx((2_000 / 1_225.25) ** 2)
    assert ts.requests == {"inf2": 192, "g6": 192}


def test_once_go_is_ruled_out_it_aims_at_zero() -> None:
    # 500 [-500, 1,500]: no Go at the optimistic end; the low end must rise above 0: (1,000 / 500)^2 = 4 x 72 = 288
    ts = to_settle(_econ(500.0, -500.0, 1_500.0), "zero", _fleets(), SRC)
    assert ts.threshold == "zero" and ts.threshold_usd_per_month == 0.0
    assert ts.factor == pytest.approx(4.0) and ts.requests == {"inf2": 288, "g6": 288}
    assert ts.minutes == pytest.approx(216 / 0.2 / 60)


def test_each_end_is_measured_against_the_threshold_priced_at_that_end() -> None:
    # point 476 - 2,774.75 = -2,298.75; the high end against its own threshold 2,600: 4,053 - 2,600 = 1,453;
    # reach 1,453 + 2,298.75 = 3,751.75: (3,751.75 / 2,298.75)^2 x 72 = 191.8 -> 192
    econ = Economics(476.0, -3_033.0, 4_053.0, GO, 3_100.0, 2_600.0, MIG, HORIZON)
    ts = to_settle(econ, "go", _fleets(), SRC)
    assert ts.factor == pytest.approx((3_751.75 / 2_298.75) ** 2) and ts.requests["inf2"] == 192


def test_an_unknown_end_gives_lower_bounds_from_the_requests_a_bounded_p95_needs() -> None:
    ts = to_settle(_econ(4_000.0, None, 6_000.0), "go", _fleets(n=40, known=False), SRC)
    assert ts.lower_bound and ts.factor is None
    assert ts.requests == {
        "inf2": 72,
        "g6": 40,
    }  # inf2's capacity low end is unknown: 72 requests bound a P95 at 95%
    assert ts.minutes == pytest.approx(32 / 0.2 / 60)
    text = settle_text(ts, ["inf2: no step held it with 95% confidence"])
    assert text.startswith(
        "an end is unknown (inf2: no step held it with 95% confidence); a sizing step holds the SLO with 95% "
        "confidence once its P95 intervals' high ends are within the targets"
    )
    assert "at least inf2 72 (now 40), g6 40 (now 40) requests" in text


def test_an_unknown_end_asks_for_the_requests_its_step_needs_to_hold() -> None:
    """A 72-request step with one request over the TTFT target bounds its P95 within the target
    only at 142 requests (core.stats.n_to_hold): the settle phase needs 70 more, not 0."""
    fleets = _fleets(n=72, known=False)
    fleets["inf2"] = FleetBasis(72, 0.2, 1, 0.7582, 3, TASK, end_known=False, hold_requests=142)
    ts = to_settle(_econ(4_000.0, None, 6_000.0), "go", fleets, SRC)
    assert ts.requests["inf2"] == 142 and ts.by_fleet["inf2"].more_requests == 70
    assert ts.minutes == pytest.approx(70 / 0.2 / 60)


def test_a_point_on_the_threshold_has_no_sample_size() -> None:
    ts = to_settle(_econ(GO, 1_000.0, 5_000.0), "go", _fleets(), SRC)
    assert ts.requests == {"inf2": None, "g6": None} and ts.minutes is None and ts.usd is None
    assert settle_text(ts) == "the point estimate is on the threshold: no sample size settles it"


def test_no_fargate_price_leaves_the_tasks_out_and_no_instance_price_no_usd() -> None:
    fleets = {"inf2": FleetBasis(72, 0.2, 1, 0.7582, 3, None), "g6": FleetBasis(72, 0.3, 1, None, 3, TASK)}
    ts = to_settle(_econ(476.0, -3_033.0, 4_053.0), "go", fleets, "no Fargate price")
    assert ts.by_fleet["inf2"].usd == pytest.approx(103 / 0.2 / 60 / 60 * 0.7582)
    assert ts.by_fleet["g6"].usd is None and ts.usd is None


def _count(demand: float = 1_000.0) -> Callable[[float], int]:
    return lambda c: math.ceil(demand / c - 1e-9)  # whole instances for a per-instance capacity


def test_an_end_moves_a_whole_instance_only_past_its_next_boundary() -> None:
    # 1,000 tok/s of demand: 100 tok/s per instance -> 10 instances, the high end 120 -> 9. The high end
    # gives 10 instances below 111.11: its reach 20 must shrink to 11.11, (20 / 11.11)^2 = 3.24 x 72 = 233.3 -> 234.
    assert requests_to_move_end(72, 100.0, 120.0, _count()) == 234
    # the low end 95 -> 11 instances; 10 from 100: the boundary is the point itself, so no finite sample moves it
    # short of the point: the 1/sqrt(n) rule gives none, and the step's own requests are returned.
    assert requests_to_move_end(72, 100.0, 95.0, _count()) == 72
    # an end that sizes the fleet as the point does: no requests at this step move the delta
    assert requests_to_move_end(72, 100.0, 105.0, _count()) is None


def test_whole_instances_set_the_requests_at_the_end_the_delta_is_priced_from() -> None:
    """The recorded demo's Defer: 1,050 [-1,312, +2,838] against a Go threshold of about 2,745; the
    1/sqrt(n) rule asked 1.0x the requests (3 and 4 more), and four settle rounds moved nothing: the
    delta's high end is the baseline's fleet at its low capacity end and the candidate's at its high
    end, and each moves only in whole instances."""
    econ = Economics(1_050.0, -1_312.0, 2_838.0, 2_745.0, 2_705.0, 2_815.0, MIG, HORIZON)
    fleets = {
        # candidate: (low end, high end) -> the high end prices the delta's high end
        "inf2": FleetBasis(92, 2.49, 4, 0.7582, 3, TASK, role="candidate", end_requests=(5_000, 749)),
        # baseline: its low end prices the delta's high end; 661: the requests its sizing step needs to hold
        "g6": FleetBasis(121, 2.59, 4, 0.8048, 3, TASK, role="baseline", end_requests=(661, 7_000)),
    }
    ts = to_settle(econ, "go", fleets, SRC)
    assert ts.factor == pytest.approx(((2_838 - 2_815 + 2_745 - 1_050) / (2_745 - 1_050)) ** 2)
    assert ts.requests == {"inf2": 749, "g6": 661} and ts.whole_instances
    assert ts.minutes == pytest.approx((749 - 92) / 2.49 / 60)
    assert settle_text(ts).startswith(
        "fleets move in whole instances: the requests at each capacity boundary that would move the end that decides "
        "are inf2 749 (now 92), g6 661 (now 121)"
    )
    # Above the threshold the delta's low end decides: the baseline's high end and the candidate's low end.
    above = to_settle(Economics(4_000.0, 2_000.0, 6_000.0, GO, GO, GO, MIG, HORIZON), "go", fleets, SRC)
    assert above.requests == {"inf2": 5_000, "g6": 7_000}


def test_an_end_that_sizes_the_fleet_as_the_point_does_needs_no_requests() -> None:
    econ = Economics(1_050.0, -1_312.0, 2_838.0, 2_745.0, 2_705.0, 2_815.0, MIG, HORIZON)
    fleets = {
        "inf2": FleetBasis(92, 2.49, 4, 0.7582, 3, TASK, role="candidate", end_requests=(300, None)),
        "g6": FleetBasis(121, 2.59, 4, 0.8048, 3, TASK, role="baseline", end_requests=(661, None)),
    }
    ts = to_settle(econ, "go", fleets, SRC)
    assert ts.requests == {"inf2": 92, "g6": 661} and ts.by_fleet["inf2"].more_requests == 0


def test_minutes_count_the_drain_and_the_load_generators_start_and_stop_as_the_settle_budget_does() -> None:
    # The issue's cloud run: the settle phase stopped on its budget while to_settle said 0.7 min:
    # it counted arrivals only. A segment also drains its last requests (the step's median
    # lifetime, 12 s) and starts and stops its Fargate tasks (the search's median overhead, 95 s).
    fleets = {
        "inf2": FleetBasis(72, 0.2, 1, 0.7582, 3, TASK, True, drain_s=12.0, overhead_s=95.0),
        "g6": FleetBasis(72, 0.3, 2, 0.8048, 3, TASK, True, drain_s=8.0, overhead_s=95.0),
    }
    ts = to_settle(_econ(476.0, -3_033.0, 4_053.0), "go", fleets, SRC)
    inf2 = ts.by_fleet["inf2"]
    assert inf2.more_requests == 103
    assert inf2.minutes == pytest.approx((103 / 0.2 + 12.0 + 95.0) / 60)
    assert inf2.drain_s == 12.0 and inf2.overhead_s == 95.0
    assert inf2.usd == pytest.approx(inf2.minutes / 60 * (0.7582 + 3 * TASK))
    assert ts.minutes == pytest.approx(max(inf2.minutes, ts.by_fleet["g6"].minutes or 0))
    # a fleet that needs no more requests takes no time, drain and overhead included (a reach of
    # 1,000 against a distance of 2,298.75: 0.19 x its 72 requests are enough)
    near = to_settle(_econ(476.0, -3_033.0, 1_476.0), "go", fleets, SRC).by_fleet["g6"]
    assert near.more_requests == 0 and near.minutes == 0.0
