"""The capacity search against a synthetic fleet whose SLO boundary is known analytically.

The fleet is an M/M/1 queue: service rate MU req/s, arrivals at BASE x k req/s. Its sojourn
time (TTFT here) is exponential with rate MU - lambda, so P95 = ln(20) / (MU - lambda) and the
median lifetime is ln(2) / (MU - lambda). The SLO P95 <= T holds exactly while
lambda <= MU - ln(20) / T: with MU = 10, T = 1 s, BASE = 2, the boundary is
k* = (10 - 2.9957) / 2 = 3.5021. The share of requests that meet T is 1 - exp(-(MU - lambda) T)
while the queue is stable; past MU (the runner abandons a request once it cannot meet its SLO)
the fleet is taken to keep serving the boundary's SLO-compliant rate, 0.95 x lambda*, so the
share is 0.95 lambda* / lambda: a modelling assumption that makes the estimate land just under
the boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.capacity.search import (
    SLO_QUANTILE,
    SearchSettings,
    StepPlan,
    Stop,
    certain_miss,
    judge,
    next_lifetime,
    next_step,
    search,
    sizing_lifetime,
    step_down,
)
from analysis.capacity.steps import SearchPath, SearchStep, StopRule, Verdict, read_search_path, write_search_path
from core.manifest import CapacitySearch
from core.quantiles import nearest_rank
from core.stats import min_n_bounded_upper, quantile_ci

MU, T, BASE = 10.0, 1.0, 2.0
LAM_STAR = MU - math.log(20) / T
K_STAR = LAM_STAR / BASE


def lengthen(settings: SearchSettings) -> Callable[[StepPlan], StepPlan]:
    """The runner's job: a span long enough for min_requests at this rate."""
    return lambda plan: replace(plan, span_s=max(plan.span_s, settings.min_requests / (BASE * plan.multiplier)))


def mm1(
    settings: SearchSettings,
    mu: float = MU,
    log: list[StepPlan] | None = None,
    shares: bool = True,
) -> Callable[[StepPlan], tuple[SearchStep, float]]:
    """`shares=False`: the steps carry no met share (as before the search used it)."""

    def run(plan: StepPlan) -> tuple[SearchStep, float]:
        if log is not None:
            log.append(plan)
        lam = BASE * plan.multiplier
        span = plan.span_s
        n = math.ceil(lam * span)
        stable = lam < mu
        p95 = math.log(20) / (mu - lam) if stable else math.inf
        life = math.log(2) / (mu - lam) if stable else None
        verdict, why = judge(
            held_slo=p95 <= T, requests=n, arrival_span_s=span, median_lifetime_s=life, settings=settings
        )
        share = 1 - math.exp(-(mu - lam) * T) if stable else 0.95 * max(mu - math.log(20) / T, 0.0) / lam
        step = SearchStep(
            plan.label,
            plan.multiplier,
            plan.why,
            plan.span_s,
            verdict,
            n,
            span,
            n / span,
            life,
            p95 if stable else None,
            None,
            0.0,
            why,
            met_share=share if shares else None,
        )
        return step, span + (life or 0.0)

    return run


def test_search_finds_the_analytic_boundary_within_the_tolerance() -> None:
    st = SearchSettings()
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    # Hand-computed: x1 (P95 0.37 s) and x2 (0.50 s) hold, x4 (lambda 8: 1.50 s) misses; then
    # geometric bisection: 2^1.5 = 2.83 (0.69 s) holds, 2^1.75 = 3.36 (0.92 s) holds,
    # 2^1.875 = 3.67 (1.12 s) misses; 3.67 / 3.36 = 1.09 <= 1.10: converged.
    assert [s.multiplier for s in path.steps] == pytest.approx([1, 2, 4, 2**1.5, 2**1.75, 2**1.875])
    assert [s.verdict for s in path.steps] == [
        Verdict.HELD,
        Verdict.HELD,
        Verdict.MISSED,
        Verdict.HELD,
        Verdict.HELD,
        Verdict.MISSED,
    ]
    assert path.stop_rule is StopRule.CONVERGED and path.converged
    assert path.held_multiplier is not None and path.missed_multiplier is not None
    assert path.held_multiplier <= K_STAR < path.missed_multiplier
    assert path.missed_multiplier / path.held_multiplier <= 1.10
    assert "within 10%" in path.stop_detail


