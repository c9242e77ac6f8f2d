"""A changed manifest replaces the fleets' instances on `deploy` (issue 25, item 5).

The manifest's digest is in every launch template's user data, so any manifest change is a new
launch template version; each ASG carries CloudFormation's AutoScalingRollingUpdate policy and
follows the template's latest version, so the update replaces the instances of the old one.
Without the policy, CloudFormation updates the group's launch template and leaves its running
instances as they were: they keep serving the old manifest.
"""

from __future__ import annotations

from core.manifest import load_manifest
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth


def _user_data(s: Synth, lt_logical_id: str) -> str:
    data = s.template_json["Resources"][lt_logical_id]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    return "".join(p for p in data["Fn::Join"][1] if isinstance(p, str))


def test_every_asg_rolls_its_instances_onto_a_new_launch_template_version(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    asgs = example.resources("AWS::AutoScaling::AutoScalingGroup")
    assert len(asgs) == len(m.fleets)
    for lid, asg in asgs.items():
        fleet = next(t["Value"] for t in asg["Properties"]["Tags"] if t["Key"] == "fleet")
        policy = asg.get("UpdatePolicy", {}).get("AutoScalingRollingUpdate")
        assert policy is not None, (
            f"{lid}: no AutoScalingRollingUpdate; a redeploy would leave the old instances serving"
        )
        assert int(policy["MinInstancesInService"]) == 0
        assert int(policy["MaxBatchSize"]) == m.fleet(fleet).asg.max  # every old instance goes in one batch
        assert "WaitOnResourceSignals" not in policy or policy["WaitOnResourceSignals"] is False
        lt = asg["Properties"]["LaunchTemplate"]
        # The group follows the template's latest version: a new version is an update of the group.
        assert lt["Version"] == {"Fn::GetAtt": [lt["LaunchTemplateId"]["Ref"], "LatestVersionNumber"]}
        assert m.digest in _user_data(example, lt["LaunchTemplateId"]["Ref"])


def test_any_manifest_change_changes_every_fleets_user_data() -> None:
    # Checked on the boot script itself (one synth per manifest would cost minutes): a change that
    # touches no serving flag (the description) still gives each fleet a new launch template.
    from core.serving import definition_for
    from stacks.fleet_boot import boot_script

    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    changed = m.model_copy(update={"description": m.description + " (revised)"})
    assert changed.digest != m.digest
    for f in m.fleets:
        kw = dict(
            driver_version=f.serving.driver_version,
            region="us-east-1",
            agent_param="p",
            neuron_monitor_param=None,
            neuron_namespace="n",
        )
        before = boot_script(definition_for(m, f), manifest=m, **kw)  # type: ignore[arg-type]
        after = boot_script(definition_for(changed, f), manifest=changed, **kw)  # type: ignore[arg-type]
        assert before != after
