"""report.html: one self-contained page (inline SVG from analysis.report.render.plots, no scripts, no network).

Its first screen answers: the verdict and why, the monthly delta and the payback with their 95%
intervals, and what would change the verdict (decision.to_settle), or what blocks the figures.
Then every section of report.md, in the same order and under the same headings, with each
figure placed in the section it illustrates, captioned with where its numbers came from and
linked to those inputs' entries in the Provenance section (anchors `prov-<key>`).
It reads the typed report model (analysis.model) only."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence

from analysis.economics.cost import cost_per_million
from analysis.economics.ledger import payback_curve
from analysis.model import PrefixCache, PrometheusSection, Report
from analysis.report.render import plots
from analysis.report.render.cells import (
    BILLING_COLUMNS,
    BILLING_NOTE,
    CAPACITY_COLUMNS,
    FLEET_COLUMNS,
    FLEETS_NOTE,
    OUTCOMES_NOTE,
    PREFIX_CACHE_COLUMNS,
    QUALITY_LAYER_COLUMNS,
    REPLAY_COLUMNS,
    SEARCH_COLUMNS,
    SENSITIVITY_COLUMNS,
    SERVER_STEP_COLUMNS,
    billing_rows,
    capacity_heading,
    capacity_notes,
    capacity_row,
    chosen,
    decided,
    decision_rule_text,
    first_screen,
    fleet_row,
    fmt,
    gap_cell,
    headline_text,
    ledger_rows,
    no_histograms_text,
    outcome_row,
    placement_lines,
    prefix_cache_rows,
    quality_layer_rows,
    quality_row,
    replay_note,
    replay_row,
    search_rows,
    search_stop,
    sensitivity_rows,
    server_step_rows,
    server_steps_intro,
    to_settle_text,
)

MEASURED_RECORDS = "per-request loadgen records, non-warmup, exact quantiles (measured)"
CDF_MARKS = (
    "band and whisker at 95%: each fleet's P95 with its 95% interval (order statistics); dashed: the SLO's P95 target"
)


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


def prov_id(key: str) -> str:
    """The id of a provenance entry's list item: `prov-` and the key, any character outside [A-Za-z0-9._-] as '-'."""
    return "prov-" + re.sub(r"[^A-Za-z0-9._-]", "-", key)


def _prov_links(r: Report, keys: Iterable[str]) -> str:
    """Links to the provenance entries of `keys` that the report has (a trailing '*' matches a prefix), in order, once each."""
    found: list[str] = []
    for k in keys:
        hits = (
            [p for p in r.provenance if p.startswith(k[:-1])] if k.endswith("*") else [k] if k in r.provenance else []
        )
        found += [h for h in hits if h not in found]
    if not found:
        return ""
    return ". Provenance: " + ", ".join(f'<a href="#{prov_id(k)}">{html.escape(k)}</a>' for k in found)


def _figure(svg: str, source: str, extra: str = "", links: str = "") -> str:
    return f"<figure>{svg}<figcaption>Source: {html.escape(source)}{extra}{links}</figcaption></figure>"


def _first_screen(r: Report) -> str:
    """The verdict and why, the delta and the payback with their intervals, what would change it (or what blocks it)."""
    fs = first_screen(r)
    rows = "".join(f"<dt>{html.escape(label)}</dt><dd>{_inline(text)}</dd>" for label, text in fs.lines)
    if fs.others:
        rows += f"<dt>Other reasons for {html.escape(fs.verdict)}</dt><dd>{html.escape('; '.join(fs.others))}</dd>"
    return (
        f'<section id="verdict" class="verdict {html.escape(fs.verdict.lower())}">'
        f'<p class="why"><b class="state">{html.escape(fs.verdict)}</b> {html.escape(fs.why)}</p><dl>{rows}</dl></section>'
    )


def _outcomes(r: Report) -> str:
    rows = [row for name, f in r.fleets.items() if (row := outcome_row(name, f))]
    if not rows:
        return ""
    return f"<p>{_inline(OUTCOMES_NOTE)}</p>" + _table(("fleet", "requests by outcome", "ITL basis"), rows)


# A goodput step holds about this many of the replay's arrivals: a request's tokens all land at its
# completion, so steps that hold one or two requests show each request as a spike.
STEP_ARRIVALS = 8


