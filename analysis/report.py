"""`build_report`: records + metrics + prices (+ bills) -> report.json, report.md, report.html.

The campaign calls this once per campaign. Missing evidence becomes a `gaps` entry (and, if
it blocks a Go, a Defer) rather than a silent zero; evidence that contradicts the manifest
(another manifest's records, an empty window) raises.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analysis import capacity, goodput, intervals, prefix_cache, sensitivity
from analysis.cost import UnitPrices
from analysis.decision import decide_at_gate
from analysis.errors import AnalysisError, PriceMissing, SourceUnavailable
from analysis.evaluate import (
    Context,
    QualityResults,
    evaluate,
    outside_evidence,
    quality_passed,
    summarize,
    unmeasured_row,
)
from analysis.histogram import bucket_cdf
from analysis.ledger import payback_curve
from analysis.provenance import Findings, Gap, Sourced, manifest_provenance, run_relative
from analysis.report_model import Headline, Report, ScenarioEvaluation, Sensitivity
from analysis.sources.billing import cost_explorer_by_fleet, read_focus
from analysis.sources.cloudwatch import CloudWatchSource, discover_asgs, fleet_specs
from analysis.sources.pricing import PRICING_ENDPOINT_REGION, RESERVED_KIND, PriceBook, PriceListSource
from analysis.sources.prometheus import HistogramNames, PrometheusSource
from analysis.sources.records import RecordSet, load_records
from analysis.sources.time_to_ready import time_to_ready
from core import catalog
from core.cloud_contract import LOADGEN_TASK_MEMORY_GIB, LOADGEN_TASK_VCPU
from core.manifest import Manifest

# The root volume the stacks deploy (core.catalog); the cache volume comes from fleets[].ebs_cache_gib.
DEFAULT_ROOT_VOLUME_GIB = float(catalog.ROOT_VOLUME_GIB)


@dataclass
class AwsClients:
    """boto3 clients the report may use; injectable so tests run against moto / Stubber."""

    pricing: Any = None
    cloudwatch: Any = None
    autoscaling: Any = None
    ce: Any = None
    elbv2: Any = None

    @classmethod
    def from_session(cls, region: str) -> AwsClients:
        import boto3

        s = boto3.session.Session()
        return cls(
            pricing=s.client("pricing", region_name=PRICING_ENDPOINT_REGION),
            cloudwatch=s.client("cloudwatch", region_name=region),
            autoscaling=s.client("autoscaling", region_name=region),
            elbv2=s.client("elbv2", region_name=region),
            ce=s.client("ce", region_name="us-east-1"),
        )


def _finite(x: Any) -> Any:
    """JSON has no Infinity/NaN: such values become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _resolve_prices(m: Manifest, book: PriceBook) -> tuple[dict[str, UnitPrices], Findings]:
    found = Findings()
    out: dict[str, UnitPrices] = {}
    shared: dict[str, Sourced] = {}
    for kind, key, name in (
        ("ebs", "gp3-storage", "ebs_gp3_gb_month"),
        ("nlb", "hour", "nlb_hour"),
        ("nlb", "lcu-hour", "nlb_lcu_hour"),
        ("network", "inter-az", "inter_az_gb"),
    ):
        try:
            shared[name] = book.get(kind, key)
            found.provenance[f"prices.{name}"] = shared[name].as_dict()
        except PriceMissing as exc:
            found.gaps.append(Gap(f"prices.{name}", str(exc)))
    for f in m.fleets:
        try:
            inst = book.get("instance", f.instance_type)
        except PriceMissing as exc:
            found.gaps.append(Gap(f"prices.instance.{f.instance_type}", str(exc)))
            continue
        found.provenance[f"prices.instance.{f.instance_type}"] = inst.as_dict()
        reserved: float | None = None
        if not any(c.fleet == f.name for c in m.costs.commitments):  # only the sensitivity's rate cells use it
            key = f"prices.{RESERVED_KIND}.{f.instance_type}"
            try:
                got = book.get(RESERVED_KIND, f.instance_type)
                reserved = got.value
                found.provenance[key] = got.as_dict()
            except PriceMissing as exc:
                found.provenance[key] = {
                    "value": None,
                    "source": "missing",
                    "detail": f"{exc}: the covered / renewal cells say 'no commitment'",
                }
        if len(shared) == 4:
            out[f.name] = UnitPrices(
                inst.value,
                shared["ebs_gp3_gb_month"].value,
                shared["nlb_hour"].value,
                shared["nlb_lcu_hour"].value,
                shared["inter_az_gb"].value,
                reserved,
            )
    return out, found


def _loadgen_task_price(book: PriceBook) -> tuple[float | None, str, Findings]:
    """One load-generator task's hourly Fargate price (its vCPU and memory, core.cloud_contract) and
    where it came from; only decision.to_settle uses it, so a missing price is no gap."""
    found = Findings()
    got: dict[str, Sourced] = {}
    for key, name in (("vcpu-hour", "fargate_vcpu_hour"), ("gb-hour", "fargate_gb_hour")):
        try:
            got[key] = book.get("fargate", key)
            found.provenance[f"prices.{name}"] = got[key].as_dict()
        except PriceMissing as exc:
            found.provenance[f"prices.{name}"] = {
                "value": None,
                "source": "missing",
                "detail": f"{exc}: decision.to_settle's usd leaves the load-generator tasks out",
            }
    if len(got) < 2:
        return None, "no Fargate price: load-generator tasks not counted", found
    hourly = LOADGEN_TASK_VCPU * got["vcpu-hour"].value + LOADGEN_TASK_MEMORY_GIB * got["gb-hour"].value
    return (
        hourly,
        (
            f"{LOADGEN_TASK_VCPU} vCPU x {got['vcpu-hour'].value:g} + {LOADGEN_TASK_MEMORY_GIB} GiB x {got['gb-hour'].value:g} "
            f"USD/h per task, provenance prices.fargate_*"
        ),
        found,
    )


