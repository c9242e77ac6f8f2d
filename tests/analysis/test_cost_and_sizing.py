from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.economics import cost
from analysis.economics.sizing import size_fleet, spread_over_azs

# Pure arithmetic, no deadline: `make test` runs these at nice 10 beside the two suites (Makefile),
# where the scheduler may hold one example past hypothesis's default 200 ms.
NO_DEADLINE = settings(deadline=None)

PRICES = cost.UnitPrices(
    instance_hourly_usd=1.0, ebs_gb_month_usd=0.08, nlb_hour_usd=0.0225, nlb_lcu_hour_usd=0.006, inter_az_gb_usd=0.01
)
INPUTS = cost.FleetCostInputs(
    root_volume_gib=100,
    cache_volume_gib=100,
    nlb_lcu_per_hour=1.0,
    inter_az_gb_per_month=50,
    observability_monthly_usd=40,
    licenses_monthly_usd=10,
    hours_per_month=730,
)


def test_seed_examples_cost_per_million() -> None:
    # g5.xlarge $1.006/h at 450 tok/s: 1.006 / (450 * 3600) * 1e6 = 0.62099
    assert cost.unit_cost_per_million(1.006, 450) == pytest.approx(0.621, abs=5e-4)
    # inf2.xlarge $0.758/h at 600 tok/s: 0.758 / (600 * 3600) * 1e6 = 0.35093
    assert cost.unit_cost_per_million(0.758, 600) == pytest.approx(0.351, abs=5e-4)


def test_no_successful_tokens_is_none_not_zero() -> None:
    assert cost.cost_per_million(100.0, 0) is None


def test_one_point_two_instances_become_two_plus_redundancy() -> None:
    s = size_fleet(1.2 * 450, 450, redundancy=1, azs=("a", "b"))
    assert (s.busy_instances, s.redundancy_instances, s.required) == (2, 1, 3)
    assert s.per_az == {"a": 2, "b": 1}


def test_exact_multiple_is_not_rounded_up_by_float_noise() -> None:
    assert size_fleet(0.3 * 3, 0.3).busy_instances == 3


def test_asg_minimum_and_utilization_headroom() -> None:
    s = size_fleet(100, 450, redundancy=0, asg_min=2)
    assert (s.busy_instances, s.asg_min_topup, s.required) == (1, 1, 2)
    h = size_fleet(900, 450, utilization_target=0.8)  # 900 / (450 * 0.8) = 2.5 -> 3
    assert (h.busy_instances, h.headroom_instances, h.required) == (2, 1, 3)


def test_zero_throughput_is_infeasible() -> None:
    with pytest.raises(ValueError, match="zero"):
        size_fleet(10, 0)


def test_monthly_cost_lines_by_hand() -> None:
    s = size_fleet(900, 450, utilization_target=0.8, redundancy=1)  # 2 busy + 1 headroom + 1 redundancy = 4
    mc = cost.monthly_fleet_cost(s, PRICES, INPUTS)
    assert mc is not None
    assert mc.compute_usd == pytest.approx(4 * 1.0 * 730)
    assert mc.idle_headroom_usd == pytest.approx(730) and mc.redundancy_usd == pytest.approx(730)
    assert mc.ebs_usd == pytest.approx(4 * 200 * 0.08)
    assert mc.nlb_usd == pytest.approx((0.0225 + 0.006) * 730)
    assert mc.inter_az_usd == pytest.approx(50 * 0.01 * 2)
    assert mc.total_usd == pytest.approx(2920 + 64 + 20.805 + 1 + 40 + 10)


def test_unused_commitment_stays_in_numerator() -> None:
    commit = (cost.CommitmentRate(covered_instances=3, effective_hourly_usd=0.6, renewal_hourly_usd=0.7),)
    one = cost.compute_monthly(1, 730, 1.0, commit, "manifest")
    assert one is not None
    # all 3 covered instances are paid although only 1 runs: never a discount on the 1
    assert one.usd == pytest.approx(3 * 0.6 * 730)
    assert one.unused_commitment_usd == pytest.approx(2 * 0.6 * 730)
    five = cost.compute_monthly(5, 730, 1.0, commit, "manifest")
    assert five is not None and five.usd == pytest.approx((3 * 0.6 + 2 * 1.0) * 730)
    renewal = cost.compute_monthly(5, 730, 1.0, commit, "renewal")
    assert renewal is not None and renewal.usd == pytest.approx((3 * 0.7 + 2 * 1.0) * 730)
    covered = cost.compute_monthly(5, 730, 1.0, commit, "covered")
    assert covered is not None and covered.usd == pytest.approx(5 * 0.6 * 730)
    assert cost.compute_monthly(5, 730, 1.0, (), "covered") is None  # no commitment: a gap, not a number


def test_run_cost_bills_at_least_sixty_seconds_per_instance() -> None:
    assert cost.run_cost(2, 10.0, 3.6, 0.0, 730) == pytest.approx(2 * 3.6 * 60 / 3600)
    assert cost.run_cost(2, 120.0, 3.6, 730.0, 730) == pytest.approx(2 * 3.6 * 120 / 3600 + 730 * (120 / 3600) / 730)


@NO_DEADLINE
@given(
    ok=st.integers(1, 10_000),
    tok=st.integers(1, 2000),
    failed=st.integers(0, 10_000),
    hourly=st.floats(0.01, 50),
    window=st.floats(1, 10_000),
)
def test_failures_never_lower_cost_per_successful_token(
    ok: int, tok: int, failed: int, hourly: float, window: float
) -> None:
    # Failed requests occupy the window (here: the run lasts longer by their share) but add no successful tokens.
    base = cost.cost_per_million(cost.run_cost(1, window, hourly, 0, 730), ok * tok)
    worse = cost.cost_per_million(cost.run_cost(1, window * (ok + failed) / ok, hourly, 0, 730), ok * tok)
    assert base is not None and worse is not None
    assert worse >= base * (1 - 1e-12)  # equal when nothing failed, up to float rounding


@NO_DEADLINE
@given(
    d1=st.floats(0, 1e6), d2=st.floats(0, 1e6), per=st.floats(1, 1e4), util=st.floats(0.1, 1.0), red=st.integers(0, 3)
)
def test_fleet_size_monotone_in_demand(d1: float, d2: float, per: float, util: float, red: int) -> None:
    lo, hi = sorted((d1, d2))
    small = size_fleet(lo, per, utilization_target=util, redundancy=red)
    assert small.required <= size_fleet(hi, per, utilization_target=util, redundancy=red).required


@NO_DEADLINE
@given(n=st.integers(0, 100), k=st.integers(1, 6))
def test_az_spread_sums_and_balances(n: int, k: int) -> None:
    spread = spread_over_azs(n, [f"az{i}" for i in range(k)])
    assert sum(spread.values()) == n
    assert max(spread.values()) - min(spread.values()) <= 1


@NO_DEADLINE
@given(thr=st.floats(1, 1e4), drop=st.floats(0.01, 0.99))
def test_lower_goodput_never_cheapens_the_fleet(thr: float, drop: float) -> None:
    a = cost.monthly_fleet_cost(size_fleet(5000, thr), PRICES, INPUTS)
    b = cost.monthly_fleet_cost(size_fleet(5000, thr * (1 - drop)), PRICES, INPUTS)
    assert a is not None and b is not None and b.total_usd >= a.total_usd and not math.isnan(b.total_usd)