@pytest.mark.parametrize("tolerance", [0.05, 0.02])
def test_a_tighter_tolerance_brackets_closer(tolerance: float) -> None:
    st = SearchSettings(tolerance=tolerance, max_steps=12)  # a tighter bracket takes more bisections
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    assert path.stop_rule is StopRule.CONVERGED
    assert path.held_multiplier is not None and path.missed_multiplier is not None
    assert path.held_multiplier <= K_STAR < path.missed_multiplier <= path.held_multiplier * (1 + tolerance)


def test_search_from_above_halves_when_no_share_was_measured() -> None:
    st = SearchSettings(start_multiplier=16)
    path = search("syn", st, mm1(st, shares=False), first_lifetime_s=0.1, resolve=lengthen(st))
    # x16 and x8 miss, x4 misses, x2 holds: then bisect as before, from below
    assert [s.multiplier for s in path.steps][:4] == pytest.approx([16, 8, 4, 2])
    assert [s.verdict for s in path.steps][:4] == [Verdict.MISSED] * 3 + [Verdict.HELD]
    assert path.stop_rule is StopRule.CONVERGED
    assert path.held_multiplier is not None and path.held_multiplier <= K_STAR < (path.missed_multiplier or 0)


def test_a_large_miss_steps_down_to_its_own_estimate_of_the_boundary() -> None:
    st = SearchSettings(start_multiplier=16)
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    # Hand-computed: x16 (lambda 32 > MU) misses with share 0.95 x 7.0043 / 32 = 0.2080, so the
    # next step is x16 x 0.2080 = x3.327 (lambda 6.654 < lambda* 7.004: holds), not x8; then the
    # confirming step just above it, x3.327 x 1.1 = x3.660 (lambda 7.320 > lambda*: misses), and
    # 3.660 / 3.327 = 1.1: converged in 3 steps. Bisection from the hold took 5 more: 7.296, 4.927,
    # 4.049, 3.670 (misses), 3.494 (holds).
    est = 16 * 0.95 * LAM_STAR / 32
    assert [s.multiplier for s in path.steps] == pytest.approx([16, est, est * 1.1])
    assert [s.verdict for s in path.steps] == [Verdict.MISSED, Verdict.HELD, Verdict.MISSED]
    assert path.steps[1].verdict is Verdict.HELD and path.steps[1].why.startswith(
        "bracket down to the estimate: missed at x16 with 21%"
    )
    assert path.steps[2].why == "confirm: held at x3.327, reached by a miss's estimate: a miss at x3.66 converges"
    assert path.stop_rule is StopRule.CONVERGED
    assert path.held_multiplier is not None and path.held_multiplier <= K_STAR < (path.missed_multiplier or 0)
    # the first hold comes one step after the miss instead of four (x8, x4, x2)
    halving = search("syn", st, mm1(st, shares=False), first_lifetime_s=0.1, resolve=lengthen(st))

    def first_hold(p: SearchPath) -> int:
        return next(i for i, s in enumerate(p.steps) if s.verdict is Verdict.HELD)

    assert first_hold(path) == 1 and first_hold(halving) == 3


def test_a_confirming_step_that_holds_is_bisected_from_as_usual() -> None:
    # The estimate lands far under the boundary (the fleet serves more than the miss's share
    # suggests): x16 misses with share 0.15 (an estimate of x2.4), x2.4 and x2.64 hold (lambda 4.8
    # and 5.28 < lambda* 7.004); the estimate is spent, so the search bisects x2.64..x16 instead
    # of walking up by 10%.
    st = SearchSettings(start_multiplier=16)
    plans: list[StepPlan] = []
    path = search("syn", st, mm1(st, log=plans), first_lifetime_s=0.1, resolve=lengthen(st), seed=(_miss(16.0, 0.15),))
    assert [p.multiplier for p in plans][:3] == pytest.approx([2.4, 2.64, math.sqrt(2.64 * 16)])
    assert plans[1].why.startswith("confirm: held at x2.4,") and plans[2].why == "bisect x2.64..x16"
    assert path.stop_rule is StopRule.CONVERGED
    assert path.held_multiplier is not None and path.held_multiplier <= K_STAR < (path.missed_multiplier or 0)


