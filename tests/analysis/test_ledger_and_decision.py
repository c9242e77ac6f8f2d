from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis.decision import DecisionInputs, decide
from analysis.ledger import migration_ledger, monthly_delta, payback_months
from core.manifest import Manifest

GOOD = DecisionInputs(
    candidate="inf2", baseline="g6", candidate_successful_tokens=1000, candidate_error_rate=0.0, max_error_rate=0.01,
    candidate_quality_passed=True, baseline_quality_passed=True, candidate_slo_pass=True, baseline_slo_pass=True,
    same_availability=True, candidate_within_asg_max=True, monthly_delta_usd=1000.0, payback_months=6.0,
    horizon_months=12, months_to_next_refresh=18,
)


def test_ledger_by_hand(m: Manifest) -> None:
    led = migration_ledger(m.migration, candidate_monthly_usd=730.0, baseline_monthly_usd=1460.0, hours_per_month=730)
    day_c, day_b = 730 / (730 / 24), 1460 / (730 / 24)  # 24 and 48 USD per day
    labor = (80 + 40 + 16) * 120
    expected = labor + 2000 + 500 + 1000 + 14 * day_c * (1 + 0.25 + 0.1) + 30 * day_b
    assert led.total_usd == pytest.approx(expected)
    assert migration_ledger(m.migration, candidate_monthly_usd=730.0, baseline_monthly_usd=1460.0, hours_per_month=730,
                            effort_scale=2.0).total_usd == pytest.approx(expected + labor)


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
    d = decide(replace(GOOD, payback_months=15.0, months_to_next_refresh=30))
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


@given(mig=st.floats(0, 1e7), delta=st.floats(-1e6, 1e6))
def test_payback_none_iff_delta_nonpositive(mig: float, delta: float) -> None:
    assert (payback_months(mig, delta) is None) == (delta <= 0)


def test_an_overloaded_replay_is_not_a_semantics_failure() -> None:
    # Seen on the Azure code trace: the replay overloaded one inf2 instance, every completed
    # request missed its SLO and the abandoned ones made the error rate 0.5. That is a capacity
    # finding (the search sizes it), not "the model or API semantics failed".
    overloaded = replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=5000, candidate_error_rate=0.5,
                         candidate_saturated=True, candidate_slo_pass=False)
    d = decide(overloaded)
    assert d.state == "defer", d.reasons
    assert not any("semantics" in r or "error rate" in r for r in d.reasons), d.reasons


def test_semantics_still_reject_when_nothing_came_back_or_errors_below_saturation() -> None:
    nothing = decide(replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=0, candidate_saturated=True))
    assert nothing.state == "reject" and any("no completed request returned output tokens" in r for r in nothing.reasons)
    errors = decide(replace(GOOD, candidate_error_rate=0.5, candidate_saturated=False))
    assert errors.state == "reject" and any("error rate 0.5000 above the ceiling" in r for r in errors.reasons)


def test_no_request_sent_after_warmup_is_missing_evidence_not_a_semantics_failure() -> None:
    # Seen with `campaign local --duration 8`: the window held only warmup requests, so nothing
    # was measured; that is "evidence insufficient" (Defer), not "the model or API semantics failed".
    empty = decide(replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=0, candidate_requests_sent=0))
    assert empty.state == "defer", empty.reasons
    assert any("no request after the warmup was sent to" in r for r in empty.reasons), empty.reasons
    assert not any("semantics" in r for r in empty.reasons), empty.reasons
    # Requests were sent and none returned tokens: still the semantics failure.
    failed = decide(replace(GOOD, candidate_successful_tokens=0, candidate_completed_output_tokens=0, candidate_requests_sent=12))
    assert failed.state == "reject" and any("semantics" in r for r in failed.reasons), failed.reasons