def _prometheus_section(
    m: Manifest,
    url: str,
    given: HistogramNames | None,
    measures: Mapping[str, goodput.FleetMeasure],
) -> tuple[dict[str, Any], Findings]:
    found = Findings()
    src = PrometheusSource(url)
    out: dict[str, Any] = {"url": url, "fleets": {}}
    for f in m.fleets:
        fm = measures.get(f.name)
        if fm is None or fm.wall_start is None or fm.window_start_s is None or fm.window_end_s is None:
            continue
        start, end = fm.wall_start + fm.window_start_s, fm.wall_start + fm.window_end_s
        names = given or HistogramNames.for_stack(f.serving.stack)  # each fleet's own series
        labels = {names.fleet_label: f.name}
        sec: dict[str, Any] = {"window_unix": [start, end]}
        try:
            server_itl = names.server_itl
            if server_itl and not src.has_series(server_itl, labels, start, end) and names.server_itl_fallback:
                server_itl = names.server_itl_fallback
            for key, metric, recorded in (
                ("client_ttft", names.client_ttft, fm.p95_ttft_s),
                ("client_itl", names.client_itl, fm.p95_itl_s),
                ("server_ttft", names.server_ttft, None),
                ("server_itl", server_itl, None),
            ):
                if metric is None:
                    sec[key] = {
                        "metric": None,
                        "note": f"{f.serving.stack} exports no such histogram; the records' figure stands alone",
                    }
                    continue
                p95 = src.merged_quantile(0.95, metric, labels, start, end)
                entry: dict[str, Any] = {"metric": f"{metric}_bucket", "p95_s_merged_histogram": p95}
                if p95 is not None:
                    entry["cdf"] = bucket_cdf(src.merged_buckets(metric, labels, start, end))
                    per = src.per_replica_quantiles(0.95, metric, labels, start, end, names.replica_label)
                    entry["per_replica_p95_s"] = per
                    entry["mean_of_replica_p95_s_not_used"] = sum(per.values()) / len(per) if per else None
                if recorded is not None and p95 is not None:
                    entry["p95_s_records"] = recorded
                    entry["difference_s"] = (
                        p95 - recorded
                    )  # bucket resolution bounds this; large = a client/clock problem
                sec[key] = entry
        except SourceUnavailable as exc:
            found.gaps.append(Gap("prometheus", str(exc)))
            out["error"] = str(exc)
            return out, found
        out["fleets"][f.name] = sec
    return out, found


def _time_to_ready(m: Manifest, clients: AwsClients) -> tuple[dict[str, Any], Findings]:
    """Per fleet, instance launch -> first healthy NLB target: a migration activity measured in the cloud run."""
    found = Findings()
    if clients.autoscaling is None or clients.elbv2 is None or clients.cloudwatch is None:
        return {}, found
    try:
        asgs = discover_asgs(clients.autoscaling, m.campaign)
        ready = time_to_ready(clients.autoscaling, clients.elbv2, clients.cloudwatch, m.campaign, asgs, time.time())
    except SourceUnavailable as exc:
        found.gaps.append(Gap("time_to_ready", str(exc), blocks_go=False))
        return {}, found
    for f in m.fleets:
        if f.name not in ready:
            found.gaps.append(
                Gap(
                    f"time_to_ready.{f.name}",
                    "no launch activity or no healthy target found for this fleet",
                    blocks_go=False,
                )
            )
    found.provenance["time_to_ready"] = {
        "source": "pulled",
        "detail": "first 'Launching a new EC2 instance' activity (DescribeScalingActivities) to the first minute with "
        "AWS/NetworkELB HealthyHostCount >= 1 on the fleet's target group (60 s resolution)",
    }
    return {name: r.as_dict() for name, r in ready.items()}, found


def _instances_measured(
    m: Manifest,
    given: Mapping[str, int] | None,
    cw: dict[str, Any],
) -> tuple[dict[str, int], Findings]:
    found = Findings()
    out: dict[str, int] = {}
    for f in m.fleets:
        if given and f.name in given:
            out[f.name] = int(given[f.name])
            found.provenance[f"instances_measured.{f.name}"] = {
                "value": out[f.name],
                "source": "measured",
                "detail": "given by the campaign runner",
            }
        elif cw.get(f.name, {}).get("instances_in_service_max"):
            out[f.name] = round(cw[f.name]["instances_in_service_max"])
            found.provenance[f"instances_measured.{f.name}"] = {
                "value": out[f.name],
                "source": "pulled",
                "detail": "CloudWatch AWS/AutoScaling GroupInServiceInstances, max over the window",
            }
        else:
            out[f.name] = f.asg.desired
            found.provenance[f"instances_measured.{f.name}"] = {
                "value": out[f.name],
                "source": "manifest",
                "detail": "fleets[].asg.desired, assumed in service for the whole run",
            }
            found.gaps.append(
                Gap(
                    f"instances_measured.{f.name}",
                    "instances in service not measured; assumed asg.desired",
                    blocks_go=False,
                )
            )
    return out, found