def itl_bound(settings: SearchSettings, k_star: float) -> Callable[[StepPlan], tuple[SearchStep, float]]:
    """A fleet bound by its P95 ITL, not by a queue: past x`k_star` the batch is too large for
    the per-token target and every request slows at once, so only 5% meet their SLO however
    close the miss is to the boundary (TTFT holds throughout; lifetimes stay 4 s)."""

    def run(plan: StepPlan) -> tuple[SearchStep, float]:
        n = math.ceil(BASE * plan.multiplier * plan.span_s)
        over = plan.multiplier > k_star
        verdict, why = judge(
            held_slo=not over, requests=n, arrival_span_s=plan.span_s, median_lifetime_s=4.0, settings=settings
        )
        step = SearchStep(
            plan.label,
            plan.multiplier,
            plan.why,
            plan.span_s,
            verdict,
            n,
            plan.span_s,
            BASE * plan.multiplier,
            4.0,
            0.5,
            0.2 if over else 0.1,
            0.0,
            why,
            4.0,
            0.05 if over else 1.0,
            itl_missed=over,
        )
        return step, plan.span_s + 4.0

    return run


def test_a_miss_on_itl_halves_instead_of_trusting_its_share() -> None:
    # Hand-computed, boundary x0.45: x1 and x0.5 miss on ITL, x0.25 holds; bisect: 0.3536 and
    # 0.4204 hold, 0.4585 misses; 0.4585 / 0.4204 = 1.09: converged. Trusting the 5% share
    # instead stepped to x0.125 (the x8 bound), 3.6x below the boundary and the longest step of
    # the search: 8 steps and 1,016 s of this fleet's time in all, against 6 and 542 s (the code
    # trace's inf2 fleet ran out of time budget so).
    st = SearchSettings()
    path = search("itl", st, itl_bound(st, 0.45), first_lifetime_s=4.0, resolve=lengthen(st))
    assert [s.multiplier for s in path.steps] == pytest.approx([1, 0.5, 0.25, 0.5**1.5, 0.5**1.25, 0.5**1.125])
    assert path.steps[1].why == "bracket down: missed at x1 on P95 ITL (its share estimates nothing)"
    assert path.stop_rule is StopRule.CONVERGED
    assert path.held_multiplier is not None and path.held_multiplier <= 0.45 < (path.missed_multiplier or 0)


def _miss(k: float, share: float | None) -> SearchStep:
    return SearchStep(
        f"x{k:g}", k, "seed", 10.0, Verdict.MISSED, 72, 60.0, 1.2, 9.0, 5.0, 0.3, 0.4, "hand-made", 4.0, share
    )


@pytest.mark.parametrize(
    ("share", "expected", "why"),
    [
        (None, 0.5, "bracket down: missed at x1"),  # no share measured: by growth, as before
        # a near miss (above 1 / 1.1^2 = 0.826): by growth
        (0.9, 0.5, "bracket down: missed at x1 (90% of requests within their SLO: a near miss)"),
        (0.83, 0.5, "bracket down: missed at x1 (83% of requests within their SLO: a near miss)"),
        # above 1 / growth but not a near miss: to the estimate (before, by growth: x0.5)
        (0.82, 0.82, "bracket down to the estimate: missed at x1 with 82% of requests within their SLO"),
        (0.55, 0.55, "bracket down to the estimate: missed at x1 with 55% of requests within their SLO"),
        (0.3, 0.3, "bracket down to the estimate: missed at x1 with 30% of requests within their SLO"),
        (
            0.01,
            0.125,
            "bracket down to the estimate: missed at x1 with 1% of requests within their SLO, bounded to x0.125 of it",
        ),
    ],
)
def test_step_down_uses_the_misss_share_unless_a_near_miss_and_at_most_growth_cubed(
    share: float | None, expected: float, why: str
) -> None:
    st = SearchSettings()
    assert step_down(st, [_miss(1.0, share)], 1.0) == (pytest.approx(expected), why)
    plan = next_step(st, [_miss(1.0, share)], lifetime_s=4.0)
    assert isinstance(plan, StepPlan) and plan.multiplier == pytest.approx(expected) and plan.why == why