def goodput_bins_per_step(requests: int, bins_in_window: int) -> int:
    """The goodput series' equal bins merged into one step: the fewest that hold STEP_ARRIVALS of the
    replay's arrivals on average, rounded up to a divisor of the window's bins so a step ends where
    the arrival window ends (and the drain begins)."""
    if bins_in_window < 1:
        return 1
    need = max(1, math.ceil(STEP_ARRIVALS * bins_in_window / max(requests, 1)))
    return next((k for k in range(need, bins_in_window + 1) if bins_in_window % k == 0), bins_in_window)


def _goodput_figure(r: Report) -> str:
    measures = {
        n: m
        for n, s in r.series.fleets.items()
        if s.goodput and n in r.fleets and (m := r.fleets[n].measure) is not None
    }
    if not measures:
        return ""
    sent = min(m.requests - m.not_sent for m in measures.values())
    series, step_s = [], []
    for n, m in measures.items():
        pts = r.series.fleets[n].goodput or []
        bin_s = pts[1][0] - pts[0][0] if len(pts) > 1 else (m.window_s or 1.0)
        k = goodput_bins_per_step(sent, round((m.window_s or 0.0) / bin_s) if bin_s > 0 else 0)
        series.append(plots.GoodputSteps(n, plots.rate_steps(pts, bin_s, k)))
        step_s.append(k * bin_s)
    ends = [m.window_end_s for m in measures.values() if m.window_end_s is not None]
    lo, hi = fmt(min(step_s), 1), fmt(max(step_s), 1)
    return _figure(
        plots.goodput_over_time("Goodput over time", series, max(ends, default=None)),
        "per-request records: ok, quality ok and per-request SLO met, by completion time (measured); each bar: a "
        f"fleet's successful output tokens that completed in a {lo if lo == hi else lo + '-' + hi} s step (about "
        f"{STEP_ARRIVALS} of the replay's arrivals) over the step's length. The replay's goodput (Trace replay table) "
        "counts the requests sent in the arrival window, over its length, the drain's completions included",
        links=_prov_links(r, ("records", "slo", "instances_measured.*")),
    )


def _latency_figures(r: Report) -> list[str]:
    fs = r.series.fleets
    if not fs:
        return []
    ttft = [plots.LatencyCdf(n, s.ttft_cdf, r.fleets[n].p95_ttft_s, r.fleets[n].p95_ttft_ci_s) for n, s in fs.items()]
    itl = [plots.LatencyCdf(n, s.itl_cdf, r.fleets[n].p95_itl_s, r.fleets[n].p95_itl_ci_s) for n, s in fs.items()]
    source = f"{MEASURED_RECORDS}; {CDF_MARKS}"
    out = [
        _figure(
            plots.latency_cdf("TTFT CDF per fleet", "TTFT (s, from scheduled send)", ttft, r.slo.ttft_p95_s),
            source,
            links=_prov_links(r, ("records", "slo")),
        ),
        _figure(
            plots.latency_cdf("ITL CDF per fleet", "ITL (s, mean gap per request)", itl, r.slo.itl_p95_s),
            source,
            links=_prov_links(r, ("records", "itl_definition", "slo")),
        ),
    ]
    goodput = _goodput_figure(r)
    return [*out, goodput] if goodput else out


def _per_million(monthly_usd: float | None, monthly_tokens: float) -> float | None:
    return None if monthly_usd is None else cost_per_million(monthly_usd, monthly_tokens)


def _cost_figure(r: Report) -> str:
    """Cost per 1M successful tokens; its interval is the monthly cost's over the same monthly tokens."""
    if not decided(r):
        if not r.series.fleets:
            return ""
        return "<p>No cost or payback figure: the fleet sizes they rest on are not decided (see Blocked by).</p>"
    bars = []
    for n, f in r.fleets.items():
        if f.cost_per_million_successful_tokens is None:
            continue
        ci, tokens = f.monthly_cost_ci_usd, f.monthly_successful_tokens
        iv = (_per_million(ci[0], tokens), _per_million(ci[1], tokens)) if ci and tokens else None
        bars.append(plots.CostBar(n, f.cost_per_million_successful_tokens, iv))
    if not bars:
        return ""
    prices = "; ".join(
        f"{k}: {p.source} {p.detail}" for k, p in r.provenance.items() if k.startswith("prices.instance")
    )
    return _figure(
        plots.cost_per_million("Cost per 1M successful output tokens", bars),
        "sized monthly fleet cost (95% interval propagated from the capacity's) / monthly successful tokens at peak "
        f"demand; prices: {prices}",
        links=_prov_links(
            r,
            (
                "prices.instance.*",
                "capacity.*",
                "saturation.*",
                "demand_tok_s",
                "utilization_target",
                "hours_per_month",
                "commitments",
            ),
        ),
    )


