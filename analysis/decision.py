"""Go / Defer / Reject, exactly per DESIGN.md, with every reason that applied.

Rule (precedence Reject > Defer > Go; all reasons are reported, not just the first):
- Reject: the candidate's model or API semantics fail (no completed request returned output
  tokens, or its error rate is above slo.max_error_rate while one instance was not saturated:
  errors in a saturated replay are an overload's timeouts, which the capacity search judges),
  its quality gate failed, or the monthly delta (baseline - candidate) is <= 0.
- Defer: the candidate is feasible but the evidence is incomplete (a blocking gap: missing
  records, prices, quality results, an unreachable source the operator asked for, an
  invalid run), the candidate did not hold the same SLO or availability (AZs, redundancy)
  as the baseline, the sized fleet exceeds its ASG maximum, the payback is beyond the
  horizon, or the refresh is near.
- Evidence insufficient (Defer): a 95% interval straddles a decision boundary: the monthly
  delta's straddles 0 (then a delta <= 0 does not Reject either), or the payback's straddles
  the horizon; the reason names the sample size that would settle it.
- Refresh near: the next hardware refresh comes before the migration pays back
  (months_to_next_refresh < payback months). When the manifest does not give
  months_to_next_refresh, the next refresh is taken to be a full refresh_cadence_months away.
- Go: none of the above.
- Stopped at the quality gate (the local campaign replays no load once a fleet fails it):
  decided on the gate alone, Reject when the candidate failed it, else Defer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

State = Literal["go", "defer", "reject"]


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
    # an interval straddles a decision boundary (delta = 0, the horizon): each is a Defer reason
    insufficient: tuple[str, ...] = field(default_factory=tuple)
    delta_settled: bool = True  # False: the delta's interval straddles 0, so delta <= 0 cannot Reject
    # The quality layer that failed (or could not be evaluated) and why, e.g. "layer equivalence: ..."
    candidate_quality_failure: str | None = None
    baseline_quality_failure: str | None = None
    # Output tokens of every completed request, SLO met or not (None: taken as the successful
    # ones): requests that came back but were late prove the semantics work.
    candidate_completed_output_tokens: int | None = None
    candidate_requests_sent: int | None = None  # non-warmup requests sent to the candidate (None: not counted)
    candidate_saturated: bool = False  # the replay drove one candidate instance to its batch limit


@dataclass(frozen=True)
class Decision:
    state: State
    reasons: list[str]

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "reasons": list(self.reasons)}


def quality_reasons(
    candidate: str, baseline: str, candidate_passed: bool | None, baseline_passed: bool | None, detail: Mapping[str, str] | None = None,
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
        defer.append(f"{baseline}: the baseline's own quality gate failed{why(baseline)}; the comparison is not like for like")
    return reject, defer


def decide_at_gate(
    candidate: str, baseline: str, candidate_passed: bool | None, baseline_passed: bool | None, detail: Mapping[str, str] | None = None,
) -> Decision:
    """The decision when the comparison stopped at the quality gate: nothing after it was measured,
    so only the gate's own rules apply (a failing candidate rejects, a failing baseline defers)."""
    reject, defer = quality_reasons(candidate, baseline, candidate_passed, baseline_passed, detail)
    stopped = "the comparison stopped at the quality gate: no load was replayed, so no cost, fleet size or payback was measured"
    if reject:
        return Decision("reject", [*reject, *defer, stopped])
    return Decision("defer", [*defer, stopped])


def decide(d: DecisionInputs) -> Decision:
    reject: list[str] = []
    defer: list[str] = []
    c = d.candidate
    q_reject, q_defer = quality_reasons(c, d.baseline, d.candidate_quality_passed, d.baseline_quality_passed,
                                        {c: d.candidate_quality_failure or "", d.baseline: d.baseline_quality_failure or ""})
    completed = d.candidate_completed_output_tokens if d.candidate_completed_output_tokens is not None else d.candidate_successful_tokens
    nothing_sent = d.candidate_requests_sent == 0
    if nothing_sent:  # nothing was measured: no finding about the model either way
        defer.append(f"evidence insufficient: no request after the warmup was sent to {c}; replay a longer window")
    elif completed <= 0:
        reject.append(f"{c}: no completed request returned output tokens; the model or API semantics failed")
    if d.candidate_error_rate is not None and d.candidate_error_rate > d.max_error_rate and not d.candidate_saturated:
        reject.append(f"{c}: error rate {d.candidate_error_rate:.4f} above the ceiling {d.max_error_rate}")
    reject.extend(q_reject)
    if d.monthly_delta_usd is not None and d.monthly_delta_usd <= 0 and d.delta_settled:
        reject.append(f"monthly delta {d.monthly_delta_usd:.2f} USD <= 0: {c} is not cheaper than {d.baseline}; no payback")

    defer.extend(f"evidence incomplete: {g}" for g in d.blocking_gaps)
    defer.extend(f"evidence insufficient: {x}" for x in d.insufficient)
    defer.extend(q_defer)
    if d.monthly_delta_usd is None:
        defer.append("evidence incomplete: a fleet's monthly cost could not be computed")
    if not d.candidate_slo_pass and d.baseline_slo_pass:
        defer.append(f"{c}: did not hold the SLO in the measured run while {d.baseline} did")
    if not d.same_availability:
        defer.append(f"{c}: fewer AZs or less redundancy than {d.baseline}; not the same availability")
    if not d.candidate_within_asg_max:
        defer.append(f"{c}: the required fleet exceeds its ASG maximum")
    if d.payback_months is not None:
        if d.payback_months > d.horizon_months:
            defer.append(f"payback {d.payback_months:.1f} months is beyond the {d.horizon_months:g}-month horizon")
        if d.months_to_next_refresh < d.payback_months:
            defer.append(
                f"refresh near: next refresh in {d.months_to_next_refresh:g} months, before the {d.payback_months:.1f}-month payback"
            )

    if reject:
        return Decision("reject", reject + defer)
    if defer:
        return Decision("defer", defer)
    return Decision(
        "go",
        [
            f"{c} holds the SLO and quality, saves {d.monthly_delta_usd:.2f} USD/month and pays back in "
            f"{d.payback_months:.1f} months, inside the {d.horizon_months:g}-month horizon and before the next refresh"
        ],
    )
