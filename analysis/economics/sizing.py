"""Fleet size from measured SLO-compliant throughput (docs/design.md: required fleet).

required = ceil(peak demand / (per-instance SLO-compliant throughput x utilization target))
           + redundancy, never below the ASG minimum, spread round-robin over the AZs.
With utilization_target = 1 this is exactly the DESIGN formula; a target below 1 buys idle
headroom, which the cost model charges for and reports as its own line.
"""

from __future__ import annotations

import math

from analysis.model import FleetSize

# Guards ceil() against float noise: 3 / 1.0000000001 must still be 3 instances, not 4.
_EPS = 1e-9


def ceil_instances(x: float) -> int:
    return max(math.ceil(x - _EPS), 0)


def spread_over_azs(n: int, azs: tuple[str, ...] | list[str]) -> dict[str, int]:
    if not azs:
        raise ValueError("a fleet needs at least one availability zone")
    k = len(azs)
    return {az: n // k + (1 if i < n % k else 0) for i, az in enumerate(azs)}


def size_fleet(
    demand_tok_s: float,
    per_instance_tok_s: float,
    *,
    utilization_target: float = 1.0,
    redundancy: int = 0,
    asg_min: int = 0,
    asg_max: int = 10**6,
    azs: tuple[str, ...] | list[str] = ("az",),
) -> FleetSize:
    if per_instance_tok_s <= 0:
        raise ValueError("per-instance SLO-compliant throughput is zero: no fleet size meets the SLO")
    if not 0 < utilization_target <= 1:
        raise ValueError(f"utilization_target must be in (0, 1], got {utilization_target}")
    if demand_tok_s < 0:
        raise ValueError(f"demand must be >= 0, got {demand_tok_s}")
    busy = ceil_instances(demand_tok_s / per_instance_tok_s)
    with_headroom = max(ceil_instances(demand_tok_s / (per_instance_tok_s * utilization_target)), busy)
    n = with_headroom + redundancy
    topup = max(asg_min - n, 0)
    required = n + topup
    # report.json's own model: what the report shows is what the cost and the decision used
    return FleetSize(
        demand_tok_s=demand_tok_s,
        per_instance_tok_s=per_instance_tok_s,
        utilization_target=utilization_target,
        busy_instances=busy,
        headroom_instances=with_headroom - busy,
        redundancy_instances=redundancy,
        asg_min_topup=topup,
        required=required,
        asg_max=asg_max,
        per_az=spread_over_azs(required, azs),
        exceeds_asg_max=required > asg_max,
    )
