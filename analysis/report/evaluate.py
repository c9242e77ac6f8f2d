"""From measurements + prices + manifest to per-fleet size and cost, delta, payback and decision.

One function, `evaluate`, serves both the headline (the manifest as written) and every
sensitivity cell, so a cell can never be computed by different rules than the headline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from analysis import model as rm
from analysis.capacity.steps import REPLAY, median_overhead_s
from analysis.economics import cost, ledger, sizing
from analysis.economics.decision import DecisionInputs, Economics, decide
from analysis.economics.sensitivity import Scenario
from analysis.economics.to_settle import FleetBasis, requests_to_move_end, settle_text, to_settle
from analysis.measure.goodput import Saturation
from analysis.measure.intervals import FleetIntervals, IntervalsFn
from analysis.provenance import Gap
from core.manifest import Manifest

QualityResults = Mapping[str, rm.QualityResult]  # per fleet (analysis.report.inputs.quality_results)


@dataclass
class Context:
    manifest: Manifest
    measures: Callable[[float], dict[str, rm.Measure]]  # slo_scale -> per-fleet measures
    instances_measured: dict[str, int]
    unit_prices: dict[str, cost.UnitPrices]  # fleets whose prices all resolved
    root_volume_gib: float
    quality: QualityResults | None
    gaps: list[Gap] = field(default_factory=list)
    saturation: dict[str, Saturation] = field(default_factory=dict)  # per fleet; absent: not measured
    # slo_scale -> per-fleet capacity from the capacity sweep; None: no sweep (size from the replay)
    capacity: Callable[[float], dict[str, rm.CapacityModel]] | None = None
    # slo_scale -> per-fleet 95% intervals; None: no intervals (the report then claims none)
    intervals: IntervalsFn | None = None
    # One load-generator task's hourly price (decision.to_settle's usd) and where it came from
    loadgen_task_hourly_usd: float | None = None
    loadgen_price_source: str = "no Fargate price: load-generator tasks not counted"

    def pooled_tokens_per_request(self, measures: Mapping[str, rm.Measure]) -> float | None:
        """Mean output tokens of a completed request, pooled over the fleets: one demand for all.

        Uses every completed request (SLO met or not) so the demand does not shrink when a
        fleet misses the SLO."""
        ok = sum(m.completed_ok for m in measures.values())
        toks = sum(m.completed_output_tokens for m in measures.values())
        return toks / ok if ok else None


def quality_passed(m: Manifest, quality: QualityResults | None, fleet: str) -> bool | None:
    if quality is None or fleet not in quality:
        return None
    q = quality[fleet]
    if "passed" in q.model_fields_set and q.passed is None:
        return None  # a layer could not be evaluated (campaign.stages.quality): evidence missing
    passed = bool(q.passed)  # not given: not passed
    if q.pass_rate is not None and q.pass_rate < m.quality.min_pass_rate:
        passed = False
    return passed


def quality_failure(quality: QualityResults | None, fleet: str) -> str | None:
    """The quality layer that stopped the comparison for this fleet and its first reason."""
    q = (quality or {}).get(fleet)
    layer, reasons = (q.failed_layer, q.failures) if q is not None else (None, [])
    if not layer:
        return None
    return f"layer {layer}" + (f": {str(reasons[0]).removeprefix(f'{layer}: ')}" if reasons else "")


def _cost_inputs(m: Manifest, fleet: str, root_gib: float) -> cost.FleetCostInputs:
    f = m.fleet(fleet)
    return cost.FleetCostInputs(
        root_volume_gib=root_gib,
        cache_volume_gib=float(f.ebs_cache_gib),
        nlb_lcu_per_hour=m.costs.network.nlb_lcu_per_hour,
        inter_az_gb_per_month=m.costs.network.inter_az_gb_per_month,
        observability_monthly_usd=m.costs.observability_monthly_usd,
        licenses_monthly_usd=m.costs.licenses_monthly_usd,
        hours_per_month=m.workload.demand.hours_per_month,
        commitments=tuple(
            cost.CommitmentRate(c.covered_instances, c.effective_hourly_usd, c.renewal_hourly_usd)
            for c in m.costs.commitments
            if c.fleet == fleet
        ),
    )


def unmeasured_row(instance_type: str) -> rm.FleetRow:
    """A fleet row with nothing measured: zero counts, and no figure that would need a measurement."""
    return rm.FleetRow(
        instance_type=instance_type,
        requests=0,
        successful_requests=0,
        successful_output_tokens=0,
        p95_ttft_s=None,
        p95_itl_s=None,
        slo_pass=False,
        instances_required=None,
        monthly_cost_usd=None,
        cost_per_million_successful_tokens=None,
    )


def _size(ctx: Context, fleet: str, demand_tok_s: float, per_instance_tok_s: float, util: float) -> rm.FleetSize:
    """The fleet sized for the demand from one per-instance capacity, within its manifest's bounds."""
    f = ctx.manifest.fleet(fleet)
    return sizing.size_fleet(
        demand_tok_s,
        per_instance_tok_s,
        utilization_target=util,
        redundancy=f.redundancy,
        asg_min=f.asg.min,
        asg_max=f.asg.max,
        azs=f.availability_zones,
    )