def _capacity(r: Report) -> str:
    fleets = {n: f for n, f in r.fleets.items() if f.capacity and f.capacity.steps}
    if not fleets:
        return ""
    out = [
        "<h2>Capacity sweep</h2>",
        "<p>Each step replays the trace's requests at a multiple of the manifest's rate; a fleet's per-instance capacity is the "
        "highest per-instance SLO-compliant goodput among the steps that held the fleet SLO and lasted at least three median "
        "request lifetimes (steady state) (chosen: <b>bold</b>).</p>",
    ]
    points: dict[str, list[plots.CapacityPoint]] = {}
    tracks = []
    for name, f in fleets.items():
        assert f.capacity is not None  # filtered above
        out.append(f"<h3>{html.escape(capacity_heading(name, f))}</h3>")
        out.append(
            _table(
                CAPACITY_COLUMNS,
                [capacity_row(f, s) for s in f.capacity.steps],
                [chosen(f, s) for s in f.capacity.steps],
            )
        )
        path = f.capacity.search
        if path and path.steps:
            out.append(f"<p>{html.escape(search_stop(path))}</p>" + _table(SEARCH_COLUMNS, search_rows(path)))
            tracks.append(
                plots.SearchTrack(
                    name, [plots.SearchPoint(s.multiplier, s.verdict) for s in path.steps], path.held_multiplier
                )
            )
        points[name] = [
            plots.CapacityPoint(s.multiplier, s.per_instance_goodput_tok_s, s.slo_pass, chosen(f, s))
            for s in f.capacity.steps
            if s.per_instance_goodput_tok_s is not None
        ]  # the replay too: it can be the chosen one
    if any(points.values()):
        out.append(
            _figure(
                plots.capacity_steps("Capacity sweep: per-instance goodput", points),
                "capacity step records (measured); each fleet's capacity is the best steady-state step that held the fleet SLO",
                links=_prov_links(r, ("capacity_sweep", "capacity.*", "records", "slo", "instances_measured.*")),
            )
        )
    if tracks:
        out.append(
            _figure(
                plots.search_path("Capacity search path", tracks),
                "capacity/<fleet>/search.json: each step's multiplier and verdict under the fleet SLO (measured)",
                links=_prov_links(r, ("capacity_sweep", "capacity.*", "slo")),
            )
        )
    return "".join(out)


def _server_steps(prom: PrometheusSection | None) -> str:
    if prom is None or not prom.steps:
        return ""
    return f"<p>{html.escape(server_steps_intro(prom))}</p>" + _table(SERVER_STEP_COLUMNS, server_step_rows(prom))


def _histograms(prom: PrometheusSection | None) -> str:
    if not prom or not prom.fleets:
        return f"<p>{html.escape(no_histograms_text(prom))}</p>" + _server_steps(prom)
    rows = [
        (
            fleet,
            key,
            h.metric or f"none: {h.note or 'not exported'}",
            fmt(h.p95_s_merged_histogram),
            fmt(h.p95_s_records),
            gap_cell(h.difference_s, h.p95_s_records, h.bucket_s),
        )
        for fleet, pf in prom.fleets.items()
        for key, h in pf.histograms().items()
    ]
    return (
        f"<p>Histograms from Prometheus ({html.escape(prom.url)}), buckets summed across replicas before the quantile:</p>"
        + _table(("fleet", "histogram", "metric", "P95 s (merged histogram)", "P95 s (records)", "difference s"), rows)
        + _server_steps(prom)
    )


def _prefix_cache(pc: PrefixCache | None) -> str:
    if not pc:
        return ""
    return (
        f"<h2>Prefix cache</h2><p>{html.escape(pc.trace)}.</p>"
        + _table(PREFIX_CACHE_COLUMNS, prefix_cache_rows(pc))
        + f"<p>{html.escape(pc.note)}.</p>"
    )


