"""deploy's compile phase as the stacks build it (`-c compile_fleets=inf2`, stacks/compile_instance.py).

Every fleet's group at 0; for the at-risk fleet one compile instance's group of at most one
instance, created empty (deploy starts it), whose launch template is the fleet's (AMI parameter,
role, security group, volumes) on the larger type with the compile script as user data; a policy
letting the fleet's role terminate instances of that group only; and the stack output deploy reads.
Without the context the template has none of it.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from core.manifest import load_manifest
from core.naming import ami_parameter_name
from core.serving import definition_for, render_docker_run
from stacks.compile_boot import COMPILE_PHASE_OUTPUT
from stacks.compile_instance import COMPILE_FOR_TAG
from stacks.settings import SynthInputError, compile_fleets_from_context
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}


def _groups(s: Synth) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(fleet groups by `fleet` tag, compile groups by `compile-for` tag), as logical id + resource."""
    fleets, compiles = {}, {}
    for lid, r in s.resources("AWS::AutoScaling::AutoScalingGroup").items():
        tags = _tags(r)
        if "fleet" in tags:
            fleets[tags["fleet"]] = {"id": lid, **r}
        if COMPILE_FOR_TAG in tags:
            compiles[tags[COMPILE_FOR_TAG]] = {"id": lid, **r}
    return fleets, compiles


def _launch_template(s: Synth, asg: dict[str, Any]) -> dict[str, Any]:
    ref = asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
    return s.template_json["Resources"][ref]["Properties"]["LaunchTemplateData"]


def _user_data(lt: dict[str, Any]) -> str:
    return "".join(p if isinstance(p, str) else "" for p in lt["UserData"]["Fn::Base64"]["Fn::Join"][1])