def _size_and_cost(
    ctx: Context,
    sc: Scenario,
    fleet: str,
    demand_tok_s: float | None,
    per_instance_tok_s: float | None,
    util: float,
) -> tuple[rm.FleetSize | None, rm.MonthlyCost | None]:
    """The fleet sized for the demand from one per-instance capacity, and its monthly cost (None where unknown)."""
    if demand_tok_s is None or not per_instance_tok_s:
        return None, None
    size = _size(ctx, fleet, demand_tok_s, per_instance_tok_s, util)
    prices = ctx.unit_prices.get(fleet)
    if prices is None:
        return size, None
    return size, cost.monthly_fleet_cost(
        size, prices, _cost_inputs(ctx.manifest, fleet, ctx.root_volume_gib), sc.rate_mode
    )


def _holds_slo(row: rm.FleetRow) -> bool:
    """A fleet holds the SLO when the replay met it, or when it is sized from a capacity step
    that met it: the replay's single instance may simply have been offered more than it can
    carry, which the sized fleet never is."""
    return row.slo_pass or (row.sized_from or "replay") != "replay"


@dataclass(frozen=True)
class _FleetFigures:
    """One fleet under one scenario: its row, its size, and what the comparison and to_settle need of it."""

    row: rm.FleetRow
    size: rm.FleetSize | None = None
    monthly_usd: float | None = None
    monthly_ends: tuple[float | None, float | None] | None = None  # 95% interval of the monthly cost; None: no interval
    basis_rate: float | None = None  # request rate of the step the fleet is sized from (with an interval only)
    basis_time: tuple[float, float] | None = (
        None  # its (drain, load-generator overhead) seconds (with an interval only)
    )


@dataclass(frozen=True)
class _Comparison:
    """The baseline against the candidate: the monthly delta, the migration ledger, the payback and their intervals."""

    delta: float | None
    ledger: rm.Ledger | None
    migration_cost_usd: float | None
    payback_months: float | None
    spread: _Spread | None
    economics: Economics | None


def evaluate(ctx: Context, sc: Scenario) -> rm.ScenarioEvaluation:
    m = ctx.manifest
    measures = ctx.measures(sc.slo_scale)
    util = sc.utilization_target if sc.utilization_target is not None else m.costs.utilization_target
    tok_per_req = ctx.pooled_tokens_per_request(measures)
    demand_tok_s = (
        None if tok_per_req is None else m.workload.demand.peak_requests_per_s * sc.demand_scale * tok_per_req
    )
    intervals = ctx.intervals(sc.slo_scale) if ctx.intervals is not None else {}
    figures = {
        f.name: _fleet_figures(ctx, sc, f.name, measures.get(f.name), intervals.get(f.name), demand_tok_s, util)
        for f in m.fleets
    }
    cmp = _compare(ctx, sc, figures, with_intervals=bool(intervals))
    econ = cmp.economics
    settle = (
        _settle_for(ctx, econ, intervals, figures, demand_tok_s, util)
        if econ is not None and econ.aim is not None
        else None
    )
    refresh = _months_to_next_refresh(m, sc)
    dec = decide(_decision_inputs(ctx, measures, figures, cmp, refresh, settle))
    return rm.ScenarioEvaluation(
        fleets={name: fig.row for name, fig in figures.items()},
        demand_tok_s=demand_tok_s,
        pooled_output_tokens_per_request=tok_per_req,
        utilization_target=util,
        monthly_delta_usd=cmp.delta,
        monthly_delta_ci_usd=cmp.spread.delta_ci if cmp.spread else None,
        migration=cmp.ledger,
        migration_cost_usd=cmp.migration_cost_usd,
        payback_months=cmp.payback_months,
        payback_months_ci=cmp.spread.payback_ci if cmp.spread else None,
        months_to_next_refresh=refresh,
        decision=dec,
    )