def _saturation(
    m: Manifest,
    rs: RecordSet,
    measures: Mapping[str, goodput.FleetMeasure],
    inst: Mapping[str, int],
    measured_capacity: frozenset[str] = frozenset(),
) -> tuple[dict[str, goodput.Saturation], Findings]:
    """Per fleet: was one instance driven to max_concurrency? If not, its goodput is a lower bound (blocking gap).

    Fleets in `measured_capacity` are sized from a capacity-sweep step that held the SLO, so
    the replay's saturation and overload do not bear on their size: no gap for them."""
    found = Findings()
    peaks = goodput.peak_in_flight(rs)
    out: dict[str, goodput.Saturation] = {}
    for f in m.fleets:
        fm = measures.get(f.name)
        if fm is None or fm.requests == 0:
            continue  # the missing records are already a gap
        sat = goodput.Saturation(f.name, peaks.get(f.name, 0), inst.get(f.name, 0), f.sequences_per_instance)
        out[f.name] = sat
        per = sat.peak_in_flight_per_instance
        found.provenance[f"saturation.{f.name}"] = {
            "value": sat.as_dict(),
            "source": "measured",
            "detail": "peak non-warmup requests in flight (send -> last token, sweep over the records) / instances_measured, "
            "against fleets[].max_concurrency x replicas_per_instance",
        }
        if f.name in measured_capacity:
            continue
        if not sat.saturated:
            peak = "n/a" if per is None else f"{per:g}"
            found.gaps.append(
                Gap(
                    f"saturation.{f.name}",
                    f"{f.name}: per-instance goodput measured below saturation (peak {peak} of {f.sequences_per_instance} concurrent "
                    "sequences): throughput is a lower bound, fleet size an upper bound; raise workload.rate_scale until one "
                    "instance saturates",
                )
            )
        over = [
            f"P95 {what} {got:.3g} s > {slo:g} s"
            for what, got, slo in (("TTFT", fm.p95_ttft_s, m.slo.ttft_p95_s), ("ITL", fm.p95_itl_s, m.slo.itl_p95_s))
            if got is not None and got > slo
        ]
        if over:
            # Beyond its SLO capacity an instance's compliant goodput collapses (queueing); scaling
            # that figure linearly would oversize the fleet, so the size is pessimistic evidence.
            found.gaps.append(
                Gap(
                    f"overload.{f.name}",
                    f"{f.name}: fleet SLO missed at the replayed load ({', '.join(over)}): per-instance SLO-compliant goodput "
                    "was measured in overload and understates what one instance sustains inside the SLO, so its fleet size is "
                    "pessimistic; lower workload.rate_scale (or measure more instances) to size it inside the SLO",
                )
            )
    return out, found


@dataclass(frozen=True)
class ReportInputs:
    """What the campaign hands the report besides the manifest (see build_report's parameters)."""

    records_dir: str | Path
    out_dir: str | Path
    prometheus_url: str | None = None
    aws: bool = False
    quality: QualityResults | None = None
    instances_measured: Mapping[str, int] | None = None
    histogram_names: HistogramNames | None = None
    focus_csv: str | Path | None = None
    root_volume_gib: float = DEFAULT_ROOT_VOLUME_GIB
    aws_clients: AwsClients | None = None
    capacity_dirs: Mapping[str, Path] | None = None
    systems_under_test: str | None = None
    settle: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RecordEvidence:
    """Stage 1: the replay's records (and the capacity steps'), with per-SLO-scale measures."""

    records: RecordSet
    sweep: list[capacity.SweepStep] | None
    measures: Callable[[float], dict[str, goodput.FleetMeasure]]  # slo_scale -> per-fleet measures (cached)
    found: Findings

    @property
    def base(self) -> dict[str, goodput.FleetMeasure]:
        return self.measures(1.0)


@dataclass(frozen=True)
class Evidence:
    """Stage 2: what the cloud, the price source, the bills and Prometheus said; each source's findings apart."""

    cloudwatch: dict[str, Any]
    time_to_ready: dict[str, Any]
    instances: dict[str, int]
    unit_prices: dict[str, UnitPrices]
    billing: dict[str, Any]
    prometheus: dict[str, Any] | None
    cloud_found: Findings
    instances_found: Findings
    prices_found: Findings
    billing_found: Findings
    prometheus_found: Findings
    loadgen_task_hourly_usd: float | None = None  # one load-generator task (Fargate), for decision.to_settle
    loadgen_price_source: str = "no Fargate price: load-generator tasks not counted"


@dataclass(frozen=True)
class Measurements:
    """Stage 3: capacity per SLO scale, saturation and the 95% intervals, from the records and instance counts."""

    capacities: Callable[[float], dict[str, capacity.Capacity]] | None
    saturation: dict[str, goodput.Saturation]
    intervals: intervals.IntervalsFn
    capacity_found: Findings
    saturation_found: Findings


@dataclass(frozen=True)
class Evaluation:
    """Stage 4: the headline scenario (the manifest as written) and, if asked, every sensitivity cell."""

    head: ScenarioEvaluation
    sensitivity: Sensitivity | None


def build_report(
    manifest: Manifest,
    records_dir: str | Path,
    *,
    prometheus_url: str | None = None,
    aws: bool = False,
    quality: QualityResults | None = None,
    out_dir: str | Path,
    instances_measured: Mapping[str, int] | None = None,
    histogram_names: HistogramNames | None = None,
    focus_csv: str | Path | None = None,
    root_volume_gib: float = DEFAULT_ROOT_VOLUME_GIB,
    aws_clients: AwsClients | None = None,
    with_sensitivity: bool = True,
    with_pages: bool = True,
    capacity_dirs: Mapping[str, Path] | None = None,
    systems_under_test: str | None = None,
    settle: Mapping[str, Any] | None = None,
) -> Report:
    """`capacity_dirs`: capacity-sweep steps, label ("x0.5", "x2": a multiplier of the manifest's rate)
    -> directory of that step's records; fleets are then sized from the measured capacity (see analysis.capacity).
    `systems_under_test`: what served the fleets when that is not the manifest's hardware (a local
    campaign's emulators or CPU engines); the report states it above the decision.
    `settle`: what the campaign's settle phase did (campaign.settle.SettleOutcome.as_dict()):
    its segments are already in the capacity steps' records; this says what they bought.

    The pipeline: records -> evidence -> measurements -> evaluation -> report; each stage returns
    its own gaps and provenance, concatenated here in one fixed order."""
    m = manifest
    inp = ReportInputs(
        records_dir,
        out_dir,
        prometheus_url,
        aws,
        quality,
        instances_measured,
        histogram_names,
        focus_csv,
        root_volume_gib,
        aws_clients,
        capacity_dirs,
        systems_under_test,
        settle,
    )
    rec = read_records(m, inp)
    ev = gather_evidence(m, inp, rec)
    meas = measure(m, rec, ev)
    prefix = prefix_cache.for_report(m, rec.records, inp.prometheus_url, rec.base)
    found = (
        rec.found
        + ev.cloud_found
        + ev.instances_found
        + meas.capacity_found
        + meas.saturation_found
        + ev.prices_found
        + ev.billing_found
        + ev.prometheus_found
        + _input_provenance(inp)
    )
    ctx = Context(
        m,
        rec.measures,
        ev.instances,
        ev.unit_prices,
        inp.root_volume_gib,
        inp.quality,
        list(found.gaps),
        meas.saturation,
        meas.capacities,
        meas.intervals,
        ev.loadgen_task_hourly_usd,
        ev.loadgen_price_source,
    )
    evaluation = evaluate_scenarios(ctx, with_sensitivity)
    found = found + _evaluation_findings(m, inp, evaluation.head, prefix)
    report = assemble_report(m, inp, rec, ev, evaluation, prefix, found)
    return _write(report, out_dir, with_pages)


