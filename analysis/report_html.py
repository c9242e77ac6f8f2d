"""report.html: one self-contained page (inline SVG from analysis.plots, no scripts, no network).

It holds every section of report.md, in the same order and under the same headings, with each
figure placed in the section it illustrates and captioned with where its numbers came from."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

from analysis import plots
from analysis.cost import cost_per_million
from analysis.ledger import payback_curve
from analysis.report_md import (
    OUTCOMES_NOTE,
    PREFIX_CACHE_COLUMNS,
    SEARCH_COLUMNS,
    capacity_rows,
    ci_text,
    decided,
    fmt,
    headline_text,
    outcome_rows,
    p95_cell,
    prefix_cache_rows,
    quality_rows,
    saturated_cell,
    search_rows,
    sensitivity_rows,
    sized_cell,
    sized_from_capacity,
)
from analysis.report_model import Report

MEASURED_RECORDS = "per-request loadgen records, non-warmup, exact quantiles (measured)"
CDF_MARKS = "band and whisker at 95%: each fleet's P95 with its 95% interval (order statistics); dashed: the SLO's P95 target"


def _inline(text: str) -> str:
    """Escape, then the two Markdown marks the shared sentences use: **bold** and `code`."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], bold: Sequence[bool] = ()) -> str:
    th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = []
    for i, row in enumerate(rows):
        style = ' style="font-weight:bold"' if i < len(bold) and bold[i] else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>"


def _figure(svg: str, source: str, extra: str = "") -> str:
    return f'<figure>{svg}<figcaption>Source: {html.escape(source)}{extra}</figcaption></figure>'


def _fleets_table(r: dict[str, Any]) -> str:
    head = ("fleet", "requests", "successful", "successful tokens", "P95 TTFT s", "P95 ITL s", "SLO", "per-instance goodput tok/s",
            "capacity 95% CI tok/s", "peak in flight / instance", "max concurrency", "saturated", "instances required", "monthly USD",
            "USD per 1M successful tokens", "measured-run USD per 1M")
    rows = []
    for name, f in r["fleets"].items():
        run = (f.get("measured_run") or {}).get("cost_per_million_successful_tokens")
        bound = " (lower bound)" if f.get("saturated") is False else ""
        upper = " (upper bound)" if (decided(r) and f.get("saturated") is False and not sized_from_capacity(f)
                                      and f.get("instances_required") is not None) else ""
        rows.append((
            f"{name} ({f['instance_type']})", fmt(f["requests"]), fmt(f["successful_requests"]), fmt(f["successful_output_tokens"]),
            p95_cell(f, "ttft"), p95_cell(f, "itl"), "pass" if f["slo_pass"] else "FAIL",
            f"{fmt(f.get('per_instance_goodput_tok_s'), 1)}{bound}", ci_text(f.get("capacity_ci_tok_s"), 1) or "n/a",
            fmt(f.get("peak_in_flight_per_instance"), 1), fmt(f.get("max_concurrency")), saturated_cell(f),
            f"{sized_cell(r, f, 'instances_required')}{upper}", sized_cell(r, f, "monthly_cost_usd", 2),
            sized_cell(r, f, "cost_per_million_successful_tokens", 4), fmt(run, 4),
        ))
    return _table(head, rows)


def _outcomes(r: dict[str, Any]) -> str:
    rows = outcome_rows(r)
    if not rows:
        return ""
    return f"<p>{_inline(OUTCOMES_NOTE)}</p>" + _table(("fleet", "requests by outcome", "ITL basis"), rows)


def _latency_figures(r: dict[str, Any]) -> list[str]:
    fs = (r.get("series") or {}).get("fleets") or {}
    if not fs:
        return []
    out = []
    for key, what, slo in (("ttft", "TTFT (s, from scheduled send)", r["slo"]["ttft_p95_s"]),
                           ("itl", "ITL (s, mean gap per request)", r["slo"]["itl_p95_s"])):
        cdfs = [plots.LatencyCdf(n, [tuple(p) for p in s.get(f"{key}_cdf") or []], r["fleets"][n].get(f"p95_{key}_s"),
                                 _interval(r["fleets"][n].get(f"p95_{key}_ci_s"))) for n, s in fs.items()]
        out.append(_figure(plots.latency_cdf(f"{key.upper()} CDF per fleet", what, cdfs, slo),
                           f"{MEASURED_RECORDS}; {CDF_MARKS}"))
    series = [plots.FleetSeries(n, [tuple(p) for p in s["goodput"]]) for n, s in fs.items() if s.get("goodput")]
    if series:
        out.append(_figure(plots.goodput_over_time("Goodput over time", series),
                           "per-request records: ok, quality ok and per-request SLO met, binned by completion time (measured)"))
    return out