def _fleet_figures(
    ctx: Context,
    sc: Scenario,
    fleet: str,
    fm: rm.Measure | None,
    iv: FleetIntervals | None,
    demand_tok_s: float | None,
    util: float,
) -> _FleetFigures:
    """One fleet's row under the scenario: its replay, saturation, capacity, size, monthly cost,
    intervals and the measured run's cost."""
    m = ctx.manifest
    f = m.fleet(fleet)
    if fm is None:
        return _FleetFigures(unmeasured_row(f.instance_type))
    slo, hours = m.slo, m.workload.demand.hours_per_month
    inst = ctx.instances_measured.get(fleet, 0)
    per_inst = fm.goodput_tok_s / inst if fm.goodput_tok_s is not None and inst > 0 else None
    row = rm.FleetRow(
        instance_type=f.instance_type,
        requests=fm.requests,
        successful_requests=fm.successful_requests,
        successful_output_tokens=fm.successful_output_tokens,
        p95_ttft_s=fm.p95_ttft_s,
        p95_itl_s=fm.p95_itl_s,
        error_rate=fm.error_rate,
        slo_pass=fm.slo_pass(slo.ttft_p95_s * sc.slo_scale, slo.itl_p95_s * sc.slo_scale, slo.max_error_rate),
        instances_measured=inst,
        per_instance_goodput_tok_s=per_inst,
        measure=fm,
        instances_required=None,
        monthly_cost_usd=None,
        cost_per_million_successful_tokens=None,
    )
    _add_saturation(row, ctx.saturation.get(fleet))
    cap = _add_capacity(row, ctx, sc, fleet)
    size_per_inst = cap.per_instance_tok_s if cap is not None and cap.per_instance_tok_s else per_inst
    size, mc = _size_and_cost(ctx, sc, fleet, demand_tok_s, size_per_inst, util)
    row.size = size
    row.instances_required = size.required if size else None
    row.monthly_cost = mc
    row.monthly_cost_usd = mc.total_usd if mc else None
    ends = rate = time = None
    if iv is not None:
        ends = _add_intervals(row, ctx, sc, fleet, iv, demand_tok_s, util)
        rate = _basis_rate(iv.shown.basis, fm.requests, fm.window_s, cap)
        time = _basis_time(iv.shown.basis, cap)
    monthly_tokens = demand_tok_s * 3600.0 * hours if demand_tok_s is not None else 0.0
    row.monthly_successful_tokens = monthly_tokens if mc else None
    row.cost_per_million_successful_tokens = cost.cost_per_million(mc.total_usd, monthly_tokens) if mc else None
    prices = ctx.unit_prices.get(fleet)
    if prices is not None and inst > 0:
        row.measured_run = _measured_run(fm, inst, prices, mc, hours)
    return _FleetFigures(row, size, mc.total_usd if mc else None, ends, rate, time)


def _add_saturation(row: rm.FleetRow, sat: Saturation | None) -> None:
    """The replay's peak concurrency against the batch limit, where it was measured."""
    if sat is None:
        return
    row.peak_in_flight = sat.peak_in_flight
    row.peak_in_flight_per_instance = sat.peak_in_flight_per_instance
    row.max_concurrency = sat.max_concurrency
    row.saturated = sat.saturated
    # below saturation the measured throughput is what was offered, not what one instance can do
    row.per_instance_goodput_bound = "capacity" if sat.saturated else "lower_bound"


def _add_capacity(row: rm.FleetRow, ctx: Context, sc: Scenario, fleet: str) -> rm.CapacityModel | None:
    """The capacity sweep's result and the step the fleet is sized from (the replay when no step is chosen)."""
    if ctx.capacity is None:
        return None
    cap = ctx.capacity(sc.slo_scale).get(fleet)
    row.capacity = cap
    row.sized_from = f"capacity sweep step {cap.step}" if cap is not None and cap.step else "replay"
    return cap


