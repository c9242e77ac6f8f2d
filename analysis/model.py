"""The typed, versioned shape of report.json: what `build_report` returns and the renderers read.

Field names are report.json's own (the README and the tests describe them). JSON has no
Infinity/NaN: such floats are written as null (`model_dump(mode="json")`).

Every field carries a `Field(description=...)`: what it is, its unit and where it comes from.
The JSON Schema generated from the model is committed as schemas/report-v<MAJOR>.json
(`python -m analysis.model --schema --write`; tests/analysis/test_report_schema.py holds
the two equal).

Compatibility rule for `report_version` ("MAJOR.MINOR"): bump MAJOR on any breaking change
(a field removed, renamed, retyped, or its meaning changed); bump MINOR when a field is only
added. A reader accepts a report of its own MAJOR and a MINOR no newer than its own (every
model forbids unknown fields, so a newer MINOR's additions would be refused anyway).
schemas/report-fields.json records every version's fields ("Model.field"), so a field added
without a MINOR bump fails a test (tests/analysis/test_report_schema.py), and `--write` refuses
to record other fields under a version already recorded. 2.2 added the billing section and the
per-step server figures (issue 39) to 2.1's; 2.3 the histogram bucket each P95 gap is read at
(issue 46); 2.4 no new field, a new value: a capacity search stopped by the campaign's deadline
(stop_rule "deadline", issue 48), which a 2.3 reader would refuse.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from analysis.errors import AnalysisError

REPORT_VERSION = "2.4"

_T = TypeVar("_T")

Interval = tuple[float | None, float | None]  # a 95% interval's [low, high]; a null end: unbounded or unknown
Point = tuple[float, float]  # one (x, y) of a plot series
Bounds = tuple[float | None, float | None]  # a histogram bucket's [lower, upper] bound; a null end: unbounded


class _Model(BaseModel):
    # Unknown fields are refused: a misspelt or stale field in a report.json is an error, not silently dropped.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="null")


class Slo(_Model):
    """The service-level objective both fleets are held to (the manifest's `slo`)."""

    ttft_p95_s: float = Field(
        description="target for a fleet's P95 time to first token, seconds from the request's scheduled send (manifest "
        "slo.ttft_p95_s); a request meets its per-request SLO when its own TTFT is at or below it"
    )
    itl_p95_s: float = Field(
        description="target for a fleet's P95 inter-token latency, seconds per output token (manifest slo.itl_p95_s; ITL as "
        "provenance.itl_definition); a request meets its per-request SLO when its own ITL is at or below it"
    )
    max_error_rate: float = Field(
        description="highest share of sent requests that may end in an error for the fleet SLO to hold, a fraction 0..1 "
        "(manifest slo.max_error_rate)"
    )
    max_retry_rate: float | None = Field(
        default=None,
        description="highest share of requests the client may retry, a fraction 0..1, held by the quality gate "
        "(manifest slo.max_retry_rate); null: a report written before the field",
    )


class Comparison(_Model):
    """Which fleet runs today and which the migration would move to (the manifest's `comparison`)."""

    baseline: str = Field(
        description="name of the fleet running today (manifest comparison.baseline, a key of `fleets`)"
    )
    candidate: str = Field(
        description="name of the fleet the migration would move to (manifest comparison.candidate, a key of `fleets`)"
    )


class ToSettleFleet(_Model):
    """One fleet's share of `decision.to_settle` (analysis.economics.to_settle)."""

    requests_now: int = Field(
        description="requests of the step the fleet is sized from (its capacity boundary), counted from its records"
    )
    more_requests: int | None = Field(
        description="requests still missing at that step (requests to settle - requests_now); null: not computable"
    )
    rate_req_s: float | None = Field(
        description="that step's measured request rate, requests per second (requests / arrival span) over the instances measured"
    )
    minutes: float | None = Field(
        description="minutes the missing requests take: their arrivals at that rate, the drain and the overhead below"
    )
    drain_s: float | None = Field(
        default=None, description="seconds the last requests take to finish: the step's median request lifetime"
    )
    overhead_s: float | None = Field(
        default=None,
        description="seconds a segment spends starting and stopping the load generator: the median step overhead "
        "its capacity search measured (0: not measured)",
    )
    instances: int = Field(description="instances in service while the step was measured (instances_measured)")
    instance_hourly_usd: float | None = Field(
        description="On-Demand price of one instance, USD per hour (provenance prices.instance.*)"
    )
    loadgen_tasks: int = Field(
        description="load-generator tasks driving the fleet: one Locust master + loadgen.workers workers (manifest)"
    )
    loadgen_task_hourly_usd: float | None = Field(
        description="one load-generator task's Fargate price, USD per hour (provenance prices.fargate_*); null: no price"
    )
    usd: float | None = Field(
        description="USD: minutes / 60 x (instances x instance price + tasks x task price); null: a price or rate is missing"
    )


class ToSettle(_Model):
    """The evidence that would settle an undecided decision, in the user's units (analysis.economics.to_settle)."""

    threshold: Literal["go", "zero"] = Field(
        description="the threshold the interval straddles and this evidence aims at: 'go' (migration cost / horizon + margin: "
        "migrate or not), or, once Go is ruled out, 'zero' (Defer or Reject); never the delta's sign for its own sake"
    )
    threshold_usd_per_month: float = Field(
        description="that threshold's value at the point estimate (USD/month of monthly delta)"
    )
    factor: float | None = Field(
        description="(the interval's reach toward the threshold / the point's distance from it)^2: the multiple of each fleet's "
        "sizing-step requests that would settle it, the half-width shrinking as 1/sqrt(n); null: no ratio (an end is "
        "unknown, or the point is on the threshold)"
    )
    lower_bound: bool = Field(description="true when an end of the interval is unknown: the figures are lower bounds")
    requests: dict[str, int | None] = Field(
        description="per fleet: requests at its capacity boundary (the step it is sized from) that would settle the threshold, "
        "in total; null: no sample size settles it (the point is on the threshold)"
    )
    minutes: float | None = Field(
        description="minutes to measure the missing requests at the measured rates, fleets side by side"
    )
    usd: float | None = Field(
        description="what those minutes cost, USD: every fleet's instances and load-generator tasks (see by_fleet)"
    )
    by_fleet: dict[str, ToSettleFleet] = Field(description="per fleet name: the figures each total above is made of")
    basis: str = Field(description="how each figure is computed and where its prices come from")
    whole_instances: bool = Field(
        default=False,
        description="true when a fleet's figure is set by whole instances rather than by `factor`: the requests that move "
        "the capacity end the delta's end is priced from past its next instance boundary (or make a borrowed low end's "
        "sizing step hold the SLO), or none where that end already sizes the fleet as the point does",
    )


class Decision(_Model):
    """Go / Defer / Reject by the rule of analysis.economics.decision (docs/design.md: Decision), with every reason that applied."""

    state: Literal["go", "defer", "reject"] = Field(
        description="the verdict: 'go' (migrate), 'defer' (not yet: the reasons say what is missing) or 'reject' (do not migrate)"
    )
    reasons: list[str] = Field(
        description="every reason that applied, Reject's before Defer's, each a sentence with the figures it rests on "
        "(computed by analysis.economics.decision from the evaluation below)"
    )
    go_threshold_usd_per_month: float | None = Field(
        default=None,
        description="migration cost / horizon + indifference margin, USD/month: a Go needs the monthly delta's 95% "
        "low end above it; null: the migration cost could not be computed",
    )
    to_settle: ToSettle | None = Field(
        default=None,
        description="while the decision is undecided (its interval straddles the Go threshold, or 0 once Go is ruled out): the "
        "requests, minutes and USD that would settle it; null when settled (or decided on semantics or quality)",
    )


class Gap(_Model):
    """A piece of evidence the report lacks or doubts, and whether it blocks a Go."""

    # Also what every report stage records (analysis.provenance.Findings): Gap(what, reason[, blocks_go=False]).
    def __init__(self, what: str, reason: str, blocks_go: bool = True) -> None:
        BaseModel.__init__(self, what=what, reason=reason, blocks_go=blocks_go)  # see SearchStep.__init__

    what: str = Field(
        description="the evidence concerned, as a dotted key (e.g. 'saturation.g6', 'capacity.inf2', 'prometheus')"
    )
    reason: str = Field(description="what is missing or doubtful and what to do about it")
    blocks_go: bool = Field(
        description="true: the decision cannot be Go while this gap stands (and a gap in the evidence the figures rest on also "
        "keeps them out of the headline); false: a caveat only"
    )


class ProvenanceEntry(_Model):
    """Where one input came from: measured, pulled, snapshot, pinned, manifest, assumption, computed or missing."""

    source: str = Field(
        description="kind of source: 'measured' (this run's records), 'pulled' (an AWS or Prometheus API at report time), "
        "'snapshot' (a dated price snapshot in the repository), 'pinned' (a constant in the code), 'manifest', "
        "'assumption', 'computed' (from other entries) or 'missing'"
    )
    detail: str = Field(description="which file, API, manifest field or formula, in words")
    value: Any = Field(
        default=None, description="the value used, in the unit its key names; null: not a single value, or missing"
    )


class Measure(_Model):
    """A fleet's measure (analysis.measure.goodput.measure_fleets): the replay's counts, tokens, window and P95s, from the per-request records."""

    fleet: str = Field(description="fleet name (a key of `fleets`)")
    requests: int = Field(description="non-warmup requests scheduled in the replay, whatever their outcome")
    successful_requests: int = Field(
        description="requests that completed ok, passed the quality gate and met the per-request SLO"
    )
    successful_output_tokens: int = Field(
        description="output tokens of the successful requests (server-reported usage where given, else counted by the client)"
    )
    completed_ok: int = Field(description="requests that completed without error, SLO met or not")
    completed_output_tokens: int = Field(
        description="output tokens of every request that completed ok, SLO met or not (the work done)"
    )
    errors: int = Field(
        description="requests that ended in an error outcome: http_error, timeout, truncated or connection_error"
    )
    no_text: int = Field(
        description="requests whose server reported output tokens but no chunk carried text: not a success"
    )
    not_sent: int = Field(
        description="requests scheduled but never sent (a duration cut, a dead worker); they do not stretch the window"
    )
    quality_failed: int = Field(
        description="requests whose outcome is quality_fail (a response that came back but failed the per-request check)"
    )
    slo_violations: int = Field(
        description="requests that completed ok but missed the per-request SLO (TTFT or ITL over its target)"
    )
    slo_verdict_disagreements: int = Field(
        description="ok requests where the load generator's own slo_ok differs from the SLO recomputed from ttft_s / itl_s "
        "(the recomputed verdict is used; a gap reports any)"
    )
    warmup_excluded: int = Field(description="warmup requests, excluded from every figure")
    p95_ttft_s: float | None = Field(
        description="P95 time to first token, seconds from the scheduled send: exact nearest-rank quantile over the non-warmup "
        "requests with a first token; null: none"
    )
    p95_itl_s: float | None = Field(
        description="P95 inter-token latency, seconds per token (provenance.itl_definition), nearest-rank over the requests with "
        "an ITL; null: none"
    )
    wall_start: float | None = Field(
        description="the run's start, Unix seconds (the records' wall_start; the earliest of its files)"
    )
    window_start_s: float | None = Field(
        description="first scheduled send of a sent request, seconds after wall_start (the loadgen's monotonic clock)"
    )
    window_end_s: float | None = Field(
        description="end of the arrival window, seconds after wall_start: the last scheduled send, the span widened by n/(n-1)"
    )
    window_s: float | None = Field(
        description="the arrival window's length, seconds (window_end_s - window_start_s); goodput divides by it"
    )
    error_rate: float | None = Field(description="errors / sent requests, a fraction 0..1; null: nothing sent")
    goodput_tok_s: float | None = Field(
        description="successful output tokens / window_s, tokens per second for the whole fleet (all instances measured)"
    )

    def slo_pass(self, ttft_p95_s: float, itl_p95_s: float, max_error_rate: float) -> bool:
        """Fleet-level SLO: P95 TTFT and P95 ITL under target and the error ceiling held."""
        if self.p95_ttft_s is None or self.error_rate is None:
            return False
        itl_ok = self.p95_itl_s is None or self.p95_itl_s <= itl_p95_s
        return self.p95_ttft_s <= ttft_p95_s and itl_ok and self.error_rate <= max_error_rate


class QuantileInterval(_Model):
    """core.stats quantile interval: order-statistic ranks, distribution-free."""

    q: float = Field(description="the quantile, a fraction (0.95 for a P95)")
    n: int = Field(description="requests the quantile is taken over")
    point: float | None = Field(description="the nearest-rank quantile itself, seconds; null: no requests")
    ci: Interval = Field(
        description="its 95% interval [low, high], seconds: the order statistics at `ranks`; a null end: too few requests to bound it"
    )
    ranks: tuple[int, int] = Field(
        description="1-based order statistics of the ends; 0 / n + 1 where an end is unbounded"
    )
    coverage: float | None = Field(
        description="exact coverage probability of the interval between those order statistics, 0..1"
    )
    method: str = Field(description="how the interval is computed, in words")


class FleetIntervalsModel(_Model):
    """A fleet's 95% intervals: the replay's P95s and the capacity of the step it is sized from (analysis.measure.intervals)."""

    basis: str = Field(
        description="label of the step the fleet is sized from: 'replay' or a capacity step (e.g. 'inf2/x0.5946')"
    )
    basis_requests: int = Field(description="non-warmup requests of that step")
    capacity_note: str = Field(description="how the capacity interval's low end was found, or why it is unknown")
    p95_ttft: QuantileInterval = Field(description="the replay's P95 TTFT with its interval (seconds)")
    p95_itl: QuantileInterval = Field(description="the replay's P95 ITL with its interval (seconds per token)")
    basis_p95_ttft: QuantileInterval = Field(description="the sizing step's P95 TTFT with its interval (seconds)")
    basis_p95_itl: QuantileInterval = Field(
        description="the sizing step's P95 ITL with its interval (seconds per token)"
    )


class CapacityStep(_Model):
    """One capacity-sweep step (or the replay) of one fleet; the P95 intervals are added per step."""

    label: str = Field(
        description="'replay' (the trace replay) or the step's directory label ('x<multiplier>' or '<fleet>/x<multiplier>')"
    )
    multiplier: float = Field(description="offered rate as a multiple of the manifest's replay rate (the replay is 1)")
    requests: int = Field(description="non-warmup requests of the step")
    successful_requests: int = Field(description="of those, completed ok, quality ok and within the per-request SLO")
    per_instance_goodput_tok_s: float | None = Field(
        description="successful output tokens per second per instance over the step's arrival window (goodput / instances "
        "measured); null: no records"
    )
    p95_ttft_s: float | None = Field(description="the step's P95 time to first token, seconds (nearest rank)")
    p95_itl_s: float | None = Field(description="the step's P95 inter-token latency, seconds per token (nearest rank)")
    error_rate: float | None = Field(description="errors / sent requests of the step, a fraction 0..1")
    slo_pass: bool = Field(
        description="the fleet SLO held over the step: P95 TTFT and P95 ITL within target and the error ceiling kept"
    )
    peak_in_flight_per_instance: float | None = Field(
        description="most requests in flight at once during the step, per instance measured (send to last token)"
    )
    window_s: float | None = Field(description="the step's arrival window, seconds")
    median_e2e_s: float | None = Field(
        description="median request lifetime (scheduled send to last token) of its completed requests, seconds"
    )
    steady_state: bool = Field(
        description="the window lasted at least three median request lifetimes: a capacity candidate"
    )
    valid: bool = Field(
        description="false: the run measured the client (schedule lag over the manifest's bound) or no instance was "
        "healthy while it ran (its divisor is 0); never a capacity"
    )
    p95_ttft_ci_s: Interval | None = Field(
        default=None, description="95% interval of p95_ttft_s, seconds (order statistics); null: not computed"
    )
    p95_ttft_n: int | None = Field(default=None, description="requests p95_ttft_s is taken over")
    p95_itl_ci_s: Interval | None = Field(
        default=None, description="95% interval of p95_itl_s, seconds per token (order statistics)"
    )
    p95_itl_n: int | None = Field(default=None, description="requests p95_itl_s is taken over")
    instances: float | None = Field(
        default=None,
        description="instances the step's goodput is divided by (per_instance_goodput_tok_s): where counted while it "
        "ran, the time-weighted mean of the healthy targets over its load window and its settle segments', which may "
        "be fractional; null: a report written before the field",
    )
    instances_detail: str | None = Field(
        default=None,
        description="where `instances` comes from and how it was computed: counted while the step ran (on AWS every "
        "poll of the healthy targets of the fleet's NLB target group, time-weighted over the load window), or the "
        "run's instances_measured",
    )


class Verdict(StrEnum):
    """A search step's outcome under the fleet SLO."""

    HELD = "held"  # the SLO held over a steady-state step
    MISSED = "missed"  # the SLO failed (a miss in a short step is still a miss: overload only grows)
    SHORT = "short"  # the SLO held, but the step was too short or too small to show steady state
    INVALID = "invalid"  # the run measured the client (schedule lag over the manifest's bound), or no instance was healthy: no verdict on the server


class StopRule(StrEnum):
    """Why the search ended; the report names it."""

    CONVERGED = "converged"  # held/missed multipliers within the tolerance
    CEILING = "ceiling"  # still held at the largest multiplier allowed: capacity is at least that
    FLOOR = "floor"  # missed even at the smallest multiplier allowed: no capacity measured
    MAX_STEPS = "max_steps"
    TIME_BUDGET = "time_budget"
    NEVER_STEADY = "never_steady"  # a step stayed too short for steady state after it was lengthened
    CLIENT_LIMITED = "client_limited"  # a step's run was invalid (the load generator fell behind) twice in a row
    TRACE_EXHAUSTED = "trace_exhausted"  # the trace has too few requests for a long-enough step at this rate
    DEADLINE = "deadline"  # the campaign's deadline (every fleet's group to 0) would cut the next step: not started


# The enums are validated and held as such (the search compares them by identity); report.json
# and its schema keep them plain strings, titled as pydantic titled the str fields they were.
_VerdictField = Annotated[Verdict, WithJsonSchema({"type": "string", "title": "Verdict"})]
_StopRuleField = Annotated[StopRule, WithJsonSchema({"type": "string", "title": "Stop Rule"})]


class SearchStep(_Model):
    """One step of the automatic capacity search (analysis.capacity.steps.SearchStep), read from capacity/<fleet>/search.json."""

    # Also what the search computes with (analysis.capacity.search, campaign.stages.capacity), which
    # builds a step positionally in its own order, the order below being report.json's.
    def __init__(
        self,
        label: str,
        multiplier: float,
        why: str,
        planned_span_s: float,
        verdict: Verdict,
        requests: int,
        arrival_span_s: float | None,
        rate_req_s: float | None,
        median_lifetime_s: float | None,
        p95_ttft_s: float | None,
        p95_itl_s: float | None,
        error_rate: float | None,
        detail: str = "",
        sizing_lifetime_s: float | None = None,
        met_share: float | None = None,
        took_s: float | None = None,
        itl_missed: bool = False,
        overhead_s: float | None = None,
    ) -> None:
        BaseModel.__init__(  # validates the fields; mypy reads super().__init__ as _Model's, which names none
            self,
            label=label,
            multiplier=multiplier,
            why=why,
            planned_span_s=planned_span_s,
            verdict=verdict,
            requests=requests,
            arrival_span_s=arrival_span_s,
            rate_req_s=rate_req_s,
            median_lifetime_s=median_lifetime_s,
            p95_ttft_s=p95_ttft_s,
            p95_itl_s=p95_itl_s,
            error_rate=error_rate,
            detail=detail,
            sizing_lifetime_s=sizing_lifetime_s,
            met_share=met_share,
            took_s=took_s,
            itl_missed=itl_missed,
            overhead_s=overhead_s,
        )

    label: str = Field(
        description="'x<multiplier>', the step's directory under capacity/<fleet>/ ('replay' for the trace replay)"
    )
    multiplier: float = Field(description="offered rate as a multiple of the manifest's replay rate")
    why: str = Field(description="what the search wanted from this step ('bracket up', 'bisect', ...)")
    planned_span_s: float = Field(description="arrival span the step was sized to, seconds of replay")
    arrival_span_s: float | None = Field(
        description="measured arrival window, seconds (first to last arrival, widened by n/(n-1))"
    )
    requests: int = Field(description="non-warmup requests measured")
    rate_req_s: float | None = Field(description="requests / arrival span, requests per second")
    median_lifetime_s: float | None = Field(
        description="median scheduled send -> last token of its completed requests, seconds"
    )
    sizing_lifetime_s: float | None = Field(
        description="the lifetime the next step was sized from, seconds: the median, except after a miss, the median over the "
        "requests that met their SLO (null: none did)"
    )
    p95_ttft_s: float | None = Field(description="P95 time to first token, seconds")
    p95_itl_s: float | None = Field(description="P95 inter-token latency, seconds per token")
    error_rate: float | None = Field(description="errors / sent requests, a fraction 0..1")
    verdict: _VerdictField = Field(
        description="'held', 'missed', 'short' (held but too short for steady state) or 'invalid' (measured the client, "
        "or no instance was healthy while it ran)"
    )
    detail: str = Field(description="why the verdict: which figure failed, which length was short")
    met_share: float | None = Field(
        default=None,
        description="share of the step's sent requests that met their per-request SLO, 0..1 (requests still in "
        "flight after an early stop count as not met)",
    )
    took_s: float | None = Field(
        default=None, description="wall seconds the step cost the search (arrivals, drain, the runner's overhead)"
    )
    itl_missed: bool = Field(
        default=False, description="its P95 ITL was over target: its met share is no estimate of the boundary"
    )
    overhead_s: float | None = Field(
        default=None,
        description="of took_s, the seconds outside the step's own requests (its first send to its last answer): "
        "starting and stopping the load generator (on AWS, Fargate tasks); null: no request was sent",
    )


class SearchPath(_Model):
    """A fleet's whole capacity search: every step in order, the bracket it ended with and the rule that stopped it."""

    # Built positionally by the search (analysis.capacity.search), as the step is.
    def __init__(
        self,
        fleet: str,
        steps: Sequence[SearchStep],
        held_multiplier: float | None,
        missed_multiplier: float | None,
        stop_rule: StopRule,
        stop_detail: str,
        tolerance: float,
    ) -> None:
        BaseModel.__init__(  # validates the fields; mypy reads super().__init__ as _Model's, which names none
            self,
            fleet=fleet,
            steps=list(steps),
            held_multiplier=held_multiplier,
            missed_multiplier=missed_multiplier,
            stop_rule=stop_rule,
            stop_detail=stop_detail,
            tolerance=tolerance,
        )

    @property
    def converged(self) -> bool:
        return self.stop_rule is StopRule.CONVERGED

    fleet: str = Field(description="fleet name")
    steps: list[SearchStep] = Field(description="the steps in the order they ran")
    held_multiplier: float | None = Field(
        description="highest multiplier that held the SLO below the lowest miss; null: none held"
    )
    missed_multiplier: float | None = Field(description="lowest multiplier that missed the SLO; null: none missed")
    stop_rule: _StopRuleField = Field(
        description="why the search ended: converged, ceiling, floor, max_steps, time_budget, never_steady, client_limited, "
        "trace_exhausted or deadline (analysis.capacity.steps.StopRule)"
    )
    stop_detail: str = Field(description="the stop rule's figures, in words")
    tolerance: float = Field(
        description="converged when missed / held <= 1 + tolerance (manifest workload.capacity_search.tolerance)"
    )


class CapacityModel(_Model):
    """A fleet's capacity: every step measured and the per-instance capacity chosen among them (analysis.capacity.steps)."""

    steps: list[CapacityStep] = Field(description="the replay and every capacity step of the fleet, by multiplier")
    per_instance_tok_s: float | None = Field(
        description="the capacity: highest per-instance SLO-compliant goodput (tokens/s) among the valid steady-state steps that "
        "held the fleet SLO; null: none held"
    )
    step: str | None = Field(description="label of the step chosen as the capacity; null: none")
    search: SearchPath | None = Field(
        default=None, description="the automatic search that chose the steps; null: a fixed sweep or none"
    )

    @property
    def top_multiplier(self) -> float | None:
        return max((s.multiplier for s in self.steps), default=None)

    @property
    def winner(self) -> CapacityStep | None:
        return next((s for s in self.steps if s.label == self.step), None)


class FleetSize(_Model):
    """The fleet sized for peak demand from one per-instance capacity (analysis.economics.sizing, docs/design.md: required fleet)."""

    demand_tok_s: float = Field(
        description="peak demand, successful output tokens per second (see demand_tok_s at the top level)"
    )
    per_instance_tok_s: float = Field(
        description="per-instance SLO-compliant capacity it is sized from, tokens per second"
    )
    utilization_target: float = Field(
        description="highest share of that capacity an instance may run at, 0..1 (manifest costs)"
    )
    busy_instances: int = Field(description="ceil(demand / per-instance capacity)")
    headroom_instances: int = Field(description="added so no instance runs above the utilization target")
    redundancy_instances: int = Field(description="added for redundancy (manifest fleets[].redundancy)")
    asg_min_topup: int = Field(description="added only to respect the ASG minimum")
    required: int = Field(description="instances required: busy + headroom + redundancy + ASG-minimum top-up")
    asg_max: int = Field(description="the ASG maximum (manifest fleets[].asg.max)")
    per_az: dict[str, int] = Field(description="required instances per availability zone, spread round-robin")
    exceeds_asg_max: bool = Field(description="required > asg_max: the fleet cannot be deployed as configured")


class MonthlyCost(_Model):
    """A sized fleet's monthly cost by line, USD per month (analysis.economics.cost)."""

    compute_usd: float = Field(
        description="instances x hours per month x hourly rate (On-Demand, or the manifest's commitments)"
    )
    idle_headroom_usd: float = Field(description="the part of compute_usd paying for headroom instances")
    redundancy_usd: float = Field(
        description="the part of compute_usd paying for redundancy and the ASG-minimum top-up"
    )
    unused_commitment_usd: float = Field(
        description="the part of compute_usd paying for committed instances the fleet does not use"
    )
    ebs_usd: float = Field(description="root and cache volumes: GiB x gp3 price (provenance prices.ebs_gp3_gb_month)")
    nlb_usd: float = Field(description="the load balancer: hours + LCU-hours at their prices (provenance prices.nlb_*)")
    inter_az_usd: float = Field(
        description="inter-AZ traffic: GB per month (manifest costs.network) x price x 2 directions"
    )
    observability_usd: float = Field(description="manifest costs.observability_monthly_usd")
    licenses_usd: float = Field(description="manifest costs.licenses_monthly_usd")
    compute_note: str = Field(description="which rate priced compute_usd (On-Demand, covered, renewal), in words")
    total_usd: float = Field(description="compute + EBS + NLB + inter-AZ + observability + licenses")

    @property
    def non_compute_usd(self) -> float:
        return self.total_usd - self.compute_usd

    def lines_usd(self) -> dict[str, float]:
        """The cost lines in USD (total last), keyed without the `_usd` suffix."""
        return {k.removesuffix("_usd"): v for k, v in self.model_dump().items() if k.endswith("_usd")}


class MeasuredRun(_Model):
    """What the measured replay itself cost: its instances for its window, and its share of the fleet's non-compute cost."""

    cost_usd: float = Field(
        description="USD: instances measured x On-Demand hourly x max(window, 60 s) + the window's share of the monthly non-compute cost"
    )
    window_s: float | None = Field(description="the replay's arrival window, seconds")
    cost_per_million_successful_tokens: float | None = Field(
        description="cost_usd / the replay's successful output tokens x 10^6, USD; null: nothing succeeded"
    )
    basis: str = Field(description="the formula, in words")


class FleetRow(_Model):
    """One fleet of the headline evaluation; fields a measurement would need stay null when it is missing."""

    instance_type: str = Field(description="EC2 instance type (manifest fleets[].instance_type)")
    requests: int = Field(description="non-warmup requests scheduled in the trace replay")
    successful_requests: int = Field(
        description="replay requests that completed ok, quality ok and within the per-request SLO"
    )
    successful_output_tokens: int = Field(description="output tokens of those requests (server usage where reported)")
    p95_ttft_s: float | None = Field(
        description="the replay's P95 time to first token, seconds (nearest rank over its records)"
    )
    p95_itl_s: float | None = Field(description="the replay's P95 inter-token latency, seconds per token")
    slo_pass: bool = Field(description="the fleet SLO held over the replay (P95s within target, error ceiling kept)")
    instances_required: int | None = Field(
        description="instances the fleet needs at peak demand, from the capacity it is sized from (size.required); null: not sized"
    )
    monthly_cost_usd: float | None = Field(
        description="that fleet's monthly cost, USD (monthly_cost.total_usd); null: not priced"
    )
    cost_per_million_successful_tokens: float | None = Field(
        description="monthly cost / monthly successful tokens at peak demand x 10^6, USD"
    )
    error_rate: float | None = Field(default=None, description="errors / sent requests of the replay, a fraction 0..1")
    instances_measured: int | None = Field(
        default=None, description="instances in service during the replay (provenance instances_measured.<fleet>)"
    )
    per_instance_goodput_tok_s: float | None = Field(
        default=None,
        description="the replay's successful output tokens per second per instance measured; a lower bound of the "
        "capacity when one instance was not saturated",
    )
    measure: Measure | None = Field(default=None, description="the replay's counts, window and P95s")
    peak_in_flight: int | None = Field(
        default=None, description="most non-warmup requests in flight at once during the replay, whole fleet"
    )
    peak_in_flight_per_instance: float | None = Field(default=None, description="peak_in_flight / instances measured")
    max_concurrency: int | None = Field(
        default=None,
        description="sequences one instance runs at once (manifest max_concurrency x replicas per instance)",
    )
    saturated: bool | None = Field(
        default=None,
        description="peak in flight per instance reached max_concurrency during the replay; null: not measured",
    )
    per_instance_goodput_bound: Literal["capacity", "lower_bound"] | None = Field(
        default=None,
        description="'capacity' when the replay saturated an instance, 'lower_bound' when not (the goodput is "
        "what was offered)",
    )
    capacity: CapacityModel | None = Field(default=None, description="the capacity sweep or search; null: none ran")
    sized_from: str | None = Field(
        default=None,
        description="what the fleet is sized from: 'capacity sweep step <label>' or 'replay'; null: no sweep ran "
        "(the replay)",
    )
    size: FleetSize | None = Field(default=None, description="the fleet size and how it adds up; null: not sized")
    monthly_cost: MonthlyCost | None = Field(default=None, description="the monthly cost by line; null: not priced")
    p95_ttft_ci_s: Interval | None = Field(
        default=None, description="95% interval of p95_ttft_s, seconds (order statistics, distribution-free)"
    )
    p95_ttft_n: int | None = Field(default=None, description="requests p95_ttft_s is taken over")
    p95_itl_ci_s: Interval | None = Field(
        default=None, description="95% interval of p95_itl_s, seconds per token (order statistics)"
    )
    p95_itl_n: int | None = Field(default=None, description="requests p95_itl_s is taken over")
    capacity_ci_tok_s: Interval | None = Field(
        default=None,
        description="95% interval of the per-instance capacity the fleet is sized from, tokens/s (intervals.capacity_note "
        "says how); a null end: unknown",
    )
    intervals: FleetIntervalsModel | None = Field(
        default=None, description="the intervals' details: basis, notes, order statistics"
    )
    instances_required_ci: tuple[int | None, int | None] | None = Field(
        default=None,
        description="instances required at the capacity interval's high and low ends [fewest, most]; a null end: unknown",
    )
    monthly_cost_ci_usd: Interval | None = Field(
        default=None, description="monthly cost at those two sizes, USD [low, high]; a null end: unknown"
    )
    monthly_successful_tokens: float | None = Field(
        default=None,
        description="successful output tokens a month at peak demand: demand_tok_s x 3600 x hours per month",
    )
    measured_run: MeasuredRun | None = Field(
        default=None, description="what the replay itself cost; null: no price or no instances"
    )
    outcomes: dict[str, int] | None = Field(
        default=None,
        description="non-warmup replay requests by outcome (ok, error, timeout, no_text, ...), zeros omitted",
    )
    itl_basis: dict[str, int] | None = Field(
        default=None,
        description="completed replay requests by how their ITL was computed: 'server_tokens', 'chunks' or 'unknown'",
    )


class Ledger(_Model):
    """The migration ledger: one-off items in USD and their total."""

    items_usd: dict[str, float] = Field(
        description="one-off migration costs by item, USD: 'labor:<activity>' (hours x loaded rate, manifest migration), testing, "
        "tooling, training (manifest), dual_run, shadow, canary, rollback_retention (priced from the sized fleets' "
        "monthly costs)"
    )
    total_usd: float = Field(description="the items' sum, USD")


class ScenarioEvaluation(_Model):
    """analysis.report.evaluate.evaluate's result for one scenario; the headline's (the manifest as written) is part of the report."""

    fleets: dict[str, FleetRow] = Field(description="per fleet name: its row")
    demand_tok_s: float | None = Field(description="peak demand, output tokens/s (see Report.demand_tok_s)")
    pooled_output_tokens_per_request: float | None = Field(
        description="mean output tokens per completed request, pooled over fleets"
    )
    utilization_target: float | None = Field(description="utilization target used, 0..1")
    monthly_delta_usd: float | None = Field(description="baseline monthly cost - candidate monthly cost, USD/month")
    monthly_delta_ci_usd: Interval | None = Field(description="its 95% interval, USD/month")
    migration: Ledger | None = Field(description="the migration ledger")
    migration_cost_usd: float | None = Field(description="the ledger's total, USD")
    payback_months: float | None = Field(
        description="migration cost / monthly delta, months; null: the delta is not positive"
    )
    payback_months_ci: Interval | None = Field(
        description="its 95% interval, months; a null high end: no payback at the pessimistic end"
    )
    months_to_next_refresh: float | None = Field(description="months until the next hardware refresh")
    decision: Decision = Field(description="the decision under this scenario")


class Headline(_Model):
    """The figures the report may headline: all of them, or none (null) with the gaps that block them."""

    decided: bool = Field(
        description="true: no blocking gap touches the evidence the figures rest on, and they are headlined; false: all are null"
    )
    blocked_by: list[str] = Field(
        description="'<gap>: <reason>' of each blocking gap in that evidence; empty when decided"
    )
    monthly_delta_usd: float | None = Field(
        default=None, description="the report's monthly_delta_usd when decided, else null (USD/month)"
    )
    monthly_delta_ci_usd: Interval | None = Field(default=None, description="its 95% interval when decided, USD/month")
    migration_cost_usd: float | None = Field(default=None, description="the migration ledger's total when decided, USD")
    payback_months: float | None = Field(default=None, description="the payback when decided, months")
    payback_months_ci: Interval | None = Field(default=None, description="its 95% interval when decided, months")
    instances_required: dict[str, int | None] = Field(
        default_factory=dict, description="per fleet: instances required when decided, else null"
    )
    instances_required_ci: dict[str, tuple[int | None, int | None] | None] = Field(
        default_factory=dict, description="per fleet: their 95% interval [fewest, most] when decided, else null"
    )
    monthly_cost_usd: dict[str, float | None] = Field(
        default_factory=dict, description="per fleet: monthly cost when decided, USD, else null"
    )


class CellFleet(_Model):
    """One fleet's figures in a sensitivity cell."""

    instances_required: int | None = Field(
        description="instances required in this cell; null: outside the evidence or not sized"
    )
    monthly_cost_usd: float | None = Field(description="monthly cost in this cell, USD")
    cost_per_million_successful_tokens: float | None = Field(
        description="USD per million successful output tokens in this cell"
    )


class CellSummary(_Model):
    """The few numbers a sensitivity cell shows; a cell outside the evidence shows none, and its reasons."""

    decision: str = Field(
        description="go / defer / reject, or why the cell is outside the evidence ('not measured', 'no commitment in the manifest')"
    )
    reasons: list[str] = Field(description="the decision's reasons in this cell, or why it is outside the evidence")
    monthly_delta_usd: float | None = Field(description="monthly delta in this cell, USD/month (baseline - candidate)")
    monthly_delta_ci_usd: Interval | None = Field(description="its 95% interval, USD/month")
    migration_cost_usd: float | None = Field(description="migration cost in this cell, USD")
    payback_months: float | None = Field(description="payback in this cell, months")
    payback_months_ci: Interval | None = Field(description="its 95% interval, months")
    fleets: dict[str, CellFleet] = Field(description="per fleet name: its figures in this cell")


class ScenarioModel(_Model):
    """The one input a sensitivity cell changes (analysis.economics.sensitivity.Scenario); every other is the manifest's."""

    demand_scale: float = Field(description="multiplies the manifest's peak demand")
    utilization_target: float | None = Field(description="utilization target, 0..1; null: the manifest's")
    rate_mode: str = Field(description="how compute is priced: 'manifest', 'on-demand', 'covered' or 'renewal'")
    slo_scale: float = Field(description="multiplies both P95 targets; goodput is recomputed from the records")
    effort_scale: float = Field(description="multiplies every migration activity's hours")
    months_to_next_refresh: float | None = Field(description="months to the next refresh; null: the manifest's")


class SensitivityCell(CellSummary):
    """One cell of the one-at-a-time grid: one input changed, the whole decision recomputed."""

    dimension: str = Field(description="the input changed: demand, utilization, rate, slo, port_effort or refresh")
    label: str = Field(description="the cell's name as the report shows it (e.g. 'demand x1.5')")
    scenario: ScenarioModel = Field(description="the scenario the cell was evaluated under")


class Sensitivity(_Model):
    """The one-at-a-time sensitivity grid (analysis.economics.sensitivity)."""

    base: CellSummary = Field(description="the manifest as written (the headline's own figures)")
    cells: list[SensitivityCell] = Field(description="one cell per input changed")
    method: str = Field(description="how the grid is computed, in words")


class HistogramEntry(_Model):
    """One histogram of one fleet from Prometheus: merged-bucket P95 next to the records' P95."""

    metric: str | None = Field(description="the Prometheus histogram's _bucket series; null: the stack exports none")
    note: str | None = Field(default=None, description="why there is no histogram, when there is none")
    p95_s_merged_histogram: float | None = Field(
        default=None,
        description="P95 from the buckets summed across replicas over the window (histogram_quantile), seconds",
    )
    cdf: list[Point] | None = Field(
        default=None, description="(bucket upper bound s, cumulative fraction) of the merged buckets"
    )
    per_replica_p95_s: dict[str, float | None] | None = Field(
        default=None, description="each replica's own P95, seconds (shown, not used)"
    )
    mean_of_replica_p95_s_not_used: float | None = Field(
        default=None, description="the mean of the replicas' P95s, seconds: not a fleet P95, shown to say so"
    )
    p95_s_records: float | None = Field(default=None, description="the same P95 from the per-request records, seconds")
    bucket_s: Bounds | None = Field(
        default=None,
        description="[lower, upper] bound of the bucket the merged-histogram P95 was interpolated in, seconds: the "
        "histogram places its P95 there and no closer, so this is the resolution it and difference_s are read at "
        "(upper null: the +Inf bucket); null: no merged-histogram P95, or a report written before the field",
    )
    difference_s: float | None = Field(
        default=None,
        description="merged-histogram P95 - records P95, seconds; large means a client or clock problem; null when "
        "either is missing, or when the records' P95 lies inside bucket_s: the two agree within the bucket's resolution",
    )


class PrometheusFleet(_Model):
    """One fleet's Prometheus histograms over its replay window."""

    window_unix: tuple[float, float] = Field(description="[start, end] of the replay's arrival window, Unix seconds")
    client_ttft: HistogramEntry | None = Field(default=None, description="the load generator's TTFT histogram")
    client_itl: HistogramEntry | None = Field(default=None, description="the load generator's ITL histogram")
    server_ttft: HistogramEntry | None = Field(default=None, description="the serving stack's own TTFT histogram")
    server_itl: HistogramEntry | None = Field(
        default=None, description="the serving stack's own per-token latency histogram"
    )

    def histograms(self) -> dict[str, HistogramEntry]:
        return {
            k: v
            for k, v in (
                ("client_ttft", self.client_ttft),
                ("client_itl", self.client_itl),
                ("server_ttft", self.server_ttft),
                ("server_itl", self.server_itl),
            )
            if v is not None
        }


class ServerStep(_Model):
    """One fleet's server-side truth over one step's window (the replay, a capacity step or a settle
    segment), computed from the series saved in the run directory (analysis.sources.server_series)."""

    label: str = Field(
        description="'replay', the capacity step's label ('x0.5', 'g6/x2') or '<label>+settle-<n>' for a settle segment"
    )
    source: Literal["pulled"] = Field(
        description="the figures come from Prometheus's own histograms, pulled at the end of the run"
    )
    series: str = Field(
        description="the saved query results the figures are computed from, relative to the run directory"
    )
    window_unix: tuple[float, float] = Field(
        description="[first request sent, last request completed] of the step for this fleet, Unix seconds"
    )
    window_s: float = Field(description="that window's length, seconds")
    scrape_interval_s: float = Field(description="the Prometheus scrape interval the window is judged against, seconds")
    status: Literal["ok", "too_short", "target_down", "no_series"] = Field(
        description="'ok'; 'too_short': under 6 scrape intervals, too short for server truth (no figure); "
        "'target_down': a serving target was down for part of the window (a gap, no figure); "
        "'no_series': the server's histograms saw no request"
    )
    note: str = Field(description="why there is no figure, in words; empty when status is 'ok'")
    p95_ttft_s: float | None = Field(
        description="the server's P95 TTFT over the window, seconds: buckets summed across instances (sum by (le) of "
        "increase), then histogram_quantile; null: no figure (status) or the stack exports no TTFT histogram"
    )
    p95_itl_s: float | None = Field(
        description="the server's P95 inter-token latency over the window, seconds, likewise"
    )
    client_p95_ttft_s: float | None = Field(
        description="the same step's P95 TTFT from the client's records, seconds; null: no capacity row for this label"
    )
    client_p95_itl_s: float | None = Field(description="the same step's P95 ITL from the client's records, seconds")
    ttft_bucket_s: Bounds | None = Field(
        default=None,
        description="[lower, upper] bound of the histogram bucket the server's P95 TTFT was interpolated in, seconds: "
        "the server's P95 is known to lie there and no closer, the resolution it and ttft_gap_s are read at (upper "
        "null: the +Inf bucket); null: no server figure, or a report written before the field",
    )
    itl_bucket_s: Bounds | None = Field(
        default=None, description="the same for the server's P95 ITL and itl_gap_s, seconds"
    )
    ttft_gap_s: float | None = Field(
        description="client P95 TTFT - server P95 TTFT, seconds: the time outside the server's own measurement (network, "
        "load balancer, queueing before the server's clock starts), read at the resolution of ttft_bucket_s; null "
        "when either P95 is missing, or when the client's P95 lies inside ttft_bucket_s: the two agree within the "
        "bucket's resolution"
    )
    itl_gap_s: float | None = Field(
        description="client P95 ITL - server P95 ITL, seconds, likewise (itl_bucket_s; null inside it)"
    )


class PrometheusSection(_Model):
    """The Prometheus cross-check of the records' percentiles (pulled at report time)."""

    url: str = Field(description="the Prometheus server queried")
    fleets: dict[str, PrometheusFleet] = Field(description="per fleet name: its histograms")
    error: str | None = Field(default=None, description="why the source failed part-way; null: it answered")
    steps: dict[str, list[ServerStep]] | None = Field(
        default=None,
        description="per fleet name: the server's P95s over every step's window, from the series saved in the run "
        "directory's metrics/; null: the run saved none",
    )


class PrefixSplit(_Model):
    """TTFT over one side of the shared-prefix split."""

    requests: int = Field(description="requests on this side")
    ttft_p50_s: float | None = Field(description="their median TTFT, seconds")
    ttft_p95_s: float | None = Field(description="their P95 TTFT, seconds")


class PrefixCacheFleet(_Model):
    """One fleet's prefix caching and its TTFT split by shared-prefix hit / miss."""

    caching: Literal["on", "off"] = Field(
        description="whether the fleet's stack caches prompt prefixes (core.scheduling)"
    )
    stack: str = Field(description="serving stack (manifest fleets[].serving.stack)")
    server_hit_rate: float | None = Field(
        description="the server's prefix-cache hit rate over the window, 0..1 (Prometheus, tokens as vLLM counts them); null: not scraped"
    )
    ttft_by_prefix: dict[Literal["hit", "miss"], PrefixSplit] | None = Field(
        default=None,
        description="TTFT over requests at least half of whose prompt is a prefix seen before (hit) and the rest "
        "(miss); null: the trace has no block ids",
    )


class PrefixCache(_Model):
    """Prefix caching, reported apart (analysis.measure.prefix_cache): a cached fleet's TTFT is not comparable on shared prefixes."""

    trace: str = Field(description="how much of the trace shares prefixes, in words")
    fleets: dict[str, PrefixCacheFleet] = Field(description="per fleet name: its caching and TTFT split")
    mixed: bool = Field(
        description="fleets differ in prefix caching and the trace shares prefixes (a gap says to compare misses)"
    )
    trace_reuse: float | None = Field(
        description="share of all prompt tokens that are a prefix seen before, 0..1: the hit rate an unbounded cache reaches"
    )
    note: str = Field(description="how to read the split")


class TimeToReadyModel(_Model):
    """Instance launch to first healthy target, measured in the cloud run (analysis.sources.time_to_ready)."""

    fleet: str = Field(description="fleet name")
    first_launch_unix: float = Field(
        description="first 'Launching a new EC2 instance' activity of the fleet's ASG, Unix seconds"
    )
    first_healthy_unix: float = Field(
        description="first minute with a healthy NLB target, Unix seconds (60 s resolution)"
    )
    instances_launched: int = Field(description="instances the ASG launched")
    seconds: float = Field(description="first_healthy_unix - first_launch_unix, seconds")


class FocusBill(_Model):
    """One fleet's costs summed from a FOCUS billing export."""

    effective_usd: float = Field(description="sum of EffectiveCost, USD")
    billed_usd: float = Field(description="sum of BilledCost, USD")
    rows: int = Field(description="export rows tagged with the campaign and fleet")
    commitment_rows: int = Field(
        description="of those, rows covered by a Savings Plan or Reserved Instance (CommitmentDiscountId set)"
    )
    resources: int = Field(description="distinct resources among the rows")


class CampaignCost(_Model):
    """One figure of the campaign's cost: what it is, where it came from, as of when, and what it covers."""

    usd: float | None = Field(description="the campaign's cost, USD; null: unavailable (`unavailable` says why)")
    source: str = Field(description="where the figure came from, in words (the plan, the prices, the billing source)")
    date: str | None = Field(description="the figure's date: the plan's, the prices', or the billed period's (UTC)")
    covers: str = Field(description="what the figure covers and what it leaves out, in words")
    unavailable: str | None = Field(default=None, description="why there is no figure; null when there is one")


class Billing(_Model):
    """The campaign's cost three ways, side by side (the plan's prediction, prices x the instance-hours
    measured, the bill), and the billing sources' own figures per fleet."""

    cost_explorer: dict[str, float] | None = Field(
        default=None,
        description="per fleet tag: Cost Explorer UnblendedCost over the whole UTC hours (or days: `billed` says "
        "which) that hold the run's window, USD",
    )
    focus: dict[str, FocusBill] | None = Field(
        default=None,
        description="per fleet tag: the FOCUS export's sums over rows whose charge period meets the window",
    )
    plan: CampaignCost | None = Field(
        default=None, description="the plan's predicted campaign cost (campaign plan); null: older reports"
    )
    computed: CampaignCost | None = Field(
        default=None, description="unit prices x the instance-hours the run measured; null: older reports"
    )
    billed: CampaignCost | None = Field(
        default=None, description="what the billing source says was billed; null: older reports"
    )


class QualityLayer(_Model):
    """One layer of a fleet's quality gate (fixtures, equivalence, task acceptance, distribution)."""

    layer: str = Field(description="the layer's name")
    passed: bool | None = Field(description="true / false; null: the layer could not be evaluated")
    reasons: list[str] = Field(description="why it failed or could not be evaluated; empty when it passed")
    figures: dict[str, Any] = Field(
        default_factory=dict, description="the layer's own figures (pass rates, p-values, counts)"
    )


class QualityResult(BaseModel):
    """One fleet's quality-gate results as the campaign runner gave them; the gate's own
    fixture details pass through unchanged (they are the runner's, not the report's)."""

    model_config = ConfigDict(extra="allow")

    passed: bool | None = Field(default=None, description="the gate's verdict; null: not evaluated")
    pass_rate: float | None = Field(default=None, description="share of fixtures passed, 0..1")
    failures: list[str] = Field(default_factory=list, description="each failed fixture or check, in words")
    failed_layer: str | None = Field(default=None, description="the first layer that failed or could not be evaluated")
    layers: dict[str, QualityLayer] | None = Field(default=None, description="per layer name: its result")


class FleetSeries(_Model):
    """One fleet's plot data, from the replay's per-request records."""

    ttft_cdf: list[Point] = Field(description="(TTFT s, cumulative fraction of requests): 50 nearest-rank quantiles")
    itl_cdf: list[Point] = Field(
        description="(ITL s per token, cumulative fraction of requests): 50 nearest-rank quantiles"
    )
    goodput: list[Point] | None = Field(
        default=None,
        description="(bin start, seconds after wall_start; successful output tokens/s): 60 equal bins of the arrival "
        "window by completion time, then bins of the same width for the drain",
    )


class Series(_Model):
    """Plot data: latency CDFs and goodput over time per fleet, and the payback curve."""

    fleets: dict[str, FleetSeries] = Field(description="per fleet name: its series")
    payback_curve: list[Point] | None = Field(
        default=None,
        description="(months after cut-over, cumulative net savings USD = -migration cost + months x monthly delta)",
    )


class Report(_Model):
    """report.json: the comparison of two fleets serving one model, and the migration decision it supports."""

    report_version: str = Field(
        default=REPORT_VERSION, description="MAJOR.MINOR of this model (see the compatibility rule)"
    )
    campaign: str = Field(description="the campaign's name (manifest campaign)")
    manifest_digest: str = Field(description="SHA-256 of the manifest's canonical form; every record carries the same")
    generated_at: str = Field(description="when the report was built, ISO 8601 UTC")
    comparison: Comparison = Field(description="which fleet is the baseline and which the candidate")
    slo: Slo = Field(description="the SLO both fleets are held to")
    horizon_months: float = Field(
        description="months within which the migration must pay back (manifest horizon_months)"
    )
    systems_under_test: str | None = Field(
        default=None, description="what actually served the fleets when not the manifest's hardware (e.g. the emulator)"
    )
    stopped_at: Literal["quality_gate"] | None = Field(
        default=None, description="set when the comparison stopped before any load: nothing after the gate was measured"
    )
    fleets: dict[str, FleetRow] = Field(description="per fleet name: the headline evaluation's row")
    demand_tok_s: float | None = Field(
        description="peak demand, output tokens/s: manifest peak_requests_per_s x mean output tokens per completed request "
        "(pooled over fleets)"
    )
    pooled_output_tokens_per_request: float | None = Field(
        default=None, description="that mean, output tokens per completed request"
    )
    utilization_target: float | None = Field(default=None, description="the manifest's utilization target, 0..1")
    monthly_delta_usd: float | None = Field(
        description="baseline monthly cost - candidate monthly cost, USD/month (> 0: the candidate saves); computed whether or not "
        "the headline shows it"
    )
    monthly_delta_ci_usd: Interval | None = Field(
        default=None, description="its 95% interval, USD/month: both fleets' cost intervals paired at their worst ends"
    )
    migration: Ledger | None = Field(description="the migration ledger; null: a fleet is not priced")
    migration_cost_usd: float | None = Field(description="the ledger's total, USD")
    payback_months: float | None = Field(
        description="migration cost / monthly delta, months; null: the delta is not positive"
    )
    payback_months_ci: Interval | None = Field(
        default=None,
        description="its 95% interval, months; a null high end: no payback at the pessimistic end (or unknown)",
    )
    months_to_next_refresh: float | None = Field(
        description="months until the next hardware refresh (manifest migration)"
    )
    decision: Decision = Field(description="Go / Defer / Reject and why")
    headline: Headline = Field(description="the figures the pages headline, or none with what blocks them")
    gaps: list[Gap] = Field(description="evidence the report lacks or doubts")
    prometheus: PrometheusSection | None = Field(
        default=None, description="the Prometheus cross-check; null: no Prometheus source"
    )
    prefix_cache: PrefixCache | None = Field(default=None, description="prefix caching per fleet; null: not computed")
    cloudwatch: dict[str, dict[str, float | None]] | None = Field(
        default=None,
        description="per fleet: CloudWatch figures over the window (instances in service, accelerator utilization "
        "%, NLB bytes), pulled; null: not a cloud run",
    )
    time_to_ready: dict[str, TimeToReadyModel] | None = Field(
        default=None, description="per fleet: launch to first healthy target"
    )
    billing: Billing | None = Field(
        default=None,
        description="the campaign's cost planned, computed and billed; null: no plan and no billing source given",
    )
    quality: dict[str, QualityResult] | None = Field(
        default=None, description="per fleet: the quality gate's results; null: none given"
    )
    provenance: dict[str, ProvenanceEntry] = Field(
        description="per input (a dotted key such as 'prices.instance.g6.xlarge' or 'capacity.inf2'): where it came from"
    )
    sensitivity: Sensitivity | None = Field(default=None, description="the one-at-a-time grid; null: not computed")
    series: Series = Field(description="the figures' plot data")

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


def non_finite_to_null(x: _T) -> _T:
    """`x` with every Infinity/NaN float (JSON has none) made None, inside models, dicts, lists and
    tuples alike, so the pages rendered from a report show what report.json says. Models are
    copied only where a value changes; anything without a non-finite float is returned as is."""
    return cast(_T, _finite(x))


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, BaseModel):
        values = {**x.__dict__, **(x.__pydantic_extra__ or {})}
        changed = {k: new for k, v in values.items() if (new := _finite(v)) is not v}
        return x.model_copy(update=changed) if changed else x
    if isinstance(x, dict):
        items = {k: _finite(v) for k, v in x.items()}
        return items if any(items[k] is not v for k, v in x.items()) else x
    if isinstance(x, list | tuple):
        seq = [_finite(v) for v in x]
        return type(x)(seq) if any(new is not old for new, old in zip(seq, x, strict=True)) else x
    return x


