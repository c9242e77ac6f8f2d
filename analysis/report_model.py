"""The typed, versioned shape of report.json: what `build_report` returns and the renderers read.

Field names are report.json's own (the README and the tests describe them). JSON has no
Infinity/NaN: such floats are written as null (`model_dump(mode="json")`).

Compatibility rule for `report_version` ("MAJOR.MINOR"): bump MAJOR on any breaking change
(a field removed, renamed, retyped, or its meaning changed); bump MINOR when a field is only
added. A reader accepts a report of its own MAJOR and a MINOR no newer than its own (every
model forbids unknown fields, so a newer MINOR's additions would be refused anyway).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from analysis.errors import AnalysisError

REPORT_VERSION = "2.1"

Interval = tuple[float | None, float | None]  # a 95% interval's [low, high]; a null end: unbounded or unknown
Point = tuple[float, float]  # one (x, y) of a plot series


class _Model(BaseModel):
    # Unknown fields are refused: a misspelt or stale field in a report.json is an error, not silently dropped.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="null")


class Slo(_Model):
    ttft_p95_s: float
    itl_p95_s: float
    max_error_rate: float
    max_retry_rate: float | None = None


class Comparison(_Model):
    baseline: str
    candidate: str


class ToSettleFleet(_Model):
    """One fleet's share of `decision.to_settle` (analysis.to_settle)."""

    requests_now: int = Field(description="requests of the step the fleet is sized from (its capacity boundary)")
    more_requests: int | None = Field(description="requests still missing at that step; null: not computable")
    rate_req_s: float | None = Field(description="that step's measured request rate (requests / arrival span) over the instances measured")
    minutes: float | None = Field(description="minutes the missing requests take at that rate")
    instances: int = Field(description="instances in service while the step was measured (instances_measured)")
    instance_hourly_usd: float | None = Field(description="On-Demand hourly price of one instance (provenance prices.instance.*)")
    loadgen_tasks: int = Field(description="load-generator tasks driving the fleet: one Locust master + loadgen.workers workers")
    loadgen_task_hourly_usd: float | None = Field(description="one task's Fargate hourly price (provenance prices.fargate_*); null: none")
    usd: float | None = Field(description="minutes x (instances x instance price + tasks x task price); null: a price or rate is missing")


class ToSettle(_Model):
    """The evidence that would settle an undecided decision, in the user's units (analysis.to_settle)."""

    threshold: Literal["go", "zero"] = Field(
        description="the threshold the interval straddles and this evidence aims at: 'go' (migration cost / horizon + margin: "
                    "migrate or not), or, once Go is ruled out, 'zero' (Defer or Reject); never the delta's sign for its own sake")
    threshold_usd_per_month: float = Field(description="that threshold's value at the point estimate (USD/month of monthly delta)")
    factor: float | None = Field(
        description="(the interval's reach toward the threshold / the point's distance from it)^2: the multiple of each fleet's "
                    "sizing-step requests that would settle it, the half-width shrinking as 1/sqrt(n); null: no ratio (an end is "
                    "unknown, or the point is on the threshold)")
    lower_bound: bool = Field(description="true when an end of the interval is unknown: the figures are lower bounds")
    requests: dict[str, int | None] = Field(
        description="per fleet: requests at its capacity boundary (the step it is sized from) that would settle the threshold, "
                    "in total; null: no sample size settles it (the point is on the threshold)")
    minutes: float | None = Field(description="minutes to measure the missing requests at the measured rates, fleets side by side")
    usd: float | None = Field(description="what those minutes cost: every fleet's instances and load-generator tasks (see by_fleet)")
    by_fleet: dict[str, ToSettleFleet]
    basis: str = Field(description="how each figure is computed and where its prices come from")


class Decision(_Model):
    state: Literal["go", "defer", "reject"]
    reasons: list[str]
    go_threshold_usd_per_month: float | None = Field(
        default=None, description="migration cost / horizon + indifference margin: a Go needs the monthly delta's 95% low end above it")
    to_settle: ToSettle | None = Field(
        default=None,
        description="while the decision is undecided (its interval straddles the Go threshold, or 0 once Go is ruled out): the "
                    "requests, minutes and USD that would settle it; null when settled (or decided on semantics or quality)")


class Gap(_Model):
    what: str
    reason: str
    blocks_go: bool


class ProvenanceEntry(_Model):
    """Where one input came from: measured, pulled, snapshot, pinned, manifest, assumption, computed or missing."""

    source: str
    detail: str
    value: Any = None


