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
import threading
from pathlib import Path

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
        _import_renderers_aside()
    rec = read_records(inp)
    ev = gather_evidence(inp, rec.base, rec.summaries())
    meas = measure(inp, rec, ev.instances)
    ev = with_server_steps(ev, inp, meas.capacities(1.0) if meas.capacities is not None else {}, rec.base)
    prefix = prefix_cache.for_report(m, rec.records, ev.prefix_cache_rates)
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


def _import_renderers_aside() -> None:
    """Import the page renderers in a thread while the records are read: duckdb and numpy release
    the GIL, so the import runs beside them instead of after them. write_pages imports them as
    before (Python's import lock makes it wait for an import under way); should one fail here, it
    fails there again, with its error."""

    def load() -> None:
        for name in _RENDERERS:
            try:
                importlib.import_module(name)
            except Exception:  # write_pages' own import raises it again
                return

    threading.Thread(target=load, name="import-renderers", daemon=True).start()


def write_pages(model: Report, out_dir: str | Path) -> None:
    """report.md and report.html from the model (also `render`, from a report.json read back)."""
    from analysis.report.render.html import render_html
    from analysis.report.render.markdown import render_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(model), encoding="utf-8")
    (out / "report.html").write_text(render_html(model), encoding="utf-8")
