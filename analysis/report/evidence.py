"""The report's evidence from outside the records: CloudWatch and time to ready (the cloud path),
instances in service, unit prices, bills and the Prometheus cross-check.

Each source returns its own findings (gaps and provenance); a source that does not answer is a
gap, never a silent zero. Every answer pulled from outside goes through the run's pulled store
(analysis.sources.pulled, `ReportInputs.pulled`): kept under the run directory's pulled/ as it is
pulled, and read back from there in place of the network when the report is rebuilt.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.economics.cost import UnitPrices
from analysis.errors import PriceMissing, SourceUnavailable
from analysis.measure.histogram import Bucket, bucket_cdf, gap_at_resolution, quantile_in_bucket
from analysis.measure.prefix_cache import server_hit_rates
from analysis.measure.server_truth import server_step
from analysis.model import CapacityModel, Measure, ServerStep
from analysis.provenance import Findings, Gap, Sourced, run_relative
from analysis.report.inputs import AwsClients, PlannedCost, ReportInputs
from analysis.sources.billing import (
    CE_REQUEST_USD,
    REFRESH_HOURS,
    CostExplorerRefused,
    cost_explorer_window,
    read_focus_parts,
)
from analysis.sources.cloudwatch import CloudWatchSource, discover_asgs, fleet_specs
from analysis.sources.instances import CountedInstances, read_counted
from analysis.sources.pricing import RESERVED_KIND, PriceBook, PriceListSource
from analysis.sources.prometheus import HistogramNames, scrape_widened
from analysis.sources.pulled import BILLING, CLOUDWATCH, PRICES, PROMETHEUS, TIME_TO_READY, PulledSource, utc
from analysis.sources.server_series import SavedSeries, read_fleet_series, series_path
from analysis.sources.time_to_ready import time_to_ready
from core import catalog
from core.cloud_contract import LOADGEN_TASK_MEMORY_GIB, LOADGEN_TASK_VCPU, check_run_id, loadgen_task_hourly_usd
from core.manifest import Manifest
from core.records import RunSummary


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
    # per fleet, the server's prefix-cache hit rate over the replay window (analysis.measure.prefix_cache)
    prefix_cache_rates: dict[str, float | None] = field(default_factory=dict)


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
    hourly = loadgen_task_hourly_usd(got["vcpu-hour"].value, got["gb-hour"].value)
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
    measures: Mapping[str, Measure],
    *,
    pulled: PulledSource | None = None,
    sigv4_region: str | None = None,
    scrape_interval_s: float | None = None,
) -> tuple[dict[str, Any], Findings]:
    """The replay window's cross-check: each fleet's merged-histogram P95s (client and server)
    beside the records', over the window widened by a scrape interval each side where it is known.
    Every query goes through `pulled` (the run's pulled answers; None: live, kept nowhere)."""
    found = Findings()
    out: dict[str, Any] = {"url": url, "fleets": {}}
    try:
        src = (pulled or PulledSource.unkept(PROMETHEUS)).prometheus(url, sigv4_region)
    except ValueError as exc:  # a URL that is no Prometheus's (the stack's output, or --prometheus)
        return _prometheus_gap(out, found, str(exc))
    for f in m.fleets:
        fm = measures.get(f.name)
        if fm is None or fm.wall_start is None or fm.window_start_s is None or fm.window_end_s is None:
            continue
        measured = fm.wall_start + fm.window_start_s, fm.wall_start + fm.window_end_s
        start, end = scrape_widened(*measured, scrape_interval_s or 0.0)
        names = given or HistogramNames.for_stack(f.serving.stack)  # each fleet's own series
        labels = {names.fleet_label: f.name}
        sec: dict[str, Any] = {"window_unix": list(measured)}
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
                bucket: Bucket | None = None
                if p95 is not None:
                    buckets = src.merged_buckets(metric, labels, start, end)
                    entry["cdf"] = bucket_cdf(buckets)
                    located = quantile_in_bucket(0.95, buckets)  # the bucket Prometheus interpolated in
                    bucket = None if located is None else located[1]
                    entry["bucket_s"] = bucket_bounds(bucket)
                    per = src.per_replica_quantiles(0.95, metric, labels, start, end, names.replica_label)
                    entry["per_replica_p95_s"] = per
                    entry["mean_of_replica_p95_s_not_used"] = sum(per.values()) / len(per) if per else None
                if recorded is not None and p95 is not None:
                    entry["p95_s_records"] = recorded
                    # histogram - records: large means a client or clock problem; none inside the bucket
                    gap = gap_at_resolution(recorded, p95, bucket)
                    entry["difference_s"] = None if gap is None else -gap
                sec[key] = entry
        except SourceUnavailable as exc:
            return _prometheus_gap(out, found, str(exc))
        out["fleets"][f.name] = sec
    return out, found


def _prefix_cache_rates(
    pulled: PulledSource, url: str, sigv4_region: str | None, measures: Mapping[str, Measure]
) -> dict[str, float | None]:
    """Each fleet's prefix-cache hit rate over its window, asked through the same pulled answers."""
    try:
        src = pulled.prometheus(url, sigv4_region)
    except ValueError:  # the cross-check's gap names the URL
        return {}
    return server_hit_rates(src, measures)


# What the report loses without Prometheus: the cross-check, never a figure (the P95s are the records').
RECORDS_FALLBACK = (
    "every fleet's P95 TTFT and ITL come from the client's records alone, "
    "without the merged-histogram cross-check or the server's own histograms"
)


def _prometheus_gap(out: dict[str, Any], found: Findings, why: str) -> tuple[dict[str, Any], Findings]:
    found.gaps.append(Gap("prometheus", f"{why}; {RECORDS_FALLBACK}"))
    out["error"] = why
    return out, found


def with_server_steps(
    ev: Evidence,
    inp: ReportInputs,
    capacities: Mapping[str, CapacityModel],
    base: Mapping[str, Measure],
) -> Evidence:
    """`ev` with the server's P95s per step (prometheus.steps), computed from the series the run saved
    in `inp.metrics_dir` alone (no query), next to each step's client P95s from the records."""
    if inp.metrics_dir is None:
        return ev
    metrics_dir = Path(inp.metrics_dir)
    found = Findings()
    steps: dict[str, list[ServerStep]] = {}
    url = ""
    for f in inp.manifest.fleets:
        saved = read_fleet_series(metrics_dir, f.name)
        if not saved:
            continue
        clients = _client_p95s(capacities.get(f.name), base.get(f.name))
        steps[f.name] = [_server_step(s, metrics_dir, clients.get(s.step), found) for s in saved]
        steps[f.name].sort(key=lambda st: st.window_unix[0])
        url = url or saved[0].url
        found.provenance[f"prometheus.steps.{f.name}"] = {
            "source": "pulled",
            "detail": f"{metrics_dir.name}/{f.name}/*.json: the server's histograms over each step's window, pulled "
            f"from {saved[0].url} at the end of the run (sum by (le) of increase, then histogram_quantile)",
        }
    if not steps:
        return ev
    section = dict(ev.prometheus) if ev.prometheus is not None else {"url": url, "fleets": {}}
    section["steps"] = {k: [st.model_dump() for st in v] for k, v in steps.items()}
    return dataclasses.replace(ev, prometheus=section, prometheus_found=ev.prometheus_found + found)


def _client_p95s(cap: CapacityModel | None, replay: Measure | None) -> dict[str, tuple[float | None, float | None]]:
    """Per step label, the client's P95 TTFT and ITL from the records (the capacity rows, the replay)."""
    out = {row.label: (row.p95_ttft_s, row.p95_itl_s) for row in (cap.steps if cap is not None else [])}
    if replay is not None:
        out.setdefault("replay", (replay.p95_ttft_s, replay.p95_itl_s))
    return out


def bucket_bounds(bucket: Bucket | None) -> tuple[float | None, float | None] | None:
    """A bucket as report.json holds it: an unbounded end (the +Inf bucket's) as null."""
    if bucket is None:
        return None
    lower, upper = bucket
    return (None if math.isinf(lower) else lower, None if math.isinf(upper) else upper)


def _server_step(
    saved: SavedSeries, metrics_dir: Path, client: tuple[float | None, float | None] | None, found: Findings
) -> ServerStep:
    rel = series_path(Path(metrics_dir.name), saved.fleet, saved.step).as_posix()
    got = server_step(saved, rel)
    if got.status == "target_down":  # a gap, never a smaller histogram
        found.gaps.append(Gap(f"prometheus.steps.{saved.fleet}.{saved.step}", got.note, blocks_go=False))
    ttft, itl = client if client is not None else (None, None)
    return ServerStep(
        label=saved.step,
        source="pulled",
        series=rel,
        window_unix=saved.window_unix,
        window_s=saved.window_s,
        scrape_interval_s=saved.scrape_interval_s,
        status=got.status,
        note=got.note,
        p95_ttft_s=got.p95_ttft_s,
        p95_itl_s=got.p95_itl_s,
        client_p95_ttft_s=ttft,
        client_p95_itl_s=itl,
        ttft_bucket_s=bucket_bounds(got.ttft_bucket),
        itl_bucket_s=bucket_bounds(got.itl_bucket),
        ttft_gap_s=gap_at_resolution(ttft, got.p95_ttft_s, got.ttft_bucket),
        itl_gap_s=gap_at_resolution(itl, got.p95_itl_s, got.itl_bucket),
    )


def _time_to_ready(m: Manifest, clients: AwsClients, pulled: PulledSource) -> tuple[dict[str, Any], Findings]:
    """Per fleet, instance launch -> first healthy NLB target: a migration activity measured in the cloud run."""
    found = Findings()
    autoscaling = pulled.client("autoscaling", clients.autoscaling)
    elbv2 = pulled.client("elbv2", clients.elbv2)
    cloudwatch = pulled.client("cloudwatch", clients.cloudwatch)
    if autoscaling is None or elbv2 is None or cloudwatch is None:
        return {}, found
    try:
        asgs = discover_asgs(autoscaling, m.campaign)
        # health up to when the answers were pulled (a rebuilt report asks up to the same time)
        ready = time_to_ready(autoscaling, elbv2, cloudwatch, m.campaign, asgs, pulled.now)
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
        f"AWS/NetworkELB HealthyHostCount >= 1 on the fleet's target group (60 s resolution); pulled {utc(pulled.now)}, "
        f"kept in {pulled.where}",
    }
    return {name: r.as_dict() for name, r in ready.items()}, found


