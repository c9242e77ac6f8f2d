"""`campaign plan --rehearsal`: the minutes and USD of the fixed rehearsal (core.rehearsal), beside
the campaign's.

The rehearsal deploys the same stacks with every accelerator fleet replaced by its emulator on the
rehearsal's host type: `measure_instances` of them per fleet, no compile phase, no weights. Its
stages are fixed (core.rehearsal), so they are priced from their lengths rather than simulated; the
stages around them (deploy, the gate, report and teardown) take the campaign plan's assumptions, and
every USD term is priced by the campaign plan's own functions (campaign.plan.predict).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from campaign.plan.predict import (
    DEPLOY_MIN,
    QUALITY_GATE_MIN,
    REPORT_AND_TEARDOWN_MIN,
    CampaignPrediction,
    StepOverhead,
    infrastructure_cost,
    instance_usd,
)
from campaign.stages.deadline import CAPACITY_STAGE, GATE_STAGE, REPLAY_STAGE, SETTLE_STAGE
from core import rehearsal
from core.manifest import Manifest


@dataclass(frozen=True)
class RehearsalPrediction:
    instance_type: str
    instance_type_source: str  # why this type, its price and facts with their sources
    hourly_usd: float
    rehearsal_minutes: float
    rehearsal_usd: float | None  # None: a price is missing from the snapshot
    minutes: dict[str, float]  # the rehearsal_minutes breakdown
    usd: dict[str, float]  # the rehearsal_usd breakdown
    assumptions: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict_rehearsal(m: Manifest, overhead: StepOverhead | None = None) -> RehearsalPrediction:
    """The rehearsal of `m`: its stages side by side on every fleet, each capacity step and settle
    segment paying `overhead` (its load generator's start and stop) on top of its arrivals and drain,
    as a campaign's do (the plan's assumed overhead by default). Raises
    core.rehearsal.NoRehearsalType when no host type qualifies."""
    overhead = overhead or StepOverhead()
    host = rehearsal.rehearsal_type(m.costs.region)
    step_min = (rehearsal.STEP_S + overhead.seconds) / 60
    replay_min = rehearsal.REPLAY_S / 60
    capacity_min = rehearsal.CAPACITY_STEPS * step_min
    settle_min = rehearsal.SETTLE_SEGMENTS * step_min
    minutes = {
        "deploy": DEPLOY_MIN,
        "ready_at_most": rehearsal.READY_MIN,
        GATE_STAGE: QUALITY_GATE_MIN,
        REPLAY_STAGE: replay_min,
        CAPACITY_STAGE: capacity_min,
        SETTLE_STAGE: settle_min,
        "report_and_teardown": REPORT_AND_TEARDOWN_MIN,
    }
    total_min = sum(minutes.values())
    usd = {f"instances.{f.name}": instance_usd(host.hourly_usd, f.instances_measured, total_min) for f in m.fleets}
    # No compile phase: the fleets and the conductor run from deploy to teardown.
    shared = infrastructure_cost(m, total_min, replay_min + capacity_min + settle_min, fleets_min=total_min)
    # As predict does: the totals are the sums of the breakdowns as printed.
    shown_min = {k: round(v, 1) for k, v in minutes.items()}
    shown_usd = {k: round(v, 2) for k, v in {**usd, **(shared or {})}.items()}
    fleets = ", ".join(f"{f.name} {f.instances_measured}" for f in m.fleets)
    return RehearsalPrediction(
        instance_type=host.name,
        instance_type_source=host.provenance,
        hourly_usd=host.hourly_usd,
        rehearsal_minutes=round(sum(shown_min.values()), 1),
        rehearsal_usd=round(sum(shown_usd.values()), 2) if shared is not None else None,
        minutes=shown_min,
        usd=shown_usd if shared is not None else {},
        assumptions=[
            f"every accelerator fleet replaced by its emulator on {host.name} (measure_instances each: {fleets}) across "
            "the fleet's AZs behind the same NLB, from deploy to teardown; no compile phase, no weights",
            f"fixed stages, side by side on every fleet: the gate, a {rehearsal.REPLAY_S / 60:g}-minute replay, "
            f"{rehearsal.CAPACITY_STEPS} capacity steps and {rehearsal.SETTLE_SEGMENTS} settle segment of "
            f"{rehearsal.STEP_S:g} s of arrivals and drain each, plus the step overhead ({overhead.seconds:.0f} s, "
            f"{overhead.source}); one `run --detach` / `--attach`: the conductor runs for the whole rehearsal",
            f"ready: at most {rehearsal.READY_MIN:g} min (core.rehearsal.READY_MIN, assumed): the emulator needs no "
            "weights and compiles nothing",
            f"deploy {DEPLOY_MIN:g} min, quality gate {QUALITY_GATE_MIN:g} min, report and teardown "
            f"{REPORT_AND_TEARDOWN_MIN:g} min: the campaign plan's assumptions",
            "the NAT gateway's hours, the interface endpoints and the AMP workspace: not priced, as in the campaign's "
            "plan (no snapshot row)",
        ],
    )


def render(r: RehearsalPrediction, campaign: CampaignPrediction | None) -> str:
    usd = "n/a (a price is missing)" if r.rehearsal_usd is None else f"{r.rehearsal_usd:,.2f} USD"
    beside = ""
    if campaign is not None:
        campaign_usd = "n/a" if campaign.campaign_usd is None else f"{campaign.campaign_usd:,.2f} USD"
        beside = f" (the campaign: about {campaign.campaign_minutes:.0f} min, {campaign_usd})"
    lines = [
        "",
        "Rehearsal (`deploy --rehearsal`: the whole AWS path once, every fleet an emulator on a cheap instance type)",
        f"  rehearsal: about {r.rehearsal_minutes:.0f} min, {usd}{beside}",
        f"    instance type: {r.instance_type_source}",
        "    minutes: " + ", ".join(f"{k} {v:g}" for k, v in r.minutes.items()),
        "    usd: " + ", ".join(f"{k} {v:,.2f}" for k, v in r.usd.items()),
    ]
    lines += [f"  assumed: {a}" for a in r.assumptions]
    return "\n".join(lines)