def _measured_run(
    fm: rm.Measure, inst: int, prices: cost.UnitPrices, mc: rm.MonthlyCost | None, hours: float
) -> rm.MeasuredRun:
    """What the measured run itself cost, and per million successful tokens."""
    rc = cost.run_cost(inst, fm.window_s or 0.0, prices.instance_hourly_usd, mc.non_compute_usd if mc else 0.0, hours)
    return rm.MeasuredRun(
        cost_usd=rc,
        window_s=fm.window_s,
        cost_per_million_successful_tokens=cost.cost_per_million(rc, fm.successful_output_tokens),
        basis="instances in service during the run x On-Demand hourly x max(window, 60 s) + the window's share of non-compute cost",
    )


def _compare(ctx: Context, sc: Scenario, figures: Mapping[str, _FleetFigures], with_intervals: bool) -> _Comparison:
    """The monthly delta (baseline - candidate), the migration ledger and payback, their 95%
    intervals (when the fleets have intervals) and the delta against the thresholds."""
    m = ctx.manifest
    base, cand = m.comparison.baseline, m.comparison.candidate
    b_month, c_month = figures[base].monthly_usd, figures[cand].monthly_usd
    delta = led = None
    if b_month is not None and c_month is not None:
        delta = ledger.monthly_delta(b_month, c_month)
        led = ledger.migration_ledger(
            m.migration,
            candidate_monthly_usd=c_month,
            baseline_monthly_usd=b_month,
            hours_per_month=m.workload.demand.hours_per_month,
            effort_scale=sc.effort_scale,
        )
    mig_cost = led.total_usd if led else None
    payback = ledger.payback_months(mig_cost, delta) if mig_cost is not None and delta is not None else None
    ends = {name: fig.monthly_ends for name, fig in figures.items() if fig.monthly_ends is not None}
    spread = _delta_payback_intervals(ctx, sc, delta, ends) if with_intervals else None
    margin = m.indifference_margin.usd(b_month) if b_month is not None else 0.0
    econ = _economics(m.horizon_months, delta, mig_cost, margin, spread)
    return _Comparison(delta, led, mig_cost, payback, spread, econ)


def _settle_for(
    ctx: Context,
    econ: Economics,
    intervals: Mapping[str, FleetIntervals],
    figures: Mapping[str, _FleetFigures],
    demand_tok_s: float | None,
    util: float,
) -> tuple[rm.ToSettle, str] | None:
    """decision.to_settle from each sized fleet's sizing step: its rate, timings, point capacity and instance count."""
    sized = {name: fig for name, fig in figures.items() if fig.size is not None}
    counts = {name: _count_at(ctx, name, demand_tok_s, util) for name in sized if demand_tok_s is not None}
    points = {name: fig.size.per_instance_tok_s for name, fig in sized.items() if fig.size is not None}
    rates = {name: fig.basis_rate for name, fig in figures.items() if fig.basis_time is not None}
    times = {name: fig.basis_time for name, fig in figures.items() if fig.basis_time is not None}
    return _to_settle(ctx, econ, intervals, rates, points, counts, times)


def _months_to_next_refresh(m: Manifest, sc: Scenario) -> float:
    """The scenario's months to the next refresh, else the manifest's, else a full refresh cadence."""
    if sc.months_to_next_refresh is not None:
        return sc.months_to_next_refresh
    if m.migration.months_to_next_refresh is not None:
        return m.migration.months_to_next_refresh
    return m.migration.refresh_cadence_months