def _instances_measured(
    m: Manifest,
    given: Mapping[str, int] | None,
    cw: dict[str, Any],
    counted: Mapping[str, CountedInstances],
) -> tuple[dict[str, int], Findings]:
    """Per fleet, the instances the replay ran on: as its runner counted them while it ran (on
    AWS, the fewest healthy targets), else as the runner gives them (locally, the emulated
    instances), else CloudWatch's in-service count, else what the stack deploys (assumed)."""
    found = Findings()
    out: dict[str, int] = {}
    for f in m.fleets:
        if f.name in counted:
            c = counted[f.name]
            out[f.name] = c.instances
            found.provenance[f"instances_measured.{f.name}"] = {
                "value": c.instances,
                "source": c.source,
                # every poll is kept (the steps divide by their time-weighted mean); the replay by the fewest
                "detail": f"the fewest {c.detail}" if c.polls else c.detail,
            }
        elif given and f.name in given:
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
            out[f.name] = f.instances_deployed
            found.provenance[f"instances_measured.{f.name}"] = {
                "value": out[f.name],
                "source": "manifest",
                "detail": "what the stack deploys (the larger of fleets[].asg.desired and measure_instances), "
                "assumed in service for the whole run",
            }
            found.gaps.append(
                Gap(
                    f"instances_measured.{f.name}",
                    "instances in service not measured; assumed what the stack deploys",
                    blocks_go=False,
                )
            )
    return out, found


