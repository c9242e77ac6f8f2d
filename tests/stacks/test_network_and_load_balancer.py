from __future__ import annotations

from typing import Any

from core.manifest import load_manifest
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth


def _attributes(lb: dict[str, Any]) -> dict[str, str]:
    return {a["Key"]: a["Value"] for a in lb["Properties"].get("LoadBalancerAttributes", [])}


def test_vpc_spans_the_manifest_azs_with_private_subnets_and_flow_logs(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    azs = {r["Properties"]["AvailabilityZone"] for r in example.resources("AWS::EC2::Subnet").values()}
    assert azs == {az for f in m.fleets for az in f.availability_zones}
    private = [
        r for r in example.resources("AWS::EC2::Subnet").values() if r["Properties"]["MapPublicIpOnLaunch"] is False
    ]
    assert len(private) == len(azs)
    flow = list(example.resources("AWS::EC2::FlowLog").values())
    assert len(flow) == 1 and flow[0]["Properties"]["TrafficType"] == "ALL"


def test_endpoints_remove_nat_traffic(example: Synth) -> None:
    services = set()
    for ep in example.resources("AWS::EC2::VPCEndpoint").values():
        name = ep["Properties"]["ServiceName"]
        services.add(name if isinstance(name, str) else "".join(p for p in name["Fn::Join"][1] if isinstance(p, str)))
    for suffix in ("s3", "ecr.api", "ecr.dkr", "logs", "monitoring", "ssm"):
        assert any(s.endswith(f".{suffix}") for s in services), (suffix, services)


def test_one_internal_nlb_with_one_listener_per_fleet(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    nlbs = {
        k: v
        for k, v in example.resources("AWS::ElasticLoadBalancingV2::LoadBalancer").items()
        if v["Properties"]["Type"] == "network"
    }
    assert len(nlbs) == 1
    ((nlb_id, nlb),) = nlbs.items()
    assert nlb["Properties"]["Scheme"] == "internal"
    listeners = [
        r
        for r in example.resources("AWS::ElasticLoadBalancingV2::Listener").values()
        if r["Properties"]["LoadBalancerArn"] == {"Ref": nlb_id}
    ]
    assert len(listeners) == len(m.fleets)
    assert len({r["Properties"]["Port"] for r in listeners}) == len(m.fleets)
    assert all(r["Properties"]["Protocol"] == "TCP" for r in listeners)


def _target_group_attributes(tg: dict[str, Any]) -> dict[str, str]:
    return {a["Key"]: a["Value"] for a in tg["Properties"].get("TargetGroupAttributes", [])}


def test_every_measured_target_group_balances_across_zones_whatever_the_priced_setting(example: Synth) -> None:
    """Cross-zone off sent each AZ's share only to that AZ's instances and, with both fleets behind
    one NLB, an AZ left DNS for g6 while inf2 compiled there. The target group's own attribute decides
    its traffic (ELB user guide, "Cross-zone load balancing for target groups"), so each fleet's sets it
    on, while the manifest's costs.network.nlb_cross_zone (off in the example) stays a pricing input."""
    m = load_manifest(EXAMPLE_MANIFEST)
    assert m.costs.network.nlb_cross_zone is False  # the priced production setting differs from what is measured
    groups = example.resources("AWS::ElasticLoadBalancingV2::TargetGroup")
    fleets = {next(t["Value"] for t in tg["Properties"]["Tags"] if t["Key"] == "fleet"): tg for tg in groups.values()}
    assert set(fleets) == {f.name for f in m.fleets}
    for name, tg in fleets.items():
        assert _target_group_attributes(tg).get("load_balancing.cross_zone.enabled") == "true", name
    (nlb,) = [
        v
        for v in example.resources("AWS::ElasticLoadBalancingV2::LoadBalancer").values()
        if v["Properties"]["Type"] == "network"
    ]
    assert _attributes(nlb)["load_balancing.cross_zone.enabled"] == "true"


def test_measured_target_groups_do_not_preserve_client_ip_and_the_fleets_still_admit_the_nlb(example: Synth) -> None:
    """With client IP preservation on (the instance target group's default), a load generator that
    reaches the same target through two NLB nodes from one source port fails intermittently (ELB NLB
    guide, troubleshooting: "Intermittent connection failure when client IP preservation is enabled").
    Off, the target sees the NLB's private addresses, so the fleet's rule must name the NLB's group."""
    m = load_manifest(EXAMPLE_MANIFEST)
    groups = example.resources("AWS::ElasticLoadBalancingV2::TargetGroup")
    fleets = {next(t["Value"] for t in tg["Properties"]["Tags"] if t["Key"] == "fleet"): tg for tg in groups.values()}
    assert set(fleets) == {f.name for f in m.fleets}
    preserved = {name: _target_group_attributes(tg).get("preserve_client_ip.enabled") for name, tg in fleets.items()}
    assert preserved == {f.name: "false" for f in m.fleets}

    (nlb,) = [
        v
        for v in example.resources("AWS::ElasticLoadBalancingV2::LoadBalancer").values()
        if v["Properties"]["Type"] == "network"
    ]
    ((nlb_sg,),) = [[g["Fn::GetAtt"][0] for g in nlb["Properties"]["SecurityGroups"]]]
    templates = example.resources("AWS::EC2::LaunchTemplate")
    asgs = example.resources("AWS::AutoScaling::AutoScalingGroup")
    ingress = list(example.resources("AWS::EC2::SecurityGroupIngress").values())
    tg_ids = {name: next(k for k, v in groups.items() if v is tg) for name, tg in fleets.items()}
    for name, tg in fleets.items():
        (asg,) = [a for a in asgs.values() if {"Ref": tg_ids[name]} in a["Properties"].get("TargetGroupARNs", [])]
        lt_id = asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
        (fleet_sg,) = [
            g["Fn::GetAtt"][0] for g in templates[lt_id]["Properties"]["LaunchTemplateData"]["SecurityGroupIds"]
        ]
        port = tg["Properties"]["Port"]
        admits = [
            r["Properties"]
            for r in ingress
            if r["Properties"]["GroupId"] == {"Fn::GetAtt": [fleet_sg, "GroupId"]}
            and r["Properties"].get("SourceSecurityGroupId") == {"Fn::GetAtt": [nlb_sg, "GroupId"]}
        ]
        assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in admits] == [("tcp", port, port)], name
