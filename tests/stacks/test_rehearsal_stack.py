"""The rehearsal's stack (issue 51): the example synthesized with `-c rehearsal=1`, beside the
campaign's. Every fleet runs its emulator on the rehearsal host type from Amazon Linux 2023, with no
compile phase, no accelerator telemetry and no weights; every other construct is the campaign's,
with its logical id, so the campaign's lookups find them; the stack says it is a rehearsal."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from core.manifest import Manifest, load_manifest
from core.naming import (
    REHEARSAL_AMI_PARAMETER,
    REHEARSAL_CONTEXT,
    REHEARSAL_OUTPUT,
    REHEARSAL_TAG,
    ami_parameter_name,
)
from core.rehearsal import rehearsal_type
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth, synthesize

ASG = "AWS::AutoScaling::AutoScalingGroup"
LAUNCH_TEMPLATE = "AWS::EC2::LaunchTemplate"
S3_WEIGHTS = "s3://weights-bucket/llama"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(EXAMPLE_MANIFEST, check_files=False)


def _user_data(lt: dict[str, Any]) -> str:
    """A launch template's user data, its literal parts (references left out)."""
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    return "".join(p for p in parts if isinstance(p, str))


def _fleet_of(resource: dict[str, Any]) -> str | None:
    tags = resource["Properties"].get("Tags") or []
    if resource["Type"] == LAUNCH_TEMPLATE:
        tags = resource["Properties"]["LaunchTemplateData"]["TagSpecifications"][0]["Tags"]
    return next((t["Value"] for t in tags if isinstance(t, dict) and t.get("Key") == "fleet"), None)


def _by_fleet(s: Synth, cfn_type: str) -> dict[str, dict[str, Any]]:
    return {f: r for r in s.resources(cfn_type).values() if (f := _fleet_of(r)) is not None}