def test_a_step_down_below_the_floor_tries_the_floor_first() -> None:
    st = SearchSettings(min_multiplier=0.25)
    plan = next_step(st, [_miss(1.0, 0.05)], lifetime_s=4.0)  # the estimate x0.125 is below the floor
    assert (
        isinstance(plan, StepPlan) and plan.multiplier == 0.25 and plan.why.endswith("bounded by min_multiplier x0.25")
    )
    stop = next_step(st, [_miss(1.0, 0.05), _miss(0.25, 0.05)], lifetime_s=4.0)
    assert isinstance(stop, Stop) and stop.rule is StopRule.FLOOR


def test_min_requests_is_the_fewest_requests_whose_p95_interval_is_bounded() -> None:
    n = min_n_bounded_upper(SLO_QUANTILE)
    assert SearchSettings().min_requests == CapacitySearch().min_requests == n
    assert quantile_ci([float(i) for i in range(n)]).high is not None  # bounded above ...
    assert quantile_ci([float(i) for i in range(n - 1)]).high is None  # ... and not with one request fewer
    assert n == 72  # 0.95^72 = 0.0249 <= 0.025 < 0.95^71 (hand-computed)


def test_certain_miss_hand_computed() -> None:
    # 72 planned requests: the P95 is the 69th value, so 3 may exceed the target and 4 decide a miss;
    # the 1% error ceiling allows 0.72 errors: the first error decides it
    assert certain_miss(72, 0, 3, 3, 0.01) is None
    assert certain_miss(72, 0, 4, 0, 0.01) == "4 requests over the TTFT target, more than the 3 a P95 of 72 allows"
    assert certain_miss(72, 0, 0, 4, 0.01) == "4 requests over the ITL target, more than the 3 a P95 of 72 allows"
    assert certain_miss(72, 1, 0, 0, 0.01) == "1 errors > 0.01 x 72 planned requests"
    assert certain_miss(200, 2, 10, 0, 0.01) is None  # 2 errors = 1% of 200 is not over; 10 = 200 - 190 allowed
    assert certain_miss(0, 0, 0, 0, 0.01) is None


@pytest.mark.parametrize("planned", [20, 72, 73, 100, 139, 140, 400])
def test_a_certain_miss_is_a_miss_whatever_the_rest_of_the_step_does(planned: int) -> None:
    """Over any m <= planned requests (the step stopped, or fewer were sent), v values over the
    target with v the least certain_miss calls decisive: the nearest-rank P95 exceeds the target."""
    v = next(v for v in range(planned + 1) if certain_miss(planned, 0, v, 0, 0.01))
    for m in range(v, planned + 1):
        sample = sorted([0.5] * (m - v) + [3.0] * v)
        assert sample[nearest_rank(m, 0.95) - 1] > T
    # and one fewer can still hold over the whole plan
    full = sorted([0.5] * (planned - v + 1) + [3.0] * (v - 1))
    assert full[nearest_rank(planned, 0.95) - 1] <= T


def test_every_step_is_long_enough_by_construction() -> None:
    st = SearchSettings(min_requests=40)
    plans: list[StepPlan] = []
    path = search("syn", st, mm1(st, log=plans), first_lifetime_s=0.1, resolve=lengthen(st))
    for prev, plan in zip(path.steps, plans[1:], strict=False):
        # each step's span is 3 lifetimes of the step before, with the 25% margin
        assert prev.median_lifetime_s is not None
        assert plan.span_s == pytest.approx(max(3 * prev.median_lifetime_s * 1.25, 40 / (BASE * plan.multiplier)))
    assert all(s.requests >= 40 for s in path.steps)
    assert all(s.verdict is not Verdict.SHORT for s in path.steps)


def test_stop_rule_max_steps() -> None:
    st = SearchSettings(max_steps=3)
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    assert len(path.steps) == 3 and path.stop_rule is StopRule.MAX_STEPS
    assert "3 steps run (max_steps 3); next would be x2.828 (bisect x2..x4)" in path.stop_detail
    assert (path.held_multiplier, path.missed_multiplier) == (2.0, 4.0)  # the bracket it had


def test_stop_rule_time_budget() -> None:
    # x1 at lambda 2: 40 requests need 20 s (+ drain); x2 needs 10 s: a 35 s budget runs two steps
    st = SearchSettings(time_budget_s=35, min_requests=40)
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    assert path.stop_rule is StopRule.TIME_BUDGET
    assert [s.multiplier for s in path.steps] == [1.0, 2.0]
    assert "of the 35 s time budget are spent" in path.stop_detail


