"""The campaign's deadline (issue 40): per fleet, a scheduled action setting its group to 0 at the
CampaignDeadline parameter, which `campaign deploy` fills with deploy time + max_campaign_hours."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from core.cloud_contract import DEADLINE_PATTERN, RUN_CONFIG_OUTPUT
from core.naming import CAMPAIGN_DEADLINE_PARAMETER
from tests.stacks.conftest import Synth


def _fleet_groups(s: Synth) -> dict[str, str]:
    """fleet name -> logical id of its Auto Scaling group (compile groups carry compile-for, not fleet)."""
    out = {}
    for lid, r in s.resources("AWS::AutoScaling::AutoScalingGroup").items():
        tags = {t["Key"]: t["Value"] for t in r["Properties"].get("Tags", [])}
        if "fleet" in tags:
            out[tags["fleet"]] = lid
    return out


def _deadline_actions(s: Synth) -> dict[str, dict[str, Any]]:
    """logical id of the group each scheduled action acts on -> the action's properties."""
    return {
        r["Properties"]["AutoScalingGroupName"]["Ref"]: r["Properties"]
        for r in s.resources("AWS::AutoScaling::ScheduledAction").values()
    }


@pytest.mark.parametrize("which", ["example", "three_fleets", "compile_phase"])
def test_every_fleet_goes_to_zero_at_the_deadline_parameter(which: str, request: pytest.FixtureRequest) -> None:
    s: Synth = request.getfixturevalue(which)
    groups = _fleet_groups(s)
    actions = _deadline_actions(s)
    assert len(groups) >= 2
    for fleet, group in groups.items():
        action = actions.get(group)
        assert action is not None, f"{fleet}: no scheduled action on its group"
        # One-time (no Recurrence), at the deploy-time parameter, min, max and desired all 0.
        assert action == {
            "AutoScalingGroupName": {"Ref": group},
            "StartTime": {"Ref": CAMPAIGN_DEADLINE_PARAMETER},
            "MinSize": 0,
            "MaxSize": 0,
            "DesiredCapacity": 0,
        }, fleet


def test_the_deadline_parameter_has_no_default_and_takes_only_a_utc_time(example: Synth) -> None:
    p = example.template_json["Parameters"][CAMPAIGN_DEADLINE_PARAMETER]
    assert p["Type"] == "String"
    assert "Default" not in p  # a deploy that names no deadline is refused by CloudFormation itself
    assert p["AllowedPattern"] == DEADLINE_PATTERN
    assert re.match(p["AllowedPattern"], "2026-12-05T22:05:00Z")
    assert not re.match(p["AllowedPattern"], "2026-12-05T22:05:00+01:00")
    assert not re.match(p["AllowedPattern"], "2026-12-05 22:05:00Z")


def test_the_run_config_carries_the_deadline_for_run(example: Synth) -> None:
    value = example.template_json["Outputs"][RUN_CONFIG_OUTPUT]["Value"]
    assert {"Ref": CAMPAIGN_DEADLINE_PARAMETER} in value["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else "@@" for p in value["Fn::Join"][1])
    assert '"deadline":"@@"' in text.replace(" ", "")
    json.loads(text.replace("@@", "x"))  # the rest of the output stays one JSON object


def test_what_plan_says_still_bills_after_the_deadline_is_what_the_template_keeps(example: Synth) -> None:
    """campaign.plan.predict.billing_after_deadline reads these facts: each held to the template."""
    from core.cloud_contract import (
        INTERFACE_ENDPOINT_SERVICES,
        NAT_GATEWAYS,
        PROMETHEUS_TASK_MEMORY_GIB,
        PROMETHEUS_TASK_VCPU,
    )

    assert len(example.resources("AWS::EC2::NatGateway")) == NAT_GATEWAYS
    interface = [
        r["Properties"]["ServiceName"]
        for r in example.resources("AWS::EC2::VPCEndpoint").values()
        if r["Properties"].get("VpcEndpointType") == "Interface"
    ]
    assert sorted(name.split(".", 3)[3] for name in interface) == sorted(INTERFACE_ENDPOINT_SERVICES)
    nlbs = example.resources("AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert [r["Properties"]["Type"] for r in nlbs] == ["network"]
    assert len(example.resources("AWS::APS::Workspace")) == 1
    (service,) = example.resources("AWS::ECS::Service").values()  # the Prometheus task; the load generators are RunTask
    assert service["Properties"]["DesiredCount"] == 1
    task = example.template_json["Resources"][service["Properties"]["TaskDefinition"]["Ref"]]["Properties"]
    assert (int(task["Cpu"]), int(task["Memory"])) == (1024 * PROMETHEUS_TASK_VCPU, 1024 * PROMETHEUS_TASK_MEMORY_GIB)


def test_the_compile_instance_goes_to_zero_at_the_deadline_too(compile_phase: Synth) -> None:
    """Issue 48, item 3: the compile group had no deadline; an inf2.8xlarge nobody watched billed until teardown."""
    from stacks.compile_instance import COMPILE_FOR_TAG

    compile_groups = [
        lid
        for lid, r in compile_phase.resources("AWS::AutoScaling::AutoScalingGroup").items()
        if COMPILE_FOR_TAG in {t["Key"] for t in r["Properties"].get("Tags", [])}
    ]
    assert len(compile_groups) == 1
    actions = _deadline_actions(compile_phase)
    assert {g: actions.get(g) for g in compile_groups} == {
        g: {
            "AutoScalingGroupName": {"Ref": g},
            "StartTime": {"Ref": CAMPAIGN_DEADLINE_PARAMETER},
            "MinSize": 0,
            "MaxSize": 0,
            "DesiredCapacity": 0,
        }
        for g in compile_groups
    }
