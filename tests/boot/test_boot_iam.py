"""Each fleet's boot script, as the synthesized launch template's user data, run in the boot
sandbox (tests/boot/test_boot_script.py's stubs), each `aws` command line it ran and each image it
pulled from this account's ECR evaluated against the fleet's synthesized instance role
(testing/iam_policy.py: iam-simulate over the role's policies, the authorizations per the Service
Authorization Reference and the CLI's calls), issue 49 item 2; and the compile instance's (deploy's
compile phase, synthesized with `-c compile_fleets=inf2`: the fleet's role, plus the policy that
lets it terminate itself through its group) the same way. Every call is allowed; removing a
statement the boot exercises denies its call, named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testing.iam_policy import (
    Authorization,
    Call,
    Denial,
    Evaluator,
    World,
    cli_authorizations,
    image_pull_authorizations,
    resolve,
    role_policies,
    without_statement,
)
from tests.boot.test_boot_script import _run
from tests.conftest import EXAMPLE_MANIFEST

pytestmark = pytest.mark.boot_script

ACCOUNT, REGION, BUCKET = "123456789012", "us-east-1", "results"
COMPILE_GROUP = "compile-inf2"  # the compile instance's Auto Scaling group, as named here
COMPILE_GROUP_ARN = (
    f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:"
    f"0c0a1e5c-0ffe-4e12-8000-000000000001:autoScalingGroupName/{COMPILE_GROUP}"
)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from testing.cloud_offline import synth

    # with deploy's compile phase for inf2: its compile instance beside the fleets (held at 0)
    return synth(EXAMPLE_MANIFEST, tmp_path_factory.mktemp("synth"), {"compile_fleets": "inf2"})


def _bindings(template: dict[str, Any]) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    resources = template["Resources"]
    refs = {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT, "AWS::Region": REGION}
    attrs: dict[tuple[str, str], str] = {}
    for logical, r in resources.items():
        if r["Type"] == "AWS::SSM::Parameter":
            refs[logical] = r["Properties"]["Name"]  # Ref of a parameter: its name
        if r["Type"] == "AWS::Logs::LogGroup":
            name = r["Properties"].get("LogGroupName", logical)
            attrs[(logical, "Arn")] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*"
        if r["Type"] == "AWS::S3::Bucket" and logical.startswith("Results") and "Logs" not in logical:
            refs[logical], attrs[(logical, "Arn")] = BUCKET, f"arn:aws:s3:::{BUCKET}"
        if r["Type"] == "AWS::AutoScaling::AutoScalingGroup" and logical.startswith("Compile"):
            refs[logical] = COMPILE_GROUP  # Ref of a group: its name
    return refs, attrs


def _world() -> World:
    def unused(*_: str) -> Any:
        raise AssertionError("not a boot's lookup")

    # the instance the sandbox's IMDS names is the compile group's (the one that terminates itself)
    return World(ACCOUNT, REGION, unused, unused, unused, unused, unused, instance_group=lambda _id: COMPILE_GROUP_ARN)


def _fleet(template: dict[str, Any], fleet: str, kind: str = "Fleet") -> tuple[str, list[dict[str, Any]]]:
    """The boot script of the fleet's launch template (`kind` "Compile": its compile instance's)
    and the policies of the role its instance profile carries, resolved."""
    refs, attrs = _bindings(template)
    resources = template["Resources"]
    (lt,) = [
        k for k, v in resources.items() if v["Type"] == "AWS::EC2::LaunchTemplate" and k.startswith(f"{kind}{fleet}")
    ]
    data = resources[lt]["Properties"]["LaunchTemplateData"]
    script = resolve(data["UserData"]["Fn::Base64"], refs, attrs)
    profile = data["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0]
    (role,) = [r["Ref"] for r in resources[profile]["Properties"]["Roles"]]
    return script, [resolve(doc, refs, attrs) for doc in role_policies(template, role)]


def _boot_calls(script: str, tmp_path: Path, fleet: str) -> list[tuple[Call, list[Authorization]]]:
    rc, calls, output = _run(script, tmp_path)
    assert rc == 0, output
    world, out = _world(), []
    for c in calls:
        if c[0] == "aws":
            out.append((Call(fleet, "aws-cli", " ".join(c[1:3]), {"argv": c[1:]}), cli_authorizations(c[1:], world)))
        elif c[:2] == ["docker", "pull"]:
            out.append((Call(fleet, "docker", "pull", {"image": c[2]}), image_pull_authorizations(c[2], world)))
    return out


def _denied(calls: list[tuple[Call, list[Authorization]]], policies: list[dict[str, Any]]) -> list[Denial]:
    with Evaluator(ACCOUNT) as iam:
        return [d for call, auths in calls for d in iam.check(call, auths, policies, _world())]


@pytest.fixture(scope="module")
def booted(template: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = {}
    for fleet in ("inf2", "g6"):
        script, policies = _fleet(template, fleet)
        out[fleet] = (_boot_calls(script, tmp_path_factory.mktemp(fleet), fleet), policies)
    script, policies = _fleet(template, "inf2", "Compile")
    out["compile"] = (_boot_calls(script, tmp_path_factory.mktemp("compile"), "compile"), policies)
    return out


def test_every_call_a_fleets_boot_makes_is_allowed_by_its_instance_role(booted: dict[str, Any]) -> None:
    inf2, g6 = booted["inf2"][0], booted["g6"][0]
    assert {c.operation for c, _ in inf2} >= {"ssm get-parameter", "s3api list-objects-v2", "s3 cp"}
    assert {c.operation for c, _ in g6} >= {"ecr get-login-password", "pull"}
    for fleet in ("inf2", "g6"):
        calls, policies = booted[fleet]
        assert [str(d) for d in _denied(calls, policies)] == [], fleet


def test_every_call_the_compile_instances_boot_makes_is_allowed_by_its_role(booted: dict[str, Any]) -> None:
    calls, policies = booted["compile"]
    assert {c.operation for c, _ in calls} >= {
        "s3api list-objects-v2",  # looking for a published set
        "s3 cp",  # publishing the set, then its marker
        "autoscaling terminate-instance-in-auto-scaling-group",  # then itself, through its group
    }
    assert [str(d) for d in _denied(calls, policies)] == []


@pytest.mark.parametrize(
    ("fleet", "action", "on"),
    [
        ("inf2", "s3:PutObject", "compiled/"),  # publishing its compiled set
        ("inf2", "s3:ListBucket", "results"),  # looking for a published set
        ("inf2", "ssm:GetParameter", "neuron-monitor"),  # neuron-monitor's configuration (the CLI reads it)
        ("g6", "ecr:GetAuthorizationToken", "*"),
        ("g6", "ecr:BatchImportUpstreamImage", "docker-hub/"),  # the first pull through the Docker Hub cache
        ("compile", "s3:PutObject", "compiled/"),  # publishing the compiled set
        ("compile", "autoscaling:TerminateInstanceInAutoScalingGroup", "autoScalingGroupName"),  # ending itself
    ],
)
def test_removing_a_statement_denies_the_boot_call_that_needs_it(
    booted: dict[str, Any], fleet: str, action: str, on: str
) -> None:
    calls, policies = booted[fleet]
    (where,) = [
        (i, j)
        for i, doc in enumerate(policies)
        for j, st in enumerate(doc["Statement"])
        if st["Effect"] == "Allow"
        and action in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
        and on in str(st["Resource"])
    ]
    denied = _denied(calls, without_statement(policies, *where))
    assert action in {d.authorization.action for d in denied}
    first = next(d for d in denied if d.authorization.action == action)
    assert str(first).startswith(f"{fleet} may not {action} on ")
    print(first)