class Measure(_Model):
    """analysis.goodput.FleetMeasure.as_dict: the replay's counts, tokens, window and P95s."""

    fleet: str
    requests: int
    successful_requests: int
    successful_output_tokens: int
    completed_ok: int
    completed_output_tokens: int
    errors: int
    no_text: int
    not_sent: int
    quality_failed: int
    slo_violations: int
    slo_verdict_disagreements: int
    warmup_excluded: int
    p95_ttft_s: float | None
    p95_itl_s: float | None
    wall_start: float | None
    window_start_s: float | None
    window_end_s: float | None
    window_s: float | None
    error_rate: float | None
    goodput_tok_s: float | None


class QuantileInterval(_Model):
    """core.stats quantile interval: order-statistic ranks, distribution-free."""

    q: float
    n: int
    point: float | None
    ci: Interval
    ranks: tuple[int, int]
    coverage: float | None
    method: str


class FleetIntervalsModel(_Model):
    basis: str
    basis_requests: int
    capacity_note: str
    p95_ttft: QuantileInterval
    p95_itl: QuantileInterval
    basis_p95_ttft: QuantileInterval
    basis_p95_itl: QuantileInterval


class CapacityStep(_Model):
    """One capacity-sweep step (or the replay) of one fleet; the P95 intervals are added per step."""

    label: str
    multiplier: float
    requests: int
    successful_requests: int
    per_instance_goodput_tok_s: float | None
    p95_ttft_s: float | None
    p95_itl_s: float | None
    error_rate: float | None
    slo_pass: bool
    peak_in_flight_per_instance: float | None
    window_s: float | None
    median_e2e_s: float | None
    steady_state: bool
    valid: bool
    p95_ttft_ci_s: Interval | None = None
    p95_ttft_n: int | None = None
    p95_itl_ci_s: Interval | None = None
    p95_itl_n: int | None = None


class SearchStep(_Model):
    """One step of the automatic capacity search (analysis.capacity.SearchStep)."""

    label: str
    multiplier: float
    why: str
    planned_span_s: float
    arrival_span_s: float | None
    requests: int
    rate_req_s: float | None
    median_lifetime_s: float | None
    sizing_lifetime_s: float | None
    p95_ttft_s: float | None
    p95_itl_s: float | None
    error_rate: float | None
    verdict: str
    detail: str
    met_share: float | None = None  # share of the step's sent requests that met their per-request SLO
    took_s: float | None = None  # wall seconds the step cost the search
    itl_missed: bool = False  # its P95 ITL was over target: its met share is no estimate of the boundary


class SearchPath(_Model):
    fleet: str
    steps: list[SearchStep]
    held_multiplier: float | None
    missed_multiplier: float | None
    stop_rule: str
    stop_detail: str
    tolerance: float


class CapacityModel(_Model):
    steps: list[CapacityStep]
    per_instance_tok_s: float | None
    step: str | None
    search: SearchPath | None = None


class FleetSize(_Model):
    demand_tok_s: float
    per_instance_tok_s: float
    utilization_target: float
    busy_instances: int
    headroom_instances: int
    redundancy_instances: int
    asg_min_topup: int
    required: int
    asg_max: int
    per_az: dict[str, int]
    exceeds_asg_max: bool


class MonthlyCost(_Model):
    compute_usd: float
    idle_headroom_usd: float
    redundancy_usd: float
    unused_commitment_usd: float
    ebs_usd: float
    nlb_usd: float
    inter_az_usd: float
    observability_usd: float
    licenses_usd: float
    compute_note: str
    total_usd: float

    def lines_usd(self) -> dict[str, float]:
        """The cost lines in USD (total last), keyed without the `_usd` suffix."""
        return {k.removesuffix("_usd"): v for k, v in self.model_dump().items() if k.endswith("_usd")}


class MeasuredRun(_Model):
    cost_usd: float
    window_s: float | None
    cost_per_million_successful_tokens: float | None
    basis: str


