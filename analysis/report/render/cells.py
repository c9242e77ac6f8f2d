"""The report's sentences and table cells, read from the typed model (analysis.model).

report.html builds every table and sentence from these; their text is report.md's, word for
word (tests/analysis/test_report_html.py compares the two pages cell by cell)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.economics.decision import RULE
from analysis.economics.ledger import FLEET_COST_ITEMS
from analysis.model import (
    Billing,
    Bounds,
    CampaignCost,
    CapacityStep,
    CellSummary,
    FleetRow,
    Interval,
    PrefixCache,
    PrometheusSection,
    QualityResult,
    Report,
    SearchPath,
    Sensitivity,
)

NOT_DECIDED = "not decided"


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def ci_text(ci: Any, digits: int = 3, missing: str = "unknown") -> str:
    """'[low, high]' of a 95% interval; a null end shows as `missing` (a P95's: 'unbounded' by the
    sample; a capacity's, size's or cost's: 'unknown'; a payback's high end: 'no payback')."""
    if not ci:
        return ""
    low, high = ci
    return f"[{missing if low is None else fmt(low, digits)}, {missing if high is None else fmt(high, digits)}]"


OUTCOMES_NOTE = (
    "Outcomes of the non-warmup requests (`no_text`: the server reported output tokens but no chunk carried text; "
    "not a success, its cost stays in the numerator). "
    "ITL basis: `server_tokens` = (last - first token arrival) / (server output tokens - 1), "
    "`chunks` = mean gap between content chunks where the server reported no usage."
)


def p95_cell(point: float | None, ci: Interval | None, n: int | None) -> str:
    """P95 with its 95% interval and the number of requests it is taken over."""
    if n is None:
        return fmt(point)
    return f"{fmt(point)} {ci_text(ci, 3, 'unbounded')} n={n:,}"


def payback_ci_text(payback_ci: Interval | None, delta_ci: Interval | None) -> str:
    """A payback interval's null high end is 'no payback' when the delta's low end is <= 0, else unknown."""
    d_low = delta_ci[0] if delta_ci else None
    return ci_text(payback_ci, 1, "no payback" if d_low is not None and d_low <= 0 else "unknown")


def decided(r: Report) -> bool:
    return r.headline.decided


def headline_text(r: Report) -> str:
    """The delta / migration / payback sentence, or 'not decided' when the report marks them invalid."""
    if not decided(r):
        return f"Monthly delta, fleet size and payback: **{NOT_DECIDED}** (the evidence they rest on is blocked; see below)."
    delta_ci = ci_text(r.monthly_delta_ci_usd, 2)
    pb_ci = payback_ci_text(r.payback_months_ci, r.monthly_delta_ci_usd)
    return (
        f"Monthly delta (baseline - candidate): {fmt(r.monthly_delta_usd, 2)} USD{' (95% CI ' + delta_ci + ')' if delta_ci else ''}; "
        f"migration cost {fmt(r.migration_cost_usd, 2)} USD; payback {fmt(r.payback_months, 1)} months"
        f"{' (95% CI ' + pb_ci + ')' if pb_ci else ''}; next refresh in {fmt(r.months_to_next_refresh, 1)} months."
    )


def decision_rule_text(r: Report) -> str:
    """The rule every decision follows (analysis.economics.decision.RULE, docs/design.md: Decision), with this report's Go threshold."""
    g = r.decision.go_threshold_usd_per_month
    return f"Rule: {RULE}" + (f" Here the Go threshold is {fmt(g, 2)} USD/month." if g is not None else "")


def to_settle_text(r: Report) -> str | None:
    """What would settle an undecided decision, in requests, minutes and USD (report.json decision.to_settle); None: settled."""
    ts = r.decision.to_settle
    if ts is None:
        return None
    target = (
        f"the Go threshold ({fmt(ts.threshold_usd_per_month, 2)} USD/month: migrate or not)"
        if ts.threshold == "go"
        else "0 (Defer or Reject; Go is ruled out)"
    )
    per = ", ".join(f"{name} {fmt(n)} (now {fmt(ts.by_fleet[name].requests_now)})" for name, n in ts.requests.items())
    return (
        f"To settle it at {target}: {'at least ' if ts.lower_bound else ''}{per} requests at each fleet's capacity boundary; "
        f"{'at least ' if ts.lower_bound else 'about '}{fmt(ts.minutes, 1)} min and {fmt(ts.usd, 2)} USD at the measured rates. "
        f"How: {ts.basis}."
    )