def _version(v: str) -> tuple[int, int]:
    major, minor = v.split(".")
    return int(major), int(minor)


class ReportInvalid(AnalysisError):
    """A report.json that does not match the model; the message names each bad field."""


def parse_report(data: Any, where: str = "report.json") -> Report:
    """A report from its JSON object; a missing `report_version` or any bad field raises ReportInvalid naming it."""
    if isinstance(data, dict) and "report_version" not in data:
        raise ReportInvalid(
            f"{where}: report_version: missing (a report written before the versioned model, or not a report)"
        )
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


SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"


def schema_path() -> Path:
    """schemas/report-v<MAJOR>.json: the committed schema of this report_version's MAJOR."""
    return SCHEMA_DIR / f"report-v{_version(REPORT_VERSION)[0]}.json"


def json_schema() -> dict[str, Any]:
    """report.json's JSON Schema (draft 2020-12), generated from the model."""
    schema = Report.model_json_schema()
    schema["description"] = (
        f"{schema.get('description', '')} report_version {REPORT_VERSION}; generated from "
        "analysis/model.py. A float that is not finite is written as null."
    )
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


FIELDS_LEDGER = SCHEMA_DIR / "report-fields.json"


def schema_fields(schema: dict[str, Any]) -> list[str]:
    """Every property of every model of a report schema, as "Model.field", sorted."""
    out = {f"Report.{p}" for p in schema.get("properties", {})}
    for name, d in schema.get("$defs", {}).items():
        out |= {f"{name}.{p}" for p in d.get("properties", {})}
    return sorted(out)