class FleetRow(_Model):
    """One fleet of the headline evaluation; fields a measurement would need stay null when it is missing."""

    instance_type: str
    requests: int
    successful_requests: int
    successful_output_tokens: int
    p95_ttft_s: float | None
    p95_itl_s: float | None
    slo_pass: bool
    instances_required: int | None
    monthly_cost_usd: float | None
    cost_per_million_successful_tokens: float | None
    error_rate: float | None = None
    instances_measured: int | None = None
    per_instance_goodput_tok_s: float | None = None
    measure: Measure | None = None
    # saturation (absent when not measured)
    peak_in_flight: int | None = None
    peak_in_flight_per_instance: float | None = None
    max_concurrency: int | None = None
    saturated: bool | None = None
    per_instance_goodput_bound: Literal["capacity", "lower_bound"] | None = None
    # capacity sweep (absent without one)
    capacity: CapacityModel | None = None
    sized_from: str | None = None
    size: FleetSize | None = None
    monthly_cost: MonthlyCost | None = None
    # 95% intervals (absent when the report claims none)
    p95_ttft_ci_s: Interval | None = None
    p95_ttft_n: int | None = None
    p95_itl_ci_s: Interval | None = None
    p95_itl_n: int | None = None
    capacity_ci_tok_s: Interval | None = None
    intervals: FleetIntervalsModel | None = None
    instances_required_ci: tuple[int | None, int | None] | None = None
    monthly_cost_ci_usd: Interval | None = None
    monthly_successful_tokens: float | None = None
    measured_run: MeasuredRun | None = None
    outcomes: dict[str, int] | None = None
    itl_basis: dict[str, int] | None = None


class Ledger(_Model):
    """The migration ledger: one-off items in USD and their total."""

    items_usd: dict[str, float]
    total_usd: float


class ScenarioEvaluation(_Model):
    """analysis.evaluate.evaluate's result for one scenario; the headline's (the manifest as written) is part of the report."""

    fleets: dict[str, FleetRow]
    demand_tok_s: float | None
    pooled_output_tokens_per_request: float | None
    utilization_target: float | None
    monthly_delta_usd: float | None
    monthly_delta_ci_usd: Interval | None
    migration: Ledger | None
    migration_cost_usd: float | None
    payback_months: float | None
    payback_months_ci: Interval | None
    months_to_next_refresh: float | None
    decision: Decision


class Headline(_Model):
    """The figures the report may headline: all of them, or none (null) with the gaps that block them."""

    decided: bool
    blocked_by: list[str]
    monthly_delta_usd: float | None = None
    monthly_delta_ci_usd: Interval | None = None
    migration_cost_usd: float | None = None
    payback_months: float | None = None
    payback_months_ci: Interval | None = None
    instances_required: dict[str, int | None] = Field(default_factory=dict)
    instances_required_ci: dict[str, tuple[int | None, int | None] | None] = Field(default_factory=dict)
    monthly_cost_usd: dict[str, float | None] = Field(default_factory=dict)


class CellFleet(_Model):
    instances_required: int | None
    monthly_cost_usd: float | None
    cost_per_million_successful_tokens: float | None


class CellSummary(_Model):
    """The few numbers a sensitivity cell shows; a cell outside the evidence shows none, and its reasons."""

    decision: str  # go / defer / reject, or why the cell is outside the evidence
    reasons: list[str]
    monthly_delta_usd: float | None
    monthly_delta_ci_usd: Interval | None
    migration_cost_usd: float | None
    payback_months: float | None
    payback_months_ci: Interval | None
    fleets: dict[str, CellFleet]


class ScenarioModel(_Model):
    demand_scale: float
    utilization_target: float | None
    rate_mode: str
    slo_scale: float
    effort_scale: float
    months_to_next_refresh: float | None


class SensitivityCell(CellSummary):
    dimension: str
    label: str
    scenario: ScenarioModel


class Sensitivity(_Model):
    base: CellSummary
    cells: list[SensitivityCell]
    method: str


class HistogramEntry(_Model):
    """One histogram of one fleet from Prometheus: merged-bucket P95 next to the records' P95."""

    metric: str | None
    note: str | None = None
    p95_s_merged_histogram: float | None = None
    cdf: list[Point] | None = None
    per_replica_p95_s: dict[str, float | None] | None = None
    mean_of_replica_p95_s_not_used: float | None = None
    p95_s_records: float | None = None
    difference_s: float | None = None


class PrometheusFleet(_Model):
    window_unix: tuple[float, float]
    client_ttft: HistogramEntry | None = None
    client_itl: HistogramEntry | None = None
    server_ttft: HistogramEntry | None = None
    server_itl: HistogramEntry | None = None

    def histograms(self) -> dict[str, HistogramEntry]:
        return {k: v for k, v in (("client_ttft", self.client_ttft), ("client_itl", self.client_itl),
                                  ("server_ttft", self.server_ttft), ("server_itl", self.server_itl)) if v is not None}


