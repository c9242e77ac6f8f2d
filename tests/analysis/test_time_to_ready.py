"""Time to ready per fleet (launch -> first healthy NLB target): ELBv2 + CloudWatch on moto, ASG activities via Stubber."""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from analysis.errors import SourceUnavailable
from analysis.sources.time_to_ready import fleet_target_groups, launches, time_to_ready

REGION = "us-east-1"
T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)


def _activities(*items: tuple[str, str, dt.datetime]) -> dict[str, Any]:
    return {
        "Activities": [
            {
                "ActivityId": f"a{i}",
                "AutoScalingGroupName": "asg",
                "Cause": "c",
                "StartTime": t,
                "StatusCode": code,
                "Description": desc,
                "Progress": 100,
            }
            for i, (desc, code, t) in enumerate(items)
        ]
    }


def _asg_client(*responses: dict[str, Any]) -> tuple[Any, Stubber]:
    client = boto3.client("autoscaling", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    for r in responses:
        stub.add_response("describe_scaling_activities", r)
    stub.activate()
    return client, stub


def test_launches_keep_successful_launch_activities_oldest_first() -> None:
    client, _ = _asg_client(
        _activities(
            ("Terminating EC2 instance: i-0000000000000000a", "Successful", T0 + dt.timedelta(hours=2)),
            ("Launching a new EC2 instance: i-0000000000000000b", "Successful", T0 + dt.timedelta(minutes=5)),
            ("Launching a new EC2 instance: i-0000000000000000c", "Failed", T0),
            ("Launching a new EC2 instance: i-0000000000000000d", "Successful", T0 + dt.timedelta(minutes=1)),
        )
    )
    assert launches(client, "asg") == [
        ("i-0000000000000000d", (T0 + dt.timedelta(minutes=1)).timestamp()),
        ("i-0000000000000000b", (T0 + dt.timedelta(minutes=5)).timestamp()),
    ]


@mock_aws
def test_time_to_ready_from_launch_to_first_healthy_minute() -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    elbv2 = boto3.client("elbv2", region_name=REGION)
    lb = elbv2.create_load_balancer(Name="fleets", Subnets=[subnet], Type="network", Scheme="internal")[
        "LoadBalancers"
    ][0]
    dims: dict[str, tuple[str, str]] = {}
    for fleet in ("inf2", "g6"):
        tg = elbv2.create_target_group(Name=f"tg-{fleet}", Protocol="TCP", Port=8000, VpcId=vpc, TargetType="instance")[
            "TargetGroups"
        ][0]
        elbv2.create_listener(
            LoadBalancerArn=lb["LoadBalancerArn"],
            Protocol="TCP",
            Port=8000 if fleet == "inf2" else 8001,
            DefaultActions=[{"Type": "forward", "TargetGroupArn": tg["TargetGroupArn"]}],
        )
        elbv2.add_tags(
            ResourceArns=[tg["TargetGroupArn"]],
            Tags=[{"Key": "campaign", "Value": "c1"}, {"Key": "fleet", "Value": fleet}],
        )
        dims[fleet] = (tg["TargetGroupArn"].split(":")[-1], lb["LoadBalancerArn"].split(":loadbalancer/")[-1])
    other = elbv2.create_target_group(Name="tg-other", Protocol="TCP", Port=80, VpcId=vpc)["TargetGroups"][0]
    elbv2.add_tags(
        ResourceArns=[other["TargetGroupArn"]],
        Tags=[{"Key": "campaign", "Value": "another"}, {"Key": "fleet", "Value": "inf2"}],
    )
    assert fleet_target_groups(elbv2, "c1") == dims

    cw = boto3.client("cloudwatch", region_name=REGION)
    # inf2: unhealthy for 40 minutes (download + Neuron compile), healthy from minute 41; g6 from minute 12.
    for fleet, healthy_from in (("inf2", 41), ("g6", 12)):
        for minute in range(0, 60):
            cw.put_metric_data(
                Namespace="AWS/NetworkELB",
                MetricData=[
                    {
                        "MetricName": "HealthyHostCount",
                        "Timestamp": T0 + dt.timedelta(minutes=minute),
                        "Value": 1.0 if minute >= healthy_from else 0.0,
                        "Dimensions": [
                            {"Name": "TargetGroup", "Value": dims[fleet][0]},
                            {"Name": "LoadBalancer", "Value": dims[fleet][1]},
                        ],
                    }
                ],
            )
    asg, _ = _asg_client(
        _activities(
            ("Launching a new EC2 instance: i-00000000000000001", "Successful", T0),
            ("Launching a new EC2 instance: i-00000000000000002", "Successful", T0 + dt.timedelta(minutes=3)),
        ),
        _activities(("Launching a new EC2 instance: i-00000000000000003", "Successful", T0)),
    )
    found = time_to_ready(
        asg, elbv2, cw, "c1", {"g6": "asg-g6", "inf2": "asg-inf2"}, (T0 + dt.timedelta(hours=2)).timestamp()
    )
    assert found["g6"].seconds == 12 * 60 and found["g6"].instances_launched == 2
    assert found["inf2"].seconds == 41 * 60 and found["inf2"].as_dict()["seconds"] == 2460


def test_api_errors_are_source_unavailable_naming_the_call() -> None:
    client = boto3.client("autoscaling", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_client_error("describe_scaling_activities", "AccessDenied", "no")
        with pytest.raises(SourceUnavailable, match=r"DescribeScalingActivities\(asg\)"):
            launches(client, "asg")


def test_report_section_carries_provenance_and_a_gap_for_a_fleet_never_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from analysis.report import evidence as report_evidence
    from analysis.sources.pulled import PulledSource
    from analysis.sources.time_to_ready import TimeToReady
    from core.manifest import load_manifest

    m = load_manifest(
        Path(__file__).resolve().parents[2] / "manifests" / "llama3-8b-inf2-vs-g6.yaml", check_files=False
    )
    monkeypatch.setattr(report_evidence, "discover_asgs", lambda client, campaign: {"inf2": "a", "g6": "b"})
    monkeypatch.setattr(report_evidence, "time_to_ready", lambda *a: {"inf2": TimeToReady("inf2", 100.0, 2560.0, 1)})
    out, found = report_evidence._time_to_ready(
        m,
        report_evidence.AwsClients(cloudwatch=object(), autoscaling=object(), elbv2=object()),
        PulledSource.unkept("time_to_ready"),
    )
    prov, gaps = found.provenance, found.gaps
    assert out == {
        "inf2": {
            "fleet": "inf2",
            "first_launch_unix": 100.0,
            "first_healthy_unix": 2560.0,
            "instances_launched": 1,
            "seconds": 2460.0,
        }
    }
    assert prov["time_to_ready"]["source"] == "pulled" and "HealthyHostCount" in prov["time_to_ready"]["detail"]
    assert [(g.what, g.blocks_go) for g in gaps] == [("time_to_ready.g6", False)]