def record_fields(ledger: Path = FIELDS_LEDGER) -> None:
    """This version's fields into the ledger; refused where the version is recorded with other
    fields: those changed without a version bump (the compatibility rule above)."""
    recorded: dict[str, list[str]] = json.loads(ledger.read_text(encoding="utf-8")) if ledger.is_file() else {}
    fields = schema_fields(json_schema())
    if recorded.get(REPORT_VERSION, fields) != fields:
        added = sorted(set(fields) - set(recorded[REPORT_VERSION]))
        gone = sorted(set(recorded[REPORT_VERSION]) - set(fields))
        raise SystemExit(
            f"{ledger.name}: report_version {REPORT_VERSION} is recorded with other fields (added {added[:10]}, "
            f"removed {gone[:10]}): bump REPORT_VERSION (MINOR for additions only, MAJOR otherwise) first"
        )
    recorded[REPORT_VERSION] = fields
    ledger.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def schema_text() -> str:
    """The schema as committed: two-space indent, UTF-8, one trailing newline."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m analysis.model", description="report.json's JSON Schema, generated from the model."
    )
    ap.add_argument("--schema", action="store_true", help="print the JSON Schema of report.json")
    ap.add_argument(
        "--write",
        action="store_true",
        help=f"with --schema: write it to schemas/report-v<MAJOR>.json ({schema_path().name}) and record this "
        f"version's fields in {FIELDS_LEDGER.name}",
    )
    args = ap.parse_args(argv)
    if not args.schema:
        ap.print_help()
        return 2
    if args.write:
        schema_path().parent.mkdir(parents=True, exist_ok=True)
        record_fields()
        schema_path().write_text(schema_text(), encoding="utf-8")
        print(schema_path())
    else:
        sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
