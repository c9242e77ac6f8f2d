"""report.html: one self-contained page (inline SVG, no scripts, no network) with every figure's source."""

from __future__ import annotations

import html
from typing import Any

from analysis import svg
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
from analysis.sensitivity import tornado


def _figure(chart: str, source: str) -> str:
    return f"<figure>{chart}<figcaption>Source: {html.escape(source)}</figcaption></figure>"


def _upper(f: dict[str, Any]) -> str:
    return " (upper bound)" if f.get("saturated") is False and not sized_from_capacity(f) else ""


def _capacity_html(fleets: dict[str, Any], sweep: dict[str, list[dict[str, Any]]]) -> str:
    """One table per fleet of the capacity-sweep steps, the chosen step in bold."""
    if not sweep:
        return ""
    out = ["<h2>Capacity sweep</h2>"]
    for n, steps in sweep.items():
        cap = fleets[n]["capacity"]
        chosen = cap.get("step") or "no steady-state step held the SLO; sized from the replay"
        out.append(f"<h3>{html.escape(n)}: capacity {fmt(cap.get('per_instance_tok_s'), 1)} tok/s per instance ({html.escape(str(chosen))})</h3>")
        out.append("<table><tr><th>step</th><th>requests</th><th>successful</th><th>P95 TTFT s</th><th>P95 ITL s</th><th>error rate</th>"
                   "<th>SLO</th><th>per-instance goodput tok/s</th><th>peak in flight / instance</th><th>window s</th>"
                   "<th>median request s</th><th>steady state</th><th>chosen</th></tr>")
        for st in steps:
            bold = ' style="font-weight:bold"' if st["chosen"] else ""
            out.append(
                f"<tr{bold}><td>{html.escape(st['label'])}</td><td>{fmt(st['requests'])}</td><td>{fmt(st['successful_requests'])}</td>"
                f"<td>{p95_cell(st, 'ttft')}</td><td>{p95_cell(st, 'itl')}</td><td>{fmt(st['error_rate'], 4)}</td>"
                f"<td>{'pass' if st['slo_pass'] else 'FAIL'}</td><td>{fmt(st['per_instance_goodput_tok_s'], 1)}</td>"
                f"<td>{fmt(st['peak_in_flight_per_instance'], 1)}</td><td>{fmt(st.get('window_s'), 1)}</td>"
                f"<td>{fmt(st.get('median_e2e_s'), 1)}</td><td>{'yes' if st.get('steady_state') else 'no'}</td>"
                f"<td>{'chosen' if st['chosen'] else ''}</td></tr>"
            )
        out.append("</table>")
        stop, rows = search_rows(fleets[n])
        if rows:
            out.append(f"<p>{html.escape(stop)}</p><table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in SEARCH_COLUMNS) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
            out.append("</table>")
    return "".join(out)


def render_html(model: Report) -> str:
    r = model.model_dump(mode="json")  # BRIDGE (analysis.report_model): the page still reads report.json's dict; read `model` typed instead
    d = r["decision"]
    series = r.get("series", {})
    fs = series.get("fleets", {})
    slo = r["slo"]
    figs = [
        _figure(
            svg.line_chart("TTFT CDF per fleet", "TTFT (s, from scheduled send)", "fraction of requests",
                           {n: s.get("ttft_cdf", []) for n, s in fs.items()}, vlines=[(slo["ttft_p95_s"], "SLO P95")], hlines=[(0.95, "P95")]),
            "per-request loadgen records, non-warmup, exact quantiles (measured)",
        ),
        _figure(
            svg.line_chart("ITL CDF per fleet", "ITL (s, mean gap per request)", "fraction of requests",
                           {n: s.get("itl_cdf", []) for n, s in fs.items()}, vlines=[(slo["itl_p95_s"], "SLO P95")], hlines=[(0.95, "P95")]),
            "per-request loadgen records, non-warmup, exact quantiles (measured)",
        ),
        _figure(
            svg.line_chart("Goodput over time", "run time (s)", "successful output tokens/s", {n: s.get("goodput", []) for n, s in fs.items()}),
            "per-request records: ok, quality ok and per-request SLO met, binned by completion time (measured)",
        ),
        _figure(
            svg.bar_chart("Cost per 1M successful tokens", "USD", [(n, f["cost_per_million_successful_tokens"]) for n, f in r["fleets"].items()
                                                                   if f.get("cost_per_million_successful_tokens") is not None]),
            "sized monthly fleet cost / monthly successful tokens at peak demand; prices: " +
            "; ".join(f"{k}: {v.get('source')} {v.get('detail')}" for k, v in r["provenance"].items() if k.startswith("prices.instance")),
        ),
    ]
    if series.get("payback_curve"):
        figs.append(_figure(
            svg.line_chart("Payback curve", "months after cut-over", "cumulative net savings (USD)", {"net savings": series["payback_curve"]},
                           hlines=[(0.0, "break-even")], vlines=[(r["horizon_months"], "horizon")] if r.get("horizon_months") else ()),
            "migration ledger (manifest) and monthly delta (computed from measured throughput and prices)",
        ))
    if r.get("sensitivity"):
        figs.append(_figure(
            svg.tornado_chart("Sensitivity: monthly delta (USD)", "baseline - candidate monthly cost", tornado(r["sensitivity"])),
            "one-at-a-time grid; every cell recomputes sizing, cost and the decision",
        ))
    sweep = {n: capacity_rows(f) for n, f in r["fleets"].items() if capacity_rows(f)}
    if sweep:
        figs.append(_figure(
            svg.line_chart("Capacity sweep: per-instance goodput", "offered rate (x the manifest's)", "SLO-compliant tok/s per instance",
                           {n: [(s["multiplier"], s["per_instance_goodput_tok_s"]) for s in steps
                                if s["label"] != "replay" and s["per_instance_goodput_tok_s"] is not None] for n, steps in sweep.items()}),
            "capacity-sweep step records (measured); each fleet's capacity is the best step that held the fleet SLO",
        ))
    rows = "".join(
        f"<tr><td>{html.escape(n)} ({html.escape(f['instance_type'])})</td><td>{fmt(f['requests'])}</td><td>{fmt(f['successful_output_tokens'])}</td>"
        f"<td>{p95_cell(f, 'ttft')}</td><td>{p95_cell(f, 'itl')}</td><td>{'pass' if f['slo_pass'] else 'FAIL'}</td>"
        f"<td>{fmt(f.get('per_instance_goodput_tok_s'), 1)}</td><td>{ci_text(f.get('capacity_ci_tok_s'), 1) or 'n/a'}</td>"
        f"<td>{fmt(f.get('peak_in_flight_per_instance'), 1)}</td>"
        f"<td>{fmt(f.get('max_concurrency'))}</td><td>{saturated_cell(f)}</td>"
        f"<td>{sized_cell(r, f, 'instances_required')}{_upper(f) if decided(r) else ''}</td><td>{sized_cell(r, f, 'monthly_cost_usd', 2)}</td>"
        f"<td>{sized_cell(r, f, 'cost_per_million_successful_tokens', 4)}</td></tr>"
        for n, f in r["fleets"].items()
    )
    cap_html = _capacity_html(r["fleets"], sweep)
    outcomes = "".join(f"<tr>{''.join(f'<td>{html.escape(x)}</td>' for x in row)}</tr>" for row in outcome_rows(r))
    if outcomes:
        outcomes = (f"<p>{html.escape(OUTCOMES_NOTE).replace('`', '')}</p><table><tr><th>fleet</th><th>requests by outcome</th>"
                    f"<th>ITL basis</th></tr>{outcomes}</table>")
    quality = "".join(f"<tr><td>{html.escape(n)}</td><td>{html.escape(v)}</td><td>{html.escape(f)}</td></tr>" for n, v, f in quality_rows(r))
    quality_html = (f"<h2>Quality gate</h2><table><tr><th>fleet</th><th>gate</th><th>failures</th></tr>{quality}</table>" if quality
                    else "<h2>Quality gate</h2><p>No quality-gate results were given.</p>")
    gaps = "".join(f"<li>{html.escape(g['what'])}: {html.escape(g['reason'])}</li>" for g in r["gaps"]) or "<li>none</li>"
    prov = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(str(v.get('source')))} - {html.escape(str(v.get('detail')))}</li>"
                   for k, v in r["provenance"].items())
    reasons = "".join(f"<li>{html.escape(x)}</li>" for x in d["reasons"])
    blocked = "".join(f"<li>{html.escape(x)}</li>" for x in (r.get("headline") or {}).get("blocked_by", []))
    head = html.escape(headline_text(r)).replace("**", "") + (f"<br>Blocked by:<ul>{blocked}</ul>" if blocked else "")
    pc = r.get("prefix_cache")
    prefix_html = ""
    if pc:
        head_row = "".join(f"<th>{html.escape(c)}</th>" for c in PREFIX_CACHE_COLUMNS)
        body = "".join(f"<tr>{''.join(f'<td>{html.escape(x)}</td>' for x in row)}</tr>" for row in prefix_cache_rows(pc))
        prefix_html = (f"<h2>Prefix cache</h2><p>{html.escape(pc['trace'])}.</p><table><tr>{head_row}</tr>{body}</table>"
                       f"<p>{html.escape(pc['note'])}.</p>")
    sens_html = ""
    if r.get("sensitivity"):
        sens_html = ("<h2>Sensitivity (one input at a time)</h2><table><tr><th>cell</th><th>decision</th>"
                     "<th>monthly delta USD (95% CI)</th><th>payback months (95% CI)</th><th>reasons</th></tr>"
                     + "".join(f"<tr>{''.join(f'<td>{html.escape(x)}</td>' for x in row)}</tr>" for row in sensitivity_rows(r["sensitivity"]))
                     + "</table>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(r['campaign'])}: {d['state']}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px}}
figure{{margin:1em 0}}figcaption{{font-size:12px;color:#444}}</style></head><body>
<h1>{html.escape(r['campaign'])}: {d['state'].upper()}</h1>
<p>manifest digest <code>{r['manifest_digest']}</code>; generated {html.escape(r['generated_at'])}</p>
{f"<p><b>{html.escape(r['systems_under_test'])}</b></p>" if r.get("systems_under_test") else ""}
<ul>{reasons}</ul>
<p>{head}</p>
<p>P95s with their 95% interval (order statistics, distribution-free) and n, the requests each is taken over.</p>
<table><tr><th>fleet</th><th>requests</th><th>successful tokens</th><th>P95 TTFT s</th><th>P95 ITL s</th><th>SLO</th>
<th>per-instance goodput tok/s</th><th>capacity 95% CI tok/s</th><th>peak in flight / instance</th><th>max concurrency</th><th>saturated</th>
<th>instances</th><th>monthly USD</th><th>USD / 1M successful tokens</th></tr>{rows}</table>
{outcomes}{quality_html}{cap_html}{prefix_html}{sens_html}{''.join(figs)}
<h2>Gaps</h2><ul>{gaps}</ul><h2>Provenance</h2><ul>{prov}</ul>
</body></html>
"""