@dataclass(frozen=True)
class FirstScreen:
    """What the top of both pages says: the verdict and why, the delta and the payback with their
    intervals, and what would change the verdict (decision.to_settle), or what blocks the figures."""

    verdict: str  # GO / DEFER / REJECT
    why: str  # one sentence
    lines: list[
        tuple[str, str]
    ]  # (label, text), in order: monthly delta, payback, then what would change it or what blocks it
    others: list[str] = field(default_factory=list)  # the decision's other reasons


CHANGE_LABEL = "What would change the verdict"
BLOCKED_LABEL = "Not decided: blocked by"


def _sentence(text: str) -> str:
    return text if text.endswith((".", ")", "!", "?")) else text + "."


def _why(r: Report) -> tuple[str, str | None]:
    """(one sentence saying why, the reason it stands for), from the decision and the figures it rests on."""
    d, ts = r.decision, r.decision.to_settle
    ci = ci_text(r.monthly_delta_ci_usd, 2)
    h = f"{r.horizon_months:g}"
    if decided(r) and ts is not None and ci:
        stands_for = next((x for x in d.reasons if x.startswith("evidence insufficient")), None)
        if ts.threshold == "go":
            return (
                f"The monthly delta's 95% interval {ci} USD/month straddles the Go threshold "
                f"({fmt(ts.threshold_usd_per_month, 2)} USD/month), so whether the migration pays back inside the {h}-month "
                "horizon is not settled.",
                stands_for,
            )
        return (
            f"Go is ruled out, but the monthly delta's 95% interval {ci} USD/month straddles 0, so whether "
            f"{r.comparison.candidate} is cheaper at all is not settled.",
            stands_for,
        )
    g = d.go_threshold_usd_per_month
    if (
        d.state == "go"
        and decided(r)
        and r.monthly_delta_ci_usd
        and r.monthly_delta_ci_usd[0] is not None
        and g is not None
    ):
        return (
            f"The monthly delta's 95% low end ({fmt(r.monthly_delta_ci_usd[0], 2)} USD/month) is above the Go threshold "
            f"({fmt(g, 2)} USD/month): the migration pays back inside the {h}-month horizon even at the pessimistic end.",
            d.reasons[0] if d.reasons else None,
        )
    if not decided(r):  # the reason that says what is missing, when one does
        first = next((x for x in d.reasons if x.startswith("evidence incomplete")), d.reasons[0] if d.reasons else None)
        return (_sentence(first) if first else ""), first
    return (_sentence(d.reasons[0]), d.reasons[0]) if d.reasons else ("", None)


def _change_text(r: Report) -> str:
    """decision.to_settle in a sentence: the requests per fleet, the minutes and USD, and the threshold they aim at."""
    ts = r.decision.to_settle
    if ts is not None:
        per = " and ".join(
            f"{name} {'no sample size (the point is on the threshold)' if n is None else fmt(n)} "
            f"(now {fmt(ts.by_fleet[name].requests_now)})"
            for name, n in ts.requests.items()
        )
        about = "at least" if ts.lower_bound else "about"
        aim = (
            f"the Go threshold, {fmt(ts.threshold_usd_per_month, 2)} USD/month (migrate or not"
            if ts.threshold == "go"
            else "0 (Defer or Reject; Go is ruled out"
        )
        return (
            f"Measure {'at least ' if ts.lower_bound else ''}{per} requests at each fleet's capacity boundary: {about} "
            f"{fmt(ts.minutes, 1)} min and {fmt(ts.usd, 2)} USD at the measured rates. That settles whether the monthly delta "
            f"clears {aim}; decision.to_settle)."
        )
    if r.stopped_at == "quality_gate":
        return "A quality gate that passes: no load was replayed, so nothing was measured after it."
    if r.monthly_delta_usd is None:
        return "Nothing to measure more of: the monthly delta was not computed (see the reasons)."
    return (
        "No more requests at these inputs: the monthly delta's 95% interval does not straddle the Go threshold or 0. "
        "Other inputs would (see Sensitivity)."
    )


