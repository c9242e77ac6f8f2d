"""Go / Defer / Reject, exactly per docs/design.md (Decision), with every reason that applied.

Rule (precedence Reject > Defer > Go; all reasons are reported, not just the first). The
monthly delta (baseline - candidate) carries a 95% interval [low, high]; the Go threshold is
migration cost / horizon + the manifest's indifference margin (USD/month).
- Go: the candidate's semantics, error rate and quality gate pass, it holds the same SLO and
  availability as the baseline, its integer fleet fits its ASG maximum, no gap blocks the
  evidence, the next refresh comes after the payback, and the delta's LOW end is above the Go
  threshold: the migration pays back inside the horizon even at the pessimistic end.
- Reject: the candidate's model or API semantics fail (no completed request returned output
  tokens, or its error rate is above slo.max_error_rate while one instance was not saturated:
  errors in a saturated replay are an overload's timeouts, which the capacity search judges),
  its quality gate failed, or the delta's HIGH end is at or below 0 (the candidate costs at
  least as much even at the optimistic end).
- Defer: the delta's high end is above 0 but at or below the Go threshold (the payback is
  beyond the horizon even at the optimistic end), the refresh is near (months_to_next_refresh <
  payback months; without months_to_next_refresh the next refresh is a full
  refresh_cadence_months away), the evidence is incomplete (a blocking gap: missing records,
  prices, quality results, an unreachable source the operator asked for, an invalid run), the
  candidate did not hold the same SLO or availability (AZs, redundancy), the sized fleet
  exceeds its ASG maximum, or the evidence does not yet separate the states:
- Evidence insufficient (Defer) is reserved for an interval that straddles a threshold, the
  Go threshold first (low <= threshold < high: whether to migrate is not settled), then, once Go
  is ruled out, 0 (low <= 0 < high: Defer or Reject is not settled). The reason names the
  threshold, and `decision.to_settle` (analysis.economics.to_settle) the evidence that would settle it.
- Each end of the interval is compared with the threshold priced at that end (the migration
  ledger's dual-run and rollback items are priced from the fleets' monthly costs), so the
  delta's low end clears the Go threshold exactly when the payback's pessimistic end is
  inside the horizon (with no margin). An unknown end is taken as unbounded. Without an
  interval the point delta stands for both ends.
- Stopped at the quality gate (the local campaign replays no load once a fleet fails it):
  decided on the gate alone, Reject when the candidate failed it, else Defer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from analysis.model import Decision, ToSettle

Aim = Literal["go", "zero"]  # the threshold the evidence must still settle: the Go threshold, or 0

# The rule as the report states it (docs/design.md: Decision says the same).
RULE = (
    "Go when the monthly delta's 95% low end is above the Go threshold (migration cost / horizon + indifference margin: "
    "payback inside the horizon even at the pessimistic end) and feasibility, quality, the SLO within the ASG maximum and "
    "the refresh allow it; Reject when semantics or quality fail or the delta's 95% high end is at or below 0; otherwise "
    "Defer. 'Evidence insufficient' means the interval straddles the Go threshold (whether to migrate is open) or, once "
    "Go is ruled out, 0 (Defer or Reject is open)."
)


@dataclass(frozen=True)
class Economics:
    """The monthly delta (USD) and its 95% interval against the two thresholds, the Go threshold and 0.

    `go_threshold` = migration cost / horizon + margin at the point; `go_threshold_low` and
    `go_threshold_high` are the thresholds the interval's low and high ends are compared with
    (each priced with its own end's migration cost). `low` / `high` None: that end is unknown."""

    delta: float
    low: float | None
    high: float | None
    go_threshold: float
    go_threshold_low: float
    go_threshold_high: float
    migration_cost_usd: float
    horizon_months: float
    margin_usd: float = 0.0

    @classmethod
    def at_point(
        cls, delta: float, migration_cost_usd: float, horizon_months: float, margin_usd: float = 0.0
    ) -> Economics:
        """No interval: the point is both ends, and one threshold."""
        g = migration_cost_usd / horizon_months + margin_usd
        return cls(delta, delta, delta, g, g, g, migration_cost_usd, horizon_months, margin_usd)

    @property
    def go_settled(self) -> bool:
        """A Go even at the pessimistic end."""
        return self.low is not None and self.low > self.go_threshold_low

    @property
    def go_ruled_out(self) -> bool:
        """No Go even at the optimistic end."""
        return self.high is not None and self.high <= self.go_threshold_high

    @property
    def reject_settled(self) -> bool:
        """Not cheaper even at the optimistic end."""
        return self.high is not None and self.high <= 0

    @property
    def aim(self) -> Aim | None:
        """The threshold the interval still straddles (the Go threshold first, then 0); None: settled."""
        if not self.go_settled and not self.go_ruled_out:
            return "go"
        if self.go_ruled_out and not self.reject_settled and not (self.low is not None and self.low > 0):
            return "zero"
        return None

    def threshold_text(self) -> str:
        ends = ""
        if (self.go_threshold_low, self.go_threshold_high) != (self.go_threshold, self.go_threshold):
            ends = (
                f"; {self.go_threshold_low:,.2f} at the pessimistic end and {self.go_threshold_high:,.2f} at the optimistic "
                "end, whose fleet costs price the ledger's dual-run and rollback items"
            )
        return (
            f"the Go threshold {self.go_threshold:,.2f} USD/month (migration {self.migration_cost_usd:,.2f} USD / "
            f"{self.horizon_months:g} months + indifference margin {self.margin_usd:,.2f} USD/month{ends})"
        )

    def ci_text(self) -> str:
        def one(v: float | None) -> str:
            return "unknown" if v is None else f"{v:,.2f}"

        return f"monthly delta {self.delta:,.2f} USD, 95% CI [{one(self.low)}, {one(self.high)}] USD"


@dataclass(frozen=True)
class DecisionInputs:
    candidate: str
    baseline: str
    candidate_successful_tokens: int
    candidate_error_rate: float | None
    max_error_rate: float
    candidate_quality_passed: bool | None  # None: no quality results given
    baseline_quality_passed: bool | None
    candidate_slo_pass: bool
    baseline_slo_pass: bool
    same_availability: bool
    candidate_within_asg_max: bool
    monthly_delta_usd: float | None  # None when a fleet's cost could not be computed
    payback_months: float | None
    horizon_months: float
    months_to_next_refresh: float
    blocking_gaps: tuple[str, ...] = field(default_factory=tuple)
    # The delta against the Go threshold and 0, with its 95% interval. None: taken at the point
    # from monthly_delta_usd and migration_cost_usd (no interval measured).
    economics: Economics | None = None
    migration_cost_usd: float | None = None  # used only when economics is None
    indifference_margin_usd: float = 0.0  # used only when economics is None
    # What would settle an "evidence insufficient" reason (analysis.economics.to_settle), appended to it.
    settle_text: str = ""
    # The quality layer that failed (or could not be evaluated) and why, e.g. "layer equivalence: ..."
    candidate_quality_failure: str | None = None
    baseline_quality_failure: str | None = None
    # Output tokens of every completed request, SLO met or not (None: taken as the successful
    # ones): requests that came back but were late prove the semantics work.
    candidate_completed_output_tokens: int | None = None
    candidate_requests_sent: int | None = None  # non-warmup requests sent to the candidate (None: not counted)
    candidate_saturated: bool = False  # the replay drove one candidate instance to its batch limit
    # The evidence that would settle the interval (analysis.economics.to_settle): the decision carries it only
    # while it still aims at a threshold (not when settled, or decided on semantics or quality).
    to_settle: ToSettle | None = None


def quality_reasons(
    candidate: str,
    baseline: str,
    candidate_passed: bool | None,
    baseline_passed: bool | None,
    detail: Mapping[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """(reject, defer) reasons from the quality gate alone; `detail`: fleet -> what failed, appended to its reason."""
    more = detail or {}

    def why(fleet: str) -> str:
        return f": {more[fleet]}" if more.get(fleet) else ""

    reject = [f"{candidate}: quality gate failed{why(candidate)}"] if candidate_passed is False else []
    defer = []
    if candidate_passed is None:  # no results, or a layer that could not be evaluated (detail names it)
        defer.append(f"evidence incomplete: no quality-gate result for {candidate}{why(candidate)}")
    if baseline_passed is False:
        defer.append(
            f"{baseline}: the baseline's own quality gate failed{why(baseline)}; the comparison is not like for like"
        )
    return reject, defer


def decide_at_gate(
    candidate: str,
    baseline: str,
    candidate_passed: bool | None,
    baseline_passed: bool | None,
    detail: Mapping[str, str] | None = None,
) -> Decision:
    """The decision when the comparison stopped at the quality gate: nothing after it was measured,
    so only the gate's own rules apply (a failing candidate rejects, a failing baseline defers)."""
    reject, defer = quality_reasons(candidate, baseline, candidate_passed, baseline_passed, detail)
    stopped = "the comparison stopped at the quality gate: no load was replayed, so no cost, fleet size or payback was measured"
    if reject:
        return Decision(state="reject", reasons=[*reject, *defer, stopped])
    return Decision(state="defer", reasons=[*defer, stopped])


def economics_of(d: DecisionInputs) -> Economics | None:
    if d.economics is not None:
        return d.economics
    if d.monthly_delta_usd is None or d.migration_cost_usd is None:
        return None
    return Economics.at_point(d.monthly_delta_usd, d.migration_cost_usd, d.horizon_months, d.indifference_margin_usd)


def _economic_reasons(d: DecisionInputs, e: Economics) -> tuple[list[str], list[str]]:
    """(reject, defer) reasons from the delta against the Go threshold and 0."""
    c, settle = d.candidate, (f"; {d.settle_text}" if d.settle_text else "")
    if e.reject_settled:
        return [
            f"{e.ci_text()}: at or below 0 even at the optimistic end: {c} is not cheaper than {d.baseline}; no payback"
        ], []
    defer: list[str] = []
    if e.go_ruled_out:
        defer.append(
            f"payback beyond the {d.horizon_months:g}-month horizon even at the optimistic end: {e.ci_text()}, "
            f"high end at or below {e.threshold_text()}"
        )
    aim = e.aim
    if aim == "go":
        defer.append(
            f"evidence insufficient at the Go threshold: {e.ci_text()} straddles {e.threshold_text()}, so whether the "
            f"migration pays back inside the {d.horizon_months:g}-month horizon is not settled{settle}"
        )
    elif aim == "zero":
        defer.append(
            f"evidence insufficient at 0 (Defer or Reject): Go is ruled out, but {e.ci_text()} straddles 0, so "
            f"whether {c} is cheaper at all is not settled{settle}"
        )
    return [], defer


def decide(d: DecisionInputs) -> Decision:
    reject: list[str] = []
    defer: list[str] = []
    c = d.candidate
    q_reject, q_defer = quality_reasons(
        c,
        d.baseline,
        d.candidate_quality_passed,
        d.baseline_quality_passed,
        {c: d.candidate_quality_failure or "", d.baseline: d.baseline_quality_failure or ""},
    )
    completed = (
        d.candidate_completed_output_tokens
        if d.candidate_completed_output_tokens is not None
        else d.candidate_successful_tokens
    )
    nothing_sent = d.candidate_requests_sent == 0
    if nothing_sent:  # nothing was measured: no finding about the model either way
        defer.append(f"evidence insufficient: no request after the warmup was sent to {c}; replay a longer window")
    elif completed <= 0:
        reject.append(f"{c}: no completed request returned output tokens; the model or API semantics failed")
    if d.candidate_error_rate is not None and d.candidate_error_rate > d.max_error_rate and not d.candidate_saturated:
        reject.append(f"{c}: error rate {d.candidate_error_rate:.4f} above the ceiling {d.max_error_rate}")
    reject.extend(q_reject)
    settled_elsewhere = bool(reject)  # semantics or quality: no more load would change a Reject
    e = economics_of(d)
    if e is not None:
        e_reject, e_defer = _economic_reasons(d, e)
        reject.extend(e_reject)
        defer.extend(e_defer)

    defer.extend(f"evidence incomplete: {g}" for g in d.blocking_gaps)
    defer.extend(q_defer)
    if d.monthly_delta_usd is None:
        defer.append("evidence incomplete: a fleet's monthly cost could not be computed")
    elif e is None:
        defer.append("evidence incomplete: the migration cost could not be computed, so neither could the Go threshold")
    if not d.candidate_slo_pass and d.baseline_slo_pass:
        defer.append(f"{c}: did not hold the SLO in the measured run while {d.baseline} did")
    if not d.same_availability:
        defer.append(f"{c}: fewer AZs or less redundancy than {d.baseline}; not the same availability")
    if not d.candidate_within_asg_max:
        defer.append(f"{c}: the required fleet exceeds its ASG maximum")
    if d.payback_months is not None and d.months_to_next_refresh < d.payback_months:
        defer.append(
            f"refresh near: next refresh in {d.months_to_next_refresh:g} months, before the {d.payback_months:.1f}-month payback"
        )

    threshold = e.go_threshold if e is not None else None
    aim = None if settled_elsewhere or e is None else e.aim
    settle = d.to_settle if aim is not None else None
    if reject:
        return Decision(state="reject", reasons=reject + defer, go_threshold_usd_per_month=threshold, to_settle=settle)
    if defer:
        return Decision(state="defer", reasons=defer, go_threshold_usd_per_month=threshold, to_settle=settle)
    assert e is not None  # no Defer reason: the delta and the threshold are known, its low end above it
    point = f" (in {d.payback_months:.1f} months at the point)" if d.payback_months is not None else ""
    return Decision(
        state="go",
        reasons=[
            f"{c} holds the SLO and quality; {e.ci_text()}: its low end is above {e.threshold_text()}, so the migration "
            f"pays back{point} inside the {d.horizon_months:g}-month horizon even at the pessimistic end, and before the next refresh"
        ],
        go_threshold_usd_per_month=threshold,
    )