def test_every_fleet_is_at_zero_and_the_at_risk_one_gets_a_compile_group(compile_phase: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    fleets, compiles = _groups(compile_phase)
    assert set(fleets) == {"inf2", "g6"} and set(compiles) == {"inf2"}
    for f in m.fleets:
        props = fleets[f.name]["Properties"]
        assert (int(props["MinSize"]), int(props["MaxSize"]), int(props["DesiredCapacity"])) == (0, f.asg.max, 0)
    group = compiles["inf2"]["Properties"]
    assert (int(group["MinSize"]), int(group["MaxSize"])) == (0, 1)
    assert "DesiredCapacity" not in group  # created empty; deploy starts it, and no redeploy resets it
    assert "fleet" not in _tags(compiles["inf2"])  # never taken for the fleet's own group
    assert _tags(compiles["inf2"])["campaign"] == m.campaign  # propagated to the instance: teardown's check sees it
    assert group["VPCZoneIdentifier"] == fleets["inf2"]["Properties"]["VPCZoneIdentifier"]  # the fleet's AZs


def test_the_compile_launch_template_is_the_fleets_on_the_larger_type(compile_phase: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    fleets, compiles = _groups(compile_phase)
    fleet_lt = _launch_template(compile_phase, fleets["inf2"])
    lt = _launch_template(compile_phase, compiles["inf2"])
    assert (fleet_lt["InstanceType"], lt["InstanceType"]) == ("inf2.xlarge", "inf2.8xlarge")
    assert lt["ImageId"] == fleet_lt["ImageId"] == {"Ref": ami_parameter_name("inf2")}
    assert lt["SecurityGroupIds"] == fleet_lt["SecurityGroupIds"]
    assert lt["BlockDeviceMappings"] == fleet_lt["BlockDeviceMappings"]
    assert lt["MetadataOptions"] == {"HttpPutResponseHopLimit": 1, "HttpTokens": "required"}
    resources = compile_phase.template_json["Resources"]

    def role(launch_template: dict[str, Any]) -> Any:
        profile = launch_template["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0]
        return resources[profile]["Properties"]["Roles"]

    assert role(lt) == role(fleet_lt)  # the fleet's role: its grants on compiled/, weights, logs
    # User data: the fleet's own server line (its key), publishing, then terminating itself.
    script = _user_data(lt)
    defn = definition_for(m, m.fleet("inf2"))
    assert defn.compiled is not None
    # the fleet's own server line, its image pulled through the ECR Public cache (the account is a
    # token, so the reference is quoted and the account left out here)
    before, after = render_docker_run(defn).split(defn.image)
    digest = defn.image.rsplit("@", 1)[1]
    assert (
        f"{before}'.dkr.ecr.{m.costs.region}.amazonaws.com/ecr-public/neuron/pytorch-inference-vllm-neuronx@{digest}'{after}"
        in script
    )
    assert f"/compiled/{defn.compiled.key}" in script
    assert "terminate-instance-in-auto-scaling-group" in script and "--should-decrement-desired-capacity" in script
    assert shlex.split(render_docker_run(defn))[0] == "docker"
    assert "neuron-monitor.service" not in script and "neuron-monitor.service" in _user_data(fleet_lt)


def test_the_fleets_role_may_terminate_instances_of_its_compile_group_only(compile_phase: Synth) -> None:
    fleets, compiles = _groups(compile_phase)
    fleet_lt = _launch_template(compile_phase, fleets["inf2"])
    resources = compile_phase.template_json["Resources"]
    fleet_role = resources[fleet_lt["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0]]["Properties"]["Roles"]
    granting = [
        p["Properties"]
        for p in compile_phase.resources("AWS::IAM::Policy").values()
        if "autoscaling:TerminateInstanceInAutoScalingGroup" in json.dumps(p["Properties"]["PolicyDocument"])
    ]
    (policy,) = granting
    assert policy["Roles"] == fleet_role
    (stmt,) = policy["PolicyDocument"]["Statement"]
    assert stmt["Action"] == "autoscaling:TerminateInstanceInAutoScalingGroup" and stmt["Effect"] == "Allow"
    parts = stmt["Resource"]["Fn::Join"][1]
    assert parts[-2].endswith(":autoScalingGroup:*:autoScalingGroupName/") and parts[-1] == {
        "Ref": compiles["inf2"]["id"]
    }


def test_the_compile_phase_output_names_each_group_and_its_log_group(compile_phase: Synth, example: Synth) -> None:
    _, compiles = _groups(compile_phase)
    out = compile_phase.template_json["Outputs"][COMPILE_PHASE_OUTPUT]["Value"]["Fn::Join"][1]
    refs = [p["Ref"] for p in out if isinstance(p, dict)]
    assert refs[0] == compiles["inf2"]["id"]
    assert compile_phase.template_json["Resources"][refs[1]]["Type"] == "AWS::Logs::LogGroup"
    assert '"inf2.8xlarge"' in "".join(p for p in out if isinstance(p, str))
    # The plain deploy: none of it, and the fleets at their size.
    assert COMPILE_PHASE_OUTPUT not in example.template_json["Outputs"]
    assert _groups(example)[1] == {}
    assert not [r for r in example.resources("AWS::IAM::Policy").values() if "TerminateInstance" in json.dumps(r)]


def test_nothing_of_the_compile_phase_is_kept_when_the_stack_goes(compile_phase: Synth, example: Synth) -> None:
    # teardown mid-phase deletes the stack: every compile resource is the stack's and none is retained.
    added = set(compile_phase.template_json["Resources"]) - set(example.template_json["Resources"])
    assert added and all("Compile" in lid for lid in added)
    for lid in added:
        assert compile_phase.template_json["Resources"][lid].get("DeletionPolicy", "Delete") == "Delete"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("g6", "g6's host memory is not at risk; it compiles on its own instances"),
        ("inf3", r"'inf3' is not a fleet of the manifest \(inf2, g6\)"),
        (",", "expected fleet names separated by commas"),
    ],
)
def test_a_bad_compile_fleets_context_names_the_key(raw: str, match: str) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    with pytest.raises(SynthInputError, match=f"context compile_fleets: {match}"):
        compile_fleets_from_context(m, raw)
    assert compile_fleets_from_context(m, "inf2, inf2") == ("inf2",)
    assert compile_fleets_from_context(m, None) == ()


def test_the_compile_user_data_runs_its_whole_boot_under_the_timeout(compile_phase: Synth) -> None:
    """Issue 48, item 3, in the synthesized template: the boot script sandbox
    (tests/boot/test_compile_script.py) runs what this user data is."""
    from stacks.compile_boot import KILL_AFTER_S, compile_boot_limit_s

    _, compiles = _groups(compile_phase)
    script = _user_data(_launch_template(compile_phase, compiles["inf2"]))
    timed = f'timeout --kill-after={KILL_AFTER_S} {compile_boot_limit_s("aws-neuron")} bash "$0"'
    assert timed in script and script.index(timed) < script.index("docker pull")


def test_the_compile_phase_output_names_each_fleets_own_group_and_target_group(compile_phase: Synth) -> None:
    """Issue 50, item 2: deploy's one-instance check (campaign/aws/compile_phase.py prove_on_fleet_type)
    starts one instance in the fleet's own group, held at 0 with the manifest's max, and waits for it
    in the fleet's target group: the output names both."""
    fleets, _ = _groups(compile_phase)
    out = compile_phase.template_json["Outputs"][COMPILE_PHASE_OUTPUT]["Value"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else "@" for p in out)
    refs = [p.get("Ref") for p in out if isinstance(p, dict)]
    assert '"fleet_group":"@"' in text.replace(" ", "") and '"target_group":"@"' in text.replace(" ", "")
    assert fleets["inf2"]["id"] in refs  # the fleet's own group, by its Ref
    groups = compile_phase.resources("AWS::ElasticLoadBalancingV2::TargetGroup")
    (inf2_tg,) = [k for k, v in groups.items() if {"Key": "fleet", "Value": "inf2"} in v["Properties"]["Tags"]]
    assert inf2_tg in refs and inf2_tg in fleets["inf2"]["Properties"]["TargetGroupARNs"][0]["Ref"]
    props = fleets["inf2"]["Properties"]
    assert int(props["DesiredCapacity"]) == 0 and int(props["MaxSize"]) >= 1  # deploy may set 1 within it