def first_screen(r: Report) -> FirstScreen:
    d = r.decision
    why, stands_for = _why(r)
    others = [x for x in d.reasons if x != stands_for]
    delta_label = f"Monthly delta (baseline {r.comparison.baseline} - candidate {r.comparison.candidate})"
    if not decided(r):  # the other reasons may quote the blocked figures: the Decision section below lists them
        lines = [
            (delta_label, NOT_DECIDED),
            ("Payback", NOT_DECIDED),
            (BLOCKED_LABEL, "; ".join(r.headline.blocked_by) or "n/a"),
        ]
        return FirstScreen(d.state.upper(), why, lines)
    delta_ci = ci_text(r.monthly_delta_ci_usd, 2)
    delta = (
        f"{fmt(r.monthly_delta_usd, 2)} USD/month{', 95% CI ' + delta_ci if delta_ci else ''} "
        f"(> 0: {r.comparison.candidate} saves)"
    )
    pb_ci = payback_ci_text(r.payback_months_ci, r.monthly_delta_ci_usd)
    point = (
        "none (no saving at the point estimate)" if r.payback_months is None else f"{fmt(r.payback_months, 1)} months"
    )
    g = d.go_threshold_usd_per_month
    payback = (
        f"{point}{', 95% CI ' + pb_ci if pb_ci else ''}; horizon {r.horizon_months:g} months, migration cost "
        f"{fmt(r.migration_cost_usd, 2)} USD" + (f", Go threshold {fmt(g, 2)} USD/month" if g is not None else "")
    )
    return FirstScreen(
        d.state.upper(), why, [(delta_label, delta), ("Payback", payback), (CHANGE_LABEL, _change_text(r))], others
    )


def sized_cell(
    r: Report, value: float | int | None, ci: Interval | tuple[int | None, int | None] | None = None, digits: int = 3
) -> str:
    """A figure computed from the fleet size ('not decided' when the headline is blocked), with its interval when known."""
    if not decided(r):
        return NOT_DECIDED
    return f"{fmt(value, digits)} {ci_text(ci, digits) if ci else ''}".strip()


def saturated_cell(f: FleetRow) -> str:
    """yes / NO (not saturated: throughput a lower bound) / n/a."""
    return "n/a" if f.saturated is None else ("yes" if f.saturated else "NO")


def sized_from_capacity(f: FleetRow) -> bool:
    """True when the fleet was sized from a capacity-sweep step that held the SLO (not from the replay)."""
    return bool(f.capacity and f.capacity.step)


def goodput_cell(f: FleetRow) -> str:
    return f"{fmt(f.per_instance_goodput_tok_s, 1)}{' (lower bound)' if f.saturated is False else ''}"


def instances_cell(r: Report, f: FleetRow) -> str:
    """Instances required, '(upper bound)' when sized from an unsaturated replay."""
    upper = decided(r) and f.saturated is False and not sized_from_capacity(f) and f.instances_required is not None
    return sized_cell(r, f.instances_required, f.instances_required_ci) + (" (upper bound)" if upper else "")


def sizing_capacity(f: FleetRow) -> float | None:
    """The per-instance capacity the fleet is sized from (tok/s): the size's own, else the capacity
    step's, else the replay's goodput (evaluate.py sizes from the same, in that order)."""
    if f.size is not None:
        return f.size.per_instance_tok_s
    if f.capacity is not None and f.capacity.per_instance_tok_s:
        return f.capacity.per_instance_tok_s
    return f.per_instance_goodput_tok_s


