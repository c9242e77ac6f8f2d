"""report.md: the verdict first (why, the delta and the payback with their intervals, what would change it),
then the decision's reasons, the fleets as sized, the trace replay, gaps and where every input came from.

Reads the typed report (analysis.model); the sentences and cells it shares with report.html
come from analysis.report.render.cells, so both pages say the same thing.
"""

from __future__ import annotations

from analysis.model import PrefixCache, PrometheusSection, Report
from analysis.report.render.cells import (
    BILLING_COLUMNS,
    BILLING_NOTE,
    FLEET_COLUMNS,
    FLEETS_NOTE,
    NOT_DECIDED,
    OUTCOMES_NOTE,
    PREFIX_CACHE_COLUMNS,
    REPLAY_COLUMNS,
    SEARCH_COLUMNS,
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


def _capacity_lines(r: Report) -> list[str]:
    fleets = {n: f for n, f in r.fleets.items() if f.capacity is not None and f.capacity.steps}
    if not fleets:
        return []
    out = [
        "",
        "## Capacity sweep",
        "",
        "Each step replays the trace's requests at a multiple of the manifest's rate; a fleet's per-instance capacity is the "
        "highest per-instance SLO-compliant goodput among the steps that held the fleet SLO and lasted at least three median "
        "request lifetimes (steady state) (chosen: **bold**).",
    ]
    for name, f in fleets.items():
        assert f.capacity is not None  # kept above
        out += [
            "",
            f"### {capacity_heading(name, f)}",
            "",
            "| step | requests | successful | P95 TTFT s | P95 ITL s | error rate | SLO | per-instance goodput tok/s "
            "| peak in flight / instance | window s | median request s | steady state | chosen |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in f.capacity.steps:
            label, *cells = capacity_row(f, s)
            out.append("| " + " | ".join((f"**{label}**" if chosen(f, s) else label, *cells)) + " |")
        if f.capacity.search is not None:
            out += [
                "",
                search_stop(f.capacity.search),
                "",
                "| " + " | ".join(SEARCH_COLUMNS) + " |",
                "|" + "---|" * len(SEARCH_COLUMNS),
            ]
            out += [
                "| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in search_rows(f.capacity.search)
            ]
    return out


def _histogram_lines(prom: PrometheusSection | None) -> list[str]:
    """P95 from merged Prometheus histograms next to P95 from raw records, with the difference;
    then the server's P95s per step where the run saved them."""
    steps = _server_step_lines(prom)
    if prom is None or not prom.fleets:
        return ["", no_histograms_text(prom), *steps]
    out = [
        "",
        f"Histograms from Prometheus ({prom.url}), buckets summed across replicas before the quantile:",
        "",
        "| fleet | histogram | metric | P95 s (merged histogram) | P95 s (records) | difference s |",
        "|---|---|---|---|---|---|",
    ]
    for fleet, series in prom.fleets.items():
        for key, h in series.histograms().items():
            metric = f"`{h.metric}`" if h.metric else f"none: {h.note or 'not exported'}"
            difference = gap_cell(h.difference_s, h.p95_s_records, h.bucket_s)
            out.append(
                f"| {fleet} | {key} | {metric} | {fmt(h.p95_s_merged_histogram)} | {fmt(h.p95_s_records)} | {difference} |"
            )
    return out + steps


def _server_step_lines(prom: PrometheusSection | None) -> list[str]:
    if prom is None or not prom.steps:
        return []
    return ["", server_steps_intro(prom), "", *_table(SERVER_STEP_COLUMNS, server_step_rows(prom))]


def prefix_cache_lines(pc: PrefixCache | None) -> list[str]:
    if pc is None:
        return []
    lines = [
        "## Prefix cache",
        "",
        pc.trace + ".",
        "",
        "| " + " | ".join(PREFIX_CACHE_COLUMNS) + " |",
        "|---" * len(PREFIX_CACHE_COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in prefix_cache_rows(pc)]
    return [*lines, "", pc.note + ".", ""]


def _quality_lines(r: Report) -> list[str]:
    rows = [quality_row(name, q) for name, q in (r.quality or {}).items()]
    if not rows:
        return ["", "## Quality gate", "", "No quality-gate results were given."]
    return [
        "",
        "## Quality gate",
        "",
        "| fleet | gate | failures |",
        "|---|---|---|",
        *(f"| {n} | {v} | {f} |" for n, v, f in rows),
    ]


def _blocked_lines(r: Report) -> list[str]:
    if r.headline.decided:
        return []
    return ["", "Blocked by:", "", *(f"- {x}" for x in r.headline.blocked_by)]


def _outcome_lines(r: Report) -> list[str]:
    rows = [row for name, f in r.fleets.items() if (row := outcome_row(name, f)) is not None]
    if not rows:
        return []
    return ["", OUTCOMES_NOTE, "", *(f"- {name}: {outcomes}; ITL basis: {basis}" for name, outcomes, basis in rows)]


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows),
    ]


def first_screen_lines(r: Report) -> list[str]:
    """The verdict and why, the delta and the payback with their intervals, what would change it."""
    fs = first_screen(r)
    out = [f"**Verdict: {fs.verdict}.** {fs.why}", "", *(f"- **{label}**: {text}" for label, text in fs.lines)]
    if fs.others:
        out.append(f"- **Other reasons for {fs.verdict}**: " + "; ".join(fs.others))
    return out


def _billing_lines(r: Report) -> list[str]:
    if r.billing is None or not (rows := billing_rows(r.billing)):
        return []
    return ["", "## Campaign cost: planned, computed, billed", "", BILLING_NOTE, "", *_table(BILLING_COLUMNS, rows)]


def _placement_lines(r: Report) -> list[str]:
    return ["", "Per-AZ placement and cost lines:", "", *(f"- {line}" for line in placement_lines(r))]


def render_markdown(r: Report) -> str:
    d = r.decision
    lines = [
        f"# {r.campaign}: {d.state.upper()}",
        "",
        *first_screen_lines(r),
        "",
        f"manifest digest `{r.manifest_digest}`, generated {r.generated_at}; "
        f"baseline **{r.comparison.baseline}**, candidate **{r.comparison.candidate}**.",
        "",
        *([f"> {r.systems_under_test}", ""] if r.systems_under_test else []),
        "## Decision",
        "",
        *(f"- {reason}" for reason in d.reasons),
        "",
        *([settle, ""] if (settle := to_settle_text(r)) else []),
        decision_rule_text(r),
        "",
        headline_text(r),
        *_blocked_lines(r),
        "",
        "## Fleets",
        "",
        FLEETS_NOTE,
        "",
        *_table(FLEET_COLUMNS, [fleet_row(r, name, f) for name, f in r.fleets.items()]),
        *(["", *(f"- {note}" for note in notes)] if (notes := capacity_notes(r)) else []),
        "",
        "## Trace replay",
        "",
        replay_note(r),
        "",
        *_table(REPLAY_COLUMNS, [replay_row(name, f) for name, f in r.fleets.items()]),
    ]
    lines += _outcome_lines(r)
    lines += _quality_lines(r)
    lines += _capacity_lines(r)
    lines += _histogram_lines(r.prometheus)
    lines += prefix_cache_lines(r.prefix_cache)
    lines += _placement_lines(r)
    if r.migration:
        lines += ["", "## Migration ledger", ""]
        lines += [f"- {k}: {v}{'' if v == NOT_DECIDED else ' USD'}" for k, v in ledger_rows(r)]
    lines += _billing_lines(r)
    if r.time_to_ready:
        lines += [
            "",
            "Time to ready (measured in the cloud run: instance launch -> first healthy target, minute resolution):",
            "",
        ]
        lines += [
            f"- {name}: {fmt(t.seconds / 60, 1)} min ({t.instances_launched} instance(s) launched)"
            for name, t in r.time_to_ready.items()
        ]
    if r.sensitivity:
        lines += [
            "",
            "## Sensitivity (one input at a time)",
            "",
            "| cell | decision | monthly delta USD (95% CI) | payback months (95% CI) | reasons |",
            "|---|---|---|---|---|",
        ]
        rows = sensitivity_rows(r.sensitivity, decided(r))
        lines += [f"| {label} | {dec} | {delta} | {payback} | {why} |" for label, dec, delta, payback, why in rows]
    lines += ["", "## Gaps", ""]
    lines += [f"- {g.what}: {g.reason}{' (blocks Go)' if g.blocks_go else ''}" for g in r.gaps] or ["- none"]
    lines += ["", "## Provenance", ""]
    lines += [f"- {k}: {p.source} - {p.detail}" for k, p in r.provenance.items()]
    return "\n".join(lines) + "\n"
