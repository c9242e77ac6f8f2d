"""Two things AWS does that moto (pinned in requirements.txt) does not, filled in for the offline run.

The moto server of `make cloud-offline` runs in this process (moto.server.ThreadedMotoServer), so
its backends can be given what they lack, and every client, the subprocesses' too, sees it:

- Auto Scaling activities. moto's DescribeScalingActivities always answers an empty list. Here it
  lists a successful "Launching a new EC2 instance: <id>" activity for each instance moto started
  in the group, at the time the stand-in gave (when the fleet's emulator was started), as EC2
  Auto Scaling records an instance launch. The report's time_to_ready reads these.
- A target group deleted with its stack. moto's CloudFormation creates an
  AWS::ElasticLoadBalancingV2::TargetGroup but leaves it behind when the stack is deleted (its
  model has no delete); CloudFormation deletes it. Without this, teardown's leftover check would
  rightly find the tagged target group after the stack is gone.

`filled_in()` applies both while its block runs and restores moto's own methods afterwards.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

LAUNCH_DESCRIPTION = "Launching a new EC2 instance: {}"  # the wording analysis.sources.time_to_ready matches


@contextmanager
def filled_in(launched_at: Mapping[str, float]) -> Iterator[None]:
    """`launched_at`: Auto Scaling group name -> unix time its instances were launched."""
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.core.responses import ActionResult
    from moto.elbv2.models import FakeTargetGroup, elbv2_backends

    def describe_scaling_activities(self: Any) -> Any:
        name = self._get_param("AutoScalingGroupName")
        group = self.autoscaling_backend.autoscaling_groups.get(name)
        at = launched_at.get(name)
        activities = []
        if group is not None and at is not None:
            start = dt.datetime.fromtimestamp(at, dt.UTC)
            for state in group.instance_states:
                activities.append(
                    {
                        "ActivityId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{state.instance.id}")),
                        "AutoScalingGroupName": name,
                        "Description": LAUNCH_DESCRIPTION.format(state.instance.id),
                        "Cause": "an instance was started in response to a difference between desired and actual capacity",
                        "StartTime": start,
                        "EndTime": start,
                        "StatusCode": "Successful",
                        "Progress": 100,
                    }
                )
        return ActionResult({"Activities": activities})

    def delete_target_group(self: Any, account_id: str, region_name: str) -> None:
        # A listener still forwarding to it raises ResourceInUse: moto's stack deletion retries
        # the resource after the others (the load balancer and its listeners) are gone.
        elbv2_backends[account_id][region_name].delete_target_group(self.arn)

    saved_activities = AutoScalingResponse.describe_scaling_activities
    had_delete = "delete" in FakeTargetGroup.__dict__
    saved_delete = FakeTargetGroup.__dict__.get("delete")
    AutoScalingResponse.describe_scaling_activities = describe_scaling_activities  # type: ignore[method-assign]
    FakeTargetGroup.delete = delete_target_group  # type: ignore[attr-defined]
    try:
        yield
    finally:
        AutoScalingResponse.describe_scaling_activities = saved_activities  # type: ignore[method-assign]
        if had_delete:
            FakeTargetGroup.delete = saved_delete  # type: ignore[attr-defined]
        else:
            del FakeTargetGroup.delete  # type: ignore[attr-defined]


# What the account of the offline rehearsal has (testing/cloud_offline.py --rehearsal): moto answers
# GetServiceQuota for VPC quotas only and has no ListCostAllocationTags. These stand for an account
# whose quotas hold the rehearsal and whose tags are activated; a test changes them to break the seam.
QUOTAS = {"L-1216C47A": 64.0, "L-3032A538": 32.0}  # EC2 Standard and Fargate On-Demand vCPUs
COST_ALLOCATION = {"campaign": "Active", "fleet": "Active"}


@contextmanager
def account_filled_in(
    quotas: Mapping[str, float] = QUOTAS, cost_allocation: Mapping[str, str] = COST_ALLOCATION
) -> Iterator[None]:
    """Service Quotas' GetServiceQuota answers `quotas` (quota code -> applied value; others as moto
    does), and Cost Explorer's ListCostAllocationTags `cost_allocation` (tag key -> status), in
    the shapes of their API references, while the block runs."""
    import json

    from moto.ce.responses import CostExplorerResponse
    from moto.servicequotas.responses import ServiceQuotasResponse

    saved_quota = ServiceQuotasResponse.get_service_quota

    def get_service_quota(self: Any) -> str:
        params = json.loads(self.body)
        code = params.get("QuotaCode")
        if code not in quotas:
            return saved_quota(self)
        quota = {"ServiceCode": params.get("ServiceCode"), "QuotaCode": code, "Value": quotas[code], "Unit": "None"}
        return json.dumps({"Quota": quota})

    def list_cost_allocation_tags(self: Any) -> str:
        params = json.loads(self.body)
        keys = params.get("TagKeys") or list(cost_allocation)
        tags = [
            {"TagKey": k, "Type": "UserDefined", "Status": cost_allocation[k]} for k in keys if k in cost_allocation
        ]
        return json.dumps({"CostAllocationTags": tags})

    ServiceQuotasResponse.get_service_quota = get_service_quota  # type: ignore[method-assign]
    CostExplorerResponse.list_cost_allocation_tags = list_cost_allocation_tags  # type: ignore[attr-defined]
    try:
        yield
    finally:
        ServiceQuotasResponse.get_service_quota = saved_quota  # type: ignore[method-assign]
        del CostExplorerResponse.list_cost_allocation_tags  # type: ignore[attr-defined]