def sized_from_cell(f: FleetRow) -> str:
    if sized_from_capacity(f):
        assert f.capacity is not None  # sized_from_capacity
        return f"step {f.capacity.step}"
    return "replay (x1)" if f.measure is not None else "n/a"


FLEETS_NOTE = (
    "Each fleet as sized for peak demand: the per-instance capacity it is sized from (the capacity search's chosen step when "
    "one ran, else the trace replay) with its 95% interval; instances and monthly cost with the interval propagated from it. "
    "Saturated: whether the replay a fleet is sized from drove one instance to its batch limit (NO: the capacity is a lower "
    "bound); a capacity step is bounded by the search instead."
)
FLEET_COLUMNS = (
    "fleet",
    "sized from",
    "capacity tok/s per instance",
    "capacity 95% CI tok/s",
    "saturated",
    "instances required",
    "monthly USD",
    "USD per 1M successful tokens",
)


def fleet_row(r: Report, name: str, f: FleetRow) -> tuple[str, ...]:
    """One fleet as sized: never the replay's own figures next to a capacity step's interval."""
    from_step = sized_from_capacity(f)
    cap = fmt(sizing_capacity(f), 1) + (" (lower bound)" if not from_step and f.saturated is False else "")
    return (
        f"{name} ({f.instance_type})",
        sized_from_cell(f),
        cap,
        ci_text(f.capacity_ci_tok_s, 1) or "n/a",
        "n/a (capacity step)" if from_step else saturated_cell(f),
        instances_cell(r, f),
        sized_cell(r, f.monthly_cost_usd, f.monthly_cost_ci_usd, 2),
        sized_cell(r, f.cost_per_million_successful_tokens, None, 4),
    )


def capacity_notes(r: Report) -> list[str]:
    """Per fleet: the step its capacity interval comes from and how its low end was found."""
    return [
        f"{name}: sized from {'the replay' if iv.basis == 'replay' else 'step ' + iv.basis} ({fmt(iv.basis_requests)} requests); "
        f"{iv.capacity_note}"
        for name, f in r.fleets.items()
        if (iv := f.intervals) is not None
    ]


def replay_note(r: Report) -> str:
    if r.stopped_at == "quality_gate":
        return "No load was replayed: the comparison stopped at the quality gate."
    searched = any(sized_from_capacity(f) for f in r.fleets.values())
    sized = (
        "The fleets sized from a capacity step (Fleets above, Capacity sweep below) are not sized from this replay. "
        if searched
        else "The fleets are sized from this replay (Fleets above). "
    )
    return (
        "The trace replayed once at the manifest's rate (x1), every fleet at once: what that run measured. "
        + sized
        + "P95s with their 95% interval (order statistics, distribution-free) and n, the requests each is taken over."
    )


REPLAY_COLUMNS = (
    "fleet",
    "requests",
    "successful",
    "successful tokens",
    "P95 TTFT s",
    "P95 ITL s",
    "error rate",
    "SLO",
    "goodput tok/s per instance",
    "peak in flight / instance",
    "max concurrency",
    "saturated",
    "window s",
    "measured-run USD per 1M",
)


def replay_row(name: str, f: FleetRow) -> tuple[str, ...]:
    run = f.measured_run.cost_per_million_successful_tokens if f.measured_run else None
    return (
        f"{name} ({f.instance_type})",
        fmt(f.requests),
        fmt(f.successful_requests),
        fmt(f.successful_output_tokens),
        p95_cell(f.p95_ttft_s, f.p95_ttft_ci_s, f.p95_ttft_n),
        p95_cell(f.p95_itl_s, f.p95_itl_ci_s, f.p95_itl_n),
        fmt(f.error_rate, 4),
        "pass" if f.slo_pass else "FAIL",
        goodput_cell(f),
        fmt(f.peak_in_flight_per_instance, 1),
        fmt(f.max_concurrency),
        saturated_cell(f),
        fmt(f.measure.window_s if f.measure else None, 1),
        fmt(run, 4),
    )


def chosen(f: FleetRow, s: CapacityStep) -> bool:
    return f.capacity is not None and s.label == f.capacity.step


