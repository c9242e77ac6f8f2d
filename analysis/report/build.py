"""`build_report`: records + metrics + prices (+ bills) -> report.json, report.md, report.html.

The campaign calls this once per campaign. Missing evidence becomes a `gaps` entry (and, if
it blocks a Go, a Defer) rather than a silent zero; evidence that contradicts the manifest
(another manifest's records, an empty window) raises.

The pipeline: records -> evidence -> measurements -> evaluation -> report, one module a
concern: analysis.report.measurement (the records, capacity, saturation, intervals),
analysis.report.evidence (CloudWatch, prices, bills, Prometheus) and analysis.report.assembly
(the evaluation and report.json's content). Each stage returns its own gaps and provenance,
concatenated here in one fixed order.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from analysis.measure import prefix_cache
from analysis.model import Report, non_finite_to_null
from analysis.report.assembly import (
    assemble_gate_report,
    assemble_report,
    evaluate_scenarios,
    evaluation_findings,
    input_provenance,
)
from analysis.report.evaluate import Context
from analysis.report.evidence import gather_evidence, with_server_steps
from analysis.report.inputs import DEFAULT_ROOT_VOLUME_GIB, AwsClients, QualityInput, ReportInputs
from analysis.report.measurement import measure, read_records
from core.manifest import Manifest

_T = TypeVar("_T")

# What callers import from here besides the builders: the inputs they build it from.
__all__ = [
    "DEFAULT_ROOT_VOLUME_GIB",
    "AwsClients",
    "ReportInputs",
    "build_gate_report",
    "build_report",
    "write_pages",
]


def build_report(inputs: ReportInputs) -> Report:
    """report.json (and, with `inputs.with_pages`, report.md and report.html) in `inputs.out_dir`;
    returns the report. See ReportInputs for what each input means."""
    inp = inputs
    m = inp.manifest
    if inp.with_pages:
        _aside(_import_renderers)
    schedule = _aside(lambda: prefix_cache.report_schedule(m))
    rec = read_records(inp)
    ev = gather_evidence(inp, rec.base, rec.summaries())
    meas = measure(inp, rec, ev.instances)
    ev = with_server_steps(ev, inp, meas.capacities(1.0) if meas.capacities is not None else {}, rec.base)
    prefix = prefix_cache.section(m, rec.records, schedule.result(), ev.prefix_cache_rates)
    found = (
        rec.found
        + ev.cloud_found
        + ev.instances_found
        + meas.capacity_found
        + meas.saturation_found
        + ev.prices_found
        + ev.billing_found
        + ev.prometheus_found
        + input_provenance(inp)
    )
    ctx = Context(
        manifest=m,
        measures=rec.measures,
        instances_measured=ev.instances,
        unit_prices=ev.unit_prices,
        root_volume_gib=inp.root_volume_gib,
        quality=dict(inp.quality) if inp.quality is not None else None,
        gaps=list(found.gaps),
        saturation=meas.saturation,
        capacity=meas.capacities,
        intervals=meas.intervals,
        loadgen_task_hourly_usd=ev.loadgen_task_hourly_usd,
        loadgen_price_source=ev.loadgen_price_source,
    )
    evaluation = evaluate_scenarios(ctx, inp.with_sensitivity)
    found = found + evaluation_findings(inp, evaluation.head, prefix)
    report = assemble_report(inp, rec, ev, evaluation, prefix, found)
    return _write(report, inp.out_dir, inp.with_pages)


def build_gate_report(
    manifest: Manifest, quality: QualityInput, *, out_dir: str | Path, with_pages: bool = True
) -> Report:
    """The report of a comparison that stopped at the quality gate: the gate's results and the
    decision they alone give; every figure that would need the replay is absent, not zero."""
    return _write(assemble_gate_report(manifest, quality), out_dir, with_pages)


def _write(report: Report, out_dir: str | Path, with_pages: bool) -> Report:
    model = non_finite_to_null(report)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(model.to_json(), encoding="utf-8")
    if with_pages:
        write_pages(model, out)
    return model


# What write_pages imports: the HTML renderer brings matplotlib, about a second of single-threaded
# CPU (bench/analysis_throughput.py, issue 53).
_RENDERERS = ("analysis.report.render.html", "analysis.report.render.markdown")


def _aside(work: Callable[[], _T]) -> Future[_T]:
    """work() in a thread of its own, its result (or its exception) in the future: the fixed,
    single-threaded Python of a report (the page renderers' imports, matplotlib's among them, about
    a second; the prefix-cache section's trace parse, 0.13-0.18 s), whatever the number of records,
    runs beside the record scans, where duckdb and numpy release the GIL, instead of after them."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="report-aside")
    try:
        return pool.submit(work)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its work


def _import_renderers() -> None:
    """What write_pages imports, imported ahead (_aside). write_pages imports them as before
    (Python's import lock makes it wait for an import under way); should one fail here, it fails
    there again, with its error."""
    for name in _RENDERERS:
        try:
            importlib.import_module(name)
        except Exception:  # write_pages' own import raises it again
            return


def write_pages(model: Report, out_dir: str | Path) -> None:
    """report.md and report.html from the model (also `render`, from a report.json read back)."""
    from analysis.report.render.html import render_html
    from analysis.report.render.markdown import render_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(model), encoding="utf-8")
    (out / "report.html").write_text(render_html(model), encoding="utf-8")