def gather_evidence(inp: ReportInputs, base: Mapping[str, Measure], summaries: Iterable[RunSummary] = ()) -> Evidence:
    """CloudWatch and time to ready (the cloud path), instances in service, prices, bills and Prometheus;
    `base`: the replay's measures under the manifest's SLO (their windows bound every query);
    `summaries`: the run summaries of the replay and every capacity step (where the run ended)."""
    m = inp.manifest
    clients = inp.aws_clients or (AwsClients.from_session(m.costs.region) if inp.aws else None)

    def pulled(name: str) -> PulledSource:
        return inp.pulled.source(name) if inp.pulled is not None else PulledSource.unkept(name)

    cw: dict[str, Any] = {}
    ready: dict[str, Any] = {}
    cloud = Findings()
    if inp.aws and clients is not None:
        cw, cloud = _cloudwatch(m, clients, base, pulled(CLOUDWATCH))
        ready, found_ready = _time_to_ready(m, clients, pulled(TIME_TO_READY))
        cloud = cloud + found_ready
    inst, inst_found = _instances_measured(m, inp.instances_measured, cw, read_counted(Path(inp.records_dir)))

    use_api = inp.aws or m.costs.price_source == "price-list-api"
    prices = pulled(PRICES) if use_api and clients is not None else None
    pricing = prices.client("pricing", clients.pricing) if prices is not None and clients is not None else None
    api = PriceListSource(pricing, m.costs.region) if pricing is not None else None
    # a pulled price is dated the day it was pulled, also when the report is rebuilt later
    book = PriceBook(m.costs.region, api)
    if prices is not None:
        book.today = utc(prices.now)[:10]
    unit_prices, prices_found = _resolve_prices(m, book)
    task_hourly, task_source, task_found = _loadgen_task_price(book)
    prices_found = prices_found + task_found
    for note in book.notes:
        prices_found.gaps.append(Gap("prices.api", note, blocks_go=False))

    billing: dict[str, Any] = {}
    billing_found = Findings()
    if inp.planned_cost is not None or inp.focus_csv is not None or inp.aws:  # else no billing section
        window = measured_window(base, summaries)
        billing, billing_found = _billing(inp, clients, window, pulled(BILLING))
        if inp.planned_cost is not None:
            billing["plan"] = _planned(inp.planned_cost)
        billing["computed"] = _computed_cost(m, book, task_hourly, window)
    prom: dict[str, Any] | None = None
    prom_found = Findings()
    rates: dict[str, float | None] = {}
    queries = pulled(PROMETHEUS)
    # saved answers are the run's own Prometheus's, at the URL they were pulled from
    url = inp.prometheus_url if queries.live else queries.prometheus_url
    if url:
        sigv4 = inp.prometheus_sigv4_region if queries.live else queries.about.get("sigv4_region")
        prom, prom_found = _prometheus_section(
            m,
            url,
            inp.histogram_names,
            base,
            pulled=queries,
            sigv4_region=sigv4,
            scrape_interval_s=inp.prometheus_scrape_interval_s,
        )
        rates = _prefix_cache_rates(queries, url, sigv4, base)
        interval = inp.prometheus_scrape_interval_s
        widened = (
            f"the window widened by the {interval:g} s scrape interval each side"
            if interval
            else "the window as measured, not widened: the scrape interval is unknown (not in campaign.json)"
        )
        prom_found.provenance["prometheus"] = {
            "source": "measured",
            "detail": f"{url}: sum by (le) of increase() over {widened}, histogram_quantile; pulled "
            f"{utc(queries.now)}, kept in {queries.where}",
        }
    return Evidence(
        cloudwatch=cw,
        time_to_ready=ready,
        instances=inst,
        unit_prices=unit_prices,
        billing=billing,
        prometheus=prom,
        cloud_found=cloud,
        instances_found=inst_found,
        prices_found=prices_found,
        billing_found=billing_found,
        prometheus_found=prom_found,
        loadgen_task_hourly_usd=task_hourly,
        loadgen_price_source=task_source,
        prefix_cache_rates=rates,
    )