def test_stop_rule_floor_and_ceiling() -> None:
    st = SearchSettings(min_multiplier=0.25)
    path = search(
        "syn", st, mm1(st, mu=0.5), first_lifetime_s=0.1, resolve=lengthen(st)
    )  # misses even at x0.25 (lambda 0.5 = MU)
    assert path.stop_rule is StopRule.FLOOR and path.held_multiplier is None
    # x1 (lambda 2 > MU) serves no request in time: the estimate x0 is bounded to x1/8, below the floor: the floor is tried
    assert [s.multiplier for s in path.steps] == [1.0, 0.25]
    assert "no SLO-compliant capacity was measured" in path.stop_detail

    st = SearchSettings(max_multiplier=8)
    path = search("syn", st, mm1(st, mu=1000.0), first_lifetime_s=0.1, resolve=lengthen(st))
    assert path.stop_rule is StopRule.CEILING and path.missed_multiplier is None
    assert [s.multiplier for s in path.steps] == [1.0, 2.0, 4.0, 8.0]
    assert "capacity is at least the x8 figure" in path.stop_detail


def test_a_short_step_is_repeated_longer_once_then_the_search_stops() -> None:
    st = SearchSettings()
    calls: list[StepPlan] = []

    def always_short(plan: StepPlan) -> tuple[SearchStep, float]:
        calls.append(plan)
        v, why = judge(held_slo=True, requests=100, arrival_span_s=10.0, median_lifetime_s=5.0, settings=st)
        return SearchStep(
            plan.label, plan.multiplier, plan.why, plan.span_s, v, 100, 10.0, 10.0, 5.0, 0.5, 0.05, 0.0, why
        ), 15.0

    path = search("syn", st, always_short, first_lifetime_s=1.0)
    assert [p.label for p in calls] == ["x1", "x1-r2"]
    assert calls[1].span_s == pytest.approx(3 * 5.0 * 1.25)  # sized from the short step's own lifetime
    assert path.stop_rule is StopRule.NEVER_STEADY
    assert "arrival span 10.0 s < 3 x median lifetime 5.0 s = 15.0 s" in path.stop_detail


def test_the_runner_can_stop_the_search() -> None:
    st = SearchSettings()

    def never(plan: StepPlan) -> tuple[SearchStep, float]:
        raise AssertionError("no step may run")

    path = search(
        "syn",
        st,
        never,
        first_lifetime_s=1.0,
        resolve=lambda plan: Stop(StopRule.TRACE_EXHAUSTED, f"{plan.label}: the trace ends"),
    )
    assert not path.steps and path.stop_rule is StopRule.TRACE_EXHAUSTED and path.stop_detail == "x1: the trace ends"


def test_judge() -> None:
    st = SearchSettings(min_requests=10)
    assert (
        judge(held_slo=False, requests=1, arrival_span_s=1, median_lifetime_s=9, settings=st, failed="P95 TTFT 3 s")[0]
        is Verdict.MISSED
    )
    assert judge(held_slo=True, requests=10, arrival_span_s=30, median_lifetime_s=10, settings=st)[0] is Verdict.HELD
    v, why = judge(held_slo=True, requests=9, arrival_span_s=29.9, median_lifetime_s=10, settings=st)
    assert v is Verdict.SHORT and "9 requests < min_requests 10" in why and "29.9 s < 3 x median lifetime 10.0 s" in why


def test_search_path_round_trips_through_json(tmp_path: Path) -> None:
    st = SearchSettings()
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    write_search_path(path, tmp_path)
    assert read_search_path(tmp_path) == path


def test_next_step_with_no_history_starts_at_the_start_multiplier() -> None:
    plan = next_step(SearchSettings(start_multiplier=0.5), [], lifetime_s=4.0)
    assert (
        isinstance(plan, StepPlan)
        and plan.multiplier == 0.5
        and plan.span_s == pytest.approx(15.0)
        and plan.why == "start"
    )


