"""CloudWatch GetMetricData over the campaign window: instances in service, accelerator
utilization, NLB processed bytes. Only Average / Sum / Maximum are asked for: percentile
statistics of CloudWatch are not what the fleet percentiles are built from (those come
from records and merged histograms)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from analysis.errors import SourceUnavailable


@dataclass(frozen=True)
class MetricSpec:
    key: str
    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]
    stat: str  # Average, Sum, Maximum, Minimum, SampleCount

    def __post_init__(self) -> None:
        if self.stat not in ("Average", "Sum", "Maximum", "Minimum", "SampleCount"):
            raise ValueError(
                f"{self.key}: statistic {self.stat!r} not allowed; percentiles come from records, not CloudWatch"
            )


def fleet_specs(asg_name: str, accelerator_vendor: str, nlb_dimension: str | None = None) -> list[MetricSpec]:
    asg = (("AutoScalingGroupName", asg_name),)
    specs = [
        MetricSpec("instances_in_service", "AWS/AutoScaling", "GroupInServiceInstances", asg, "Average"),
        MetricSpec("instances_in_service_max", "AWS/AutoScaling", "GroupInServiceInstances", asg, "Maximum"),
    ]
    if accelerator_vendor == "aws-neuron":
        # neuron-monitor's CloudWatch publisher; namespace as the AWS Neuron docs set it up.
        specs.append(MetricSpec("accelerator_utilization", "NeuronMonitor", "neuroncore_utilization", asg, "Average"))
    else:
        specs.append(MetricSpec("accelerator_utilization", "CWAgent", "nvidia_smi_utilization_gpu", asg, "Average"))
    if nlb_dimension:
        specs.append(
            MetricSpec(
                "nlb_processed_bytes", "AWS/NetworkELB", "ProcessedBytes", (("LoadBalancer", nlb_dimension),), "Sum"
            )
        )
    return specs


class CloudWatchSource:
    def __init__(self, client: Any):
        self.client = client

    def fetch(self, specs: list[MetricSpec], start: float, end: float, period_s: int = 60) -> dict[str, float | None]:
        """Aggregate each metric over the window: mean of Average points, sum of Sum points, max of Maximum.
        The query covers every whole period the window touches: a datapoint is stamped with its
        period's start, so a window shorter than a period (a 12 s replay) would otherwise hold
        none. CloudWatch rounds the start down this way itself (GetMetricStatistics: "rounded
        down to the nearest whole minute" for a 60 s period); asking for it makes moto agree."""
        start = math.floor(start / period_s) * period_s
        end = max(math.ceil(end / period_s) * period_s, start + period_s)
        queries = [
            {
                "Id": f"m{i}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": s.namespace,
                        "MetricName": s.name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in s.dimensions],
                    },
                    "Period": period_s,
                    "Stat": s.stat,
                },
                "ReturnData": True,
            }
            for i, s in enumerate(specs)
        ]
        values: dict[str, list[float]] = {f"m{i}": [] for i in range(len(specs))}
        token = None
        try:
            while True:
                kw: dict[str, Any] = {
                    "MetricDataQueries": queries,
                    "StartTime": dt.datetime.fromtimestamp(start, dt.UTC),
                    "EndTime": dt.datetime.fromtimestamp(end, dt.UTC),
                }
                if token:
                    kw["NextToken"] = token
                resp = self.client.get_metric_data(**kw)
                for r in resp.get("MetricDataResults", []):
                    values[r["Id"]].extend(float(v) for v in r.get("Values", []))
                token = resp.get("NextToken")
                if not token:
                    break
        except Exception as exc:  # botocore: credentials, endpoint, throttling, client errors
            raise SourceUnavailable(f"CloudWatch GetMetricData: {type(exc).__name__}: {exc}") from None
        out: dict[str, float | None] = {}
        for i, s in enumerate(specs):
            vs = values[f"m{i}"]
            if not vs:
                out[s.key] = None  # no datapoints: a gap, not a zero
            elif s.stat == "Sum":
                out[s.key] = sum(vs)
            elif s.stat == "Maximum":
                out[s.key] = max(vs)
            elif s.stat == "Minimum":
                out[s.key] = min(vs)
            else:
                out[s.key] = sum(vs) / len(vs)
        return out


def discover_asgs(autoscaling: Any, campaign: str) -> dict[str, str]:
    """fleet -> ASG name, from the `campaign` and `fleet` tags the stacks put on each group."""
    out: dict[str, str] = {}
    try:
        pages = autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
            Filters=[{"Name": "tag:campaign", "Values": [campaign]}]
        )
        for page in pages:
            for g in page.get("AutoScalingGroups", []):
                tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
                if tags.get("campaign") == campaign and "fleet" in tags:
                    out[tags["fleet"]] = g["AutoScalingGroupName"]
    except Exception as exc:  # botocore
        raise SourceUnavailable(f"Auto Scaling DescribeAutoScalingGroups: {type(exc).__name__}: {exc}") from None
    return out