def _decision_inputs(
    ctx: Context,
    measures: Mapping[str, rm.Measure],
    figures: Mapping[str, _FleetFigures],
    cmp: _Comparison,
    refresh: float,
    settle: tuple[rm.ToSettle, str] | None,
) -> DecisionInputs:
    """What analysis.economics.decision decides from: the candidate's replay, both fleets' quality and SLO,
    availability, the economics and the blocking gaps."""
    m = ctx.manifest
    base, cand = m.comparison.baseline, m.comparison.candidate
    cf, bf = m.fleet(cand), m.fleet(base)
    cm = measures.get(cand)
    c_size = figures[cand].size
    return DecisionInputs(
        candidate=cand,
        baseline=base,
        candidate_successful_tokens=cm.successful_output_tokens if cm else 0,
        candidate_error_rate=cm.error_rate if cm else None,
        candidate_completed_output_tokens=cm.completed_output_tokens if cm else 0,
        candidate_requests_sent=(cm.requests - cm.not_sent) if cm else 0,
        candidate_saturated=cand in ctx.saturation and ctx.saturation[cand].saturated,
        max_error_rate=m.slo.max_error_rate,
        candidate_quality_passed=quality_passed(m, ctx.quality, cand),
        baseline_quality_passed=quality_passed(m, ctx.quality, base),
        candidate_quality_failure=quality_failure(ctx.quality, cand),
        baseline_quality_failure=quality_failure(ctx.quality, base),
        candidate_slo_pass=_holds_slo(figures[cand].row),
        baseline_slo_pass=_holds_slo(figures[base].row),
        same_availability=len(set(cf.availability_zones)) >= len(set(bf.availability_zones))
        and cf.redundancy >= bf.redundancy,
        candidate_within_asg_max=c_size is None or not c_size.exceeds_asg_max,
        monthly_delta_usd=cmp.delta,
        payback_months=cmp.payback_months,
        horizon_months=m.horizon_months,
        months_to_next_refresh=refresh,
        blocking_gaps=tuple(f"{g.what}: {g.reason}" for g in ctx.gaps if g.blocks_go),
        economics=cmp.economics,
        settle_text=settle[1] if settle else "",
        to_settle=settle[0] if settle else None,
    )


def _add_intervals(
    row: rm.FleetRow,
    ctx: Context,
    sc: Scenario,
    fleet: str,
    iv: FleetIntervals,
    demand_tok_s: float | None,
    util: float,
) -> tuple[float | None, float | None]:
    """The fleet row's interval fields; returns its monthly cost at the capacity interval's ends
    (the high capacity end gives the low cost; an unknown capacity end, an unknown cost)."""
    shown = iv.shown.model_copy(deep=True)  # the row's own: the intervals are cached across scenarios
    row.p95_ttft_ci_s, row.p95_ttft_n = shown.p95_ttft.ci, shown.p95_ttft.n
    row.p95_itl_ci_s, row.p95_itl_n = shown.p95_itl.ci, shown.p95_itl.n
    row.capacity_ci_tok_s = iv.capacity_tok_s if iv.capacity_tok_s else None
    row.intervals = shown
    low_cap, high_cap = iv.capacity_tok_s if iv.capacity_tok_s else (None, None)
    small, cheap = _size_and_cost(ctx, sc, fleet, demand_tok_s, high_cap, util)
    large, dear = _size_and_cost(ctx, sc, fleet, demand_tok_s, low_cap, util)
    row.instances_required_ci = (small.required if small else None, large.required if large else None)
    ends = (cheap.total_usd if cheap else None, dear.total_usd if dear else None)
    row.monthly_cost_ci_usd = ends
    return ends


@dataclass(frozen=True)
class _Spread:
    delta_ci: rm.Interval  # [low, high]; None: unknown end
    payback_ci: rm.Interval  # [low, high]; high None: no payback at the pessimistic end (or unknown)
    # migration cost at the pessimistic (delta low) and optimistic (delta high) ends; None: unknown end
    migration_ends: tuple[float | None, float | None]


def _delta_payback_intervals(
    ctx: Context,
    sc: Scenario,
    delta: float | None,
    monthly_ends: Mapping[str, tuple[float | None, float | None]],
) -> _Spread | None:
    """Delta and payback at the two extremes of the fleets' cost intervals (candidate dear + baseline
    cheap, and the reverse), each with the migration cost priced at that end. The interval holds the
    true value whenever both fleets' 95% capacity intervals do, so with independent samples it
    covers at least 0.95^2 = 90.25%; pairing both worst ends makes it wider than that bound needs
    (it can cover even when one fleet's interval misses), which is the side a Defer should err on."""
    m = ctx.manifest
    base, cand = m.comparison.baseline, m.comparison.candidate
    if delta is None or base not in monthly_ends or cand not in monthly_ends:
        return None
    (b_cheap, b_dear), (c_cheap, c_dear) = monthly_ends[base], monthly_ends[cand]
    hours = m.workload.demand.hours_per_month

    def end(b_month: float | None, c_month: float | None) -> tuple[float | None, float | None, float | None]:
        if b_month is None or c_month is None:
            return None, None, None
        led = ledger.migration_ledger(
            m.migration,
            candidate_monthly_usd=c_month,
            baseline_monthly_usd=b_month,
            hours_per_month=hours,
            effort_scale=sc.effort_scale,
        )
        d = ledger.monthly_delta(b_month, c_month)
        return d, ledger.payback_months(led.total_usd, d), led.total_usd

    d_low, pb_high, mig_pess = end(b_cheap, c_dear)
    d_high, pb_low, mig_opt = end(b_dear, c_cheap)
    return _Spread((d_low, d_high), (pb_low, pb_high), (mig_pess, mig_opt))