def read_records(m: Manifest, inp: ReportInputs) -> RecordEvidence:
    """Load and check the records (and capacity steps); gaps for fleets without records and for invalid runs."""
    found = Findings()
    for label in inp.capacity_dirs or {}:  # labels are checked before anything is loaded
        capacity.parse_label(label)
    found.provenance["manifest"] = manifest_provenance(m)
    rs: RecordSet = load_records(inp.records_dir, m.digest)
    found.provenance["records"] = {
        "source": "measured",
        "detail": f"{len(rs.files)} file(s), {rs.count()} records under {run_relative(inp.records_dir, inp.out_dir)}",
    }
    for torn in rs.torn_tails:  # a writer died mid-record: the complete records are all used
        found.gaps.append(Gap("records.torn_tail", f"{torn} left out (cut mid-write)", blocks_go=False))
    unknown = sorted(set(rs.fleets()) - {f.name for f in m.fleets})
    if unknown:
        raise AnalysisError(f"records name fleet(s) {unknown} that the manifest does not define")

    cache: dict[float, dict[str, goodput.FleetMeasure]] = {}

    def measures(scale: float) -> dict[str, goodput.FleetMeasure]:
        if scale not in cache:
            if scale == 1.0:
                cache[scale] = goodput.measure_fleets(rs, m.slo.ttft_p95_s, m.slo.itl_p95_s)
            else:  # goodput changes with the SLO, the measured percentiles do not
                base = measures(1.0)
                cache[scale] = {
                    k: replace(v, p95_ttft_s=base[k].p95_ttft_s, p95_itl_s=base[k].p95_itl_s)
                    for k, v in goodput.measure_fleets(
                        rs, m.slo.ttft_p95_s * scale, m.slo.itl_p95_s * scale, percentiles=False
                    ).items()
                }
        return cache[scale]

    base_measures = measures(1.0)
    sweep: list[capacity.SweepStep] | None = None
    if inp.capacity_dirs is not None:
        sweep = capacity.load_sweep(inp.capacity_dirs, m.digest, {f.name for f in m.fleets})
        found.provenance["capacity_sweep"] = {
            "source": "measured",
            "detail": "; ".join(
                f"{s.label}: {len(s.records.files)} file(s), {s.records.count()} records under "
                f"{run_relative(s.directory, inp.out_dir)}"
                for s in sweep
            ),
        }
    for f in m.fleets:
        fm = base_measures.get(f.name)
        if fm is None or fm.requests == 0:
            found.gaps.append(Gap(f"records.{f.name}", "no non-warmup records in the window for this fleet"))
        elif fm.slo_verdict_disagreements:
            found.gaps.append(
                Gap(
                    f"records.{f.name}.slo_ok",
                    f"{fm.slo_verdict_disagreements} ok request(s) where loadgen's slo_ok "
                    "differs from the SLO recomputed from ttft_s/itl_s; the recomputed verdict is used",
                    blocks_go=False,
                )
            )
    for key, s in rs.summaries.items():
        if not s.valid:
            found.gaps.append(Gap(f"run_summary.{key}", "run marked invalid: " + "; ".join(s.invalid_reasons)))
        if not s.invariant_holds():
            found.gaps.append(Gap(f"run_summary.{key}", "scheduled != completed + failed + not_sent"))
    return RecordEvidence(rs, sweep, measures, found)


def gather_evidence(m: Manifest, inp: ReportInputs, rec: RecordEvidence) -> Evidence:
    """CloudWatch and time to ready (the cloud path), instances in service, prices, bills and Prometheus."""
    clients = inp.aws_clients or (AwsClients.from_session(m.costs.region) if inp.aws else None)
    cw: dict[str, Any] = {}
    ready: dict[str, Any] = {}
    cloud = Findings()
    if inp.aws and clients is not None:
        cw, cloud = _cloudwatch(m, clients, rec.base)
        ready, found_ready = _time_to_ready(m, clients)
        cloud = cloud + found_ready
    inst, inst_found = _instances_measured(m, inp.instances_measured, cw)

    use_api = inp.aws or m.costs.price_source == "price-list-api"
    api = (
        PriceListSource(clients.pricing, m.costs.region)
        if use_api and clients is not None and clients.pricing is not None
        else None
    )
    book = PriceBook(m.costs.region, api)
    unit_prices, prices_found = _resolve_prices(m, book)
    task_hourly, task_source, task_found = _loadgen_task_price(book)
    prices_found = prices_found + task_found
    for note in book.notes:
        prices_found.gaps.append(Gap("prices.api", note, blocks_go=False))

    billing, billing_found = _billing(m, inp, clients, rec.base)
    prom: dict[str, Any] | None = None
    prom_found = Findings()
    if inp.prometheus_url:
        prom, prom_found = _prometheus_section(m, inp.prometheus_url, inp.histogram_names, rec.base)
        prom_found.provenance["prometheus"] = {
            "source": "measured",
            "detail": f"{inp.prometheus_url}: sum by (le) of increase() over the window, histogram_quantile",
        }
    return Evidence(
        cw,
        ready,
        inst,
        unit_prices,
        billing,
        prom,
        cloud,
        inst_found,
        prices_found,
        billing_found,
        prom_found,
        task_hourly,
        task_source,
    )


