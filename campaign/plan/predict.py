"""`campaign plan`'s prediction: the whole campaign run in simulated time, before any spend.

The trace replay and each fleet's capacity search run through the emulator's engine in simulated
time (`campaign.backends.simulated.fleets`), by the same search, records and report code as a live
campaign (`campaign.stages.capacity`, `analysis.report.build.build_report`). From that predicted report
come each fleet's per-instance capacity and size, the likely decision with its interval and
what would settle it; from the simulated steps' durations and the price snapshot, how long the
cloud campaign will take and what it will cost.

Every figure here is a prediction of the emulator, whose out-of-sample error the plan prints
beside it (the calibration band in each fleet's efficiency provenance, runtime/emulator/calibrate.py
--loso). The quality gate is assumed to pass: it is not predicted.
"""

from __future__ import annotations

import math
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.capacity.settle_record import SettleOutcome
from analysis.capacity.steps import REPLAY, median_overhead_s, read_search_path
from campaign.aws.compile_estimate import (
    NEURON_COMPILE_MIN_PER_GB,
    CompilePhase,
    compile_phase,
    compiled_prefix,
    hourly_price,
)
from campaign.backends.simulated.fleets import SimulatedFleets
from campaign.stages.deadline import CAPACITY_STAGE, GATE_STAGE, REPLAY_STAGE, SETTLE_STAGE
from core import catalog, prices
from core.cloud_contract import (
    CONDUCTOR_TASK_MEMORY_GIB,
    CONDUCTOR_TASK_VCPU,
    HEALTH_GRACE_MIN,
    INTERFACE_ENDPOINT_SERVICES,
    NAT_GATEWAYS,
    PROMETHEUS_TASK_MEMORY_GIB,
    PROMETHEUS_TASK_VCPU,
    loadgen_task_hourly_usd,
)
from core.errors import CampaignError
from core.manifest import CapacitySearch, Issue, Manifest, weight_bytes

# Assumptions of the cloud campaign's time outside the measured load (minutes). Each is printed
# with the plan as an assumption, not a measurement.
DEPLOY_MIN = 15.0  # cdk deploy of the VPC, NLB, fleets, ECS cluster and bucket before instances boot
QUALITY_GATE_MIN = 5.0  # the manifest's fixtures and the tokenizer check on every fleet
REPORT_AND_TEARDOWN_MIN = 15.0  # report, cdk destroy and the leftover check
STEP_OVERHEAD_S = 60.0  # each capacity step's load-generator tasks started and stopped on Fargate, when not measured


@dataclass(frozen=True)
class FleetPrediction:
    fleet: str
    instance_type: str
    capacity_tok_s: float | None  # per instance, SLO-compliant
    capacity_ci_tok_s: list[float | None] | None
    instances_required: int | None
    instances_required_ci: list[int | None] | None
    search_steps: int
    search_bracket: list[float | None]
    search_stop: str
    search_minutes: float
    instances_measured: int  # measure_instances: behind the endpoint while load runs, as simulated
    instances_deployed: (
        int  # what runs (and is paid) for the whole campaign: asg.desired, or measure_instances when more
    )
    hourly_usd: float | None
    error_band: str  # the emulator's calibration and its out-of-sample error, as the fleet's efficiency states it


@dataclass(frozen=True)
class CampaignPrediction:
    campaign_minutes: float
    campaign_usd: float | None
    predicted_decision: str
    decision_reasons: list[str]
    monthly_delta_usd: float | None
    monthly_delta_ci_usd: list[float | None] | None
    to_settle: dict[str, Any] | None  # what would still settle the decision after the settle phase's budget
    settle: dict[str, Any] | None  # the settle phase as simulated (campaign.stages.settle.SettleOutcome)
    fleets: dict[str, FleetPrediction]
    minutes: dict[str, float]  # the campaign_minutes breakdown
    usd: dict[str, float]  # the campaign_usd breakdown
    assumptions: list[str]
    billing_after_deadline: list[str]  # what the deadline's scheduled actions do not stop (billing_after_deadline)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepOverhead:
    """Seconds a capacity step or settle segment spends starting and stopping its load generator,
    and where the figure comes from."""

    seconds: float = STEP_OVERHEAD_S
    source: str = "assumed"

    @classmethod
    def measured_in(cls, run_dir: Path) -> StepOverhead:
        """The median step overhead (SearchStep.overhead_s) over every search of a run directory
        (`campaign run`'s on AWS: Fargate's start and stop), or an error naming what is missing."""
        fleets = sorted(p.parent for p in (run_dir / "capacity").glob("*/search.json"))
        steps = [s for d in fleets if (path := read_search_path(d)) is not None for s in path.steps]
        measured = [s for s in steps if s.overhead_s is not None]
        if not measured:
            raise CampaignError(
                f"{run_dir}: no capacity step with a measured overhead under capacity/*/search.json "
                "(a run directory of `campaign run` or `campaign local`)"
            )
        return cls(median_overhead_s(measured), f"measured: the median of {len(measured)} steps of {run_dir}")