def _economics(
    horizon: float, delta: float | None, mig_cost: float | None, margin: float, spread: _Spread | None
) -> Economics | None:
    """The delta against the Go threshold (migration cost / horizon + margin) and 0; each end of its
    interval against the threshold priced with that end's own migration cost (docs/design.md: Decision)."""
    if delta is None or mig_cost is None:
        return None
    if spread is None:
        return Economics.at_point(delta, mig_cost, horizon, margin)
    go = mig_cost / horizon + margin
    mig_pess, mig_opt = spread.migration_ends
    return Economics(
        delta,
        spread.delta_ci[0],
        spread.delta_ci[1],
        go,
        go if mig_pess is None else mig_pess / horizon + margin,
        go if mig_opt is None else mig_opt / horizon + margin,
        mig_cost,
        horizon,
        margin,
    )


def _basis_rate(
    basis: str, replay_requests: int, replay_window_s: float | None, cap: rm.CapacityModel | None
) -> float | None:
    """Requests per second over the step a fleet is sized from (the replay or a capacity step)."""
    if basis == REPLAY:
        requests, window = replay_requests, replay_window_s
    else:
        st = next((s for s in cap.steps if s.label == basis), None) if cap is not None else None
        requests, window = (st.requests, st.window_s) if st is not None else (0, None)
    return requests / window if window and requests else None


def _basis_time(basis: str, cap: rm.CapacityModel | None) -> tuple[float, float]:
    """(drain, overhead): seconds a segment of the step a fleet is sized from takes beside its
    arrivals: its last requests' lifetime (the step's median) and the load generator's start and
    stop (the search's median step overhead), as the settle budget counts them."""
    if cap is None:
        return 0.0, 0.0
    st = next((s for s in cap.steps if s.label == basis), None)
    return (st.median_e2e_s or 0.0) if st is not None else 0.0, median_overhead_s(
        cap.search.steps if cap.search is not None else ()
    )


def _count_at(ctx: Context, fleet: str, demand_tok_s: float, util: float) -> Callable[[float], int]:
    """The fleet's instance count for a per-instance capacity, as the report sizes it (no pricing:
    analysis.economics.to_settle bisects on it)."""

    def count(per_instance_tok_s: float) -> int:
        return _size(ctx, fleet, demand_tok_s, per_instance_tok_s, util).required if per_instance_tok_s > 0 else 0

    return count


def _end_requests(
    iv: FleetIntervals, point: float | None, count: Callable[[float], int] | None
) -> tuple[int | None, int | None] | None:
    """Per capacity end (low, high): the requests at the sizing step before that end moves the
    fleet's count toward the point's (analysis.economics.to_settle); None: not computable here."""
    if point is None or count is None or iv.capacity_tok_s is None or None in iv.capacity_tok_s:
        return None
    low, high = iv.capacity_tok_s
    assert low is not None and high is not None
    n = iv.shown.basis_requests
    move_low = requests_to_move_end(n, point, low, count)
    if iv.low_borrowed:  # the basis must first hold with 95% confidence for its own low end to count
        move_low = max(iv.hold_requests, move_low or 0) if iv.hold_requests is not None else move_low
    return move_low, requests_to_move_end(n, point, high, count)