def _cloudwatch(
    m: Manifest, clients: AwsClients, base: Mapping[str, goodput.FleetMeasure]
) -> tuple[dict[str, Any], Findings]:
    """Per fleet, the ASG's and accelerator's CloudWatch figures over the measured window."""
    found = Findings()
    cw: dict[str, Any] = {}
    try:
        asgs = discover_asgs(clients.autoscaling, m.campaign)
        src = CloudWatchSource(clients.cloudwatch)
        for f in m.fleets:
            fm = base.get(f.name)
            if (
                f.name not in asgs
                or fm is None
                or fm.wall_start is None
                or fm.window_start_s is None
                or fm.window_end_s is None
            ):
                found.gaps.append(
                    Gap(f"cloudwatch.{f.name}", "no ASG tagged with this campaign and fleet", blocks_go=False)
                )
                continue
            vendor = catalog.instance(f.instance_type).accelerator.vendor
            cw[f.name] = src.fetch(
                fleet_specs(asgs[f.name], vendor), fm.wall_start + fm.window_start_s, fm.wall_start + fm.window_end_s
            )
        found.provenance["cloudwatch"] = {
            "source": "pulled",
            "detail": "CloudWatch GetMetricData (Average/Sum/Maximum)",
        }
    except SourceUnavailable as exc:
        found.gaps.append(Gap("cloudwatch", str(exc), blocks_go=False))
    return cw, found


def _billing(
    m: Manifest,
    inp: ReportInputs,
    clients: AwsClients | None,
    base: Mapping[str, goodput.FleetMeasure],
) -> tuple[dict[str, Any], Findings]:
    """Cost Explorer by fleet tag over the run's days (cloud path) and a FOCUS export, where given."""
    found = Findings()
    billing: dict[str, Any] = {}
    if inp.aws and clients is not None and clients.ce is not None:
        walls = [fm.wall_start + (fm.window_end_s or 0) for fm in base.values() if fm.wall_start is not None]
        starts = [fm.wall_start + (fm.window_start_s or 0) for fm in base.values() if fm.wall_start is not None]
        if walls:
            d0 = dt.datetime.fromtimestamp(min(starts), dt.UTC).date()
            d1 = dt.datetime.fromtimestamp(max(walls), dt.UTC).date() + dt.timedelta(days=1)
            try:
                billing["cost_explorer"] = cost_explorer_by_fleet(
                    clients.ce, m.campaign, d0.isoformat(), d1.isoformat()
                )
                found.provenance["billing.cost_explorer"] = {
                    "source": "pulled",
                    "detail": f"Cost Explorer UnblendedCost by tag fleet, {d0}..{d1}",
                }
            except SourceUnavailable as exc:
                found.gaps.append(Gap("billing.cost_explorer", str(exc), blocks_go=False))
    if inp.focus_csv is not None:
        billing["focus"] = {k: v.as_dict() for k, v in read_focus(inp.focus_csv, m.campaign).items()}
        found.provenance["billing.focus"] = {"source": "pulled", "detail": f"FOCUS export {inp.focus_csv}"}
    return billing, found


def measure(m: Manifest, rec: RecordEvidence, ev: Evidence) -> Measurements:
    """Capacity from the sweep (if any), then saturation (which a capacity measured inside the SLO exempts), and the intervals."""
    capacities = _capacity_fn(m, rec.sweep, rec.measures, rec.records, ev.instances) if rec.sweep is not None else None
    measured_capacity: frozenset[str] = frozenset()
    capacity_found = Findings()
    if capacities is not None:
        measured_capacity, capacity_found = _capacity_gaps(m, capacities(1.0))
    saturation, saturation_found = _saturation(m, rec.records, rec.base, ev.instances, measured_capacity)
    spread = _intervals_fn(m, rec.records, rec.measures, ev.instances, rec.sweep, capacities)
    return Measurements(capacities, saturation, spread, capacity_found, saturation_found)


def evaluate_scenarios(ctx: Context, with_sensitivity: bool) -> Evaluation:
    """The headline scenario, and every sensitivity cell by the same rules (analysis.evaluate)."""
    head = ScenarioEvaluation.model_validate(evaluate(ctx, sensitivity.BASE))
    grid = (
        Sensitivity.model_validate(sensitivity.run_grid(ctx.manifest, lambda sc: _cell(ctx, sc)))
        if with_sensitivity
        else None
    )
    return Evaluation(head, grid)


def _input_provenance(inp: ReportInputs) -> Findings:
    """What served the fleets (when not the manifest's hardware) and whether quality-gate results were given."""
    found = Findings()
    if inp.systems_under_test:
        found.provenance["systems_under_test"] = {"source": "measured", "detail": inp.systems_under_test}
    if inp.settle is not None:
        s = inp.settle
        found.provenance["settle"] = {
            "source": "measured",
            "value": dict(s),
            "detail": f"settle phase: {s.get('stopped')} ({s.get('detail')}); {len(s.get('segments') or [])} segment(s) over "
            f"{float(s.get('seconds') or 0):.0f} s; monthly delta 95% CI {s.get('delta_ci_before')} before, "
            f"{s.get('delta_ci_after')} after; decision {s.get('decision_before')} -> {s.get('decision_after')}",
        }
    if inp.quality is None:
        found.provenance["quality"] = {"source": "missing", "detail": "no quality-gate results were given"}
    else:
        found.provenance["quality"] = {
            "source": "measured",
            "detail": "quality-gate results given by the campaign runner",
        }
    return found


