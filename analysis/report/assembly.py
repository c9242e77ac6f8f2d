"""The report's assembly: the headline scenario and the sensitivity grid evaluated by one rule
(analysis.report.evaluate), the findings the evaluation adds, and report.json's content: a Report built
from the stages' models as they are (the evidence sections that still arrive as dicts are validated
once, here).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from analysis.economics import sensitivity
from analysis.economics.decision import decide_at_gate
from analysis.economics.ledger import payback_curve
from analysis.measure import goodput
from analysis.model import (
    Billing,
    CellSummary,
    Comparison,
    FleetSeries,
    Headline,
    Measure,
    PrefixCache,
    PrometheusSection,
    ProvenanceEntry,
    Report,
    ScenarioEvaluation,
    Sensitivity,
    Series,
    Slo,
    non_finite_to_null,
)
from analysis.provenance import Findings, Gap, manifest_provenance
from analysis.report.evaluate import (
    Context,
    evaluate,
    outside_evidence,
    quality_passed,
    summarize,
    unmeasured_row,
)
from analysis.report.evidence import Evidence
from analysis.report.inputs import DEFAULT_ROOT_VOLUME_GIB, QualityInput, ReportInputs
from analysis.report.measurement import RecordEvidence, step_percentile_intervals
from analysis.sources.records import RecordSet
from core.manifest import Manifest

_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class Evaluation:
    """Stage 4: the headline scenario (the manifest as written) and, if asked, every sensitivity cell."""

    head: ScenarioEvaluation
    sensitivity: Sensitivity | None


def evaluate_scenarios(ctx: Context, with_sensitivity: bool) -> Evaluation:
    """The headline scenario, and every sensitivity cell by the same rules (analysis.report.evaluate)."""
    head = evaluate(ctx, sensitivity.BASE)
    grid = sensitivity.run_grid(ctx.manifest, lambda sc: _cell(ctx, sc)) if with_sensitivity else None
    return Evaluation(head, grid)


def input_provenance(inp: ReportInputs) -> Findings:
    """What served the fleets (when not the manifest's hardware), what the settle phase did, whether
    the run was resumed (when it was cut off, what it carried over, what ran again) and whether
    quality-gate results were given."""
    found = Findings()
    if inp.systems_under_test:
        found.provenance["systems_under_test"] = {"source": "measured", "detail": inp.systems_under_test}
    if inp.settle is not None:
        s = inp.settle
        found.provenance["settle"] = {
            "source": "measured",
            "value": s,
            "detail": f"settle phase: {s.stopped} ({s.detail}); {len(s.segments)} segment(s) over "
            f"{s.seconds:.0f} s"
            + (
                f" ({s.interrupted_seconds:.0f} s and {s.interrupted_usd:.2f} USD of it reserved by a round a resume cut off)"
                if s.interrupted_seconds or s.interrupted_usd
                else ""
            )
            + f"; monthly delta 95% CI {s.delta_ci_before} before, "
            f"{s.delta_ci_after} after; decision {s.decision_before} -> {s.decision_after}",
        }
    if inp.resumed:
        found.provenance["resume"] = {
            "source": "measured",
            "value": list(inp.resumed),
            "detail": f"the run was cut off and resumed {len(inp.resumed)} time(s) (resumes.json): "
            + "; ".join(
                f"{i}. cut off in the {r.at}; carried over {len(r.carried_over)} finished step(s) and "
                f"segment(s), not run again; set aside and run again: {', '.join(r.set_aside) or 'nothing'}"
                for i, r in enumerate(inp.resumed, 1)
            ),
        }
    if inp.quality is None:
        found.provenance["quality"] = {"source": "missing", "detail": "no quality-gate results were given"}
    else:
        found.provenance["quality"] = {
            "source": "measured",
            "detail": "quality-gate results given by the campaign runner",
        }
    return found


def evaluation_findings(inp: ReportInputs, head: ScenarioEvaluation, prefix: PrefixCache) -> Findings:
    """The manifest's inputs to the evaluation, the computed demand, and the prefix-cache caveat."""
    m = inp.manifest
    found = Findings()
    for key, val, detail in (
        ("slo", m.slo.model_dump(), "slo"),
        ("demand.peak_requests_per_s", m.workload.demand.peak_requests_per_s, "workload.demand"),
        ("hours_per_month", m.workload.demand.hours_per_month, "workload.demand"),
        ("utilization_target", m.costs.utilization_target, "costs"),
        ("commitments", [c.model_dump() for c in m.costs.commitments], "costs.commitments"),
        ("migration", m.migration.model_dump(), "migration"),
        ("horizon_months", m.horizon_months, "horizon_months"),
        ("network", m.costs.network.model_dump(), "costs.network"),
        ("observability_monthly_usd", m.costs.observability_monthly_usd, "costs"),
        ("licenses_monthly_usd", m.costs.licenses_monthly_usd, "costs"),
    ):
        found.provenance[key] = {"value": val, "source": "manifest", "detail": detail}
    found.provenance["root_volume_gib"] = {
        "value": inp.root_volume_gib,
        "source": "pinned" if inp.root_volume_gib == DEFAULT_ROOT_VOLUME_GIB else "assumption",
        "detail": "root EBS volume per instance, as the fleet stacks deploy it (core.catalog.ROOT_VOLUME_GIB)",
    }
    found.provenance["demand_tok_s"] = {
        "value": head.demand_tok_s,
        "source": "computed",
        "detail": "manifest peak_requests_per_s x measured mean output tokens per completed request "
        "(pooled over fleets)",
    }
    if prefix.mixed:
        found.gaps.append(
            Gap(
                "prefix_cache",
                "fleets differ in prefix caching and the trace shares prefixes: compare TTFT on "
                "requests that miss (report section 'Prefix cache')",
                blocks_go=False,
            )
        )
    found.provenance["itl_definition"] = {"source": "measured", "detail": ITL_DEFINITION}
    return found


def assemble_report(
    inp: ReportInputs,
    rec: RecordEvidence,
    ev: Evidence,
    evaluation: Evaluation,
    prefix: PrefixCache,
    found: Findings,
) -> Report:
    """Stage 5: report.json's content (its order is the model's)."""
    m = inp.manifest
    head = evaluation.head.model_copy(deep=True)
    step_percentile_intervals(head, rec.records, rec.sweep)
    _add_outcomes(head, rec.records)
    return Report(
        **_identity(m),
        systems_under_test=inp.systems_under_test,
        fleets=head.fleets,
        demand_tok_s=head.demand_tok_s,
        pooled_output_tokens_per_request=head.pooled_output_tokens_per_request,
        utilization_target=head.utilization_target,
        monthly_delta_usd=head.monthly_delta_usd,
        monthly_delta_ci_usd=head.monthly_delta_ci_usd,
        migration=head.migration,
        migration_cost_usd=head.migration_cost_usd,
        payback_months=head.payback_months,
        payback_months_ci=head.payback_months_ci,
        months_to_next_refresh=head.months_to_next_refresh,
        decision=head.decision,
        headline=headline(head, list(found.gaps)),
        gaps=list(found.gaps),
        # these evidence sections arrive as their producers' JSON-shaped dicts: validated here, once
        prometheus=_section(PrometheusSection, ev.prometheus),
        prefix_cache=prefix,
        cloudwatch=non_finite_to_null(ev.cloudwatch) or None,
        time_to_ready=non_finite_to_null(ev.time_to_ready) or None,
        billing=_section(Billing, ev.billing or None),
        quality=non_finite_to_null(dict(inp.quality)) if inp.quality is not None else None,
        provenance=found.provenance,
        sensitivity=evaluation.sensitivity,
        series=_series(m, rec.records, rec.base, head),
    )


def _section(model: type[_M], produced: Mapping[str, Any] | None) -> _M | None:
    """A report section from the dict its producer built (non-finite floats made null first, as
    report.json writes them); None stays None."""
    return None if produced is None else model.model_validate(non_finite_to_null(produced))


def _identity(m: Manifest) -> dict[str, Any]:
    """The fields every report starts with: which campaign, manifest and comparison, when, and the SLO and horizon."""
    return {
        "campaign": m.campaign,
        "manifest_digest": m.digest,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "comparison": Comparison(baseline=m.comparison.baseline, candidate=m.comparison.candidate),
        "slo": Slo.model_validate(m.slo, from_attributes=True),
        "horizon_months": m.horizon_months,
    }


# Gaps in the evidence a delta, fleet size or payback is computed from (by Gap.what's first part):
# while one blocks, those figures are not headlined. Other blocking gaps (no Prometheus
# cross-check, a missing quality result) defer the decision but leave the figures valid.
FIGURE_GAPS = frozenset({"records", "run_summary", "prices", "saturation", "overload", "capacity"})


def headline(head: ScenarioEvaluation, gaps: list[Gap]) -> Headline:
    """The figures the report may headline: all of them, or none with the gaps that block them."""
    blocked = [f"{g.what}: {g.reason}" for g in gaps if g.blocks_go and g.what.split(".", 1)[0] in FIGURE_GAPS]
    if blocked:
        return Headline(
            decided=False,
            blocked_by=blocked,
            instances_required=dict.fromkeys(head.fleets),
            instances_required_ci=dict.fromkeys(head.fleets),
            monthly_cost_usd=dict.fromkeys(head.fleets),
        )
    return Headline(
        decided=True,
        blocked_by=[],
        monthly_delta_usd=head.monthly_delta_usd,
        monthly_delta_ci_usd=head.monthly_delta_ci_usd,
        migration_cost_usd=head.migration_cost_usd,
        payback_months=head.payback_months,
        payback_months_ci=head.payback_months_ci,
        instances_required={n: f.instances_required for n, f in head.fleets.items()},
        instances_required_ci={n: f.instances_required_ci for n, f in head.fleets.items()},
        monthly_cost_usd={n: f.monthly_cost_usd for n, f in head.fleets.items()},
    )


def _cell(ctx: Context, sc: sensitivity.Scenario) -> CellSummary:
    res = evaluate(ctx, sc)
    return summarize(res, outside_evidence(ctx, sc, res))


ITL_DEFINITION = (
    "per request, (last output token's arrival - first output token's arrival) / (server-reported output tokens - 1); "
    "a request without server usage falls back to the mean gap between content chunks (itl_basis 'chunks')"
)


def _add_outcomes(head: ScenarioEvaluation, rs: RecordSet) -> None:
    """Each fleet's non-warmup requests by outcome, and how many ITLs came from which definition."""
    bases = goodput.itl_basis_counts(rs)
    for name, counts in goodput.outcome_counts(rs).items():
        row = head.fleets.get(name)
        if row is not None:
            row.outcomes = counts
            row.itl_basis = bases.get(name, {})


def _series(m: Manifest, rs: RecordSet, measures: Mapping[str, Measure], head: ScenarioEvaluation) -> Series:
    """Plot data: latency CDFs and goodput over time from the records, and the payback curve."""
    windows = {
        name: (fm.window_start_s, fm.window_end_s)
        for name, fm in measures.items()
        if fm.window_start_s is not None and fm.window_end_s is not None
    }
    series = goodput.goodput_series(rs, windows, m.slo.ttft_p95_s, m.slo.itl_p95_s)
    fleets = {
        name: FleetSeries(
            ttft_cdf=goodput.latency_cdf(rs, name, "ttft_s"),
            itl_cdf=goodput.latency_cdf(rs, name, "itl_s"),
            goodput=series.get(name),  # None: no window
        )
        for name in measures
    }
    mig, delta = head.migration_cost_usd, head.monthly_delta_usd
    if mig is None or delta is None:
        return Series(fleets=fleets)
    months = int(max(m.horizon_months * 2, (head.payback_months or 0) * 1.5, 12))
    return Series(fleets=fleets, payback_curve=payback_curve(mig, delta, months))


def assemble_gate_report(m: Manifest, given: QualityInput) -> Report:
    """report.json's content for a comparison that stopped at the quality gate: the gate's results
    and the decision they alone give; every figure that would need the replay is absent, not zero."""
    quality = dict(given)
    base, cand = m.comparison.baseline, m.comparison.candidate
    failed = [f.name for f in m.fleets if quality_passed(m, quality, f.name) is False]
    detail = {name: "; ".join(quality[name].failures) for name in failed}
    dec = decide_at_gate(cand, base, quality_passed(m, quality, cand), quality_passed(m, quality, base), detail)
    unknown = [f.name for f in m.fleets if quality_passed(m, quality, f.name) is None]
    stopped_by = [f"failed for {', '.join(failed)}"] if failed else []
    stopped_by += [f"could not be evaluated for {', '.join(unknown)}"] if unknown else []
    gaps = [Gap("records", f"no load was replayed: the quality gate {' and '.join(stopped_by) or 'did not pass'}")]
    return Report(
        **_identity(m),
        stopped_at="quality_gate",
        fleets={f.name: unmeasured_row(f.instance_type) for f in m.fleets},
        demand_tok_s=None,
        monthly_delta_usd=None,
        migration=None,
        migration_cost_usd=None,
        payback_months=None,
        months_to_next_refresh=None,
        decision=dec,
        headline=Headline(
            decided=False,
            blocked_by=[f"{g.what}: {g.reason}" for g in gaps],
            monthly_delta_usd=None,
            payback_months=None,
            instances_required={f.name: None for f in m.fleets},
        ),
        gaps=list(gaps),
        prometheus=None,
        cloudwatch=None,
        billing=None,
        quality=non_finite_to_null(dict(given)),
        provenance={
            "manifest": ProvenanceEntry(**manifest_provenance(m)),
            "quality": ProvenanceEntry(source="measured", detail="quality-gate results given by the campaign runner"),
        },
        series=Series(fleets={}),
    )