def test_every_fleet_runs_on_the_rehearsal_host_type_from_the_al2023_parameter(
    rehearsal: Synth, example: Synth, manifest: Manifest
) -> None:
    from stacks.rehearsal_boot import READY_GRACE_S
    from stacks.rehearsal_fleet import AL2023_AMI_SSM_PARAMETER

    params = rehearsal.template_json["Parameters"]
    ami = params[REHEARSAL_AMI_PARAMETER]
    assert ami["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert (
        ami["Default"]
        == AL2023_AMI_SSM_PARAMETER
        == "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    )
    assert not {ami_parameter_name(f.name) for f in manifest.fleets} & set(params)  # no DLAMI for deploy to fill
    host = rehearsal_type(manifest.costs.region).name
    assert host == "c6a.large"  # the snapshot's cheapest fit (core/data/host-types.csv)
    templates = _by_fleet(rehearsal, LAUNCH_TEMPLATE)
    assert set(templates) == {f.name for f in manifest.fleets}
    campaign_templates = _by_fleet(example, LAUNCH_TEMPLATE)
    for name, lt in templates.items():
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["InstanceType"] == host
        assert data["ImageId"] == {"Ref": REHEARSAL_AMI_PARAMETER}
        # One small encrypted root disk (Amazon Linux's /dev/xvda), no cache volume.
        assert data["BlockDeviceMappings"] == [
            {"DeviceName": "/dev/xvda", "Ebs": {"Encrypted": True, "VolumeSize": 16, "VolumeType": "gp3"}}
        ]
        campaign = campaign_templates[name]["Properties"]["LaunchTemplateData"]
        for key in ("MetadataOptions", "IamInstanceProfile", "SecurityGroupIds", "Monitoring", "TagSpecifications"):
            assert _without_rehearsal_tag(data[key]) == campaign[key], key
        # Instances and volumes carry the rehearsal's tag from launch, as they carry the campaign's.
        assert all({"Key": REHEARSAL_TAG[0], "Value": REHEARSAL_TAG[1]} in t["Tags"] for t in data["TagSpecifications"])
    # The groups: the campaign's sizes, subnets and deadline; the emulator's grace.
    groups, campaign_groups = _by_fleet(rehearsal, ASG), _by_fleet(example, ASG)
    for name, group in groups.items():
        props, campaign = group["Properties"], campaign_groups[name]["Properties"]
        assert props["HealthCheckGracePeriod"] == READY_GRACE_S
        assert _without_rehearsal_tag({k: v for k, v in props.items() if k != "HealthCheckGracePeriod"}) == {
            k: v for k, v in campaign.items() if k != "HealthCheckGracePeriod"
        }
        assert props["DesiredCapacity"] == str(manifest.fleet(name).instances_deployed)


def test_the_fleets_boot_their_emulator_without_compile_telemetry_or_weights(
    rehearsal: Synth, manifest: Manifest
) -> None:
    from stacks.compile_boot import COMPILE_PHASE_OUTPUT
    from stacks.rehearsal_boot import EMULATOR_MANIFEST

    for name, lt in _by_fleet(rehearsal, LAUNCH_TEMPLATE).items():
        text = _user_data(lt)
        assert f"--manifest {EMULATOR_MANIFEST} --fleet {name}" in text and "emulator healthy" in text
        for absent in ("neuron-monitor", "nvidia-smi", "modinfo", "mkfs", "snapshot_download", "compiled", "aws s3"):
            assert absent not in text, (name, absent)
    assert COMPILE_PHASE_OUTPUT not in rehearsal.template_json["Outputs"]
    assert not [r for r in rehearsal.resources(ASG).values() if "compile-for" in json.dumps(r)]
    ssm = json.dumps(rehearsal.resources("AWS::SSM::Parameter"))
    assert "neuron-monitor" not in ssm and "nvidia_gpu" not in ssm


def test_the_stack_says_it_is_a_rehearsal_and_a_campaigns_does_not(rehearsal: Synth, example: Synth) -> None:
    key, value = REHEARSAL_TAG
    assert rehearsal.template_json["Outputs"][REHEARSAL_OUTPUT]["Value"] == "true"
    assert REHEARSAL_OUTPUT not in example.template_json["Outputs"]

    def stack_tags(s: Synth) -> dict[str, str]:
        assembly = json.loads((s.outdir / "manifest.json").read_text(encoding="utf-8"))
        return dict(assembly["artifacts"]["Comparison"]["properties"].get("tags", {}))

    assert stack_tags(rehearsal).get(key) == value and key not in stack_tags(example)
    tagged = [r for r in rehearsal.template_json["Resources"].values() if "Tags" in r.get("Properties", {})]
    assert len(tagged) > 30
    for r in tagged:
        tags = r["Properties"]["Tags"]
        assert (tags.get(key) if isinstance(tags, dict) else {t["Key"]: t["Value"] for t in tags}.get(key)) == value
    assert f'"Key": "{key}"' not in json.dumps(example.template_json)


def _without_rehearsal_tag(value: Any) -> Any:
    key, tag_value = REHEARSAL_TAG
    if isinstance(value, list):
        # {Key, Value} (and an Auto Scaling group's PropagateAtLaunch)
        return [
            _without_rehearsal_tag(v)
            for v in value
            if not (isinstance(v, dict) and v.get("Key") == key and v.get("Value") == tag_value)
        ]
    if isinstance(value, dict):
        return {k: _without_rehearsal_tag(v) for k, v in value.items() if not (k == key and v == tag_value)}
    return value


def test_every_construct_of_the_campaign_is_there_with_its_logical_id(
    rehearsal: Synth, example: Synth, manifest: Manifest
) -> None:
    """What the campaign's code looks up (groups, target groups, listeners, Cloud Map, AMP, the
    results bucket, the gate, Locust, the conductor, the deadline actions) is the same resource,
    property for property; only what runs on the fleets' instances differs."""
    campaign, rehearsed = example.template_json["Resources"], rehearsal.template_json["Resources"]
    dropped = set(campaign) - set(rehearsed)
    assert dropped and all(re.fullmatch(r"Fleetinf2NeuronMonitorConfig[0-9A-F]{8}", lid) for lid in dropped)
    assert set(rehearsed) - set(campaign) == set()
    fleet_scoped = {
        lid
        for lid, r in rehearsed.items()
        if r["Type"] in (LAUNCH_TEMPLATE, ASG)
        or re.fullmatch(r"Fleet\w+(InstanceRoleDefaultPolicy|CloudWatchAgentConfig)[0-9A-F]{8}", lid)
    }
    assert len(fleet_scoped) == 4 * len(manifest.fleets)
    for lid, r in rehearsed.items():
        assert r["Type"] == campaign[lid]["Type"], lid
        if lid not in fleet_scoped:
            assert _without_rehearsal_tag(r) == campaign[lid], lid
    deadline = {lid for lid, r in rehearsed.items() if r["Type"] == "AWS::AutoScaling::ScheduledAction"}
    assert len(deadline) == len(manifest.fleets)
    outputs = rehearsal.template_json["Outputs"]
    assert set(outputs) == set(example.template_json["Outputs"]) | {REHEARSAL_OUTPUT}
    for name, output in example.template_json["Outputs"].items():
        assert outputs[name] == output, name
    params = set(example.template_json["Parameters"]) - {ami_parameter_name(f.name) for f in manifest.fleets}
    assert set(rehearsal.template_json["Parameters"]) == params | {REHEARSAL_AMI_PARAMETER}


def _fleet_policies(s: Synth) -> dict[str, list[dict[str, Any]]]:
    return {
        m.group(1): r["Properties"]["PolicyDocument"]["Statement"]
        for lid, r in s.template_json["Resources"].items()
        if (m := re.fullmatch(r"Fleet(\w+?)InstanceRoleDefaultPolicy[0-9A-F]{8}", lid))
    }


def test_the_fleet_roles_pull_the_emulator_and_read_no_weights(rehearsal: Synth, manifest: Manifest) -> None:
    policies = _fleet_policies(rehearsal)
    assert set(policies) == {f.name for f in manifest.fleets}
    for name, statements in policies.items():
        actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
        assert not [a for a in actions if a.startswith(("s3:", "secretsmanager:"))], name
        pull = next(s for s in statements if "ecr:BatchGetImage" in s["Action"])
        assert "cdk-hnb659fds-container-assets" in json.dumps(pull["Resource"]), name


@pytest.fixture(scope="module")
def rehearsal_from_s3(tmp_path_factory: pytest.TempPathFactory, manifest: Manifest) -> tuple[Synth, Manifest]:
    """A rehearsal of a manifest with a pinned huggingface tokenizer whose weights come from S3."""
    import stacks.settings

    files = {"tokenizer.json": "a" * 64, "tokenizer_config.json": "b" * 64}
    tok = manifest.tokenizer.model_copy(update={"kind": "huggingface", "path": "tok/tokenizer.json", "files": files})
    hf = manifest.model_copy(update={"tokenizer": tok})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stacks.settings, "load_checked_manifest", lambda path: (hf, EXAMPLE_MANIFEST))
        synth = synthesize(
            EXAMPLE_MANIFEST,
            tmp_path_factory.mktemp("rehearsal-s3") / "cdk.out",
            **{REHEARSAL_CONTEXT: "1", "weights_s3_uri": S3_WEIGHTS},
        )
    return synth, hf