def _interval(ci: Any) -> plots.Interval | None:
    return (ci[0], ci[1]) if ci else None


def _per_million(monthly_usd: float | None, monthly_tokens: float) -> float | None:
    return None if monthly_usd is None else cost_per_million(monthly_usd, monthly_tokens)


def _cost_figure(r: dict[str, Any]) -> str:
    """Cost per 1M successful tokens; its interval is the monthly cost's over the same monthly tokens."""
    if not decided(r):
        return ""
    bars = []
    for n, f in r["fleets"].items():
        v, tokens = f.get("cost_per_million_successful_tokens"), f.get("monthly_successful_tokens")
        if v is None:
            continue
        ci = f.get("monthly_cost_ci_usd")
        iv = (_per_million(ci[0], tokens), _per_million(ci[1], tokens)) if ci and tokens else None
        bars.append(plots.CostBar(n, v, iv))
    if not bars:
        return ""
    prices = "; ".join(f"{k}: {v.get('source')} {v.get('detail')}" for k, v in r["provenance"].items() if k.startswith("prices.instance"))
    return _figure(plots.cost_per_million("Cost per 1M successful output tokens", bars),
                   "sized monthly fleet cost (95% interval propagated from the capacity's) / monthly successful tokens at peak "
                   f"demand; prices: {prices}")


def _no_cost_figure(r: dict[str, Any]) -> str:
    if decided(r) or not (r.get("series") or {}).get("fleets"):
        return ""
    return "<p>No cost or payback figure: the fleet sizes they rest on are not decided (see Blocked by).</p>"


def _capacity(r: dict[str, Any]) -> str:
    fleets = {n: f for n, f in r["fleets"].items() if capacity_rows(f)}
    if not fleets:
        return ""
    out = ["<h2>Capacity sweep</h2>",
           "<p>Each step replays the trace's requests at a multiple of the manifest's rate; a fleet's per-instance capacity is the "
           "highest per-instance SLO-compliant goodput among the steps that held the fleet SLO and lasted at least three median "
           "request lifetimes (steady state) (chosen: <b>bold</b>).</p>"]
    head = ("step", "requests", "successful", "P95 TTFT s", "P95 ITL s", "error rate", "SLO", "per-instance goodput tok/s",
            "peak in flight / instance", "window s", "median request s", "steady state", "chosen")
    for name, f in fleets.items():
        cap = f["capacity"]
        where = f" (step {cap['step']})" if cap.get("step") else " (no steady-state step held the SLO; sized from the replay)"
        out.append(f"<h3>{html.escape(name)}: capacity {fmt(cap.get('per_instance_tok_s'), 1)} tok/s per instance{html.escape(where)}</h3>")
        steps = capacity_rows(f)
        rows = [(s["label"], fmt(s["requests"]), fmt(s["successful_requests"]), p95_cell(s, "ttft"), p95_cell(s, "itl"),
                 fmt(s["error_rate"], 4), "pass" if s["slo_pass"] else "FAIL", fmt(s["per_instance_goodput_tok_s"], 1),
                 fmt(s["peak_in_flight_per_instance"], 1), fmt(s.get("window_s"), 1), fmt(s.get("median_e2e_s"), 1),
                 "yes" if s.get("steady_state") else "no", "chosen" if s["chosen"] else "") for s in steps]
        out.append(_table(head, rows, [s["chosen"] for s in steps]))
        stop, search = search_rows(f)
        if search:
            out.append(f"<p>{html.escape(stop)}</p>" + _table(SEARCH_COLUMNS, search))
    points = {n: [plots.CapacityPoint(s["multiplier"], s["per_instance_goodput_tok_s"], bool(s["slo_pass"]), bool(s["chosen"]))
                  for s in capacity_rows(f) if s["label"] != "replay" and s["per_instance_goodput_tok_s"] is not None]
              for n, f in fleets.items()}
    if any(points.values()):
        out.append(_figure(plots.capacity_steps("Capacity sweep: per-instance goodput", points),
                           "capacity step records (measured); each fleet's capacity is the best steady-state step that held the fleet SLO"))
    tracks = [plots.SearchTrack(n, [plots.SearchPoint(s["multiplier"], s["verdict"]) for s in f["capacity"]["search"]["steps"]],
                                f["capacity"]["search"].get("held_multiplier"))
              for n, f in fleets.items() if (f["capacity"].get("search") or {}).get("steps")]
    if tracks:
        out.append(_figure(plots.search_path("Capacity search path", tracks),
                           "capacity/<fleet>/search.json: each step's multiplier and verdict under the fleet SLO (measured)"))
    return "".join(out)


