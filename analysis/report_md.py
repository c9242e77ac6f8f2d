"""report.md: the decision first, then the per-fleet table, gaps and where every input came from."""

from __future__ import annotations

from typing import Any

from analysis.report_model import Report


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


def payback_ci_text(r: dict[str, Any]) -> str:
    """A payback interval's null high end is 'no payback' when the delta's low end is <= 0, else unknown."""
    d_low = (r.get("monthly_delta_ci_usd") or [None])[0]
    return ci_text(r.get("payback_months_ci"), 1, "no payback" if d_low is not None and d_low <= 0 else "unknown")


def p95_cell(f: dict[str, Any], what: str) -> str:
    """P95 with its 95% interval and the number of requests it is taken over."""
    point = f.get(f"p95_{what}_s")
    n = f.get(f"p95_{what}_n")
    if n is None:
        return fmt(point)
    return f"{fmt(point)} {ci_text(f.get(f'p95_{what}_ci_s'), 3, 'unbounded')} n={n:,}"


NOT_DECIDED = "not decided"


def headline_text(r: dict[str, Any]) -> str:
    """The delta / migration / payback sentence, or 'not decided' when the report marks them invalid."""
    h = r.get("headline") or {}
    if h and not h.get("decided", True):
        return f"Monthly delta, fleet size and payback: **{NOT_DECIDED}** (the evidence they rest on is blocked; see below)."
    delta_ci = ci_text(r.get("monthly_delta_ci_usd"), 2)
    pb_ci = payback_ci_text(r)
    return (f"Monthly delta (baseline - candidate): {fmt(r['monthly_delta_usd'], 2)} USD{' (95% CI ' + delta_ci + ')' if delta_ci else ''}; "
            f"migration cost {fmt(r['migration_cost_usd'], 2)} USD; payback {fmt(r['payback_months'], 1)} months"
            f"{' (95% CI ' + pb_ci + ')' if pb_ci else ''}; next refresh in {fmt(r['months_to_next_refresh'], 1)} months.")


def decided(r: dict[str, Any]) -> bool:
    return bool((r.get("headline") or {}).get("decided", True))


def sized_cell(r: dict[str, Any], f: dict[str, Any], key: str, digits: int = 3) -> str:
    """A figure computed from the fleet size ('not decided' when the headline is blocked), with its interval when known."""
    if not decided(r):
        return NOT_DECIDED
    ci = {"instances_required": "instances_required_ci", "monthly_cost_usd": "monthly_cost_ci_usd"}.get(key)
    text = fmt(f.get(key), digits)
    interval = ci_text(f.get(ci), digits) if ci and f.get(ci) else ""
    return f"{text} {interval}".strip()


def saturated_cell(f: dict[str, Any]) -> str:
    """yes / NO (not saturated: throughput a lower bound) / n/a."""
    sat = f.get("saturated")
    return "n/a" if sat is None else ("yes" if sat else "NO")


def _bound(f: dict[str, Any]) -> str:
    return " (lower bound)" if f.get("saturated") is False else ""


def sized_from_capacity(f: dict[str, Any]) -> bool:
    """True when the fleet was sized from a capacity-sweep step that held the SLO (not from the replay)."""
    return bool((f.get("capacity") or {}).get("step"))


def _upper(f: dict[str, Any]) -> str:
    if sized_from_capacity(f):
        return ""
    return " (upper bound)" if f.get("saturated") is False and f.get("instances_required") is not None else ""


def capacity_rows(f: dict[str, Any]) -> list[dict[str, Any]]:
    """The capacity-sweep steps of one fleet (empty without a sweep), each with `chosen`."""
    cap = f.get("capacity")
    if not cap:
        return []
    return [{**s, "chosen": s["label"] == cap.get("step")} for s in cap["steps"]]


SEARCH_COLUMNS = ("#", "step", "why", "planned span s", "arrival span s", "requests", "rate req/s", "median lifetime s",
                  "P95 TTFT s", "verdict", "detail")