def test_tokenizer_files_from_s3_are_the_only_objects_a_rehearsal_fleet_reads(
    rehearsal_from_s3: tuple[Synth, Manifest],
) -> None:
    synth, m = rehearsal_from_s3
    prefix = f"weights-bucket/llama/{m.model.commit}"
    for name, statements in _fleet_policies(synth).items():
        reads = [s for s in statements if s["Action"] == "s3:GetObject"]
        assert len(reads) == 1, name
        objects = json.dumps(reads[0]["Resource"])
        assert sorted(re.findall(rf"{prefix}/([^\"]+)", objects)) == sorted(m.tokenizer.files), name
        assert "*" not in objects  # not the weights, not the prefix
        listing = next(s for s in statements if s["Action"] == "s3:ListBucket")
        assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"llama/{m.model.commit}/*"]}}
    for name, lt in _by_fleet(synth, LAUNCH_TEMPLATE).items():
        text = _user_data(lt)
        assert f"aws s3 sync --region {m.costs.region} {S3_WEIGHTS}/{m.model.commit}/" in text, name
        sync = next(line for line in text.splitlines() if line.startswith("aws s3 sync"))
        assert sync.endswith("--exclude '*' --include tokenizer.json --include tokenizer_config.json"), sync


def test_the_rehearsal_context_is_1_or_0_and_has_no_compile_phase() -> None:
    from stacks.app_builder import pinned_context
    from stacks.compile_boot import COMPILE_FLEETS_CONTEXT
    from stacks.settings import SynthInputError, rehearsal_from_context, settings_from_context

    assert [rehearsal_from_context(v) for v in (None, "", "0", "1")] == [False, False, False, True]
    with pytest.raises(SynthInputError, match="context rehearsal: expected 1 or 0, got 'yes'"):
        rehearsal_from_context("yes")
    context = {**pinned_context(), "manifest": str(EXAMPLE_MANIFEST), REHEARSAL_CONTEXT: "1"}
    assert settings_from_context(context).rehearsal
    with pytest.raises(SynthInputError, match=r"a rehearsal .* has no compile phase"):
        settings_from_context({**context, COMPILE_FLEETS_CONTEXT: "inf2"})
