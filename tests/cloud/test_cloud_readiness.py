"""A fleet that never serves: `run`'s error carries what Auto Scaling and the target group say."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest

from campaign.aws.readiness import not_ready_evidence
from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate.fleets import CloudFleets
from testing.moto_gaps import filled_in
from tests.cloud.test_cloud_stages import _passed, _Run
from tests.conftest import moto_server

CAMPAIGN = "c1"


def _fleet_on_moto(s: Any, fleet: str) -> str:
    ec2 = s.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    ec2.create_launch_template(LaunchTemplateName="lt-fleet", LaunchTemplateData={"ImageId": "ami-12345678"})
    tags = [{"Key": "campaign", "Value": CAMPAIGN}, {"Key": "fleet", "Value": fleet}]
    s.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=f"{CAMPAIGN}-{fleet}",
        LaunchTemplate={"LaunchTemplateName": "lt-fleet"},
        MinSize=1,
        MaxSize=2,
        DesiredCapacity=1,
        VPCZoneIdentifier=sub,
        Tags=[{**t, "PropagateAtLaunch": True} for t in tags],
    )
    elbv2 = s.client("elbv2")
    tg = elbv2.create_target_group(Name=f"tg-{fleet}", Protocol="TCP", Port=8000, VpcId=vpc, Tags=tags)
    return str(tg["TargetGroups"][0]["TargetGroupArn"])


def test_the_evidence_names_the_groups_activities_and_target_health() -> None:
    with moto_server("us-east-1"), filled_in({f"{CAMPAIGN}-inf2": time.time()}):
        s = boto3.session.Session(region_name="us-east-1")
        tg = _fleet_on_moto(s, "inf2")
        said = not_ready_evidence(s, CAMPAIGN, "inf2")
        assert f"ASG {CAMPAIGN}-inf2 latest activities: Successful: Launching a new EC2 instance: i-" in said
        assert "targetgroup/tg-inf2/" in said and said.endswith(": no registered targets")
        (instance,) = s.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]
        s.client("elbv2").register_targets(TargetGroupArn=tg, Targets=[{"Id": instance["InstanceId"]}])
        said = not_ready_evidence(s, CAMPAIGN, "inf2")
        state = s.client("elbv2").describe_target_health(TargetGroupArn=tg)["TargetHealthDescriptions"][0]
        assert f"targets: {instance['InstanceId']} {state['TargetHealth']['State']}" in said
        missing = not_ready_evidence(s, CAMPAIGN, "g6")
    assert missing == "no Auto Scaling group tagged for this fleet; no target group tagged for this fleet"


def test_unreadable_aws_is_said_not_raised() -> None:
    class Denied:
        def client(self, name: str) -> Any:
            raise PermissionError(f"no access to {name}")

    said = not_ready_evidence(Denied(), CAMPAIGN, "inf2")
    assert "Auto Scaling not readable (PermissionError" in said and "target health not readable" in said


def test_the_run_error_carries_the_evidence_for_the_fleet_that_never_served() -> None:
    run = _Run(
        {
            "inf2": {"ready": False, "ready_after_s": 4500.0, "seen": "HTTP 503", "gate": None},
            "g6": {"ready": True, "ready_after_s": 300.0, "seen": "ok", "gate": _passed("g6")},
        }
    )
    asked: list[str] = []

    def diagnose(fleet: str) -> str:
        asked.append(fleet)
        return "ASG x latest activities: Failed: Launching a new EC2 instance (InsufficientInstanceCapacity)"

    with pytest.raises(
        CloudRunError, match=r"fleet inf2: not serving .*HTTP 503; ASG x .*InsufficientInstanceCapacity"
    ):
        CloudFleets(run, diagnose=diagnose).gate()  # type: ignore[arg-type]
    assert asked == ["inf2"]
