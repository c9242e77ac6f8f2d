"""Every manifest fleet becomes one ASG + launch template, built by the same construct."""

from __future__ import annotations

from typing import Any

from core import catalog
from core.manifest import load_manifest
from core.naming import ami_parameter_name
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth


def _fleet_tag(resource: dict[str, Any]) -> str | None:
    for tag in resource["Properties"].get("Tags", []):
        if tag["Key"] == "fleet":
            return str(tag["Value"])
    return None


def _subnet_azs(s: Synth, subnet_refs: list[dict[str, str]]) -> set[str]:
    subnets = s.template_json["Resources"]
    return {subnets[ref["Ref"]]["Properties"]["AvailabilityZone"] for ref in subnet_refs}


def _launch_template_of(s: Synth, asg: dict[str, Any]) -> dict[str, Any]:
    ref = asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
    return s.template_json["Resources"][ref]["Properties"]["LaunchTemplateData"]


def test_each_fleet_has_an_asg_over_its_azs_with_its_instance_type(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    asgs = {_fleet_tag(r): r for r in example.resources("AWS::AutoScaling::AutoScalingGroup").values()}
    assert set(asgs) == {f.name for f in m.fleets}
    assert any(f.instances_measured > f.asg.desired for f in m.fleets)  # so DesiredCapacity below shows which one wins
    for f in m.fleets:
        asg = asgs[f.name]["Properties"]
        assert _subnet_azs(example, asg["VPCZoneIdentifier"]) == set(f.availability_zones)
        # In service while the campaign measures: measure_instances (the example: 4, asg.desired 2).
        assert (int(asg["MinSize"]), int(asg["MaxSize"]), int(asg["DesiredCapacity"])) == (
            f.asg.min,
            f.asg.max,
            max(f.asg.desired, f.instances_measured),
        )
        assert "ELB" in asg["HealthCheckType"]
        lt = _launch_template_of(example, asgs[f.name])
        assert lt["InstanceType"] == f.instance_type


def test_launch_templates_require_imdsv2_and_encrypt_every_volume(example: Synth) -> None:
    lts = example.resources("AWS::EC2::LaunchTemplate")
    assert len(lts) == 2
    for lt in lts.values():
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        mappings = data["BlockDeviceMappings"]
        assert len(mappings) == 2  # root + cache
        for bdm in mappings:
            assert bdm["Ebs"]["Encrypted"] is True
            assert bdm["Ebs"]["VolumeType"] == "gp3"
    for vol in example.resources("AWS::EC2::Volume").values():
        assert vol["Properties"]["Encrypted"] is True


def test_cache_volume_is_sized_from_the_manifest_and_mounted_before_docker_run(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    asgs = {_fleet_tag(r): r for r in example.resources("AWS::AutoScaling::AutoScalingGroup").values()}
    for f in m.fleets:
        lt = _launch_template_of(example, asgs[f.name])
        sizes = sorted(b["Ebs"]["VolumeSize"] for b in lt["BlockDeviceMappings"])
        assert f.ebs_cache_gib in sizes
        # the root volume deployed is the one the cost model bills (100 GiB was billed against 150 deployed)
        root = next(b for b in lt["BlockDeviceMappings"] if b["DeviceName"] == "/dev/sda1")
        assert (
            root["Ebs"]["VolumeSize"] == catalog.ROOT_VOLUME_GIB
        )  # analysis.report.build bills catalog.ROOT_VOLUME_GIB
        script = "".join(p if isinstance(p, str) else "" for p in lt["UserData"]["Fn::Base64"]["Fn::Join"][1])
        assert script.index("mount /opt/cache") < script.index("docker run -d")
        assert f"@{f.serving.image.rsplit('@', 1)[1]}" in script  # the pinned digest (pulled through the cache)


def test_each_fleet_ami_is_a_deploy_parameter_never_a_latest_alias(example: Synth) -> None:
    params = example.template_json["Parameters"]
    assert not [p for p in params.values() if "latest" in str(p.get("Default", ""))]
    asgs = {_fleet_tag(r): r for r in example.resources("AWS::AutoScaling::AutoScalingGroup").values()}
    for fleet, sdk in (("inf2", "aws-neuron SDK 2.28.0"), ("g6", "nvidia SDK 12.8")):
        ref = _launch_template_of(example, asgs[fleet])["ImageId"]["Ref"]
        assert ref == ami_parameter_name(fleet)
        assert params[ref]["Type"] == "AWS::EC2::Image::Id" and "Default" not in params[ref]
        assert sdk in params[ref]["Description"]
    assert "Neuron SDK 2.28.0" in params[ami_parameter_name("inf2")]["Description"]


def test_launch_templates_keep_imds_to_the_host(example: Synth) -> None:
    for lt in example.resources("AWS::EC2::LaunchTemplate").values():
        assert lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpPutResponseHopLimit"] == 1


def test_accelerator_telemetry_per_vendor(example: Synth) -> None:
    values = {
        r["Properties"]["Name"]: r["Properties"]["Value"] for r in example.resources("AWS::SSM::Parameter").values()
    }
    g6_agent = next(v for k, v in values.items() if k.endswith("/g6/cloudwatch-agent"))
    inf2_agent = next(v for k, v in values.items() if k.endswith("/inf2/cloudwatch-agent"))
    assert "nvidia_gpu" in str(g6_agent) and "nvidia_gpu" not in str(inf2_agent)
    assert any(k.endswith("/inf2/neuron-monitor") for k in values)
    assert not any(k.endswith("/g6/neuron-monitor") for k in values)


def test_nlb_target_groups_health_check_the_servers_health_path(example: Synth) -> None:
    tgs = [
        r["Properties"]
        for r in example.resources("AWS::ElasticLoadBalancingV2::TargetGroup").values()
        if r["Properties"]["Protocol"] == "TCP"
    ]
    assert len(tgs) == 2
    for tg in tgs:
        assert tg["HealthCheckProtocol"] == "HTTP"
        assert tg["HealthCheckPath"] == "/health"
        assert tg["TargetType"] == "instance"


def test_the_boot_scripts_own_wait_is_the_asgs_health_grace(example: Synth) -> None:
    # One source (core.cloud_contract.HEALTH_GRACE_MIN) for both: the group's grace and the bound
    # of the boot script's health wait (a fixed 7200 s once outlived the 75-min grace).
    import re

    for asg in example.resources("AWS::AutoScaling::AutoScalingGroup").values():
        lt = _launch_template_of(example, asg)
        script = "".join(p if isinstance(p, str) else "" for p in lt["UserData"]["Fn::Base64"]["Fn::Join"][1])
        (bound,) = re.findall(r'\[ "\$SECONDS" -ge (\d+) \]', script)
        grace = int(asg["Properties"]["HealthCheckGracePeriod"])
        vendor = catalog.instance(lt["InstanceType"]).accelerator.vendor
        assert int(bound) == grace == {"aws-neuron": 75, "nvidia": 30}[vendor] * 60