def test_the_time_budget_counts_the_runners_overhead_per_step() -> None:
    # each step really takes 30 s more than its span and drain (starting the load generator):
    # x1 (20 s + 30 s) = 50 s spent; x2 would cost 10 + 0.1 + 30 = 40 s more: over a 80 s budget
    st = SearchSettings(time_budget_s=80, min_requests=40)
    inner = mm1(st)

    def slow(plan: StepPlan) -> tuple[SearchStep, float]:
        step, took = inner(plan)
        return step, took + 30.0

    path = search("syn", st, slow, first_lifetime_s=0.1, resolve=lengthen(st))
    assert [s.multiplier for s in path.steps] == [1.0] and path.stop_rule is StopRule.TIME_BUDGET
    assert (
        "the next step x2 (bracket up: held at x1) needs about 40 s; 50 s of the 80 s time budget are spent"
        in path.stop_detail
    )


def _step(label: str, k: float, verdict: Verdict, life: float | None, sizing: float | None = None) -> SearchStep:
    return SearchStep(label, k, "seed", 10.0, verdict, 40, 60.0, 0.7, life, 1.0, 0.05, 0.0, "hand-made", sizing)


def test_the_replay_seeds_the_search_and_a_miss_sizes_the_next_step_from_compliant_requests() -> None:
    st = SearchSettings()
    plans: list[StepPlan] = []
    # the replay missed at x1; its completed requests lived 40 s (queued), those that met the SLO 4 s
    seed = (_step("replay", 1.0, Verdict.MISSED, 40.0, 4.0),)
    path = search("syn", st, mm1(st, log=plans), first_lifetime_s=4.0, resolve=lengthen(st), seed=seed)
    assert plans[0].multiplier == 0.5 and plans[0].why == "bracket down: missed at x1"
    assert plans[0].span_s == pytest.approx(
        max(3 * 4.0 * 1.25, min_n_bounded_upper(SLO_QUANTILE) / (BASE * 0.5))
    )  # not 3 x 40 s
    assert path.steps[0].label == "replay" and path.steps[1].label == "x0.5"


def test_a_short_replay_is_repeated_at_x1_as_the_first_real_step() -> None:
    plan = next_step(SearchSettings(), [_step("replay", 1.0, Verdict.SHORT, 8.0)], lifetime_s=8.0)
    assert isinstance(plan, StepPlan) and plan.label == "x1" and plan.span_s == pytest.approx(30.0)
    stop = next_step(
        SearchSettings(),
        [_step("replay", 1.0, Verdict.SHORT, 8.0), _step("x1", 1.0, Verdict.SHORT, 8.0)],
        lifetime_s=8.0,
    )
    assert isinstance(stop, Stop) and stop.rule is StopRule.NEVER_STEADY


def test_a_step_between_a_hold_and_a_miss_is_sized_from_the_hold_not_from_the_miss_s_fastest_requests() -> None:
    st = SearchSettings(max_steps=3)
    plans: list[StepPlan] = []

    def run(plan: StepPlan) -> tuple[SearchStep, float]:
        # holds below x1.5 with requests living 10 s; above, a miss whose SLO-compliant requests lived 4 s
        plans.append(plan)
        held = plan.multiplier < 1.5
        step = SearchStep(
            plan.label,
            plan.multiplier,
            plan.why,
            plan.span_s,
            Verdict.HELD if held else Verdict.MISSED,
            100,
            plan.span_s,
            100 / plan.span_s,
            10.0 if held else 30.0,
            0.5 if held else 5.0,
            0.05,
            0.0,
            "synthetic",
            None if held else 4.0,
        )
        return step, plan.span_s

    search("syn", st, run, first_lifetime_s=10.0)
    assert [p.multiplier for p in plans] == pytest.approx([1.0, 2.0, math.sqrt(2)])
    assert plans[2].why.startswith("bisect") and plans[2].span_s == pytest.approx(3 * 10.0 * 1.25)  # was 3 x 4 s x 1.25
    # below a miss with no hold under it, the miss's compliant requests still size the step down
    assert sizing_lifetime([_step("replay", 1.0, Verdict.MISSED, 40.0, 4.0)], 26.0) == 4.0