def predict(m: Manifest, work_dir: Path | None = None, overhead: StepOverhead = StepOverhead()) -> CampaignPrediction:
    """Run the campaign in simulated time under `work_dir` (a temporary directory by default);
    each simulated step and settle segment pays `overhead` on top of its arrivals and drain."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="plan-") as tmp:
            return predict(m, Path(tmp), overhead)
    from campaign.stages.run import run_stages

    simulated = SimulatedFleets(m, overhead.seconds)
    log: list[str] = []
    rep = run_stages(m, simulated, work_dir, threading.Event(), full_report=False, log=log.append)
    assert rep is not None  # final_report is on
    replay_min = simulated.replay_s / 60
    outcome = SettleOutcome.read(work_dir / "capacity")
    cfg = m.workload.capacity_search or CapacitySearch()
    searches = {f.name: read_search_path(work_dir / "capacity" / f.name) for f in m.fleets}
    preds: dict[str, FleetPrediction] = {}
    for f in m.fleets:
        row = rep.fleets[f.name]
        path = searches.get(f.name)
        steps = [s for s in path.steps if s.label != REPLAY] if path is not None else []
        hourly, _ = hourly_price(f.instance_type, m.costs.region)
        preds[f.name] = FleetPrediction(
            fleet=f.name,
            instance_type=f.instance_type,
            capacity_tok_s=row.capacity.per_instance_tok_s if row.capacity is not None else None,
            capacity_ci_tok_s=list(row.capacity_ci_tok_s) if row.capacity_ci_tok_s else None,
            instances_required=row.instances_required,
            instances_required_ci=list(row.instances_required_ci) if row.instances_required_ci else None,
            search_steps=len(steps),
            search_bracket=[path.held_multiplier, path.missed_multiplier] if path is not None else [None, None],
            search_stop=str(path.stop_rule) if path is not None else "no search",
            search_minutes=sum(s.took_s or 0.0 for s in steps) / 60,
            instances_measured=f.instances_measured,
            instances_deployed=f.instances_deployed,
            hourly_usd=hourly,
            error_band=f.efficiency.resolved().provenance,
        )
    ready_min = max(HEALTH_GRACE_MIN[catalog.instance(f.instance_type).accelerator.vendor] for f in m.fleets)
    search_min = max((p.search_minutes for p in preds.values()), default=0.0)  # fleets side by side
    # The settle phase's seconds: each round's longest segment as SimulatedSteps.run returned it,
    # its load generator's start and stop (`overhead`) already in, as a capacity step's took_s has it.
    settle_min = outcome.seconds / 60 if outcome is not None else 0.0
    # deploy's compile phases run side by side, with every fleet at 0 (campaign/aws/compile_phase.py).
    compiles = [c for c in (compile_phase(m, f) for f in m.fleets) if c is not None]
    compile_min = max((c.minutes for c in compiles), default=0.0)
    # Then one instance per compiled fleet on its own type, side by side (compile_phase.prove_on_fleet_type).
    check_min = max((c.check_minutes for c in compiles), default=0.0)
    minutes = {
        "deploy": DEPLOY_MIN,
        **({"compile_phase_at_most": compile_min} if compiles else {}),
        **({"one_instance_check_at_most": check_min} if compiles else {}),
        "ready_at_most": ready_min,
        GATE_STAGE: QUALITY_GATE_MIN,
        REPLAY_STAGE: replay_min,
        CAPACITY_STAGE: search_min,
        SETTLE_STAGE: settle_min,
        "report_and_teardown": REPORT_AND_TEARDOWN_MIN,
    }
    total_min = sum(minutes.values())
    usd = _cost(m, preds, total_min, replay_min + search_min + settle_min, compiles)
    # The totals are the sums of the breakdowns as printed, so that the parts add up to them
    # (rounding each of eight parts moves their sum up to 4 cents off the rounded total).
    shown_min = {k: round(v, 1) for k, v in minutes.items()}
    shown_usd = {k: round(v, 2) for k, v in usd.items()}
    return CampaignPrediction(
        campaign_minutes=round(sum(shown_min.values()), 1),
        campaign_usd=round(sum(shown_usd.values()), 2) if usd else None,
        predicted_decision=rep.decision.state,
        decision_reasons=list(rep.decision.reasons),
        monthly_delta_usd=rep.monthly_delta_usd,
        monthly_delta_ci_usd=list(rep.monthly_delta_ci_usd) if rep.monthly_delta_ci_usd else None,
        to_settle=rep.decision.to_settle.model_dump(mode="json") if rep.decision.to_settle is not None else None,
        settle=outcome.model_dump(mode="json") if outcome is not None else None,
        fleets=preds,
        minutes=shown_min,
        usd=shown_usd,
        assumptions=[
            f"deploy {DEPLOY_MIN:g} min, quality gate {QUALITY_GATE_MIN:g} min, report and teardown {REPORT_AND_TEARDOWN_MIN:g} min: assumed",
            f"step overhead {overhead.seconds:.0f} s: starting and stopping each capacity step's and settle segment's "
            f"load-generator tasks ({overhead.source})",
            "ready: at most the fleets' health-check grace (core.cloud_contract.HEALTH_GRACE_MIN), the time the stacks allow "
            "a first boot (weights, Neuron compile)",
            "each fleet's measure_instances measured behind its NLB, as simulated; asg.desired instances (measure_instances when "
            "more) run and are paid for the whole campaign but deploy's compile phase (every fleet at 0 while it runs); "
            "load-generator tasks (a master and loadgen.workers workers per fleet) "
            "while load runs; the Prometheus task and one NLB for the whole campaign",
            *_compile_assumptions(m),
            f"weights: {weight_bytes(m) / 1e9:.1f} GB per instance boot from the Hub through the NAT gateway "
            f"(nat_weights: {nat_weight_gb(m, preds, compiles):.0f} GB for the instances deployed and the compile "
            "instances, replacements not counted); `deploy --weights-s3-uri` stages them from S3 through the VPC's "
            "gateway endpoint instead, with no NAT data processing charge (docs/cloud.md); the images come through "
            "the ECR pull-through cache (a tagged Docker Hub or ECR Public image), once per account",
            "the quality gate passes (not predicted)",
            f"the settle phase within capacity_search.settle_budget_s ({cfg.settle_budget_s:g} s of arrivals and drains) as simulated",
        ],
        billing_after_deadline=billing_after_deadline(m),
    )


def deadline_issues(m: Manifest, p: CampaignPrediction) -> list[Issue]:
    """max_campaign_hours must cover the plan's campaign minutes (the compile phase included), or the
    fleets go to 0 before the campaign can end."""
    hours = m.max_campaign_hours
    if hours is None or hours * 60 >= p.campaign_minutes:
        return []
    return [
        Issue(
            "max_campaign_hours",
            f"{hours:g} h ({hours * 60:.0f} min) does not cover the plan's campaign, {p.campaign_minutes:.0f} min "
            f"({', '.join(f'{k} {v:g}' for k, v in p.minutes.items())}): every fleet would be set to 0 before it "
            f"ends; set at least {math.ceil(p.campaign_minutes / 60)}",
        )
    ]


def billing_after_deadline(m: Manifest) -> list[str]:
    """What the stacks keep running after the deadline sets every fleet to 0, until `teardown`: one
    line each, with its hourly price and the price's source where the snapshot has it."""
    region = m.costs.region
    azs = len({az for f in m.fleets for az in f.availability_zones})
    endpoints = ", ".join(INTERFACE_ENDPOINT_SERVICES)
    return [
        f"{NAT_GATEWAYS} NAT gateway (stacks/network.py): hours not priced (no snapshot row); data processed "
        f"{_per_gb(('network', 'nat-gb'), region)}",
        f"1 Network Load Balancer (stacks/load_balancer.py): {_hourly(('nlb', 'hour'), region)}",
        f"{len(INTERFACE_ENDPOINT_SERVICES)} interface VPC endpoints ({endpoints}; stacks/network.py), one network "
        f"interface each in every one of the VPC's {azs} AZs: not priced (no snapshot row)",
        f"the Prometheus task (stacks/observability.py, Fargate, {PROMETHEUS_TASK_VCPU} vCPU, "
        f"{PROMETHEUS_TASK_MEMORY_GIB} GiB): {_fargate_hourly(region)}",
        "the Amazon Managed Service for Prometheus workspace (stacks/observability.py): samples ingested and stored, "
        "not priced (no snapshot row)",
    ]


