"""`deploy --extend-hours` after the deadline fired brings the fleets back (issue 48, finding 2).

Against a moto server on loopback: a stack with each fleet's Auto Scaling group and its scheduled
action at the CampaignDeadline parameter; the action "fires" as EC2 Auto Scaling would (min, max
and desired to 0, UpdateAutoScalingGroup: moto runs no schedule); `cdk deploy` is a stand-in that
updates the stack with the new deadline, as CloudFormation is given it. moto, like the template
reference, does not reset a group that the update leaves unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from campaign.aws import stack as aws
from core.cloud_contract import format_deadline
from core.manifest import load_manifest
from core.naming import CAMPAIGN_DEADLINE_PARAMETER, stack_name
from tests.campaign.test_cloud_checks import _filled
from tests.campaign.test_compile_phase import _with_tokenizer_files
from tests.campaign.test_deadline import NOW, deploy_args
from tests.conftest import moto_server, write_manifest

REGION = "us-east-1"
AMI = "ami-12c6146b"  # one of moto's stock images
SIZES = {"inf2": (1, 3, 2), "g6": (2, 4, 2)}  # min, max, desired as each group's template gives them


def _template(launch_templates: dict[str, str]) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    for fleet, (lo, hi, desired) in SIZES.items():
        resources[f"Group{fleet}"] = {
            "Type": "AWS::AutoScaling::AutoScalingGroup",
            "Properties": {
                "AutoScalingGroupName": f"group-{fleet}",
                "MinSize": str(lo),
                "MaxSize": str(hi),
                "DesiredCapacity": str(desired),
                "LaunchTemplate": {"LaunchTemplateId": launch_templates[fleet], "Version": "1"},
                "AvailabilityZones": [f"{REGION}a"],
            },
        }
        resources[f"StopAtDeadline{fleet}"] = {  # stacks/fleet.py's action
            "Type": "AWS::AutoScaling::ScheduledAction",
            "Properties": {
                "AutoScalingGroupName": {"Ref": f"Group{fleet}"},
                "StartTime": {"Ref": CAMPAIGN_DEADLINE_PARAMETER},
                "MinSize": 0,
                "MaxSize": 0,
                "DesiredCapacity": 0,
            },
        }
    return {"Parameters": {CAMPAIGN_DEADLINE_PARAMETER: {"Type": "String"}}, "Resources": resources}


@pytest.fixture
def session() -> Iterator[Any]:
    with moto_server(REGION):
        yield boto3.session.Session(region_name=REGION)


def _sizes(session: Any) -> dict[str, tuple[int, int, int]]:
    groups = session.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    return {g["AutoScalingGroupName"]: (g["MinSize"], g["MaxSize"], g["DesiredCapacity"]) for g in groups}


def test_extend_hours_sets_back_every_group_the_deadline_set_to_zero(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    session: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On 63bedbd the groups stayed at 0 after `deploy --extend-hours 3` ({'group-inf2': (0, 0, 0), ...})."""
    from campaign.aws import compile_phase, dlami
    from campaign.cli import aws_cmds

    manifest_data["max_campaign_hours"] = 6
    path = write_manifest(tmp_path, _with_tokenizer_files(tmp_path, _filled(manifest_data)))
    stack = stack_name(load_manifest(path, check_files=False).campaign)
    ec2 = session.client("ec2")
    templates = {
        f: ec2.create_launch_template(LaunchTemplateName=f"lt-{f}", LaunchTemplateData={"ImageId": AMI})[
            "LaunchTemplate"
        ]["LaunchTemplateId"]
        for f in SIZES
    }
    body = json.dumps(_template(templates))
    cfn = session.client("cloudformation")
    fired = "2026-12-05T19:00:00Z"  # an hour before NOW: the action has fired
    cfn.create_stack(
        StackName=stack,
        TemplateBody=body,
        Parameters=[{"ParameterKey": CAMPAIGN_DEADLINE_PARAMETER, "ParameterValue": fired}],
    )
    autoscaling = session.client("autoscaling")
    for f in SIZES:  # what the scheduled action does at its StartTime
        autoscaling.update_auto_scaling_group(
            AutoScalingGroupName=f"group-{f}", MinSize=0, MaxSize=0, DesiredCapacity=0
        )
    assert set(_sizes(session).values()) == {(0, 0, 0)}

    updates: list[str] = []

    def cdk_deploy(manifest_path: Path, *, extra: list[str], **kw: Any) -> int:
        """`cdk deploy` as far as this stack goes: the same template with the deadline it was given."""
        deadline = next(a.split("=", 1)[1] for a in extra if a.startswith(f"{CAMPAIGN_DEADLINE_PARAMETER}="))
        updates.append(deadline)
        cfn.update_stack(
            StackName=stack,
            TemplateBody=body,
            Parameters=[{"ParameterKey": CAMPAIGN_DEADLINE_PARAMETER, "ParameterValue": deadline}],
        )
        return 0

    monkeypatch.setattr(aws_cmds, "aws_session", lambda region: session)
    monkeypatch.setattr(aws_cmds, "check_workload", lambda m: [])
    monkeypatch.setattr(compile_phase, "needed", lambda *a, **k: [])
    monkeypatch.setattr(dlami, "resolve_amis", lambda *a: [])
    monkeypatch.setattr(aws, "utc_now", lambda: NOW)
    monkeypatch.setattr(aws, "deploy", cdk_deploy)
    args = deploy_args(path, 3.0)
    assert aws_cmds.cmd_deploy(args) == 0
    assert updates == [format_deadline(NOW + timedelta(hours=2))]  # 19:00 + 3 h
    assert _sizes(session) == {"group-inf2": (1, 3, 2), "group-g6": (2, 4, 2)}
    out = capsys.readouterr().out
    assert "restored group-inf2 (Groupinf2): min 0, max 0, desired 0 -> min 1, max 3, desired 2" in out
    assert "restored group-g6 (Groupg6): min 0, max 0, desired 0 -> min 2, max 4, desired 2" in out


def test_a_group_at_or_above_its_templates_sizes_is_left_as_it_is(session: Any) -> None:
    from campaign.aws.fleet_sizes import restore_fleet_sizes

    ec2 = session.client("ec2")
    templates = {
        f: ec2.create_launch_template(LaunchTemplateName=f"lt-{f}", LaunchTemplateData={"ImageId": AMI})[
            "LaunchTemplate"
        ]["LaunchTemplateId"]
        for f in SIZES
    }
    cfn = session.client("cloudformation")
    cfn.create_stack(
        StackName="s",
        TemplateBody=json.dumps(_template(templates)),
        Parameters=[{"ParameterKey": CAMPAIGN_DEADLINE_PARAMETER, "ParameterValue": "2026-12-06T02:00:00Z"}],
    )
    session.client("autoscaling").update_auto_scaling_group(AutoScalingGroupName="group-g6", DesiredCapacity=3)
    restored, notes = restore_fleet_sizes(session, "s")
    assert restored == [] and notes == []
    assert _sizes(session) == {"group-inf2": (1, 3, 2), "group-g6": (2, 4, 3)}