CAPACITY_COLUMNS = (
    "step",
    "requests",
    "successful",
    "P95 TTFT s",
    "P95 ITL s",
    "error rate",
    "SLO",
    "per-instance goodput tok/s",
    "peak in flight / instance",
    "window s",
    "median request s",
    "steady state",
    "chosen",
)


def capacity_row(f: FleetRow, s: CapacityStep) -> tuple[str, ...]:
    return (
        s.label,
        fmt(s.requests),
        fmt(s.successful_requests),
        p95_cell(s.p95_ttft_s, s.p95_ttft_ci_s, s.p95_ttft_n),
        p95_cell(s.p95_itl_s, s.p95_itl_ci_s, s.p95_itl_n),
        fmt(s.error_rate, 4),
        "pass" if s.slo_pass else "FAIL",
        fmt(s.per_instance_goodput_tok_s, 1),
        fmt(s.peak_in_flight_per_instance, 1),
        fmt(s.window_s, 1),
        fmt(s.median_e2e_s, 1),
        "yes" if s.steady_state else "no",
        "chosen" if chosen(f, s) else "",
    )


def capacity_heading(name: str, f: FleetRow) -> str:
    cap = f.capacity
    where = f" (step {cap.step})" if cap and cap.step else " (no steady-state step held the SLO; sized from the replay)"
    return f"{name}: capacity {fmt(cap.per_instance_tok_s if cap else None, 1)} tok/s per instance{where}"


SEARCH_COLUMNS = (
    "#",
    "step",
    "why",
    "planned span s",
    "arrival span s",
    "requests",
    "rate req/s",
    "median lifetime s",
    "P95 TTFT s",
    "verdict",
    "detail",
)


def search_stop(path: SearchPath) -> str:
    return f"Search stopped ({path.stop_rule}): {path.stop_detail}"


def search_rows(path: SearchPath) -> list[tuple[str, ...]]:
    return [
        (
            str(i),
            s.label,
            s.why,
            fmt(s.planned_span_s, 1),
            fmt(s.arrival_span_s, 1),
            fmt(s.requests),
            fmt(s.rate_req_s, 2),
            fmt(s.median_lifetime_s, 1),
            fmt(s.p95_ttft_s),
            s.verdict,
            s.detail,
        )
        for i, s in enumerate(path.steps, 1)
    ]


PREFIX_CACHE_COLUMNS = (
    "fleet",
    "stack",
    "prefix caching",
    "server hit rate",
    "TTFT P50 / P95 hit (n)",
    "TTFT P50 / P95 miss (n)",
)


def prefix_cache_rows(pc: PrefixCache) -> list[tuple[str, ...]]:
    """Per fleet, cached and uncached side by side, never pooled: TTFT split by shared-prefix hit / miss."""
    out = []
    for name, f in pc.fleets.items():
        split = f.ttft_by_prefix or {}
        cells = []
        for kind in ("hit", "miss"):
            x = split.get(kind)
            cells.append(f"{fmt(x.ttft_p50_s)} / {fmt(x.ttft_p95_s)} s ({x.requests})" if x else "-")
        rate = "-" if f.server_hit_rate is None else f"{f.server_hit_rate:.1%}"
        out.append((name, f.stack, f.caching, rate, *cells))
    return out


def quality_row(name: str, q: QualityResult) -> tuple[str, str, str]:
    """(fleet, verdict with pass rate, failures)."""
    rate = f" ({q.pass_rate:.0%} of fixtures)" if q.pass_rate is not None else ""
    verdict = "not evaluated" if q.passed is None else ("pass" if q.passed else "FAIL")
    return name, verdict + rate, "; ".join(q.failures) or "none"


QUALITY_LAYER_COLUMNS = ("fleet", "layer", "result", "figures", "reasons")


def _figures_text(figures: dict[str, Any]) -> str:
    """'k v, k v', a nested mapping in parentheses (a KS test's figures: against, p-value, n, m)."""
    return ", ".join(
        f"{k} ({_figures_text(v)})" if isinstance(v, dict) else f"{k} {fmt(v)}" for k, v in figures.items()
    )


