"""The report's sentences and table cells, read from the typed model (analysis.report_model).

report.html builds every table and sentence from these; their text is report.md's, word for
word (tests/analysis/test_report_html.py compares the two pages cell by cell)."""

from __future__ import annotations

from typing import Any

from analysis.decision import RULE
from analysis.ledger import FLEET_COST_ITEMS
from analysis.report_model import (
    CapacityStep,
    CellSummary,
    FleetRow,
    Interval,
    PrefixCache,
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
    return (f"Monthly delta (baseline - candidate): {fmt(r.monthly_delta_usd, 2)} USD{' (95% CI ' + delta_ci + ')' if delta_ci else ''}; "
            f"migration cost {fmt(r.migration_cost_usd, 2)} USD; payback {fmt(r.payback_months, 1)} months"
            f"{' (95% CI ' + pb_ci + ')' if pb_ci else ''}; next refresh in {fmt(r.months_to_next_refresh, 1)} months.")


def decision_rule_text(r: Report) -> str:
    """The rule every decision follows (analysis.decision.RULE, DESIGN.md: Decision), with this report's Go threshold."""
    g = r.decision.go_threshold_usd_per_month
    return f"Rule: {RULE}" + (f" Here the Go threshold is {fmt(g, 2)} USD/month." if g is not None else "")


def to_settle_text(r: Report) -> str | None:
    """What would settle an undecided decision, in requests, minutes and USD (report.json decision.to_settle); None: settled."""
    ts = r.decision.to_settle
    if ts is None:
        return None
    target = (f"the Go threshold ({fmt(ts.threshold_usd_per_month, 2)} USD/month: migrate or not)" if ts.threshold == "go"
              else "0 (Defer or Reject; Go is ruled out)")
    per = ", ".join(f"{name} {fmt(n)} (now {fmt(ts.by_fleet[name].requests_now)})" for name, n in ts.requests.items())
    return (f"To settle it at {target}: {'at least ' if ts.lower_bound else ''}{per} requests at each fleet's capacity boundary; "
            f"{'at least ' if ts.lower_bound else 'about '}{fmt(ts.minutes, 1)} min and {fmt(ts.usd, 2)} USD at the measured rates. "
            f"How: {ts.basis}.")


def sized_cell(r: Report, value: float | int | None, ci: Interval | tuple[int | None, int | None] | None = None, digits: int = 3) -> str:
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


def chosen(f: FleetRow, s: CapacityStep) -> bool:
    return f.capacity is not None and s.label == f.capacity.step


CAPACITY_COLUMNS = ("step", "requests", "successful", "P95 TTFT s", "P95 ITL s", "error rate", "SLO", "per-instance goodput tok/s",
                    "peak in flight / instance", "window s", "median request s", "steady state", "chosen")


def capacity_row(f: FleetRow, s: CapacityStep) -> tuple[str, ...]:
    return (s.label, fmt(s.requests), fmt(s.successful_requests), p95_cell(s.p95_ttft_s, s.p95_ttft_ci_s, s.p95_ttft_n),
            p95_cell(s.p95_itl_s, s.p95_itl_ci_s, s.p95_itl_n), fmt(s.error_rate, 4), "pass" if s.slo_pass else "FAIL",
            fmt(s.per_instance_goodput_tok_s, 1), fmt(s.peak_in_flight_per_instance, 1), fmt(s.window_s, 1), fmt(s.median_e2e_s, 1),
            "yes" if s.steady_state else "no", "chosen" if chosen(f, s) else "")


def capacity_heading(name: str, f: FleetRow) -> str:
    cap = f.capacity
    where = f" (step {cap.step})" if cap and cap.step else " (no steady-state step held the SLO; sized from the replay)"
    return f"{name}: capacity {fmt(cap.per_instance_tok_s if cap else None, 1)} tok/s per instance{where}"


SEARCH_COLUMNS = ("#", "step", "why", "planned span s", "arrival span s", "requests", "rate req/s", "median lifetime s",
                  "P95 TTFT s", "verdict", "detail")


def search_stop(path: SearchPath) -> str:
    return f"Search stopped ({path.stop_rule}): {path.stop_detail}"


def search_rows(path: SearchPath) -> list[tuple[str, ...]]:
    return [(str(i), s.label, s.why, fmt(s.planned_span_s, 1), fmt(s.arrival_span_s, 1), fmt(s.requests), fmt(s.rate_req_s, 2),
             fmt(s.median_lifetime_s, 1), fmt(s.p95_ttft_s), s.verdict, s.detail) for i, s in enumerate(path.steps, 1)]


PREFIX_CACHE_COLUMNS = ("fleet", "stack", "prefix caching", "server hit rate", "TTFT P50 / P95 hit (n)", "TTFT P50 / P95 miss (n)")


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
    return ", ".join(f"{k} ({_figures_text(v)})" if isinstance(v, dict) else f"{k} {fmt(v)}" for k, v in figures.items())


def quality_layer_rows(name: str, q: QualityResult) -> list[tuple[str, str, str, str, str]]:
    """One row per layer the gate evaluated (fixtures, equivalence, task acceptance, distribution...)."""
    return [(name, layer, "not evaluated" if x.passed is None else ("pass" if x.passed else "FAIL"),
             _figures_text(x.figures), "; ".join(x.reasons) or "none")
            for layer, x in (q.layers or {}).items()]


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
        return (f"{fmt(c.monthly_delta_usd, 2)} {ci_text(c.monthly_delta_ci_usd, 2)}".strip(),
                f"{fmt(c.payback_months, 1)} {payback_ci_text(c.payback_months_ci, c.monthly_delta_ci_usd)}".strip())

    rows = [("base (manifest)", sens.base.decision, *figures(sens.base), "; ".join(sens.base.reasons))]
    rows += [(c.label, c.decision, *figures(c), _reasons_against_base(c.reasons, sens.base.reasons)) for c in sens.cells]
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
            lines.append(f"{name}: {s.busy_instances} busy + {s.headroom_instances} headroom + {s.redundancy_instances} "
                         f"redundancy + {s.asg_min_topup} ASG-min = {s.required} ({per_az})")
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
    rows = [(k, NOT_DECIDED if blocked and k in FLEET_COST_ITEMS else fmt(v, 2)) for k, v in r.migration.items_usd.items()]
    return [*rows, ("total", NOT_DECIDED if blocked else fmt(r.migration.total_usd, 2))]
