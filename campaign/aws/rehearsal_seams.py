"""The rehearsal's observations of the deployed stack (issue 51), each a seam of the rehearsal
report (campaign.aws.rehearsal_report): what AWS answered, or its error and what to fix.

Each function asks AWS itself and never raises for an AWS error: the error is the seam's. The
calls are reads the operator's published minimum policy (docs/operator-policy.json) allows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from campaign.aws.rehearsal_report import AMP, COST_ALLOCATION, DEADLINE, QUOTAS, STACK, TAGS, Seam, failed
from core import rehearsal
from core.manifest import Manifest
from core.naming import REHEARSAL_OUTPUT, REHEARSAL_OUTPUT_VALUE

# The host types' EC2 vCPU quota: "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z)
# instances" (EC2 User Guide, "Amazon EC2 service quotas", On-Demand Instance quotas; its code as
# `aws service-quotas list-service-quotas --service-code ec2` lists it).
STANDARD_QUOTA = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
TAG_KEY = "campaign"


def is_rehearsal_stack(stack: Mapping[str, Any]) -> bool:
    return any(
        o.get("OutputKey") == REHEARSAL_OUTPUT and o.get("OutputValue") == REHEARSAL_OUTPUT_VALUE
        for o in stack.get("Outputs", [])
    )


def quotas_seam(session: Any, m: Manifest) -> Seam:
    """The rehearsal's vCPUs against the account's quotas: asg.max of every fleet on the host type
    (a bound: the rehearsal runs measure_instances of them) and the campaign's Fargate tasks."""
    from campaign.aws.cloud_checks import QuotaNeed, quota_needs, quota_value

    host = rehearsal.rehearsal_type(m.costs.region)
    count = sum(f.asg.max for f in m.fleets)
    needs = [
        QuotaNeed("ec2", *STANDARD_QUOTA, count * host.host.vcpus, f"{count} x {host.host.vcpus} vCPU ({host.name})"),
        *(n for n in quota_needs(m, compiling=[]) if n.service == "fargate"),
    ]
    client = session.client("service-quotas")
    seen, short = [], []
    for need in needs:
        try:
            have = quota_value(client, need.service, need.code)
        except Exception as exc:  # botocore: AccessDenied, throttling, endpoint errors
            return failed(
                QUOTAS,
                f"{need.name} ({need.service} {need.code}) not readable",
                exc,
                "allow servicequotas:GetServiceQuota and GetAWSDefaultServiceQuota (docs/operator-policy.json)",
            )
        seen.append(f"{need.name} {have:g} >= {need.vcpus} vCPU")
        if have < need.vcpus:
            short.append(f"{need.name} ({need.service} {need.code}): {have:g} < {need.vcpus} vCPU ({need.why})")
    if short:
        return failed(QUOTAS, "; ".join(short), "; ".join(short), "request an increase in Service Quotas")
    return Seam(QUOTAS, True, "checked: " + "; ".join(seen))


def stack_seam(cfn: Any, stack: str) -> Seam:
    try:
        (desc,) = cfn.describe_stacks(StackName=stack)["Stacks"]
    except Exception as exc:
        return failed(STACK, f"{stack} not found", exc, "`deploy MANIFEST --rehearsal` first")
    status = desc.get("StackStatus", "?")
    if not status.endswith("_COMPLETE") or "ROLLBACK" in status or "DELETE" in status:
        return failed(
            STACK, f"{stack} is {status}", status, "its events (`aws cloudformation describe-stack-events`) say why"
        )
    if not is_rehearsal_stack(desc):
        return failed(
            STACK,
            f"{stack} is {status}, but not deployed as a rehearsal (no {REHEARSAL_OUTPUT} output 'true')",
            f"output {REHEARSAL_OUTPUT} missing",
            "`deploy MANIFEST --rehearsal`: a rehearsal never runs on the accelerator fleets",
        )
    return Seam(STACK, True, f"{stack} {status}, a rehearsal ({REHEARSAL_OUTPUT}=true)")


def _stack_resources(cfn: Any, stack: str) -> list[dict[str, Any]]:
    return [
        r
        for page in cfn.get_paginator("list_stack_resources").paginate(StackName=stack)
        for r in page.get("StackResourceSummaries", [])
    ]