def quality_layer_rows(name: str, q: QualityResult) -> list[tuple[str, str, str, str, str]]:
    """One row per layer the gate evaluated (fixtures, equivalence, task acceptance, distribution...)."""
    return [
        (
            name,
            layer,
            "not evaluated" if x.passed is None else ("pass" if x.passed else "FAIL"),
            _figures_text(x.figures),
            "; ".join(x.reasons) or "none",
        )
        for layer, x in (q.layers or {}).items()
    ]


SENSITIVITY_COLUMNS = ("cell", "decision", "monthly delta USD (95% CI)", "payback months (95% CI)", "reasons")


def _reasons_against_base(cell: list[str], base: list[str]) -> str:
    """A cell's reasons as what differs from the base cell's: the grid repeats the base's reasons
    in every cell, which buries the one a cell changes (report.json keeps them all)."""
    more = [x for x in cell if x not in base]
    fewer = [x for x in base if x not in cell]
    if len(more) == len(cell):  # nothing in common with the base: the cell's own reasons, whole
        return "; ".join(cell)
    return "as base" + (f", but: {'; '.join(more)}" if more else "") + (f"; not: {'; '.join(fewer)}" if fewer else "")


def sensitivity_rows(sens: Sensitivity, decided: bool) -> list[tuple[str, str, str, str, str]]:
    """(cell, decision, delta with CI, payback with CI, reasons) for the base and every cell. When
    the headline is not decided, the cells' figures rest on the same blocked evidence: none shown."""

    def figures(c: CellSummary) -> tuple[str, str]:
        if not decided:
            return NOT_DECIDED, NOT_DECIDED
        return (
            f"{fmt(c.monthly_delta_usd, 2)} {ci_text(c.monthly_delta_ci_usd, 2)}".strip(),
            f"{fmt(c.payback_months, 1)} {payback_ci_text(c.payback_months_ci, c.monthly_delta_ci_usd)}".strip(),
        )

    rows = [("base (manifest)", sens.base.decision, *figures(sens.base), "; ".join(sens.base.reasons))]
    rows += [
        (c.label, c.decision, *figures(c), _reasons_against_base(c.reasons, sens.base.reasons)) for c in sens.cells
    ]
    return rows


def outcome_row(name: str, f: FleetRow) -> tuple[str, str, str] | None:
    """(fleet, outcome counts, ITL basis counts), None for a fleet without records."""
    if not f.outcomes:
        return None
    basis = ", ".join(f"{k} {v}" for k, v in (f.itl_basis or {}).items()) or "none"
    return name, ", ".join(f"{k} {v}" for k, v in f.outcomes.items()), basis


def placement_lines(r: Report) -> list[str]:
    """Per fleet: its size by role and AZ, and its monthly cost lines; when the headline is not
    decided the size and the costs rest on the blocked evidence, so neither is printed."""
    lines = []
    for name, f in r.fleets.items():
        if not decided(r):
            if f.size or f.monthly_cost:
                lines.append(f"{name}: {NOT_DECIDED} (the fleet size rests on the blocked evidence)")
            continue
        if f.size:
            s = f.size
            per_az = ", ".join(f"{az} {n}" for az, n in s.per_az.items())
            lines.append(
                f"{name}: {s.busy_instances} busy + {s.headroom_instances} headroom + {s.redundancy_instances} "
                f"redundancy + {s.asg_min_topup} ASG-min = {s.required} ({per_az})"
            )
        if f.monthly_cost:
            parts = ", ".join(f"{k} {fmt(v, 2)}" for k, v in f.monthly_cost.lines_usd().items())
            lines.append(f"{name} monthly USD: {parts} ({f.monthly_cost.compute_note})")
    return lines


def ledger_rows(r: Report) -> list[tuple[str, str]]:
    """(item, USD) for the migration ledger and its total; the items priced from the fleets'
    monthly costs, and so the total, are 'not decided' when the headline is."""
    if r.migration is None:
        return []
    blocked = not decided(r)
    rows = [
        (k, NOT_DECIDED if blocked and k in FLEET_COST_ITEMS else fmt(v, 2)) for k, v in r.migration.items_usd.items()
    ]
    return [*rows, ("total", NOT_DECIDED if blocked else fmt(r.migration.total_usd, 2))]


