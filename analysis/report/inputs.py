"""What the campaign hands `build_report`: the manifest, where the records are, and what else the run knows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from analysis.capacity.settle_record import SettleOutcome
from analysis.model import QualityResult
from analysis.sources.pricing import PRICING_ENDPOINT_REGION
from analysis.sources.prometheus import HistogramNames
from analysis.sources.pulled import PulledStore
from core import catalog
from core.manifest import Manifest

# The root volume the stacks deploy (core.catalog); the cache volume comes from fleets[].ebs_cache_gib.
DEFAULT_ROOT_VOLUME_GIB = float(catalog.ROOT_VOLUME_GIB)

# The quality gate's results per fleet, as the campaign runner's stages produce them
# (campaign.stages.quality.fleet_quality; quality.json read back by campaign.stages.run.read_quality).
QualityInput = Mapping[str, QualityResult]


@dataclass
class AwsClients:
    """boto3 clients the report may use; injectable so tests run against moto / Stubber."""

    pricing: Any = None
    cloudwatch: Any = None
    autoscaling: Any = None
    ce: Any = None
    elbv2: Any = None
    s3: Any = None  # a FOCUS export at s3://

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
            s3=s.client("s3", region_name=region),
        )


@dataclass(frozen=True)
class PlannedCost:
    """The plan's predicted campaign cost (campaign.plan.predict's campaign_usd and minutes), as the
    campaign hands it over: analysis cannot import the plan, which is above it."""

    usd: float | None  # None: the plan could not price a fleet
    minutes: float
    source: str  # e.g. "predicted (campaign plan, 2026-12-05T20:00:00Z)"
    date: str  # when the plan was made; `source` says how that is known


class Resumption(BaseModel):
    """One `run --resume` of the run, as campaign.stages.resume.record_resume keeps it in the run
    directory (resumes.json, one per resume, in order): the report says the run was cut off and
    what of it was measured before and after, and `report --run-dir` says the same."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str = Field(description="the stage the run was cut off in, which it went on from")
    carried_over: tuple[str, ...] = Field(
        description='finished search steps and settle segments kept, "<fleet>/x<k>[/settle-<n>]"'
    )
    set_aside: tuple[str, ...] = Field(
        description="what the cut-off stage had left half done, moved under interrupted/ (run-relative) and run again"
    )


@dataclass(frozen=True)
class ReportInputs:
    """Everything `build_report` reads. Past `records_dir` every field is keyword-only.

    `capacity_dirs`: capacity-sweep steps, label ("x0.5", "g6/x2": a multiplier of the manifest's
    rate) -> directory of that step's records; fleets are then sized from the measured capacity
    (see analysis.capacity.steps). `systems_under_test`: what served the fleets when that is not the
    manifest's hardware (a local campaign's emulators or CPU engines); the report states it above
    the decision. `settle`: what the campaign's settle phase did (analysis.capacity.settle_record.SettleOutcome):
    its segments are already in the capacity steps' records; this says what they bought."""

    manifest: Manifest
    records_dir: str | Path
    _: KW_ONLY
    out_dir: str | Path
    prometheus_url: str | None = None
    # Sign the queries with SigV4 for service aps in this region even though the URL is not an AMP
    # workspace's (the offline stand-in, testing/sigv4_proxy.py); an AMP URL is signed anyway.
    prometheus_sigv4_region: str | None = None
    # The interval the fleets were scraped at (RunFacts): the replay window's queries are widened
    # by it (analysis.sources.prometheus.scrape_widened); None: unknown, the window as measured.
    prometheus_scrape_interval_s: float | None = None
    aws: bool = False
    quality: QualityInput | None = None
    instances_measured: Mapping[str, int] | None = None
    histogram_names: HistogramNames | None = None
    focus_csv: str | Path | None = None  # a FOCUS export: a local CSV or s3://bucket/key
    planned_cost: PlannedCost | None = None  # the plan's figure, for billing's plan / computed / billed
    root_volume_gib: float = DEFAULT_ROOT_VOLUME_GIB
    aws_clients: AwsClients | None = None
    with_sensitivity: bool = True
    with_pages: bool = True
    capacity_dirs: Mapping[str, Path] | None = None
    # The run's capacity/ directory: each fleet's search.json is read from `<fleet>/` there too, so
    # that a search stopped before its first step (no step directory) still shows how it stopped.
    capacity_root: Path | None = None
    systems_under_test: str | None = None
    settle: SettleOutcome | None = None
    # The run's resumes, in order (empty: it ran through): stated in the report's provenance.
    resumed: tuple[Resumption, ...] = ()
    # The run directory's metrics/: the server's histograms per step as the run saved them
    # (analysis.sources.server_series); the report's per-step server figures come from it alone.
    metrics_dir: str | Path | None = None
    # The run directory's pulled/: every answer pulled from AWS and Prometheus is kept there as it
    # is pulled, and read from there in place of the network for the sources it names as saved
    # (analysis.sources.pulled); None: pulled live and kept nowhere.
    pulled: PulledStore | None = None