def _cloudwatch(
    m: Manifest, clients: AwsClients, base: Mapping[str, Measure], pulled: PulledSource
) -> tuple[dict[str, Any], Findings]:
    """Per fleet, the ASG's and accelerator's CloudWatch figures over the measured window."""
    found = Findings()
    cw: dict[str, Any] = {}
    try:
        asgs = discover_asgs(pulled.client("autoscaling", clients.autoscaling), m.campaign)
        src = CloudWatchSource(pulled.client("cloudwatch", clients.cloudwatch))
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
            "detail": f"CloudWatch GetMetricData (Average/Sum/Maximum); pulled {utc(pulled.now)}, kept in {pulled.where}",
        }
    except SourceUnavailable as exc:
        found.gaps.append(Gap("cloudwatch", str(exc), blocks_go=False))
    return cw, found


@dataclass(frozen=True)
class MeasuredWindow:
    """The run's measured wall-clock window: the replay's first request to the last end a step or
    settle segment's run summary records (core.records.RunSummary.ended_at), Unix seconds."""

    start: float
    end: float

    @property
    def hours(self) -> float:
        return (self.end - self.start) / 3600

    def words(self) -> str:
        return f"{_iso(self.start)} .. {_iso(self.end)} UTC ({self.hours * 60:.1f} min)"


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def measured_window(base: Mapping[str, Measure], summaries: Iterable[RunSummary]) -> MeasuredWindow | None:
    """From the replay's first request to the latest ended_at among the replay's, the capacity
    steps' and the settle segments' run summaries (their last answer, or the window's end when none
    says); None without a replay window."""
    starts = [
        fm.wall_start + fm.window_start_s
        for fm in base.values()
        if fm.wall_start is not None and fm.window_start_s is not None
    ]
    if not starts:
        return None
    ends = [
        fm.wall_start + fm.window_end_s
        for fm in base.values()
        if fm.wall_start is not None and fm.window_end_s is not None
    ]
    ends += [s.ended_at for s in summaries if s.ended_at > 0]
    start = min(starts)
    return MeasuredWindow(start, max([start, *ends]))


