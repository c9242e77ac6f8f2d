"""What AWS says about a fleet that never served: the error `run` ends with names the cause.

The gate task sees only the NLB from inside the VPC (an HTTP status, a refused connection).
Why a fleet is not serving is in two other places: its Auto Scaling group's latest activities
(a launch that failed for capacity, a quota, a bad AMI) and its target group's target health
(Target.FailedHealthChecks while the engine still compiles, Target.NotRegistered).
"""

from __future__ import annotations

from typing import Any

from analysis.sources.cloudwatch import discover_asgs
from analysis.sources.time_to_ready import tagged_target_groups

ACTIVITIES = 3  # the latest few: the failure, and what came before it


def _activities(autoscaling: Any, group: str) -> str:
    acts = autoscaling.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=ACTIVITIES)
    lines = [
        f"{a.get('StatusCode', '?')}: {a.get('Description', '')}"
        + (f" ({a['StatusMessage']})" if a.get("StatusMessage") else "")
        for a in acts.get("Activities", [])[:ACTIVITIES]
    ]
    return f"ASG {group} latest activities: " + ("; ".join(lines) if lines else "none")


def _health(elbv2: Any, group: dict[str, Any]) -> str:
    name = group["TargetGroupArn"].split(":")[-1]
    found = elbv2.describe_target_health(TargetGroupArn=group["TargetGroupArn"]).get("TargetHealthDescriptions", [])
    if not found:
        return f"{name}: no registered targets"
    parts = []
    for d in found:
        h = d.get("TargetHealth", {})
        why = ", ".join(x for x in (h.get("Reason"), h.get("Description")) if x)
        parts.append(f"{d.get('Target', {}).get('Id', '?')} {h.get('State', '?')}" + (f" ({why})" if why else ""))
    return f"{name} targets: " + "; ".join(parts)


def not_ready_evidence(session: Any, campaign: str, fleet: str) -> str:
    """One line: the fleet's ASG activities and target health, or why they could not be read."""
    parts: list[str] = []
    try:
        autoscaling = session.client("autoscaling")
        group = discover_asgs(autoscaling, campaign).get(fleet)
        parts.append(_activities(autoscaling, group) if group else "no Auto Scaling group tagged for this fleet")
    except Exception as exc:  # botocore: the operator's role may not read Auto Scaling
        parts.append(f"Auto Scaling not readable ({type(exc).__name__}: {exc})")
    try:
        elbv2 = session.client("elbv2")
        tg = tagged_target_groups(elbv2, campaign).get(fleet)
        parts.append(_health(elbv2, tg) if tg else "no target group tagged for this fleet")
    except Exception as exc:
        parts.append(f"target health not readable ({type(exc).__name__}: {exc})")
    return "; ".join(parts)