def _histograms(prom: dict[str, Any] | None) -> str:
    if not prom or not prom.get("fleets"):
        return "<p>Histograms: no Prometheus source; every percentile above comes from the raw records.</p>"
    rows = []
    for fleet, series in prom["fleets"].items():
        for key, h in series.items():
            if isinstance(h, dict) and "metric" in h:
                metric = h["metric"] or f"none: {h.get('note', 'not exported')}"
                rows.append((fleet, key, metric, fmt(h.get("p95_s_merged_histogram")), fmt(h.get("p95_s_records")), fmt(h.get("difference_s"))))
    return (f"<p>Histograms from Prometheus ({html.escape(str(prom.get('url')))}), buckets summed across replicas before the quantile:</p>"
            + _table(("fleet", "histogram", "metric", "P95 s (merged histogram)", "P95 s (records)", "difference s"), rows))


def _prefix_cache(pc: dict[str, Any] | None) -> str:
    if not pc:
        return ""
    return (f"<h2>Prefix cache</h2><p>{html.escape(pc['trace'])}.</p>" + _table(PREFIX_CACHE_COLUMNS, prefix_cache_rows(pc))
            + f"<p>{html.escape(pc['note'])}.</p>")


def _placement(r: dict[str, Any]) -> str:
    items = []
    for name, f in r["fleets"].items():
        size, mc = f.get("size"), f.get("monthly_cost")
        if size:
            per_az = ", ".join(f"{az} {n}" for az, n in size["per_az"].items()) if isinstance(size["per_az"], dict) else str(size["per_az"])
            items.append(f"{html.escape(name)}: {size['busy_instances']} busy + {size['headroom_instances']} headroom + "
                         f"{size['redundancy_instances']} redundancy + {size['asg_min_topup']} ASG-min = {size['required']} "
                         f"({html.escape(per_az)})")
        if mc:
            parts = ", ".join(f"{k.removesuffix('_usd')} {fmt(v, 2)}" for k, v in mc.items() if k.endswith("_usd"))
            items.append(f"{html.escape(name)} monthly USD: {html.escape(parts)} ({html.escape(str(mc['compute_note']))})")
    return "<p>Per-AZ placement and cost lines:</p>" + (_list(items) if items else "<p>none (no fleet was sized)</p>")


def _migration(r: dict[str, Any]) -> str:
    if not r.get("migration"):
        return ""
    out = ["<h2>Migration ledger</h2>",
           _table(("item", "USD"), [(k, fmt(v, 2)) for k, v in r["migration"]["items_usd"].items()]
                  + [("total", fmt(r["migration"].get("total_usd"), 2))])]
    curve = (r.get("series") or {}).get("payback_curve")
    if curve and decided(r) and r.get("migration_cost_usd") is not None:
        months = int(curve[-1][0])
        ci = r.get("monthly_delta_ci_usd") or (None, None)
        low = payback_curve(r["migration_cost_usd"], ci[0], months) if ci[0] is not None else None
        high = payback_curve(r["migration_cost_usd"], ci[1], months) if ci[1] is not None else None
        p = plots.Payback([tuple(x) for x in curve], low, high, r["migration_cost_usd"], r.get("payback_months"), r.get("horizon_months"))
        out.append(_figure(plots.payback("Payback: cumulative net savings after cut-over", p),
                           "migration ledger (manifest activities and the sized fleets' dual-run costs) and the monthly delta "
                           "(computed from measured capacity and prices), with the delta's 95% interval"))
    return "".join(out)