# What the computed figure leaves out, in the report's words.
COMPUTED_LEAVES_OUT = (
    "EBS volumes, inter-AZ transfer, LCUs, the Prometheus task and a `run --detach`'s conductor (which the plan "
    "counts) are left out, and so is the time outside the window: the fleets "
    "bill from deploy to teardown (deploy, compile, readiness, the quality gate, the report and teardown), "
    "which campaign.json does not record"
)


def _computed_cost(
    m: Manifest,
    book: PriceBook,
    task_hourly: float | None,
    window: MeasuredWindow | None,
) -> dict[str, Any]:
    """Unit prices x the instance-hours of the measured window: each fleet's instances deployed for
    the whole window (a fleet bills while the other is measured), the load generator's tasks (a
    master and the workers per fleet) and the NLB's hours over the same window."""
    if window is None:
        return _unavailable("computed (prices x measured instance-hours)", "the replay recorded no window")
    usd, parts, dates = 0.0, [], set()
    try:
        for f in m.fleets:
            price = book.get("instance", f.instance_type)
            dates.update(_DATE.findall(price.detail))
            # Every instance the fleet's Auto Scaling group runs bills, healthy or not: the group's
            # size the stack deploys (stacks/fleet.py: desired_capacity=instances_deployed), not the
            # healthy targets the runner counted (instances.json), which size the measured capacity.
            n = f.instances_deployed
            usd += n * price.value * window.hours
            parts.append(f"{f.name}: {n} x {f.instance_type} deployed at {price.value:g} USD/h")
        nlb = book.get("nlb", "hour")
        usd += nlb.value * window.hours
        parts.append(f"the NLB at {nlb.value:g} USD/h")
    except PriceMissing as exc:
        return _unavailable("computed (prices x measured instance-hours)", str(exc))
    if task_hourly is not None:
        tasks = len(m.fleets) * (m.loadgen.workers + 1)
        usd += tasks * task_hourly * window.hours
        parts.append(
            f"{tasks} load-generator tasks at {task_hourly:.4g} USD/h (they run only while a step does: an upper bound)"
        )
    else:
        parts.append("load-generator tasks not counted (no Fargate price)")
    return {
        "usd": round(usd, 4),
        "source": "computed: unit prices (provenance prices.*) x the instances deployed over the measured window",
        "date": " .. ".join(sorted({min(dates), max(dates)})) if dates else None,  # the prices' as-of dates
        "covers": f"the measured window, {window.words()}: " + "; ".join(parts) + f". {COMPUTED_LEAVES_OUT}",
    }


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _unavailable(source: str, why: str) -> dict[str, Any]:
    return {"usd": None, "source": source, "date": None, "covers": "nothing: unavailable", "unavailable": why}


