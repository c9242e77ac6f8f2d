from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.economics.decision import DecisionInputs, Economics, decide
from analysis.economics.ledger import migration_ledger, monthly_delta, payback_months
from analysis.model import ToSettle
from core.manifest import Manifest

# Pure arithmetic, no deadline: `make test` runs these at nice 10 beside the two suites (Makefile),
# where the scheduler may hold one example past hypothesis's default 200 ms.
NO_DEADLINE = settings(deadline=None)

GOOD = DecisionInputs(
    candidate="inf2",
    baseline="g6",
    candidate_successful_tokens=1000,
    candidate_error_rate=0.0,
    max_error_rate=0.01,
    candidate_quality_passed=True,
    baseline_quality_passed=True,
    candidate_slo_pass=True,
    baseline_slo_pass=True,
    same_availability=True,
    candidate_within_asg_max=True,
    monthly_delta_usd=1000.0,
    payback_months=6.0,
    horizon_months=12,
    months_to_next_refresh=18,
    migration_cost_usd=6000.0,
)


def test_ledger_by_hand(m: Manifest) -> None:
    led = migration_ledger(m.migration, candidate_monthly_usd=730.0, baseline_monthly_usd=1460.0, hours_per_month=730)
    day_c, day_b = 730 / (730 / 24), 1460 / (730 / 24)  # 24 and 48 USD per day
    labor = (80 + 40 + 16) * 120
    expected = labor + 2000 + 500 + 1000 + 14 * day_c * (1 + 0.25 + 0.1) + 30 * day_b
    assert led.total_usd == pytest.approx(expected)
    assert migration_ledger(
        m.migration, candidate_monthly_usd=730.0, baseline_monthly_usd=1460.0, hours_per_month=730, effort_scale=2.0
    ).total_usd == pytest.approx(expected + labor)


def test_delta_is_baseline_minus_candidate() -> None:
    assert monthly_delta(baseline_monthly_usd=1000, candidate_monthly_usd=600) == 400
    assert payback_months(2000, 400) == 5


def test_go_when_everything_holds() -> None:
    assert decide(GOOD).state == "go"


def test_nonpositive_delta_gives_no_payback_and_reject() -> None:
    assert payback_months(5000, 0.0) is None and payback_months(5000, -10.0) is None
    d = decide(replace(GOOD, monthly_delta_usd=-10.0, payback_months=None))
    assert d.state == "reject" and any("delta" in r for r in d.reasons)


def test_payback_beyond_horizon_defers() -> None:
    # no interval: the point is both ends; 15,000 USD / 12 months = 1,250 USD/month > the 1,000 saved
    d = decide(replace(GOOD, payback_months=15.0, migration_cost_usd=15_000.0, months_to_next_refresh=30))
    assert d.state == "defer" and any("beyond the 12-month horizon" in r for r in d.reasons)


def test_refresh_before_payback_defers() -> None:
    d = decide(replace(GOOD, payback_months=6.0, months_to_next_refresh=4))
    assert d.state == "defer" and any("refresh near" in r for r in d.reasons)


def test_quality_failure_rejects_and_missing_quality_defers() -> None:
    assert decide(replace(GOOD, candidate_quality_passed=False)).state == "reject"
    assert decide(replace(GOOD, candidate_quality_passed=None)).state == "defer"


def test_no_successful_tokens_or_errors_reject() -> None:
    assert decide(replace(GOOD, candidate_successful_tokens=0)).state == "reject"
    assert decide(replace(GOOD, candidate_error_rate=0.5)).state == "reject"


def test_blocking_gap_defers() -> None:
    d = decide(replace(GOOD, blocking_gaps=("prometheus: unreachable",)))
    assert d.state == "defer" and "evidence incomplete: prometheus: unreachable" in d.reasons


@NO_DEADLINE
@given(mig=st.floats(0, 1e7), delta=st.floats(-1e6, 1e6))
def test_payback_none_iff_delta_nonpositive(mig: float, delta: float) -> None:
    assert (payback_months(mig, delta) is None) == (delta <= 0)


