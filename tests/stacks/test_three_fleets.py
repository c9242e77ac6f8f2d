from __future__ import annotations

from core.manifest import load_manifest
from tests.stacks.conftest import THREE_FLEET_MANIFEST, Synth


def test_three_fleet_manifest_yields_three_fleets_without_new_code(three_fleets: Synth) -> None:
    m = load_manifest(THREE_FLEET_MANIFEST)
    assert len(m.fleets) == 3
    asgs = three_fleets.resources("AWS::AutoScaling::AutoScalingGroup")
    lts = three_fleets.resources("AWS::EC2::LaunchTemplate")
    assert len(asgs) == len(lts) == 3
    types = sorted(lt["Properties"]["LaunchTemplateData"]["InstanceType"] for lt in lts.values())
    assert types == sorted(f.instance_type for f in m.fleets)
    nlb_listeners = [
        r
        for r in three_fleets.resources("AWS::ElasticLoadBalancingV2::Listener").values()
        if r["Properties"]["Protocol"] == "TCP"
    ]
    assert len(nlb_listeners) == 3
    # The g5 fleet asks for a third AZ: the VPC grows to cover it.
    azs = {r["Properties"]["AvailabilityZone"] for r in three_fleets.resources("AWS::EC2::Subnet").values()}
    assert azs == {"us-east-1a", "us-east-1b", "us-east-1c"}