def _evaluation_findings(
    m: Manifest, inp: ReportInputs, head: ScenarioEvaluation, prefix: Mapping[str, Any]
) -> Findings:
    """The manifest's inputs to the evaluation, the computed demand, and the prefix-cache caveat."""
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
    if prefix["mixed"]:
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
    m: Manifest,
    inp: ReportInputs,
    rec: RecordEvidence,
    ev: Evidence,
    evaluation: Evaluation,
    prefix: dict[str, Any],
    found: Findings,
) -> dict[str, Any]:
    """Stage 5: report.json's content, in its order (validated against analysis.report_model by _write)."""
    head = evaluation.head.model_copy(deep=True)
    _step_percentile_intervals(head, rec.records, rec.sweep)
    _add_outcomes(head, rec.records)
    report: dict[str, Any] = {
        "campaign": m.campaign,
        "manifest_digest": m.digest,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "comparison": {"baseline": m.comparison.baseline, "candidate": m.comparison.candidate},
        "slo": m.slo.model_dump(),
        "horizon_months": m.horizon_months,
        "systems_under_test": inp.systems_under_test,
        **head.model_dump(),
        "gaps": [g.as_dict() for g in found.gaps],
        "prometheus": ev.prometheus,
        "prefix_cache": prefix,
        "cloudwatch": ev.cloudwatch or None,
        "time_to_ready": ev.time_to_ready or None,
        "billing": ev.billing or None,
        "quality": dict(inp.quality) if inp.quality is not None else None,
        "provenance": found.provenance,
        "headline": headline(head, list(found.gaps)).model_dump(),
    }
    if evaluation.sensitivity is not None:
        report["sensitivity"] = evaluation.sensitivity.model_dump()
    report["series"] = _series(m, rec.records, rec.base, head)
    return report


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


def _cell(ctx: Context, sc: sensitivity.Scenario) -> dict[str, Any]:
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


def _write(report: dict[str, Any], out_dir: str | Path, with_pages: bool) -> Report:
    model = Report.model_validate(_finite(report))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(model.to_json(), encoding="utf-8")
    if with_pages:
        write_pages(model, out)
    return model


def write_pages(model: Report, out_dir: str | Path) -> None:
    """report.md and report.html from the model (also `render`, from a report.json read back)."""
    from analysis.report_html import render_html
    from analysis.report_md import render_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(render_markdown(model), encoding="utf-8")
    (out / "report.html").write_text(render_html(model), encoding="utf-8")


def build_gate_report(
    manifest: Manifest, quality: QualityResults, *, out_dir: str | Path, with_pages: bool = True
) -> Report:
    """The report of a comparison that stopped at the quality gate: the gate's results and the
    decision they alone give; every figure that would need the replay is absent, not zero."""
    m = manifest
    base, cand = m.comparison.baseline, m.comparison.candidate
    failed = [f.name for f in m.fleets if quality_passed(m, quality, f.name) is False]
    detail = {name: "; ".join(str(x) for x in quality.get(name, {}).get("failures", [])) for name in failed}
    dec = decide_at_gate(cand, base, quality_passed(m, quality, cand), quality_passed(m, quality, base), detail)
    unknown = [f.name for f in m.fleets if quality_passed(m, quality, f.name) is None]
    stopped_by = [f"failed for {', '.join(failed)}"] if failed else []
    stopped_by += [f"could not be evaluated for {', '.join(unknown)}"] if unknown else []
    gaps = [Gap("records", f"no load was replayed: the quality gate {' and '.join(stopped_by) or 'did not pass'}")]
    report: dict[str, Any] = {
        "campaign": m.campaign,
        "manifest_digest": m.digest,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "comparison": {"baseline": base, "candidate": cand},
        "slo": m.slo.model_dump(),
        "horizon_months": m.horizon_months,
        "stopped_at": "quality_gate",
        "fleets": {f.name: unmeasured_row(f.instance_type) for f in m.fleets},
        "demand_tok_s": None,
        "monthly_delta_usd": None,
        "migration": None,
        "migration_cost_usd": None,
        "payback_months": None,
        "months_to_next_refresh": None,
        "decision": dec.as_dict(),
        "headline": {
            "decided": False,
            "blocked_by": [f"{g.what}: {g.reason}" for g in gaps],
            "monthly_delta_usd": None,
            "payback_months": None,
            "instances_required": {f.name: None for f in m.fleets},
        },
        "gaps": [g.as_dict() for g in gaps],
        "prometheus": None,
        "cloudwatch": None,
        "billing": None,
        "quality": dict(quality),
        "provenance": {
            "manifest": manifest_provenance(m),
            "quality": {"source": "measured", "detail": "quality-gate results given by the campaign runner"},
        },
        "series": {"fleets": {}},
    }
    return _write(report, out_dir, with_pages)


def _capacity_fn(
    m: Manifest,
    sweep: list[capacity.SweepStep],
    measures: Callable[[float], dict[str, goodput.FleetMeasure]],
    rs: RecordSet,
    inst: Mapping[str, int],
) -> Callable[[float], dict[str, capacity.Capacity]]:
    """slo_scale -> per-fleet capacity, recomputed from the step records under the scaled SLO (cached)."""
    step_cache: dict[float, dict[str, dict[str, goodput.FleetMeasure]]] = {}
    cap_cache: dict[float, dict[str, capacity.Capacity]] = {}
    replay_peaks = goodput.peak_in_flight(rs)
    replay_median_e2e = goodput.median_e2e(rs)
    searches = capacity.search_paths(sweep)

    def step_measures(scale: float) -> dict[str, dict[str, goodput.FleetMeasure]]:
        if scale not in step_cache:
            ttft, itl = m.slo.ttft_p95_s * scale, m.slo.itl_p95_s * scale
            if scale == 1.0:
                step_cache[scale] = {s.label: goodput.measure_fleets(s.records, ttft, itl) for s in sweep}
            else:  # as for the replay: goodput changes with the SLO, the measured percentiles do not
                base = step_measures(1.0)
                step_cache[scale] = {
                    s.label: {
                        k: replace(v, p95_ttft_s=base[s.label][k].p95_ttft_s, p95_itl_s=base[s.label][k].p95_itl_s)
                        for k, v in goodput.measure_fleets(s.records, ttft, itl, percentiles=False).items()
                    }
                    for s in sweep
                }
        return step_cache[scale]

    def capacities(scale: float) -> dict[str, capacity.Capacity]:
        if scale not in cap_cache:
            cap_cache[scale] = capacity.measure_capacity(
                sweep,
                [f.name for f in m.fleets],
                inst,
                m.slo.ttft_p95_s * scale,
                m.slo.itl_p95_s * scale,
                m.slo.max_error_rate,
                replay=measures(scale),
                replay_peaks=replay_peaks,
                replay_median_e2e=replay_median_e2e,
                step_measures=step_measures(scale),
                searches=searches,
            )
        return cap_cache[scale]

    return capacities