def _per_gb(row: tuple[str, str], region: str) -> str:
    try:
        price = prices.lookup(*row, region)
    except prices.PriceNotFound:
        return f"not priced (no snapshot row for {region})"
    return f"{price.usd:.4f} USD/GB ({price.provenance})"


def _hourly(row: tuple[str, str], region: str) -> str:
    try:
        price = prices.lookup(*row, region)
    except prices.PriceNotFound:
        return f"not priced (no snapshot row for {region})"
    return f"{price.usd:.4f} USD/hour ({price.provenance})"


def _fargate_hourly(region: str) -> str:
    try:
        vcpu = prices.lookup("fargate", "vcpu-hour", region)
        gib = prices.lookup("fargate", "gb-hour", region)
    except prices.PriceNotFound:
        return f"not priced (no snapshot row for {region})"
    usd = PROMETHEUS_TASK_VCPU * vcpu.usd + PROMETHEUS_TASK_MEMORY_GIB * gib.usd
    return f"{usd:.4f} USD/hour (vCPU-hour and GB-hour, {vcpu.provenance})"


def _compile_assumptions(m: Manifest) -> list[str]:
    """What a Neuron fleet's first boot compiles, and what its later instances fetch instead."""
    out = []
    for f in m.fleets:
        where = compiled_prefix(m, f)
        if where is None:
            continue
        gb = weight_bytes(m) / 1e9
        phase = compile_phase(m, f)
        if phase is not None:
            out.append(
                f"{f.name}: compiled once by deploy's compile phase on one {phase.instance_type} (its own host memory is at "
                f"risk), about {phase.compile_minutes:.0f} min for {gb:.0f} GB of weights (published: the NxD Inference "
                f"vLLM guide's 15 GB in about 15 min) within compile_phase_at_most, while every fleet is at 0; published "
                f"under the results bucket's {where}, which every instance of the fleet fetches instead of compiling "
                "(its boot log says in how many seconds)"
            )
            continue
        out.append(
            f"{f.name}: the first instances compile (all those that boot before a set is published: a new fleet's "
            f"first boots, side by side), about {gb * NEURON_COMPILE_MIN_PER_GB:.0f} min for {gb:.0f} GB of weights "
            "(published: the NxD Inference vLLM guide's 15 GB in about 15 min), within ready_at_most; each then "
            f"publishes its set under the results bucket's {where}, and every later instance or "
            "replacement fetches one instead of compiling (its boot log says in how many seconds)"
        )
    return out