def _to_settle(
    ctx: Context,
    econ: Economics,
    intervals: Mapping[str, FleetIntervals],
    rates: Mapping[str, float | None],
    points: Mapping[str, float] | None = None,
    counts: Mapping[str, Callable[[float], int]] | None = None,
    times: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[rm.ToSettle, str] | None:
    """decision.to_settle and the sentence a Defer reason ends with (None: no interval to size it from).
    `points`, `counts`: each fleet's per-instance capacity at the point and its instance count for a
    capacity, so the figures respect whole instances."""
    m = ctx.manifest
    aim = econ.aim
    names = (m.comparison.candidate, m.comparison.baseline)
    if aim is None or any(n not in intervals for n in names):
        return None
    fleets = {}
    for n in names:
        iv, prices = intervals[n], ctx.unit_prices.get(n)
        fleets[n] = FleetBasis(
            requests=iv.shown.basis_requests,
            rate_req_s=rates.get(n),
            instances=ctx.instances_measured.get(n, 0),
            instance_hourly_usd=prices.instance_hourly_usd if prices is not None else None,
            loadgen_tasks=m.loadgen.workers + 1,
            loadgen_task_hourly_usd=ctx.loadgen_task_hourly_usd,
            end_known=iv.capacity_tok_s is not None and None not in iv.capacity_tok_s,
            hold_requests=iv.hold_requests,
            role="baseline" if n == m.comparison.baseline else "candidate",
            end_requests=_end_requests(iv, (points or {}).get(n), (counts or {}).get(n)),
            drain_s=(times or {}).get(n, (0.0, 0.0))[0],
            overhead_s=(times or {}).get(n, (0.0, 0.0))[1],
        )
    ts = to_settle(econ, aim, fleets, ctx.loadgen_price_source)
    unknown = [f"{n}: {intervals[n].shown.capacity_note}" for n in names if not fleets[n].end_known]
    return ts, settle_text(ts, unknown)


NOT_MEASURED = "not measured"
NO_COMMITMENT = "no commitment in the manifest"


def outside_evidence(ctx: Context, sc: Scenario, res: rm.ScenarioEvaluation) -> list[str]:
    """Why a scenario's answer would need evidence the campaign does not have (empty: it is inside).

    - An SLO other than the manifest's, that a fleet never held in any measured step: its
      SLO-compliant capacity there is unknown, and the overload goodput would size it as if
      one instance carried almost nothing.
    - A commitment rate (covered / renewal) for a fleet with no commitment in the manifest and no
      Reserved rate from the price source."""
    out = []
    if sc.slo_scale != 1.0:
        out += [
            f"{NOT_MEASURED}: {name} never held the SLO at x{sc.slo_scale:g}"
            for name, row in res.fleets.items()
            if row.requests and not _holds_slo(row)
        ]
    if sc.rate_mode in ("covered", "renewal"):
        committed = {c.fleet for c in ctx.manifest.costs.commitments}
        listed = {name for name, p in ctx.unit_prices.items() if p.listed_commitment_hourly_usd is not None}
        out += [
            f"{NO_COMMITMENT}: {f.name} has none in costs.commitments and the price source lists no Reserved rate, "
            f"which the {sc.rate_mode} rate needs"
            for f in ctx.manifest.fleets
            if f.name not in committed | listed
        ]
    return out


def summarize(res: rm.ScenarioEvaluation, outside: list[str] | None = None) -> rm.CellSummary:
    """The few numbers a sensitivity cell shows; a cell `outside` the evidence shows none, and no decision."""
    if outside:
        state = NO_COMMITMENT if all(x.startswith(NO_COMMITMENT) for x in outside) else NOT_MEASURED
        return rm.CellSummary(
            decision=state,
            reasons=list(outside),
            monthly_delta_usd=None,
            monthly_delta_ci_usd=None,
            migration_cost_usd=None,
            payback_months=None,
            payback_months_ci=None,
            fleets={
                name: rm.CellFleet(
                    instances_required=None, monthly_cost_usd=None, cost_per_million_successful_tokens=None
                )
                for name in res.fleets
            },
        )
    return rm.CellSummary(
        decision=res.decision.state,
        reasons=res.decision.reasons,
        monthly_delta_usd=res.monthly_delta_usd,
        monthly_delta_ci_usd=res.monthly_delta_ci_usd,
        migration_cost_usd=res.migration_cost_usd,
        payback_months=res.payback_months,
        payback_months_ci=res.payback_months_ci,
        fleets={
            name: rm.CellFleet(
                instances_required=r.instances_required,
                monthly_cost_usd=r.monthly_cost_usd,
                cost_per_million_successful_tokens=r.cost_per_million_successful_tokens,
            )
            for name, r in res.fleets.items()
        },
    )
