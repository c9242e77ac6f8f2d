"""Time to ready per fleet: instance launch -> first healthy target, from ASG and NLB data.

A cloud run measures what the seed study asks to count as a migration activity: how long a new
instance takes from launch to serving (weight download, Neuron compile or engine build, load).
Launch: the Auto Scaling group's "Launching a new EC2 instance" activities (DescribeScalingActivities).
Ready: the first minute the fleet's NLB target group reports a healthy host (CloudWatch
AWS/NetworkELB HealthyHostCount, Maximum, 60 s), so the figure has minute resolution. The boot
log also prints "server healthy after N s" per instance (stacks/fleet_boot.py).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass
from typing import Any

from analysis.errors import SourceUnavailable

_LAUNCH = re.compile(r"^Launching a new EC2 instance: (i-[0-9a-f]+)")
HEALTHY_PERIOD_S = 60


@dataclass(frozen=True)
class TimeToReady:
    fleet: str
    first_launch_unix: float
    first_healthy_unix: float
    instances_launched: int

    @property
    def seconds(self) -> float:
        return self.first_healthy_unix - self.first_launch_unix

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds}


def _unix(value: Any) -> float:
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return float(value)


def launches(autoscaling: Any, asg_name: str) -> list[tuple[str, float]]:
    """(instance id, launch start) of every successful launch activity of the group, oldest first."""
    out: list[tuple[str, float]] = []
    try:
        for page in autoscaling.get_paginator("describe_scaling_activities").paginate(AutoScalingGroupName=asg_name):
            for a in page.get("Activities", []):
                m = _LAUNCH.match(a.get("Description", ""))
                if m and a.get("StatusCode") == "Successful":
                    out.append((m.group(1), _unix(a["StartTime"])))
    except Exception as exc:  # botocore ClientError, credentials
        raise SourceUnavailable(
            f"Auto Scaling DescribeScalingActivities({asg_name}): {type(exc).__name__}: {exc}"
        ) from None
    return sorted(out, key=lambda x: x[1])


def tagged_target_groups(elbv2: Any, campaign: str) -> dict[str, dict[str, Any]]:
    """fleet -> its target group's description (DescribeTargetGroups), from the stacks' tags."""
    try:
        groups = [
            g for page in elbv2.get_paginator("describe_target_groups").paginate() for g in page.get("TargetGroups", [])
        ]
        by_arn = {g["TargetGroupArn"]: g for g in groups}
        out: dict[str, dict[str, Any]] = {}
        arns = list(by_arn)
        for i in range(0, len(arns), 20):  # DescribeTags takes at most 20 ARNs
            for d in elbv2.describe_tags(ResourceArns=arns[i : i + 20]).get("TagDescriptions", []):
                tags = {t["Key"]: t["Value"] for t in d.get("Tags", [])}
                if tags.get("campaign") == campaign and "fleet" in tags:
                    out[tags["fleet"]] = by_arn[d["ResourceArn"]]
    except Exception as exc:
        raise SourceUnavailable(f"ELBv2 DescribeTargetGroups/DescribeTags: {type(exc).__name__}: {exc}") from None
    return out


def fleet_target_groups(elbv2: Any, campaign: str) -> dict[str, tuple[str, str]]:
    """fleet -> (TargetGroup, LoadBalancer) CloudWatch dimension values of its NLB's target group."""
    out: dict[str, tuple[str, str]] = {}
    for fleet, g in tagged_target_groups(elbv2, campaign).items():
        if g.get("LoadBalancerArns"):
            tg_dim = g["TargetGroupArn"].split(":")[-1]  # targetgroup/name/id
            lb_dim = g["LoadBalancerArns"][0].split(":loadbalancer/")[-1]  # net/name/id
            out[fleet] = (tg_dim, lb_dim)
    return out


def first_healthy(cloudwatch: Any, dims: tuple[str, str], start: float, end: float) -> float | None:
    """Start of the first minute with at least one healthy target, or None."""
    query = {
        "Id": "healthy",
        "MetricStat": {
            "Metric": {
                "Namespace": "AWS/NetworkELB",
                "MetricName": "HealthyHostCount",
                "Dimensions": [{"Name": "TargetGroup", "Value": dims[0]}, {"Name": "LoadBalancer", "Value": dims[1]}],
            },
            "Period": HEALTHY_PERIOD_S,
            "Stat": "Maximum",
        },
    }
    points: list[tuple[float, float]] = []
    try:
        for page in cloudwatch.get_paginator("get_metric_data").paginate(
            MetricDataQueries=[query],
            StartTime=dt.datetime.fromtimestamp(start, dt.UTC),
            EndTime=dt.datetime.fromtimestamp(end, dt.UTC),
        ):
            for r in page.get("MetricDataResults", []):
                points += [
                    (_unix(t), float(v)) for t, v in zip(r.get("Timestamps", []), r.get("Values", []), strict=True)
                ]
    except Exception as exc:
        raise SourceUnavailable(f"CloudWatch GetMetricData HealthyHostCount: {type(exc).__name__}: {exc}") from None
    healthy = sorted(t for t, v in points if v >= 1)
    return healthy[0] if healthy else None


def time_to_ready(
    autoscaling: Any, elbv2: Any, cloudwatch: Any, campaign: str, asgs: dict[str, str], until: float
) -> dict[str, TimeToReady]:
    """Per fleet with both a launch and a healthy minute; fleets without either are left out (the caller says so)."""
    tgs = fleet_target_groups(elbv2, campaign)
    out: dict[str, TimeToReady] = {}
    for fleet, asg in sorted(asgs.items()):
        started = launches(autoscaling, asg)
        if not started or fleet not in tgs:
            continue
        first = started[0][1]
        ready = first_healthy(cloudwatch, tgs[fleet], first - HEALTHY_PERIOD_S, until)
        if ready is not None and ready >= first - HEALTHY_PERIOD_S:
            out[fleet] = TimeToReady(fleet, first, max(ready, first), len(started))
    return out