def test_a_reopened_search_sizes_its_step_from_the_step_it_goes_under_not_the_last_one() -> None:
    # The demo's inf2 (2026-12-05): x0.7071 held over its own requests (median lifetime 11.8 s) and
    # missed pooled with its settle segments; x0.8485 above it was stopped early, its compliant
    # requests lived 8.5 s. The reopened search goes under x0.7071; sized from 8.5 s, its step
    # spanned 31.3 s < 3 x its own 11.0 s and ran again.
    st = SearchSettings()
    seed = (
        _step("replay", 1.0, Verdict.MISSED, 14.7, 9.6),
        _step("x0.7071", 0.7071, Verdict.MISSED, 11.8, 11.8),
        _step("x0.8485", 0.8485, Verdict.MISSED, 8.6, 8.5),
    )
    assert sizing_lifetime(seed, 8.5) == 11.8
    plans: list[StepPlan] = []

    def run(plan: StepPlan) -> tuple[SearchStep, float]:
        plans.append(plan)
        return _step(plan.label, plan.multiplier, Verdict.HELD, 11.0), plan.span_s

    search("inf2", replace(st, max_steps=len(seed) + 1), run, first_lifetime_s=26.0, seed=seed)
    assert plans[0].multiplier < 0.7071 and plans[0].span_s == pytest.approx(3 * 11.8 * 1.25)  # was 3 x 8.5 s x 1.25


def test_a_miss_with_no_compliant_request_keeps_the_previous_lifetime() -> None:
    assert next_lifetime(_step("x4", 4.0, Verdict.MISSED, 50.0, None), 6.0) == 6.0
    assert (
        next_lifetime(_step("x2", 2.0, Verdict.HELD, 7.0, 5.0), 6.0) == 7.0
    )  # a hold: its own median, as the analysis checks it


def test_an_invalid_run_is_repeated_once_and_never_counted_as_a_miss() -> None:
    st = SearchSettings()
    v, why = judge(
        held_slo=False,
        requests=40,
        arrival_span_s=60.0,
        median_lifetime_s=5.0,
        settings=st,
        failed="P95 TTFT 3 s",
        invalid="schedule lag p99 0.16 s > bound 0.05 s",
    )
    assert v is Verdict.INVALID and why == "run invalid: schedule lag p99 0.16 s > bound 0.05 s"
    steps = [_step("x1", 1.0, Verdict.HELD, 5.0), _step("x2", 2.0, Verdict.INVALID, 5.0)]
    plan = next_step(st, steps, lifetime_s=5.0)
    assert isinstance(plan, StepPlan) and plan.label == "x2-r2" and plan.why == "repeat: the last run was invalid"
    from analysis.capacity.search import bracket

    assert bracket(steps) == (1.0, None)  # the invalid run is neither a hold nor a miss
    stop = next_step(st, [*steps, _step("x2-r2", 2.0, Verdict.INVALID, 5.0)], lifetime_s=5.0)
    assert isinstance(stop, Stop) and stop.rule is StopRule.CLIENT_LIMITED and "x2 was run twice" in stop.detail


def test_the_search_defaults_are_the_manifests() -> None:
    # One set of defaults: the search code had max_steps 12 and a 900 s budget while a manifest
    # without the fields got 8 and 240 s.
    from dataclasses import fields

    code, manifest = SearchSettings(), CapacitySearch()
    shared = [f.name for f in fields(SearchSettings) if f.name in CapacitySearch.model_fields]
    assert len(shared) == 8
    assert {n: getattr(code, n) for n in shared} == {n: getattr(manifest, n) for n in shared}


def _replay_miss(st: SearchSettings) -> tuple[SearchStep]:
    """The trace replay at x16, a miss (as the campaign's replay seeds the search)."""
    return (mm1(st)(lengthen(st)(StepPlan(16.0, 1.0, "the trace replay")))[0],)


def test_a_predicted_boundary_is_stepped_to_once_below_a_miss_and_confirmed() -> None:
    """With the plan's prediction just under the boundary (x3.4 < K* = 3.502), the search goes there from
    the x16 miss instead of to the miss's estimate, holds, and confirms just above: 3 steps, the
    2nd and 3rd at x3.4 and x3.4 x 1.1 = x3.74 (a miss: lambda 7.48 > lambda* 7.004)."""
    st = SearchSettings(predicted=3.4)
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st), seed=_replay_miss(st))
    assert [s.multiplier for s in path.steps] == pytest.approx([16, 3.4, 3.74])
    assert [s.verdict for s in path.steps] == [Verdict.MISSED, Verdict.HELD, Verdict.MISSED]
    assert path.steps[1].why == "the plan's predicted boundary (campaign plan, simulated): missed at x16"
    assert (
        path.steps[2].why
        == "confirm: held at x3.4, reached by the plan's predicted boundary: a miss at x3.74 converges"
    )
    assert path.stop_rule is StopRule.CONVERGED