def _step_percentile_intervals(head: ScenarioEvaluation, rs: RecordSet, sweep: list[capacity.SweepStep] | None) -> None:
    """Every capacity step's P95s get their 95% interval and n, as the fleet rows' do."""
    by_label = {s.label: s.records for s in sweep or []}
    for name, row in head.fleets.items():
        for st in row.capacity.steps if row.capacity is not None else []:
            records = rs if st.label == capacity.REPLAY else by_label.get(st.label)
            if records is None:
                continue
            ttft, itl = intervals.latency_cis(records, name)
            st.p95_ttft_ci_s, st.p95_ttft_n = (ttft.bounds[0], ttft.bounds[1]), ttft.n
            st.p95_itl_ci_s, st.p95_itl_n = (itl.bounds[0], itl.bounds[1]), itl.n


def _intervals_fn(
    m: Manifest,
    rs: RecordSet,
    measures: Callable[[float], dict[str, goodput.FleetMeasure]],
    inst: Mapping[str, int],
    sweep: list[capacity.SweepStep] | None,
    capacities: Callable[[float], dict[str, capacity.Capacity]] | None,
) -> intervals.IntervalsFn:
    """slo_scale -> per-fleet 95% intervals (cached). Each step's P95 intervals are computed once,
    and its capacity interval once per SLO (intervals.StepEvidence): the sensitivity cells that
    keep the SLO only re-read them."""
    evidence: dict[tuple[str, str], intervals.StepEvidence] = {}
    cache: dict[float, dict[str, intervals.FleetIntervals]] = {}
    by_label = {s.label: s for s in sweep or []}

    def step(fleet: str, st: capacity.StepResult) -> intervals.StepEvidence | None:
        key = (fleet, st.label)
        if key not in evidence:
            src = by_label.get(st.label)
            if src is None:
                return None
            evidence[key] = intervals.step_evidence(
                st.label,
                src.records,
                fleet,
                requests=st.requests,
                per_instance_tok_s=st.per_instance_goodput_tok_s,
                window_s=st.window_s,
                instances=inst.get(fleet, 0),
            )
        return evidence[key]

    def replay(fleet: str, fm: goodput.FleetMeasure) -> intervals.StepEvidence:
        """The replay's evidence under this scale's goodput; its P95s and capacity cache are the base scale's."""
        key = (fleet, intervals.REPLAY)
        if key not in evidence:
            evidence[key] = intervals.replay_evidence(rs, fleet, fm, inst.get(fleet, 0))
        base = evidence[key]
        n = inst.get(fleet, 0)
        per = fm.goodput_tok_s / n if fm.goodput_tok_s is not None and n > 0 else None
        return replace(base, requests=fm.requests, per_instance_tok_s=per, window_s=fm.window_s or 0.0)

    def fn(scale: float) -> dict[str, intervals.FleetIntervals]:
        if scale not in cache:
            ttft, itl = m.slo.ttft_p95_s * scale, m.slo.itl_p95_s * scale
            out: dict[str, intervals.FleetIntervals] = {}
            for name, fm in measures(scale).items():
                if fm.requests == 0:
                    continue
                rep = replay(name, fm)
                cap = capacities(scale).get(name) if capacities is not None else None
                basis = cap.step if cap is not None and cap.step else intervals.REPLAY
                held: dict[str, intervals.StepEvidence] = {}
                for st in cap.steps if cap is not None else ():
                    if st.slo_pass and st.steady_state and st.per_instance_goodput_tok_s:
                        ev = rep if st.label == capacity.REPLAY else step(name, st)
                        if ev is not None:
                            held[st.label] = ev
                out[name] = intervals.fleet_intervals(name, rep, held, basis, ttft, itl)
            cache[scale] = out
        return cache[scale]

    return fn


def _capacity_gaps(m: Manifest, caps: Mapping[str, capacity.Capacity]) -> tuple[frozenset[str], Findings]:
    """Provenance and gaps of the sweep, and the fleets whose capacity was measured inside the SLO."""
    found = Findings()
    measured: set[str] = set()
    for f in m.fleets:
        cap = caps.get(f.name)
        if cap is None:
            continue
        tried = ", ".join(s.label for s in cap.steps)
        win = cap.winner
        if cap.search is not None:
            held_fleets, searched = _search_gaps(f.name, cap, cap.search, tried)
            measured |= held_fleets
            found = found + searched
            continue
        if cap.per_instance_tok_s is None or win is None:
            found.provenance[f"capacity.{f.name}"] = {
                "value": None,
                "source": "missing",
                "detail": f"no steady-state capacity-sweep step held the fleet SLO (tried {tried}); "
                "sized from the replay",
            }
            held = [st for st in cap.steps if st.slo_pass and st.per_instance_goodput_tok_s]
            if held:  # steps held the SLO but none ran long enough to show steady state
                found.gaps.append(Gap(f"capacity.{f.name}", _short_steps_reason(m, f.name, held)))
            else:
                found.gaps.append(Gap(f"capacity.{f.name}", _no_step_held_reason(m, f.name, cap.steps)))
            continue
        measured.add(f.name)
        found.provenance[f"capacity.{f.name}"] = {
            "value": cap.per_instance_tok_s,
            "source": "measured",
            "detail": f"capacity-sweep step {win.label} (x{win.multiplier:g} the manifest's rate): the highest per-instance "
            f"SLO-compliant goodput among the steps that held the fleet SLO (tried {tried})",
        }
        if win.multiplier == cap.top_multiplier:
            found.gaps.append(
                Gap(
                    f"capacity.{f.name}",
                    f"{f.name}: the capacity comes from the highest multiplier tried ({win.label}); "
                    "capacity may be higher: raise the sweep's top multiplier",
                    blocks_go=False,
                )
            )
    return frozenset(measured), found


