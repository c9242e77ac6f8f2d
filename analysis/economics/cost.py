"""The cost numerator (docs/design.md) and cost per 10^6 successful tokens.

Monthly fleet cost = compute for every required instance (busy + idle headroom + redundancy
+ ASG-minimum top-up) at the effective rate + EBS GB-month (root + cache volume) + NLB hours
and LCUs + inter-AZ bytes + observability + licenses. Commitments are charged at their
effective covered rate for every covered instance whether used or not: unused commitment
stays in the numerator, it is never a headline discount. Failed work is in the numerator
because the fleet is sized on SLO-compliant throughput: capacity spent on failures is paid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analysis.model import FleetSize, MonthlyCost

RateMode = Literal["manifest", "on-demand", "covered", "renewal"]
# EC2 bills per second with a 60-second minimum each time an instance starts.
MIN_BILLED_SECONDS = 60.0
# AWS prices "per month" on 730 hours; GB-month is prorated to the hours the fleet runs.
HOURS_PER_PRICED_MONTH = 730.0
# An inter-AZ GB is charged on the way out of one AZ and on the way into the other.
INTER_AZ_DIRECTIONS = 2


@dataclass(frozen=True)
class CommitmentRate:
    covered_instances: int
    effective_hourly_usd: float
    renewal_hourly_usd: float | None


@dataclass(frozen=True)
class UnitPrices:
    instance_hourly_usd: float  # On-Demand
    ebs_gb_month_usd: float
    nlb_hour_usd: float
    nlb_lcu_hour_usd: float
    inter_az_gb_usd: float
    # the price source's 1-yr No Upfront Standard Reserved rate: the covered / renewal rate of a
    # fleet the manifest lists no commitment for; None: the source has none
    listed_commitment_hourly_usd: float | None = None


@dataclass(frozen=True)
class FleetCostInputs:
    root_volume_gib: float
    cache_volume_gib: float
    nlb_lcu_per_hour: float
    inter_az_gb_per_month: float
    observability_monthly_usd: float
    licenses_monthly_usd: float
    hours_per_month: float
    commitments: tuple[CommitmentRate, ...] = ()


@dataclass(frozen=True)
class ComputeCost:
    usd: float
    unused_commitment_usd: float
    note: str


def compute_monthly(
    required: int,
    hours: float,
    on_demand_hourly: float,
    commitments: tuple[CommitmentRate, ...],
    mode: RateMode,
    listed_commitment_hourly: float | None = None,
) -> ComputeCost | None:
    """Monthly compute cost of `required` instances; None when `mode` needs a commitment that neither
    the manifest nor the price source (`listed_commitment_hourly`) has."""
    if mode == "on-demand" or (not commitments and mode == "manifest"):
        return ComputeCost(required * on_demand_hourly * hours, 0.0, "On-Demand")
    if not commitments:
        if listed_commitment_hourly is None:
            return None
        # nothing committed yet: buying exactly the required instances at today's listed rate, renewal included
        return ComputeCost(
            required * listed_commitment_hourly * hours,
            0.0,
            f"no commitment in the manifest: every instance at the price source's 1-yr No Upfront Standard "
            f"Reserved rate {listed_commitment_hourly:.4f}/h",
        )
    if mode == "covered":
        covered = sum(c.covered_instances for c in commitments)
        if covered == 0:
            return None
        rate = sum(c.covered_instances * c.effective_hourly_usd for c in commitments) / covered
        return ComputeCost(required * rate * hours, 0.0, f"every instance at the effective covered rate {rate:.4f}/h")
    usd = unused = 0.0
    left = required
    for c in commitments:
        rate = (
            c.renewal_hourly_usd if mode == "renewal" and c.renewal_hourly_usd is not None else c.effective_hourly_usd
        )
        usd += c.covered_instances * rate * hours  # paid whether used or not
        used = min(left, c.covered_instances)
        unused += (c.covered_instances - used) * rate * hours
        left -= used
    usd += left * on_demand_hourly * hours
    note = "commitments at renewal rates" if mode == "renewal" else "commitments at effective covered rates"
    return ComputeCost(usd, unused, f"{note}; {left} instance(s) On-Demand")


def monthly_fleet_cost(
    size: FleetSize, prices: UnitPrices, inp: FleetCostInputs, mode: RateMode = "manifest"
) -> MonthlyCost | None:
    h = inp.hours_per_month
    compute = compute_monthly(
        size.required, h, prices.instance_hourly_usd, inp.commitments, mode, prices.listed_commitment_hourly_usd
    )
    if compute is None:
        return None
    blended = compute.usd / size.required if size.required else 0.0
    month_fraction = h / HOURS_PER_PRICED_MONTH
    ebs = size.required * (inp.root_volume_gib + inp.cache_volume_gib) * prices.ebs_gb_month_usd * month_fraction
    nlb = (prices.nlb_hour_usd + inp.nlb_lcu_per_hour * prices.nlb_lcu_hour_usd) * h
    inter_az = inp.inter_az_gb_per_month * prices.inter_az_gb_usd * INTER_AZ_DIRECTIONS
    # report.json's own model: the lines and the total the report shows are the ones the decision used
    return MonthlyCost(
        compute_usd=compute.usd,
        idle_headroom_usd=size.headroom_instances * blended,
        redundancy_usd=(size.redundancy_instances + size.asg_min_topup) * blended,
        unused_commitment_usd=compute.unused_commitment_usd,
        ebs_usd=ebs,
        nlb_usd=nlb,
        inter_az_usd=inter_az,
        observability_usd=inp.observability_monthly_usd,
        licenses_usd=inp.licenses_monthly_usd,
        compute_note=compute.note,
        total_usd=compute.usd + ebs + nlb + inter_az + inp.observability_monthly_usd + inp.licenses_monthly_usd,
    )


def cost_per_million(total_usd: float, successful_tokens: float) -> float | None:
    """docs/design.md: total metered serving cost / successful tokens * 10^6; None when nothing succeeded."""
    if successful_tokens <= 0:
        return None
    return total_usd / successful_tokens * 1e6


def unit_cost_per_million(hourly_usd: float, successful_tok_s: float) -> float | None:
    """One instance-hour's price over the successful tokens it produced in that hour."""
    return cost_per_million(hourly_usd, successful_tok_s * 3600.0)


def run_cost(
    instances: int, window_s: float, hourly_usd: float, monthly_non_compute_usd: float, hours_per_month: float
) -> float:
    """Metered cost of the measured run: whole instances, each billed at least 60 s, plus the
    window's share of the fleet's non-compute monthly cost."""
    billed_s = max(window_s, MIN_BILLED_SECONDS)
    return instances * hourly_usd * billed_s / 3600.0 + monthly_non_compute_usd * (window_s / 3600.0) / hours_per_month