def test_a_wrong_prediction_costs_one_step_then_the_search_goes_on_as_without_it() -> None:
    # x5 (lambda 10 = MU) misses with share 0.95 x 7.0043 / 10 = 0.6654: the next step is the miss's
    # estimate x5 x 0.6654 = x3.327, as after any miss; the prediction is tried only once.
    st = SearchSettings(predicted=5.0)
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st), seed=_replay_miss(st))
    est = 5 * 0.95 * LAM_STAR / 10
    assert [s.multiplier for s in path.steps][:3] == pytest.approx([16, 5.0, est])
    assert path.steps[2].why.startswith("bracket down to the estimate: missed at x5")
    assert path.stop_rule is StopRule.CONVERGED
    assert path.held_multiplier is not None and path.held_multiplier <= K_STAR < (path.missed_multiplier or 0)


def test_with_no_history_a_prediction_is_the_start_and_a_hold_there_is_confirmed() -> None:
    st = SearchSettings(predicted=3.4)
    path = search("syn", st, mm1(st), first_lifetime_s=0.1, resolve=lengthen(st))
    assert [s.multiplier for s in path.steps] == pytest.approx([3.4, 3.74])
    assert path.steps[0].why == "the plan's predicted boundary (campaign plan, simulated)"
    assert path.steps[1].why.startswith("confirm: held at x3.4, reached by the plan's predicted boundary")
    assert path.stop_rule is StopRule.CONVERGED


def test_a_prediction_outside_the_search_range_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity search settings out of range"):
        SearchSettings(predicted=1e-6)


def test_a_step_that_missed_pooled_with_its_settle_segments_is_approached_from_just_below() -> None:
    """x3.6 held over its own requests, then the settle phase's segments pooled with it missed: the
    boundary lies just under it, so the next step is x3.6 / 1.1 = x3.273, which holds (K* = 3.502):
    converged, where a miss with no hold below would halve to x1.8 and bisect up from there."""
    st = SearchSettings()
    run = mm1(st)
    held, _ = run(lengthen(st)(StepPlan(3.6, 1.0, "bisect")))
    flipped = held.model_copy(update={"verdict": Verdict.MISSED, "detail": "missed pooled with its settle segments: x"})
    path = search("syn", st, run, first_lifetime_s=0.1, resolve=lengthen(st), seed=(flipped,))
    assert [s.multiplier for s in path.steps] == pytest.approx([3.6, 3.6 / 1.1])
    assert (
        path.steps[1].why == "just below x3.6: it held over its own requests but missed pooled with its settle segments"
    )
    assert path.stop_rule is StopRule.CONVERGED and path.held_multiplier == pytest.approx(3.6 / 1.1)


def test_a_step_whose_lifetimes_grow_when_lengthened_is_a_miss_not_never_steady() -> None:
    """Real vLLM on a CPU core at x8: too short at 3.1 s of arrivals (median lifetime 2.1 s), then,
    lengthened, too short again at 7.9 s (4.2 s): a queue that grows with the step. That is a miss,
    and the search bisects below it; lifetimes that stay put (the test above) still stop never_steady."""
    st = SearchSettings(start_multiplier=4)

    def engine(plan: StepPlan) -> tuple[SearchStep, float]:
        k, span = plan.multiplier, plan.span_s
        life = 1.0 if k < 6 else (2.1 if plan.repeat == 1 else 4.2)
        v, why = judge(held_slo=True, requests=100, arrival_span_s=span, median_lifetime_s=life, settings=st)
        step = SearchStep(plan.label, k, plan.why, span, v, 100, span, 100 / span, life, 0.5, 0.05, 0.0, why)
        return step, span + life

    path = search("syn", st, engine, first_lifetime_s=1.0, resolve=lambda p: replace(p, span_s=min(p.span_s, 8.0)))
    labels = [s.label for s in path.steps]
    assert labels[:4] == ["x4", "x8", "x8-r2", "x5.657"]
    grown = path.steps[2]
    assert grown.verdict is Verdict.MISSED and grown.detail.startswith(
        "a growing queue: its median lifetime went from 2.1 s to 4.2 s when lengthened"
    )
    assert path.stop_rule is not StopRule.NEVER_STEADY