def test_an_overloaded_replay_is_not_a_semantics_failure() -> None:
    # Seen on the Azure code trace: the replay overloaded one inf2 instance, every completed
    # request missed its SLO and the abandoned ones made the error rate 0.5. That is a capacity
    # finding (the search sizes it), not "the model or API semantics failed".
    overloaded = replace(
        GOOD,
        candidate_successful_tokens=0,
        candidate_completed_output_tokens=5000,
        candidate_error_rate=0.5,
        candidate_saturated=True,
        candidate_slo_pass=False,
    )
    d = decide(overloaded)
    assert d.state == "defer", d.reasons
    assert not any("semantics" in r or "error rate" in r for r in d.reasons), d.reasons


def test_semantics_still_reject_when_nothing_came_back_or_errors_below_saturation() -> None:
    nothing = decide(
        replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=0, candidate_saturated=True)
    )
    assert nothing.state == "reject" and any(
        "no completed request returned output tokens" in r for r in nothing.reasons
    )
    errors = decide(replace(GOOD, candidate_error_rate=0.5, candidate_saturated=False))
    assert errors.state == "reject" and any("error rate 0.5000 above the ceiling" in r for r in errors.reasons)


def test_no_request_sent_after_warmup_is_missing_evidence_not_a_semantics_failure() -> None:
    # Seen with `campaign local --duration 8`: the window held only warmup requests, so nothing
    # was measured; that is "evidence insufficient" (Defer), not "the model or API semantics failed".
    empty = decide(
        replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=0, candidate_requests_sent=0)
    )
    assert empty.state == "defer", empty.reasons
    assert any("no request after the warmup was sent to" in r for r in empty.reasons), empty.reasons
    assert not any("semantics" in r for r in empty.reasons), empty.reasons
    # Requests were sent and none returned tokens: still the semantics failure.
    failed = decide(
        replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=0, candidate_requests_sent=12)
    )
    assert failed.state == "reject" and any("semantics" in r for r in failed.reasons), failed.reasons


# The three states on the decision's own quantities (docs/design.md: Decision), by hand, on the issue's
# own example: migration 33,297 USD over a 12-month horizon, so the Go threshold is 2,774.75 USD/month.
MIG, HORIZON = 33_297.0, 12.0
GO = MIG / HORIZON  # 2,774.75


# What would settle an undecided interval (analysis.economics.to_settle computes the real one): the decision
# carries it exactly while it still aims at a threshold, so `to_settle is SETTLE` tells that it does.
SETTLE = ToSettle(
    threshold="go",
    threshold_usd_per_month=2_774.75,
    factor=2.4,
    lower_bound=False,
    requests={"inf2": 100, "g6": 100},
    minutes=5.0,
    usd=1.0,
    by_fleet={},
    basis="test",
)


def _at(delta: float, low: float | None, high: float | None, margin: float = 0.0, **kw: Any) -> DecisionInputs:
    econ = Economics(delta, low, high, GO + margin, GO + margin, GO + margin, MIG, HORIZON, margin)
    return replace(
        GOOD,
        monthly_delta_usd=delta,
        payback_months=MIG / delta if delta > 0 else None,
        migration_cost_usd=MIG,
        economics=econ,
        months_to_next_refresh=80,
        to_settle=SETTLE,
        **kw,
    )


def _insufficient(reasons: list[str]) -> list[str]:
    return [r for r in reasons if r.startswith("evidence insufficient")]


def test_go_when_the_deltas_low_end_is_above_the_go_threshold() -> None:
    d = decide(_at(4_000.0, 3_000.0, 5_000.0))  # 3,000 > 2,774.75: pays back in 11.1 months even at the pessimistic end
    assert d.state == "go" and d.to_settle is None and d.go_threshold_usd_per_month == pytest.approx(2_774.75)
    assert "the Go threshold 2,774.75 USD/month (migration 33,297.00 USD / 12 months" in d.reasons[0]
    # a low end exactly on the threshold pays back exactly at the horizon: not yet a Go
    on = decide(_at(4_000.0, 2_774.75, 5_000.0))
    assert on.state == "defer" and on.to_settle is SETTLE
    assert _insufficient(on.reasons)[0].startswith("evidence insufficient at the Go threshold")