def _planned(planned: PlannedCost) -> dict[str, Any]:
    covers = f"the whole campaign as planned, {planned.minutes:.0f} min from deploy to teardown (campaign plan's usd breakdown)"
    if planned.usd is None:
        return _unavailable(
            planned.source, "the plan could not price every part (a price is missing from the snapshot)"
        )
    return {"usd": planned.usd, "source": planned.source, "date": planned.date, "covers": covers}


def _refetch_command(inp: ReportInputs) -> str:
    """The command that asks for the bill again: `report --run-id` (docs/cli.md), with the run's id
    where the run directory is named by it (a cloud run's), else a placeholder."""
    run_dir = Path(inp.records_dir).parent
    try:
        run_id = check_run_id(run_dir.name)
    except ValueError:
        run_id = "RUN_ID"
    return f"`python -m campaign report MANIFEST --run-id {run_id} --out DIR` (it asks Cost Explorer again)"


def _provisional(
    inp: ReportInputs, window: MeasuredWindow, pulled_at: float, estimated: bool, source: str
) -> str | None:
    """Why a billed figure may still change, naming the command that fetches it again; None when
    nothing says so. Cost Explorer marks a period whose month is not closed `Estimated`
    (GetCostAndUsage, ResultByTime.Estimated) and refreshes its data up to REFRESH_HOURS after usage."""
    why = []
    if estimated:
        why.append(f"{source} marks it Estimated (its month's bill is not final)")
    age_h = (pulled_at - window.end) / 3600
    if age_h < REFRESH_HOURS:
        why.append(
            f"pulled {max(age_h, 0.0):.1f} h after the window ended, less than the {REFRESH_HOURS:g} h Cost Explorer and "
            "the billing data take to refresh (and cost allocation tags to activate)"
        )
    if not why:
        return None
    return "; ".join(why) + f"; fetch it again later with {_refetch_command(inp)}"