BILLING_COLUMNS = ("figure", "USD", "source", "date", "covers")
BILLING_NOTE = (
    "The campaign's cost three ways: what the plan predicted, unit prices x the instance-hours this run "
    "measured, and what the bill says. They cover different spans (each row says which), so they differ."
)


def billing_rows(b: Billing) -> list[tuple[str, ...]]:
    """One row per figure present: planned, computed, billed; an unavailable one says why."""
    named: list[tuple[str, CampaignCost | None]] = [("planned", b.plan), ("computed", b.computed), ("billed", b.billed)]
    return [
        (
            label,
            "unavailable" if c.usd is None else fmt(c.usd, 2),
            c.source,
            c.date or "n/a",
            c.covers if c.unavailable is None else f"unavailable: {c.unavailable}",
        )
        for label, c in named
        if c is not None
    ]


SERVER_STEP_COLUMNS = (
    "fleet",
    "step",
    "window s",
    "server P95 TTFT s",
    "client P95 TTFT s",
    "TTFT gap s",
    "server P95 ITL s",
    "client P95 ITL s",
    "ITL gap s",
    "server truth",
)


def no_histograms_text(prom: PrometheusSection | None) -> str:
    """The sentence where the replay window's histograms would be."""
    if prom is not None and prom.steps:
        return (
            "Histograms over the replay window: not queried for this report (the server truth per step below comes "
            "from the run's saved series); every percentile above comes from the raw records."
        )
    return "Histograms: no Prometheus source; every percentile above comes from the raw records."


def server_steps_intro(prom: PrometheusSection) -> str:
    return (
        f"Server truth per step (the server's own histograms, pulled from {prom.url} at the end of the run and kept in "
        "the run directory's metrics/: buckets summed across instances, sum by (le) of increase over each step's "
        "window, first send to last completion); gap = client P95 - server P95, read at the server bucket its P95 "
        "lies in (within bucket: the client's P95 lies in it too, and the two agree within its resolution):"
    )


def _bound(v: float | None, unbounded: str) -> str:
    return unbounded if v is None else f"{v:g}"


def bucket_text(bucket: Bounds) -> str:
    """'0.1-0.25': a histogram bucket's bounds, seconds; '1-+Inf' for the +Inf bucket."""
    return f"{_bound(bucket[0], '-Inf')}-{_bound(bucket[1], '+Inf')}"


def gap_cell(gap: float | None, records: float | None, bucket: Bounds | None, digits: int = 3) -> str:
    """A P95 gap as report.json gives it, with the histogram bucket it is read at: 'within bucket
    0.1-0.25' where the report gives no figure because the records' P95 lies inside that bucket,
    else the signed figure and its bucket; without a bucket (no histogram P95, or a report before
    2.3) the figure alone."""
    if bucket is None:
        return fmt(gap, digits)
    if gap is None:
        return f"within bucket {bucket_text(bucket)}" if records is not None else "n/a"
    return f"{fmt(gap, digits)} (bucket {bucket_text(bucket)})"


def server_step_rows(prom: PrometheusSection) -> list[tuple[str, ...]]:
    """One row per fleet and step; a step without a figure says why (too short, a target down)."""
    return [
        (
            fleet,
            st.label,
            fmt(st.window_s, 1),
            fmt(st.p95_ttft_s),
            fmt(st.client_p95_ttft_s),
            gap_cell(st.ttft_gap_s, st.client_p95_ttft_s, st.ttft_bucket_s),
            fmt(st.p95_itl_s, 4),
            fmt(st.client_p95_itl_s, 4),
            gap_cell(st.itl_gap_s, st.client_p95_itl_s, st.itl_bucket_s, 4),
            st.source if st.status == "ok" else st.note,
        )
        for fleet, steps in (prom.steps or {}).items()
        for st in steps
    ]