def test_defer_when_the_payback_is_beyond_the_horizon_even_at_the_optimistic_end() -> None:
    d = decide(_at(1_500.0, 1_000.0, 2_000.0))  # 0 < 2,000 <= 2,774.75, and 1,000 > 0: settled, not insufficient
    assert d.state == "defer" and d.to_settle is None
    assert any(r.startswith("payback beyond the 12-month horizon even at the optimistic end") for r in d.reasons), (
        d.reasons
    )
    assert not _insufficient(d.reasons)


def test_the_issues_example_is_insufficient_at_the_go_threshold_not_at_zero() -> None:
    # 476 USD/month, 95% CI [-3,033, +4,053]: it straddles 0 too, but the action turns on 2,774.75
    d = decide(_at(476.0, -3_033.0, 4_053.0, settle_text="about 2.4x the requests"))
    assert d.state == "defer" and d.to_settle is SETTLE
    [why] = _insufficient(d.reasons)
    assert why.startswith(
        "evidence insufficient at the Go threshold: monthly delta 476.00 USD, 95% CI [-3,033.00, 4,053.00] USD "
        "straddles the Go threshold 2,774.75 USD/month"
    ), why
    assert why.endswith("; about 2.4x the requests") and "straddles 0" not in why


def test_insufficient_at_zero_once_go_is_ruled_out() -> None:
    # high end 1,500 <= 2,774.75: no Go even at the optimistic end; low end -500 <= 0 < 1,500: Defer or Reject is open
    for delta in (500.0, -200.0):  # a negative point whose interval reaches above 0 does not Reject
        d = decide(_at(delta, -500.0, 1_500.0))
        assert d.state == "defer" and d.to_settle is SETTLE, d.reasons
        [why] = _insufficient(d.reasons)
        assert why.startswith("evidence insufficient at 0 (Defer or Reject): Go is ruled out"), why
        assert any(r.startswith("payback beyond the 12-month horizon even at the optimistic end") for r in d.reasons)


def test_reject_when_the_deltas_high_end_is_at_or_below_zero() -> None:
    for high in (-100.0, 0.0):
        d = decide(_at(-1_000.0, -2_000.0, high))
        assert d.state == "reject" and d.to_settle is None
        assert any("at or below 0 even at the optimistic end: inf2 is not cheaper than g6" in r for r in d.reasons), (
            d.reasons
        )


def test_reject_on_quality_leaves_nothing_to_settle() -> None:
    d = decide(_at(476.0, -3_033.0, 4_053.0, candidate_quality_passed=False))
    assert d.state == "reject" and d.to_settle is None  # more load cannot undo a failed quality gate
    assert "inf2: quality gate failed" in d.reasons


def test_an_indifference_margin_raises_the_go_threshold() -> None:
    d = decide(_at(4_000.0, 3_000.0, 5_000.0, margin=500.0))  # 2,774.75 + 500 = 3,274.75 > the 3,000 low end
    assert d.state == "defer" and d.to_settle is SETTLE and d.go_threshold_usd_per_month == pytest.approx(3_274.75)
    assert "+ indifference margin 500.00 USD/month" in _insufficient(d.reasons)[0]


def test_each_end_meets_the_threshold_priced_at_that_end() -> None:
    # the pessimistic end's dearer candidate fleet prices a dearer dual run: threshold 3,100 there, 2,600 at the optimistic end
    econ = Economics(4_000.0, 3_000.0, 5_000.0, GO, 3_100.0, 2_600.0, MIG, HORIZON)
    assert not econ.go_settled and econ.aim == "go"  # 3,000 clears 2,774.75 but not its own 3,100
    assert (
        Economics(2_000.0, 1_000.0, 2_700.0, GO, 3_100.0, 2_600.0, MIG, HORIZON).aim == "go"
    )  # 2,700 > 2,600: Go not ruled out