def search_rows(f: dict[str, Any]) -> tuple[str, list[list[str]]]:
    """The automatic capacity search's path of one fleet ('' and [] without one): the stop line and one row per step."""
    path = (f.get("capacity") or {}).get("search")
    if not path:
        return "", []
    stop = f"Search stopped ({path['stop_rule']}): {path['stop_detail']}"
    rows = [[str(i), s["label"], s["why"], fmt(s["planned_span_s"], 1), fmt(s.get("arrival_span_s"), 1), fmt(s["requests"]),
             fmt(s.get("rate_req_s"), 2), fmt(s.get("median_lifetime_s"), 1), fmt(s.get("p95_ttft_s")), s["verdict"], s["detail"]]
            for i, s in enumerate(path["steps"], 1)]
    return stop, rows


def _capacity_lines(r: dict[str, Any]) -> list[str]:
    fleets = {n: f for n, f in r["fleets"].items() if capacity_rows(f)}
    if not fleets:
        return []
    out = ["", "## Capacity sweep", "",
           "Each step replays the trace's requests at a multiple of the manifest's rate; a fleet's per-instance capacity is the "
           "highest per-instance SLO-compliant goodput among the steps that held the fleet SLO and lasted at least three median "
           "request lifetimes (steady state) (chosen: **bold**)."]
    for name, f in fleets.items():
        cap = f["capacity"]
        out += ["", f"### {name}: capacity {fmt(cap.get('per_instance_tok_s'), 1)} tok/s per instance"
                f"{' (step ' + str(cap['step']) + ')' if cap.get('step') else ' (no steady-state step held the SLO; sized from the replay)'}", "",
                "| step | requests | successful | P95 TTFT s | P95 ITL s | error rate | SLO | per-instance goodput tok/s "
                "| peak in flight / instance | window s | median request s | steady state | chosen |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in capacity_rows(f):
            label = f"**{s['label']}**" if s["chosen"] else s["label"]
            out.append(f"| {label} | {fmt(s['requests'])} | {fmt(s['successful_requests'])} | {p95_cell(s, 'ttft')} "
                       f"| {p95_cell(s, 'itl')} | {fmt(s['error_rate'], 4)} | {'pass' if s['slo_pass'] else 'FAIL'} "
                       f"| {fmt(s['per_instance_goodput_tok_s'], 1)} | {fmt(s['peak_in_flight_per_instance'], 1)} "
                       f"| {fmt(s.get('window_s'), 1)} | {fmt(s.get('median_e2e_s'), 1)} | {'yes' if s.get('steady_state') else 'no'} "
                       f"| {'chosen' if s['chosen'] else ''} |")
        stop, rows = search_rows(f)
        if rows:
            out += ["", stop, "", "| " + " | ".join(SEARCH_COLUMNS) + " |", "|" + "---|" * len(SEARCH_COLUMNS)]
            out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return out


def _histogram_lines(prom: dict[str, Any] | None) -> list[str]:
    """P95 from merged Prometheus histograms next to P95 from raw records, with the difference."""
    if not prom or not prom.get("fleets"):
        return ["", "Histograms: no Prometheus source; every percentile above comes from the raw records."]
    out = [
        "",
        f"Histograms from Prometheus ({prom.get('url')}), buckets summed across replicas before the quantile:",
        "",
        "| fleet | histogram | metric | P95 s (merged histogram) | P95 s (records) | difference s |",
        "|---|---|---|---|---|---|",
    ]
    for fleet, series in prom["fleets"].items():
        for key, h in series.items():
            if isinstance(h, dict) and "metric" in h:
                metric = f"`{h['metric']}`" if h["metric"] else f"none: {h.get('note', 'not exported')}"
                out.append(
                    f"| {fleet} | {key} | {metric} | {fmt(h.get('p95_s_merged_histogram'))} "
                    f"| {fmt(h.get('p95_s_records'))} | {fmt(h.get('difference_s'))} |"
                )
    return out


PREFIX_CACHE_COLUMNS = ("fleet", "stack", "prefix caching", "server hit rate", "TTFT P50 / P95 hit (n)", "TTFT P50 / P95 miss (n)")


def prefix_cache_rows(pc: dict[str, Any]) -> list[tuple[str, ...]]:
    """Per fleet, cached and uncached side by side, never pooled: TTFT split by shared-prefix hit / miss."""
    out: list[tuple[str, ...]] = []
    for name, f in pc["fleets"].items():
        split = f.get("ttft_by_prefix") or {}
        cells = []
        for kind in ("hit", "miss"):
            x = split.get(kind)
            cells.append(f"{fmt(x['ttft_p50_s'])} / {fmt(x['ttft_p95_s'])} s ({x['requests']})" if x else "-")
        rate = f.get("server_hit_rate")
        out.append((name, f["stack"], f["caching"], "-" if rate is None else f"{rate:.1%}", *cells))
    return out


def prefix_cache_lines(pc: dict[str, Any] | None) -> list[str]:
    if not pc:
        return []
    lines = ["## Prefix cache", "", pc["trace"] + ".", "", "| " + " | ".join(PREFIX_CACHE_COLUMNS) + " |", "|---" * len(PREFIX_CACHE_COLUMNS) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in prefix_cache_rows(pc)]
    return [*lines, "", pc["note"] + ".", ""]


def quality_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(fleet, verdict with pass rate, failures) per fleet that has quality-gate results."""
    rows = []
    for name, q in (r.get("quality") or {}).items():
        if not isinstance(q, dict):
            continue
        rate = q.get("pass_rate")
        verdict = ("pass" if q.get("passed") else "FAIL") + (f" ({rate:.0%} of fixtures)" if isinstance(rate, int | float) else "")
        rows.append((name, verdict, "; ".join(str(x) for x in q.get("failures") or []) or "none"))
    return rows


def _quality_lines(r: dict[str, Any]) -> list[str]:
    rows = quality_rows(r)
    if not rows:
        return ["", "## Quality gate", "", "No quality-gate results were given."]
    return ["", "## Quality gate", "", "| fleet | gate | failures |", "|---|---|---|",
            *(f"| {n} | {v} | {f} |" for n, v, f in rows)]


def _blocked_lines(r: dict[str, Any]) -> list[str]:
    h = r.get("headline") or {}
    if h.get("decided", True):
        return []
    return ["", "Blocked by:", "", *(f"- {x}" for x in h.get("blocked_by", []))]


def sensitivity_rows(sens: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(cell, decision, delta with CI, payback with CI, reasons) for the base and every cell."""
    def row(label: str, c: dict[str, Any]) -> tuple[str, str, str, str, str]:
        delta = f"{fmt(c['monthly_delta_usd'], 2)} {ci_text(c.get('monthly_delta_ci_usd'), 2)}".strip()
        payback = f"{fmt(c['payback_months'], 1)} {payback_ci_text(c)}".strip()
        return label, str(c["decision"]), delta, payback, "; ".join(c.get("reasons") or [])

    return [row("base (manifest)", sens["base"]), *(row(c["label"], c) for c in sens["cells"])]


OUTCOMES_NOTE = (
    "Outcomes of the non-warmup requests (`no_text`: the server reported output tokens but no chunk carried text; "
    "not a success, its cost stays in the numerator). "
    "ITL basis: `server_tokens` = (last - first token arrival) / (server output tokens - 1), "
    "`chunks` = mean gap between content chunks where the server reported no usage."
)


def outcome_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(fleet, outcome counts, ITL basis counts) for every fleet with records."""
    rows = []
    for name, f in r["fleets"].items():
        if f.get("outcomes"):
            outcomes = ", ".join(f"{k} {v}" for k, v in f["outcomes"].items())
            basis = ", ".join(f"{k} {v}" for k, v in (f.get("itl_basis") or {}).items()) or "none"
            rows.append((name, outcomes, basis))
    return rows


def _outcome_lines(r: dict[str, Any]) -> list[str]:
    rows = outcome_rows(r)
    if not rows:
        return []
    return ["", OUTCOMES_NOTE, "", *(f"- {name}: {outcomes}; ITL basis: {basis}" for name, outcomes, basis in rows)]


def render_markdown(model: Report) -> str:
    r = model.model_dump(mode="json")
    d = r["decision"]
    lines = [
        f"# {r['campaign']}: {d['state'].upper()}",
        "",
        f"manifest digest `{r['manifest_digest']}`, generated {r['generated_at']}; "
        f"baseline **{r['comparison']['baseline']}**, candidate **{r['comparison']['candidate']}**.",
        "",
        *([f"> {r['systems_under_test']}", ""] if r.get("systems_under_test") else []),
        "## Decision",
        "",
        *(f"- {reason}" for reason in d["reasons"]),
        "",
        headline_text(r),
        *_blocked_lines(r),
        "",
        "## Fleets",
        "",
        "P95s with their 95% interval (order statistics, distribution-free) and n, the requests each is taken over; "
        "instances and monthly cost with the interval propagated from the capacity's.",
        "",
        "| fleet | requests | successful | successful tokens | P95 TTFT s | P95 ITL s | SLO | per-instance goodput tok/s "
        "| capacity 95% CI tok/s | peak in flight / instance | max concurrency | saturated "
        "| instances required | monthly USD | USD per 1M successful tokens | measured-run USD per 1M |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in r["fleets"].items():
        run = (f.get("measured_run") or {}).get("cost_per_million_successful_tokens")
        lines.append(
            f"| {name} ({f['instance_type']}) | {fmt(f['requests'])} | {fmt(f['successful_requests'])} | {fmt(f['successful_output_tokens'])} "
            f"| {p95_cell(f, 'ttft')} | {p95_cell(f, 'itl')} | {'pass' if f['slo_pass'] else 'FAIL'} "
            f"| {fmt(f.get('per_instance_goodput_tok_s'), 1)}{_bound(f)} | {ci_text(f.get('capacity_ci_tok_s'), 1) or 'n/a'} "
            f"| {fmt(f.get('peak_in_flight_per_instance'), 1)} "
            f"| {fmt(f.get('max_concurrency'))} | {saturated_cell(f)} | {sized_cell(r, f, 'instances_required')}{_upper(f) if decided(r) else ''} "
            f"| {sized_cell(r, f, 'monthly_cost_usd', 2)} "
            f"| {sized_cell(r, f, 'cost_per_million_successful_tokens', 4)} | {fmt(run, 4)} |"
        )
    lines += _outcome_lines(r)
    lines += _quality_lines(r)
    lines += _capacity_lines(r)
    lines += _histogram_lines(r.get("prometheus"))
    lines += prefix_cache_lines(r.get("prefix_cache"))
    lines += ["", "Per-AZ placement and cost lines:", ""]
    for name, f in r["fleets"].items():
        size, mc = f.get("size"), f.get("monthly_cost")
        if size:
            lines.append(f"- {name}: {size['busy_instances']} busy + {size['headroom_instances']} headroom + "
                         f"{size['redundancy_instances']} redundancy + {size['asg_min_topup']} ASG-min = {size['required']} {size['per_az']}")
        if mc:
            parts = ", ".join(f"{k.removesuffix('_usd')} {fmt(v, 2)}" for k, v in mc.items() if k.endswith("_usd"))
            lines.append(f"  - monthly USD: {parts} ({mc['compute_note']})")
    if r.get("migration"):
        lines += ["", "## Migration ledger", ""]
        lines += [f"- {k}: {fmt(v, 2)} USD" for k, v in r["migration"]["items_usd"].items()]
    if r.get("time_to_ready"):
        lines += ["", "Time to ready (measured in the cloud run: instance launch -> first healthy target, minute resolution):", ""]
        lines += [f"- {name}: {fmt(t['seconds'] / 60, 1)} min ({t['instances_launched']} instance(s) launched)"
                  for name, t in r["time_to_ready"].items()]
    sens = r.get("sensitivity")
    if sens:
        lines += ["", "## Sensitivity (one input at a time)", "",
                  "| cell | decision | monthly delta USD (95% CI) | payback months (95% CI) | reasons |", "|---|---|---|---|---|"]
        lines += [f"| {label} | {d} | {delta} | {payback} | {why} |" for label, d, delta, payback, why in sensitivity_rows(sens)]
    lines += ["", "## Gaps", ""]
    lines += [f"- {g['what']}: {g['reason']}{' (blocks Go)' if g['blocks_go'] else ''}" for g in r["gaps"]] or ["- none"]
    lines += ["", "## Provenance", ""]
    for k, p in r["provenance"].items():
        lines.append(f"- {k}: {p.get('source')} - {p.get('detail')}")
    return "\n".join(lines) + "\n"