def _time_to_ready(r: dict[str, Any]) -> str:
    if not r.get("time_to_ready"):
        return ""
    return ("<p>Time to ready (measured in the cloud run: instance launch -> first healthy target, minute resolution):</p>"
            + _list(f"{html.escape(n)}: {fmt(t['seconds'] / 60, 1)} min ({t['instances_launched']} instance(s) launched)"
                    for n, t in r["time_to_ready"].items()))


def _sensitivity(sens: dict[str, Any] | None) -> str:
    if not sens:
        return ""
    out = ["<h2>Sensitivity (one input at a time)</h2>",
           _table(("cell", "decision", "monthly delta USD (95% CI)", "payback months (95% CI)", "reasons"), sensitivity_rows(sens))]
    base = sens["base"].get("monthly_delta_usd")
    drawn = [plots.SensitivityBar(c["label"], c["monthly_delta_usd"], _interval(c.get("monthly_delta_ci_usd")), str(c["decision"]))
             for c in sens["cells"] if plots.finite(c.get("monthly_delta_usd"))]
    left = [f"{c['label']} ({c['decision']})" for c in sens["cells"] if not plots.finite(c.get("monthly_delta_usd"))]
    if plots.finite(base) and drawn:
        extra = f". Not drawn (no figure: outside the evidence): {'; '.join(left)}" if left else ""
        out.append(_figure(plots.sensitivity_tornado("Sensitivity: monthly delta per cell", base, drawn),
                           f"one-at-a-time grid ({sens.get('method', '')}); whiskers: each cell's 95% interval", html.escape(extra)))
    return "".join(out)


def _gaps(r: dict[str, Any]) -> str:
    items = [f"{html.escape(g['what'])}: {html.escape(g['reason'])}{' (blocks Go)' if g['blocks_go'] else ''}" for g in r["gaps"]]
    return "<h2>Gaps</h2>" + _list(items or ["none"])


def _provenance(r: dict[str, Any]) -> str:
    return "<h2>Provenance</h2>" + _list(f"<b>{html.escape(k)}</b>: {html.escape(str(p.get('source')))} - {html.escape(str(p.get('detail')))}"
                                         for k, p in r["provenance"].items())


STYLE = """body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3}figure{margin:1.2em 0}figure svg{max-width:100%;height:auto}
figcaption{font-size:12px;color:#444}blockquote{border-left:4px solid #ccc;margin:0;padding-left:1em}"""


def render_html(model: Report) -> str:
    r = model.model_dump(mode="json")  # BRIDGE (analysis.report_model): the page still reads report.json's dict; read `model` typed instead
    d = r["decision"]
    comp = r.get("comparison") or {}
    blocked = (r.get("headline") or {}).get("blocked_by") or []
    sut = f"<blockquote>{html.escape(r['systems_under_test'])}</blockquote>" if r.get("systems_under_test") else ""
    body = [
        f"<h1>{html.escape(r['campaign'])}: {html.escape(d['state'].upper())}</h1>",
        f"<p>manifest digest <code>{html.escape(r['manifest_digest'])}</code>, generated {html.escape(r['generated_at'])}; "
        f"baseline <b>{html.escape(str(comp.get('baseline')))}</b>, candidate <b>{html.escape(str(comp.get('candidate')))}</b>.</p>",
        sut,
        "<h2>Decision</h2>", _list(html.escape(x) for x in d["reasons"]), f"<p>{_inline(headline_text(r))}</p>",
        ("<p>Blocked by:</p>" + _list(html.escape(x) for x in blocked)) if not decided(r) and blocked else "",
        "<h2>Fleets</h2>",
        "<p>P95s with their 95% interval (order statistics, distribution-free) and n, the requests each is taken over; "
        "instances and monthly cost with the interval propagated from the capacity's.</p>",
        _fleets_table(r), _outcomes(r), *_latency_figures(r), _cost_figure(r) or _no_cost_figure(r),
        "<h2>Quality gate</h2>",
        (_table(("fleet", "gate", "failures"), quality_rows(r)) if quality_rows(r) else "<p>No quality-gate results were given.</p>"),
        _capacity(r), _histograms(r.get("prometheus")), _prefix_cache(r.get("prefix_cache")), _placement(r), _migration(r),
        _time_to_ready(r), _sensitivity(r.get("sensitivity")), _gaps(r), _provenance(r),
    ]
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(r["campaign"])}: {html.escape(d["state"])}'
            f"</title>\n<style>{STYLE}</style></head><body>\n" + "\n".join(x for x in body if x) + "\n</body></html>\n")
