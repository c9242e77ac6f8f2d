"""A redeploy replaces a fleet's instances when, and only when, what they serve changed (issue 37).

Each launch template's user data names its fleet's serving definition digest
(core.serving.definition_digest), never the manifest's, and the template's launch tags do the same:
an SLO or `loadgen.workers` edit leaves every launch template as it was, so CloudFormation replaces
no instance (a change of the group's LaunchTemplate is what triggers AutoScalingRollingUpdate;
CloudFormation template reference, "UpdatePolicy attribute"), and no fleet re-downloads 16 GB of
weights through the NAT. A serving change (image, flags, batch size, ...) is a new template version,
which each ASG's AutoScalingRollingUpdate policy rolls out on `deploy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from core.manifest import Manifest, load_manifest
from core.serving import definition_digest, definition_for
from stacks.fleet_boot import boot_definition, boot_script
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth, synthesize


def _user_data(s: Synth, lt_logical_id: str) -> str:
    data = s.template_json["Resources"][lt_logical_id]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    return "".join(p for p in data["Fn::Join"][1] if isinstance(p, str))


def _fleet_of(resource: dict[str, Any]) -> str:
    return str(next(t["Value"] for t in resource["Properties"]["Tags"] if t["Key"] == "fleet"))


def test_every_asg_rolls_its_instances_onto_a_new_launch_template_version(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    asgs = example.resources("AWS::AutoScaling::AutoScalingGroup")
    assert len(asgs) == len(m.fleets)
    for lid, asg in asgs.items():
        fleet = _fleet_of(asg)
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
        user_data = _user_data(example, lt["LaunchTemplateId"]["Ref"])
        assert f"serving definition {definition_digest(definition_for(m, m.fleet(fleet)))}" in user_data
        assert m.digest not in user_data


def _edited_outside_serving(tmp: Path) -> Path:
    """The example with every SLO and the load generator's worker count changed, nothing else."""
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str(load_manifest(EXAMPLE_MANIFEST).trace_path)
    data["slo"]["ttft_p95_s"] = data["slo"]["ttft_p95_s"] * 2
    data["slo"]["itl_p95_s"] = data["slo"]["itl_p95_s"] * 2
    data["loadgen"]["workers"] = data["loadgen"]["workers"] + 2
    path = tmp / EXAMPLE_MANIFEST.name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def slo_and_workers_edit(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    path = _edited_outside_serving(tmp_path_factory.mktemp("edit-root"))
    return synthesize(path, tmp_path_factory.mktemp("edit") / "cdk.out")


def test_an_slo_or_workers_edit_leaves_every_launch_template_unchanged(
    example: Synth, slo_and_workers_edit: Synth
) -> None:
    before = load_manifest(example.manifest_path, check_files=False)
    after = load_manifest(slo_and_workers_edit.manifest_path, check_files=False)
    assert after.digest != before.digest and after.loadgen.workers != before.loadgen.workers
    # Keyed by logical id (Fleet<name>LaunchTemplate...): the same resource in both templates.
    templates = {lid: lt["Properties"] for lid, lt in example.resources("AWS::EC2::LaunchTemplate").items()}
    edited = {lid: lt["Properties"] for lid, lt in slo_and_workers_edit.resources("AWS::EC2::LaunchTemplate").items()}
    assert len(templates) == len(before.fleets)
    # The whole template (user data, launch tags, devices, ...), not only the user data: any change
    # to it is a new version, and a new version replaces every instance.
    assert edited == templates
    # What did change still shows where it belongs: the group's tags name the new manifest.
    for asg in slo_and_workers_edit.resources("AWS::AutoScaling::AutoScalingGroup").values():
        tags = {t["Key"]: t["Value"] for t in asg["Properties"]["Tags"]}
        assert tags["manifest-digest"] == after.digest


def _script(m: Manifest, fleet: str) -> list[str]:
    f = m.fleet(fleet)
    boot_defn, cached = boot_definition(
        m, f, weights_s3_uri=None, cache_registry="123456789012.dkr.ecr.us-east-1.amazonaws.com", region="us-east-1"
    )
    return boot_script(
        boot_defn,
        campaign=m.campaign,
        serving_digest=definition_digest(definition_for(m, f)),
        cached=cached,
        driver_version=f.serving.driver_version,
        region="us-east-1",
        agent_param="p",
        neuron_monitor_param=None,
        neuron_namespace="n",
    )


def test_a_serving_change_changes_the_user_data_and_an_slo_change_does_not() -> None:
    m = load_manifest(EXAMPLE_MANIFEST, check_files=False)
    slo = m.model_copy(update={"slo": m.slo.model_copy(update={"ttft_p95_s": m.slo.ttft_p95_s * 2})})
    assert slo.digest != m.digest
    g6 = m.fleet("g6")
    bigger_batch = m.model_copy(
        update={
            "fleets": tuple(
                f.model_copy(update={"max_concurrency": f.max_concurrency * 2}) if f is g6 else f for f in m.fleets
            )
        }
    )
    for f in m.fleets:
        assert _script(slo, f.name) == _script(m, f.name)
    assert _script(bigger_batch, "g6") != _script(m, "g6")
    assert _script(bigger_batch, "inf2") == _script(m, "inf2")