def _short_steps_reason(m: Manifest, fleet: str, held: list[capacity.StepResult]) -> str:
    """Steps held the SLO but their arrivals spanned too few request lifetimes: say which quantity
    was short (the arrival span, against 3 lifetimes) and what to change, given the manifest's own step_s."""
    k = capacity.STEADY_STATE_LIFETIMES
    parts, advice = [], []
    sweep = m.workload.capacity_sweep
    for st in held:
        span, life = st.window_s or 0.0, st.median_e2e_s or 0.0
        need = k * life
        parts.append(
            f"{st.label}: arrivals spanned {span:.1f} s, {k:g} median request lifetimes need {k:g} x {life:.1f} s = {need:.1f} s"
        )
        if st.label == capacity.REPLAY:
            advice.append(
                f"widen workload.window.duration_s (now {m.workload.window.duration_s:g} s) so the replay's arrivals "
                f"span at least {need:.0f} s"
            )
        elif sweep is None:
            advice.append(f"lengthen step {st.label} so its arrivals span at least {need:.0f} s")
        elif sweep.step_s < need:
            advice.append(
                f"lengthen workload.capacity_sweep.step_s (now {sweep.step_s:g} s) to at least {math.ceil(need)} s"
            )
        elif span > 0:
            advice.append(
                f"workload.capacity_sweep.step_s is {sweep.step_s:g} s but {st.label}'s arrivals filled only {span:.1f} s "
                f"of it: lengthen step_s to at least {math.ceil(sweep.step_s * need / span)} s, or widen "
                "workload.window.duration_s if the trace window runs out of arrivals"
            )
    return (
        f"{fleet}: the steps that met the SLO were too short to show steady state ({'; '.join(parts)}); "
        + "; ".join(dict.fromkeys(advice))
    )


def _no_step_held_reason(m: Manifest, fleet: str, steps: tuple[capacity.StepResult, ...]) -> str:
    """No step held the SLO: each step's figure that missed, and the smallest multiplier tried."""
    slo = m.slo
    misses = []
    for st in steps:
        why = [
            f"P95 {what} {got:.3g} s > {target:g} s"
            for what, got, target in (("TTFT", st.p95_ttft_s, slo.ttft_p95_s), ("ITL", st.p95_itl_s, slo.itl_p95_s))
            if got is not None and got > target
        ]
        if st.error_rate is not None and st.error_rate > slo.max_error_rate:
            why.append(f"error rate {st.error_rate:.3f} > {slo.max_error_rate:g}")
        misses.append(
            f"{st.label}: {', '.join(why) or ('no requests' if not st.requests else 'no SLO-compliant goodput')}"
        )
    lowest = min((st for st in steps if st.label != capacity.REPLAY), key=lambda st: st.multiplier, default=None)
    advice = f"add a step below the smallest multiplier tried ({lowest.label})" if lowest else "add capacity steps"
    return f"{fleet}: no sweep step met the SLO ({'; '.join(misses)}); {advice}"


def _search_gaps(
    fleet: str,
    cap: capacity.Capacity,
    path: capacity.SearchPath,
    tried: str,
) -> tuple[set[str], Findings]:
    """Provenance and gaps of a fleet measured by the automatic search: the stop rule is named."""
    found = Findings()
    stop = f"the capacity search stopped ({path.stop_rule}: {path.stop_detail})"
    win = cap.winner
    if cap.per_instance_tok_s is None or win is None:
        found.provenance[f"capacity.{fleet}"] = {
            "value": None,
            "source": "missing",
            "detail": f"no steady-state step held the fleet SLO (tried {tried}); sized from the replay",
        }
        found.gaps.append(Gap(f"capacity.{fleet}", f"{fleet}: no steady-state step held the SLO; {stop}"))
        return set(), found
    found.provenance[f"capacity.{fleet}"] = {
        "value": cap.per_instance_tok_s,
        "source": "measured",
        "detail": f"capacity search step {win.label} (x{win.multiplier:.4g} the manifest's rate): the highest per-instance "
        f"SLO-compliant goodput among the steps that held the fleet SLO (tried {tried}); {stop}",
    }
    if not path.converged:
        found.gaps.append(
            Gap(
                f"capacity.{fleet}",
                f"{fleet}: the SLO boundary is not bracketed within {path.tolerance:.0%}: {stop}; "
                "capacity may be higher than the figure used",
                blocks_go=False,
            )
        )
    return {fleet}, found


def _series(
    m: Manifest, rs: RecordSet, measures: Mapping[str, goodput.FleetMeasure], head: ScenarioEvaluation
) -> dict[str, Any]:
    """Plot data: latency CDFs and goodput over time from the records, and the payback curve."""
    out: dict[str, Any] = {"fleets": {}}
    for name, fm in measures.items():
        s: dict[str, Any] = {
            "ttft_cdf": goodput.latency_cdf(rs, name, "ttft_s"),
            "itl_cdf": goodput.latency_cdf(rs, name, "itl_s"),
        }
        if fm.window_start_s is not None and fm.window_end_s is not None:
            s["goodput"] = goodput.goodput_series(
                rs, name, m.slo.ttft_p95_s, m.slo.itl_p95_s, fm.window_start_s, fm.window_end_s
            )
        out["fleets"][name] = s
    mig, delta = head.migration_cost_usd, head.monthly_delta_usd
    if mig is not None and delta is not None:
        months = int(max(m.horizon_months * 2, (head.payback_months or 0) * 1.5, 12))
        out["payback_curve"] = payback_curve(mig, delta, months)
    return out