def _placement(r: Report) -> str:
    items = [html.escape(line) for line in placement_lines(r)]
    return "<p>Per-AZ placement and cost lines:</p>" + (_list(items) if items else "<p>none (no fleet was sized)</p>")


def _migration(r: Report) -> str:
    if not r.migration:
        return ""
    out = ["<h2>Migration ledger</h2>", _table(("item", "USD"), ledger_rows(r))]
    curve = r.series.payback_curve
    if curve and decided(r) and r.migration_cost_usd is not None:
        months = int(curve[-1][0])
        low_delta, high_delta = r.monthly_delta_ci_usd or (None, None)
        p = plots.Payback(
            curve,
            None if low_delta is None else payback_curve(r.migration_cost_usd, low_delta, months),
            None if high_delta is None else payback_curve(r.migration_cost_usd, high_delta, months),
            r.migration_cost_usd,
            r.payback_months,
            r.horizon_months,
        )
        out.append(
            _figure(
                plots.payback("Payback: cumulative net savings after cut-over", p),
                "migration ledger (manifest activities and the sized fleets' dual-run costs) and the monthly delta "
                "(computed from measured capacity and prices), with the delta's 95% interval",
                links=_prov_links(r, ("migration", "horizon_months", "prices.instance.*", "capacity.*")),
            )
        )
    return "".join(out)


def _billing(r: Report) -> str:
    if r.billing is None or not (rows := billing_rows(r.billing)):
        return ""
    return (
        "<h2>Campaign cost: planned, computed, billed</h2>"
        + f"<p>{_inline(BILLING_NOTE)}</p>"
        + _table(BILLING_COLUMNS, rows)
        + (
            f"<p>{links.removeprefix('. ')}</p>"
            if (links := _prov_links(r, ("billing.*", "prices.instance.*")))
            else ""
        )
    )


def _time_to_ready(r: Report) -> str:
    if not r.time_to_ready:
        return ""
    return (
        "<p>Time to ready (measured in the cloud run: instance launch -> first healthy target, minute resolution):</p>"
        + _list(
            html.escape(f"{n}: {fmt(t.seconds / 60, 1)} min ({t.instances_launched} instance(s) launched)")
            for n, t in r.time_to_ready.items()
        )
    )


def _sensitivity(r: Report) -> str:
    sens = r.sensitivity
    if not sens:
        return ""
    out = [
        "<h2>Sensitivity (one input at a time)</h2>",
        _table(SENSITIVITY_COLUMNS, sensitivity_rows(sens, decided(r))),
    ]
    if not decided(r):  # the cells' deltas rest on the blocked evidence: no tornado either
        return "".join(
            [*out, "<p>No sensitivity figure: the cells' deltas rest on the same blocked evidence as the headline.</p>"]
        )
    base = sens.base.monthly_delta_usd
    drawn = [
        plots.SensitivityBar(c.label, c.monthly_delta_usd, c.monthly_delta_ci_usd, c.decision)
        for c in sens.cells
        if c.monthly_delta_usd is not None and plots.finite(c.monthly_delta_usd)
    ]
    left = [f"{c.label} ({c.decision})" for c in sens.cells if not plots.finite(c.monthly_delta_usd)]
    if base is not None and plots.finite(base) and drawn:
        extra = f". Not drawn (no figure: outside the evidence): {'; '.join(left)}" if left else ""
        out.append(
            _figure(
                plots.sensitivity_tornado("Sensitivity: monthly delta per cell", base, drawn),
                f"one-at-a-time grid ({sens.method}); whiskers: each cell's 95% interval where both ends are known",
                html.escape(extra),
                links=_prov_links(
                    r,
                    (
                        "demand.peak_requests_per_s",
                        "utilization_target",
                        "commitments",
                        "prices.instance*",
                        "slo",
                        "migration",
                        "horizon_months",
                    ),
                ),
            )
        )
    return "".join(out)


def _gaps(r: Report) -> str:
    items = [html.escape(f"{g.what}: {g.reason}{' (blocks Go)' if g.blocks_go else ''}") for g in r.gaps]
    return "<h2>Gaps</h2>" + _list(items or ["none"])


def _provenance(r: Report) -> str:
    items = "".join(
        f'<li id="{prov_id(k)}"><b>{html.escape(k)}</b>: {html.escape(p.source)} - {html.escape(p.detail)}</li>'
        for k, p in r.provenance.items()
    )
    return f'<h2 id="provenance">Provenance</h2><ul>{items}</ul>'