class PrometheusSection(_Model):
    url: str
    fleets: dict[str, PrometheusFleet]
    error: str | None = None


class PrefixSplit(_Model):
    requests: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None


class PrefixCacheFleet(_Model):
    caching: Literal["on", "off"]
    stack: str
    server_hit_rate: float | None
    ttft_by_prefix: dict[Literal["hit", "miss"], PrefixSplit] | None = None


class PrefixCache(_Model):
    trace: str
    fleets: dict[str, PrefixCacheFleet]
    mixed: bool
    trace_reuse: float | None
    note: str


class TimeToReadyModel(_Model):
    fleet: str
    first_launch_unix: float
    first_healthy_unix: float
    instances_launched: int
    seconds: float


class FocusBill(_Model):
    effective_usd: float
    billed_usd: float
    rows: int
    commitment_rows: int
    resources: int


class Billing(_Model):
    cost_explorer: dict[str, float] | None = None
    focus: dict[str, FocusBill] | None = None


class QualityLayer(_Model):
    layer: str
    passed: bool | None
    reasons: list[str]
    figures: dict[str, Any] = Field(default_factory=dict)


class QualityResult(BaseModel):
    """One fleet's quality-gate results as the campaign runner gave them; the gate's own
    fixture details pass through unchanged (they are the runner's, not the report's)."""

    model_config = ConfigDict(extra="allow")

    passed: bool | None = None
    pass_rate: float | None = None
    failures: list[str] = Field(default_factory=list)
    failed_layer: str | None = None
    layers: dict[str, QualityLayer] | None = None


class FleetSeries(_Model):
    ttft_cdf: list[Point]
    itl_cdf: list[Point]
    goodput: list[Point] | None = None


class Series(_Model):
    """Plot data: latency CDFs and goodput over time per fleet, and the payback curve."""

    fleets: dict[str, FleetSeries]
    payback_curve: list[Point] | None = None


class Report(_Model):
    report_version: str = REPORT_VERSION
    campaign: str
    manifest_digest: str
    generated_at: str
    comparison: Comparison
    slo: Slo
    horizon_months: float
    systems_under_test: str | None = None
    stopped_at: Literal["quality_gate"] | None = None  # set when the comparison stopped before any load
    fleets: dict[str, FleetRow]
    demand_tok_s: float | None
    pooled_output_tokens_per_request: float | None = None
    utilization_target: float | None = None
    monthly_delta_usd: float | None
    monthly_delta_ci_usd: Interval | None = None
    migration: Ledger | None
    migration_cost_usd: float | None
    payback_months: float | None
    payback_months_ci: Interval | None = None
    months_to_next_refresh: float | None
    decision: Decision
    headline: Headline
    gaps: list[Gap]
    prometheus: PrometheusSection | None = None
    prefix_cache: PrefixCache | None = None
    cloudwatch: dict[str, dict[str, float | None]] | None = None
    time_to_ready: dict[str, TimeToReadyModel] | None = None
    billing: Billing | None = None
    quality: dict[str, QualityResult] | None = None
    provenance: dict[str, ProvenanceEntry]
    sensitivity: Sensitivity | None = None
    series: Series

    @field_validator("report_version")
    @classmethod
    def _readable_version(cls, v: str) -> str:
        major, minor = _version(REPORT_VERSION)
        try:
            got = _version(v)
        except ValueError:
            raise ValueError(f"{v!r} is not MAJOR.MINOR") from None
        if got[0] != major or got[1] > minor:
            raise ValueError(f"report version {v} cannot be read by this code (reads {major}.0 to {REPORT_VERSION})")
        return v

    def to_json(self) -> str:
        """report.json's text; non-finite floats become null (`ser_json_inf_nan`)."""
        return self.model_dump_json(indent=2)


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split(".")
    return int(major), int(minor)


class ReportInvalid(AnalysisError):
    """A report.json that does not match the model; the message names each bad field."""


def parse_report(data: Any, where: str = "report.json") -> Report:
    """A report from its JSON object; a missing `report_version` or any bad field raises ReportInvalid naming it."""
    if isinstance(data, dict) and "report_version" not in data:
        raise ReportInvalid(f"{where}: report_version: missing (a report written before the versioned model, or not a report)")
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ReportInvalid(f"{where}: " + "; ".join(lines)) from None


def load_report(path: str | Path) -> Report:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportInvalid(f"{p}: {exc}") from None
    return parse_report(data, str(p))