def _billing(
    inp: ReportInputs,
    clients: AwsClients | None,
    window: MeasuredWindow | None,
    pulled: PulledSource,
) -> tuple[dict[str, Any], Findings]:
    """What the bill says over the run's window: a FOCUS export (local, s3:// object or every part
    under an s3:// prefix, rows whose charge period meets the window) and Cost Explorer by fleet tag
    (cloud path), each where given; `billed` is the FOCUS export's BilledCost when it has rows
    (resource-level, by the hour), else Cost Explorer's, else unavailable with the reason. No rows
    is no figure (a gap with its reason), never 0 USD; a figure that may still change says so
    (`_provisional`), and Cost Explorer's requests are counted and priced (provenance)."""
    m = inp.manifest
    found = Findings()
    billing: dict[str, Any] = {}
    billed: dict[str, Any] | None = None
    why_not: list[str] = []
    client = pulled.client("ce", clients.ce) if inp.aws and clients is not None else None
    requests = 0
    if client is None:
        why_not.append("Cost Explorer: not asked (a report without --aws)")
    elif window is None:
        why_not.append("Cost Explorer: the replay recorded no window to ask about")
    else:
        try:
            # "now" is when the bill was pulled: HOURLY reaches 14 days back from then
            ce = cost_explorer_window(client, m.campaign, window.start, window.end, pulled.now)
        except SourceUnavailable as exc:
            requests = exc.requests if isinstance(exc, CostExplorerRefused) else 0
            found.gaps.append(Gap("billing.cost_explorer", str(exc), blocks_go=False))
            why_not.append(str(exc))
        else:
            requests = ce.requests
            usd = ce.usd
            if usd is None:  # no rows: the bill is not known yet, not 0 USD (billing.NO_ROWS says why)
                no_rows = f"{ce.no_rows}; fetch it again later with {_refetch_command(inp)}"
                found.gaps.append(Gap("billing.cost_explorer", no_rows, blocks_go=False))
                why_not.append(no_rows)
            else:
                billing["cost_explorer"] = ce.by_fleet
                # the bill as it stood when pulled: Cost Explorer refreshes it for up to 24 h after
                # (billing.NO_ROWS), so the answer keeps its date (pulled/billing.json)
                detail = (
                    f"Cost Explorer UnblendedCost by tag fleet, {ce.granularity} {ce.start} .. {ce.end} (end exclusive); "
                    f"{ce.note}; pulled {utc(pulled.now)}, kept in {pulled.where}"
                )
                found.provenance["billing.cost_explorer"] = {"source": "pulled", "detail": detail}
                covers = (
                    f"{ce.granularity}: the whole UTC {'hours' if ce.granularity == 'HOURLY' else 'days'} "
                    f"that hold the measured window, so whatever else the campaign's resources ran in them; {ce.note}"
                )
                provisional = _provisional(inp, window, pulled.now, ce.estimated, "Cost Explorer")
                if provisional:
                    found.gaps.append(Gap("billing.billed", f"the billed figure is provisional: {provisional}", False))
                    covers = f"PROVISIONAL: {provisional}. {covers}"
                billed = {
                    "usd": round(usd, 4),
                    "source": f"billed: Cost Explorer GetCostAndUsage, tag campaign={m.campaign}, pulled {utc(pulled.now)}",
                    "date": f"{ce.start} .. {ce.end}",
                    "covers": covers,
                }
    if requests:
        found.provenance["billing.cost_explorer_requests"] = {
            "source": "pulled",
            "value": round(requests * CE_REQUEST_USD, 4),
            "detail": f"{requests} Cost Explorer GetCostAndUsage request(s) when the bill was pulled "
            f"({utc(pulled.now)}), {requests * CE_REQUEST_USD:.2f} USD at {CE_REQUEST_USD:g} USD a request, every page "
            "and a refused HOURLY one counted (AWS Cost Explorer pricing, 'AWS Cost Explorer API'); each "
            "`report --run-id` asks again",
        }
    if inp.focus_csv is not None:
        span = (window.start, window.end) if window is not None else None
        s3 = clients.s3 if clients is not None else None
        where = run_relative(inp.focus_csv, inp.out_dir)
        try:
            sums = read_focus_parts(inp.focus_csv, m.campaign, span, s3=s3)
        except SourceUnavailable as exc:
            found.gaps.append(Gap("billing.focus", str(exc), blocks_go=False))
            why_not.append(str(exc))
        else:
            parts = f"{len(sums.parts)} part(s)" if len(sums.parts) > 1 else "one file"
            if not sums.bills:  # no rows is no bill known, not 0 USD
                why = (
                    f"FOCUS export {where} ({parts}) has no rows tagged campaign={m.campaign}"
                    + (" whose charge period meets the measured window" if window is not None else "")
                    + ": the export may not cover the window yet (it is refreshed as the bill is, up to 24 h "
                    "after usage), or the campaign's cost allocation tags were not active when it was written"
                )
                found.gaps.append(Gap("billing.focus", why, blocks_go=False))
                why_not.append(why)
            else:
                billing["focus"] = {k: v.as_dict() for k, v in sums.bills.items()}
                found.provenance["billing.focus"] = {"source": "pulled", "detail": f"FOCUS export {where}, {parts}"}
                covers = (
                    "rows whose charge period [ChargePeriodStart, ChargePeriodEnd) meets the measured window: "
                    "whole charge periods (an hour, typically), so all their resources billed in them"
                    if window is not None
                    else "every row of the export (no replay window to limit it)"
                )
                provisional = _provisional(inp, window, pulled.now, False, "") if window is not None else None
                if provisional:
                    found.gaps.append(Gap("billing.billed", f"the billed figure is provisional: {provisional}", False))
                    covers = f"PROVISIONAL: {provisional}. {covers}"
                billed = {
                    "usd": round(sum(b.billed_usd for b in sums.bills.values()), 4),
                    "source": f"billed: FOCUS export {where} ({parts}), BilledCost of rows tagged campaign={m.campaign}",
                    "date": window.words() if window is not None else None,
                    "covers": covers,
                }
    else:
        why_not.append("FOCUS: no export given (report --focus FILE, s3://BUCKET/KEY or s3://BUCKET/PREFIX/)")
    billing["billed"] = billed or _unavailable("billed: no billing source answered", "; ".join(why_not))
    return billing, found