def _cost(
    m: Manifest,
    preds: dict[str, FleetPrediction],
    total_min: float,
    load_min: float,
    compiles: Sequence[CompilePhase] = (),
) -> dict[str, float]:
    """USD of the campaign: instance-hours of every fleet for its whole length but the compile
    phase and the one-instance check after it (every fleet is at 0 meanwhile), each compile
    instance for its phase and the check's one instance of the fleet's type for its grace, and
    the infrastructure beside the fleets (infrastructure_cost); empty when a price is missing
    from the snapshot."""
    out: dict[str, float] = {}
    # The fleets are at 0 through the compile phase and the one-instance check after it.
    compile_min = max((c.minutes for c in compiles), default=0.0) + max(
        (c.check_minutes for c in compiles), default=0.0
    )
    for p in preds.values():
        if p.hourly_usd is None:
            return {}
        out[f"instances.{p.fleet}"] = instance_usd(p.hourly_usd, p.instances_deployed, total_min - compile_min)
    for c in compiles:
        if c.usd is None or c.check_usd is None:
            return {}
        out[f"compile.{c.fleet}"] = c.usd
        out[f"one_instance_check.{c.fleet}"] = c.check_usd
    # The weights cross the NAT gateway once per instance boot when they come from the Hub (the boot
    # script's default): each fleet instance and each compile instance; replacements add more.
    # `deploy --weights-s3-uri` stages them from S3 through the VPC's gateway endpoint instead, which
    # has no data processing charge. Priced at the snapshot's NAT per-GB rate where it has one.
    try:
        nat_gb = prices.lookup("network", "nat-gb", m.costs.region).usd
    except prices.PriceNotFound:
        nat_gb = None
    if nat_gb is not None:
        out["nat_weights"] = nat_weight_gb(m, preds, compiles) * nat_gb
    shared = infrastructure_cost(m, total_min, load_min, fleets_min=total_min - compile_min)
    return {**out, **shared} if shared is not None else {}