def tags_seam(session: Any, m: Manifest, stack: str) -> Seam:
    """The `campaign` tag on every resource of the stack the report and teardown find by it: the
    Auto Scaling groups (their instances inherit it), the NLBs and target groups, the results bucket."""
    try:
        resources = _stack_resources(session.client("cloudformation"), stack)
        by_type: dict[str, list[str]] = {}
        for r in resources:
            if r.get("PhysicalResourceId"):
                by_type.setdefault(r["ResourceType"], []).append(r["PhysicalResourceId"])
        untagged: list[str] = []
        checked = 0
        groups = by_type.get("AWS::AutoScaling::AutoScalingGroup", [])
        if groups:
            autoscaling = session.client("autoscaling")
            found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=groups)["AutoScalingGroups"]
            tags = {g["AutoScalingGroupName"]: {t["Key"]: t["Value"] for t in g.get("Tags", [])} for g in found}
            untagged += [f"Auto Scaling group {g}" for g in groups if tags.get(g, {}).get(TAG_KEY) != m.campaign]
            checked += len(groups)
        arns = by_type.get("AWS::ElasticLoadBalancingV2::LoadBalancer", []) + by_type.get(
            "AWS::ElasticLoadBalancingV2::TargetGroup", []
        )
        if arns:
            elbv2 = session.client("elbv2")
            for i in range(0, len(arns), 20):  # DescribeTags takes at most 20 ARNs
                for d in elbv2.describe_tags(ResourceArns=arns[i : i + 20]).get("TagDescriptions", []):
                    if {t["Key"]: t["Value"] for t in d.get("Tags", [])}.get(TAG_KEY) != m.campaign:
                        untagged.append(d["ResourceArn"])
            checked += len(arns)
        buckets = by_type.get("AWS::S3::Bucket", [])
        if buckets:
            tagging = session.client("resourcegroupstaggingapi")
            listed = {
                r["ResourceARN"]
                for page in tagging.get_paginator("get_resources").paginate(
                    TagFilters=[{"Key": TAG_KEY, "Values": [m.campaign]}], ResourceTypeFilters=["s3"]
                )
                for r in page.get("ResourceTagMappingList", [])
            }
            untagged += [f"arn:aws:s3:::{b}" for b in buckets if f"arn:aws:s3:::{b}" not in listed]
            checked += len(buckets)
    except Exception as exc:
        return failed(
            TAGS,
            "the stack's resources or their tags not readable",
            exc,
            "allow the reads in docs/operator-policy.json",
        )
    if untagged:
        return failed(
            TAGS,
            f"{len(untagged)} of {checked} resource(s) without {TAG_KEY}={m.campaign}: {', '.join(untagged)}",
            f"untagged: {untagged[0]}",
            f"tag it {TAG_KEY}={m.campaign} in the stacks (Tags.of): the report's bill and teardown's check find "
            "resources by that tag",
        )
    return Seam(
        TAGS,
        True,
        f"{TAG_KEY}={m.campaign} on all {checked} Auto Scaling group(s), load balancer(s), target group(s) and bucket(s)",
    )


def cost_allocation_seam(session: Any) -> Seam:
    """Whether the report's tags are activated for cost allocation (checked: the answer is the observation)."""
    from analysis.errors import SourceUnavailable
    from analysis.sources.billing import COST_ALLOCATION_TAGS, activation_advice, tag_activation

    try:
        # Cost Explorer's one endpoint is in us-east-1 (as analysis.report.inputs.AwsClients asks it)
        status, _ = tag_activation(session.client("ce", region_name="us-east-1"))
    except SourceUnavailable as exc:
        return failed(
            COST_ALLOCATION,
            f"{', '.join(COST_ALLOCATION_TAGS)} not checked",
            str(exc),
            "allow ce:ListCostAllocationTags (docs/operator-policy.json)",
        )
    states = ", ".join(f"{k} {v}" for k, v in status.items())
    inactive = [k for k, v in status.items() if v != "Active"]
    note = (
        f"; until active, the campaign's report cannot read its bill: {activation_advice(inactive)}" if inactive else ""
    )
    return Seam(COST_ALLOCATION, True, f"checked: {states}{note}")


def deadline_seam(session: Any, m: Manifest, deadline: str) -> Seam:
    """Each fleet's group has its one-time scheduled action to 0 at the stack's deadline."""
    from analysis.sources.cloudwatch import discover_asgs

    try:
        autoscaling = session.client("autoscaling")
        groups = discover_asgs(autoscaling, m.campaign)
        seen = []
        for f in m.fleets:
            group = groups.get(f.name)
            if group is None:
                return failed(DEADLINE, f"{f.name}: no Auto Scaling group tagged for it", "not found", "deploy again")
            actions = autoscaling.describe_scheduled_actions(AutoScalingGroupName=group).get(
                "ScheduledUpdateGroupActions", []
            )
            to_zero = [a for a in actions if a.get("DesiredCapacity") == 0 and a.get("MaxSize") == 0]
            if not to_zero:
                return failed(
                    DEADLINE,
                    f"{f.name}: group {group} has no scheduled action to 0",
                    f"{len(actions)} scheduled action(s), none to 0",
                    "deploy again: the stacks put one on every fleet's group",
                )
            when = to_zero[0].get("StartTime")
            seen.append(f"{f.name} at {when.isoformat() if hasattr(when, 'isoformat') else when}")
    except Exception as exc:
        return failed(DEADLINE, "scheduled actions not readable", exc, "allow autoscaling:DescribeScheduledActions")
    return Seam(
        DEADLINE, True, f"every group to 0 at the deadline {deadline or '(none in the run config)'}: {'; '.join(seen)}"
    )


def amp_seam(prometheus_url: str | None, sigv4_region: str | None, saved_steps: int) -> Seam:
    """The workspace answers a signed query (`up` now: the series the stack's Prometheus remote-wrote),
    beside the run's own signed queries (the per-step series it saved)."""
    from analysis.errors import SourceUnavailable
    from analysis.sources.prometheus import PrometheusSource

    if not prometheus_url:
        return failed(
            AMP, "no workspace query URL in the run", "none", "deploy again: the stack outputs PrometheusQueryUrl"
        )
    try:
        series = PrometheusSource(prometheus_url, sigv4_region=sigv4_region, timeout_s=30).query("up", time.time())
    except (SourceUnavailable, ValueError) as exc:
        return failed(
            AMP, "the workspace refused or failed a signed query", str(exc), "allow aps:QueryMetrics on the workspace"
        )
    if not series:
        return failed(
            AMP,
            "the workspace answered a signed query with 0 series",
            "no series",
            "the stack's Prometheus task's remote write (its logs in CloudWatch) did not reach the workspace",
        )
    return Seam(
        AMP,
        True,
        f"signed queries answered: `up` {len(series)} series; the run saved {saved_steps} step(s) of server series",
    )