def _fleets(r: Report) -> str:
    notes = capacity_notes(r)
    return (
        "<h2>Fleets</h2>"
        + f"<p>{html.escape(FLEETS_NOTE)}</p>"
        + _table(FLEET_COLUMNS, [fleet_row(r, n, f) for n, f in r.fleets.items()])
        + (_list(html.escape(x) for x in notes) if notes else "")
        + _cost_figure(r)
    )


def _replay(r: Report) -> str:
    return (
        "<h2>Trace replay</h2>"
        + f"<p>{html.escape(replay_note(r))}</p>"
        + _table(REPLAY_COLUMNS, [replay_row(n, f) for n, f in r.fleets.items()])
        + _outcomes(r)
        + "".join(_latency_figures(r))
    )


def _quality(r: Report) -> str:
    rows = [quality_row(n, q) for n, q in (r.quality or {}).items()]
    out = "<h2>Quality gate</h2>" + (
        _table(("fleet", "gate", "failures"), rows) if rows else "<p>No quality-gate results were given.</p>"
    )
    layers = [row for n, q in (r.quality or {}).items() for row in quality_layer_rows(n, q)]
    failed = [f"{n}: {q.failed_layer}" for n, q in (r.quality or {}).items() if q.failed_layer]
    if layers:
        out += "<p>By layer" + (f" (failed layer: {html.escape('; '.join(failed))})" if failed else "") + ":</p>"
        out += _table(QUALITY_LAYER_COLUMNS, layers)
    return out


STYLE = """body{font-family:sans-serif;max-width:72em;margin:1.2em auto;padding:0 1em;color:#222}
h1{margin:.2em 0 .4em}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3}figure{margin:1.2em 0}figure svg{max-width:100%;height:auto}
figcaption{font-size:12px;color:#444}blockquote{border-left:4px solid #ccc;margin:0;padding-left:1em}
.verdict{border:1px solid #ccc;border-left:8px solid #999;border-radius:4px;padding:.6em 1em;margin:0 0 1em;background:#fafafa}
.verdict.go{border-left-color:#2ca02c}.verdict.defer{border-left-color:#e6a700}.verdict.reject{border-left-color:#d62728}
.verdict .why{font-size:1.1em;margin:.2em 0 .6em}.verdict .state{font-size:1.2em;margin-right:.3em}
.verdict dl{display:grid;grid-template-columns:max-content 1fr;gap:.3em 1em;margin:0}.verdict dt{font-weight:bold}.verdict dd{margin:0}
li:target{background:#fff3c4}"""


def render_html(r: Report) -> str:
    d = r.decision
    blocked = r.headline.blocked_by
    body = [
        f"<h1>{html.escape(r.campaign)}: {html.escape(d.state.upper())}</h1>",
        _first_screen(r),
        f"<p>manifest digest <code>{html.escape(r.manifest_digest)}</code>, generated {html.escape(r.generated_at)}; "
        f"baseline <b>{html.escape(r.comparison.baseline)}</b>, candidate <b>{html.escape(r.comparison.candidate)}</b>.</p>",
        f"<blockquote>{html.escape(r.systems_under_test)}</blockquote>" if r.systems_under_test else "",
        "<h2>Decision</h2>",
        _list(html.escape(x) for x in d.reasons),
        f"<p>{_inline(settle)}</p>" if (settle := to_settle_text(r)) else "",
        f"<p>{_inline(decision_rule_text(r))}</p>",
        f"<p>{_inline(headline_text(r))}</p>",
        ("<p>Blocked by:</p>" + _list(html.escape(x) for x in blocked)) if not decided(r) and blocked else "",
        _fleets(r),
        _replay(r),
        _quality(r),
        _capacity(r),
        _histograms(r.prometheus),
        _prefix_cache(r.prefix_cache),
        _placement(r),
        _migration(r),
        _billing(r),
        _time_to_ready(r),
        _sensitivity(r),
        _gaps(r),
        _provenance(r),
    ]
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(r.campaign)}: {html.escape(d.state)}'
        f"</title>\n<style>{STYLE}</style></head><body>\n" + "\n".join(x for x in body if x) + "\n</body></html>\n"
    )