def instance_usd(hourly_usd: float, instances: int, minutes: float) -> float:
    """`instances` of one type at `hourly_usd` for `minutes` (On-Demand bills by the second)."""
    return hourly_usd * instances * minutes / 60


def infrastructure_cost(m: Manifest, total_min: float, load_min: float, fleets_min: float) -> dict[str, float] | None:
    """USD of what runs beside the fleets, a campaign's or a rehearsal's alike: the load-generator
    tasks (a master and loadgen.workers workers per fleet) while load runs (`load_min`), the
    conductor for as long as the fleets run (`fleets_min`: a `run --detach`'s; a run in a
    terminal saves it: a bound), the Prometheus task's and the NLB's hours for the whole
    `total_min`; None when a price is missing from the snapshot."""
    try:
        vcpu = prices.lookup("fargate", "vcpu-hour", m.costs.region).usd
        gib = prices.lookup("fargate", "gb-hour", m.costs.region).usd
        nlb = prices.lookup("nlb", "hour", m.costs.region).usd
    except prices.PriceNotFound:
        return None
    tasks = len(m.fleets) * (1 + m.loadgen.workers)
    return {
        "loadgen_tasks": tasks * loadgen_task_hourly_usd(vcpu, gib) * load_min / 60,
        "conductor": (CONDUCTOR_TASK_VCPU * vcpu + CONDUCTOR_TASK_MEMORY_GIB * gib) * fleets_min / 60,
        # stacks/observability.py's Prometheus service (desired_count 1; its task's size is
        # core.cloud_contract's PROMETHEUS_TASK_*) runs from deploy to teardown, the compile phase and
        # past the deadline included (billing_after_deadline), as the NLB does.
        "prometheus_task": (PROMETHEUS_TASK_VCPU * vcpu + PROMETHEUS_TASK_MEMORY_GIB * gib) * total_min / 60,
        "nlb": nlb * total_min / 60,
    }


def nat_weight_gb(m: Manifest, preds: Mapping[str, FleetPrediction], compiles: Sequence[CompilePhase]) -> float:
    """GB of weights through the NAT gateway when every boot downloads them from the Hub: every fleet
    instance deployed and every compile instance, once (an instance replaced downloads them again)."""
    boots = sum(p.instances_deployed for p in preds.values()) + len(compiles)
    return weight_bytes(m) / 1e9 * boots


def _x(k: float | None) -> str:
    return "none" if k is None else f"x{k:.4g}"


def render(p: CampaignPrediction) -> str:
    lines = ["", "Predicted campaign (the emulator in simulated time: the same search, records and report code)"]
    for f in p.fleets.values():
        cap = "n/a" if f.capacity_tok_s is None else f"{f.capacity_tok_s:.0f}"
        ci = (
            ""
            if not f.capacity_ci_tok_s
            else " [" + ", ".join("?" if v is None else f"{v:.0f}" for v in f.capacity_ci_tok_s) + "]"
        )
        size = "n/a" if f.instances_required is None else str(f.instances_required)
        lo, hi = f.search_bracket
        lines += [
            f"  {f.fleet}: capacity {cap}{ci} tok/s per instance ({f.instances_measured} measured), fleet {size} x {f.instance_type}; "
            f"search {f.search_steps} steps, {f.search_minutes:.1f} min, stopped {f.search_stop} (held {_x(lo)}, missed {_x(hi)})",
            f"    error band: {f.error_band}",
        ]
    delta = "n/a" if p.monthly_delta_usd is None else f"{p.monthly_delta_usd:+,.0f} USD/month"
    ci = (
        ""
        if not p.monthly_delta_ci_usd
        else " [" + ", ".join("?" if v is None else f"{v:+,.0f}" for v in p.monthly_delta_ci_usd) + "]"
    )
    lines += [f"  likely decision: {p.predicted_decision.upper()}, monthly delta {delta}{ci}"]
    lines += [f"    {r}" for r in p.decision_reasons[:3]]
    usd = "n/a (a price is missing)" if p.campaign_usd is None else f"{p.campaign_usd:,.2f} USD"
    lines += [
        f"  cloud campaign: about {p.campaign_minutes:.0f} min, {usd}",
        "    minutes: " + ", ".join(f"{k} {v:g}" for k, v in p.minutes.items()),
        "    usd: " + ", ".join(f"{k} {v:,.2f}" for k, v in p.usd.items()),
    ]
    lines += [f"  assumed: {a}" for a in p.assumptions]
    lines += ["  still billing after the deadline (every fleet at 0 then), until teardown:"]
    lines += [f"    {b}" for b in p.billing_after_deadline]
    return "\n".join(lines)
