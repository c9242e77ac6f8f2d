"""No instance or task pulls an image from Docker Hub anonymously (issue 37).

Docker Hub limits unauthenticated pulls per IPv4 address and every host leaves through one NAT
address; the stacks pull every Docker Hub image (g6's vLLM, Prometheus) through an ECR
pull-through cache rule whose Docker Hub credentials are the operator's Secrets Manager secret
(core/images.py, stacks/image_cache.py). Each check here fails on the old stacks, which pulled
`vllm/vllm-openai@...` and `prom/prometheus:...` straight from Docker Hub.
"""

from __future__ import annotations

import json
import re
from typing import Any

from core.images import docker_hub_image
from core.manifest import load_manifest
from stacks.image_cache import CACHE_PULL_ACTIONS, CREDENTIAL_PARAMETER
from tests.stacks.conftest import Synth

DOCKER_PULL = re.compile(r"docker pull '?([^' \n|]+)")


def _joined(value: Any) -> str:
    """A CloudFormation string as text, the account as <account>."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        return str(value["Fn::Join"][0]).join(_joined(p) for p in value["Fn::Join"][1])
    if value == {"Ref": "AWS::AccountId"}:
        return "<account>"
    return json.dumps(value)


def _user_data(s: Synth) -> dict[str, str]:
    return {
        lid: _joined(lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"])
        for lid, lt in s.resources("AWS::EC2::LaunchTemplate").items()
    }


def _rules(s: Synth) -> dict[str, dict[str, Any]]:
    """The pull-through cache rules by their repository prefix."""
    return {r["Properties"]["EcrRepositoryPrefix"]: r for r in s.resources("AWS::ECR::PullThroughCacheRule").values()}


def test_one_pull_through_cache_rule_for_docker_hub_with_the_operators_credentials(example: Synth) -> None:
    props = _rules(example)["docker-hub"]["Properties"]
    assert props["UpstreamRegistryUrl"] == "registry-1.docker.io" and props["UpstreamRegistry"] == "docker-hub"
    assert props["EcrRepositoryPrefix"] == "docker-hub"
    assert props["CredentialArn"] == {"Ref": CREDENTIAL_PARAMETER}
    param = example.template_json["Parameters"][CREDENTIAL_PARAMETER]
    assert "Default" not in param  # deploy must name the secret; nothing of it is in the template
    assert re.match(
        param["AllowedPattern"], "arn:aws:secretsmanager:us-east-1:123456789012:secret:ecr-pullthroughcache/hub-AbCdEf"
    )
    assert not re.match(
        param["AllowedPattern"], "arn:aws:secretsmanager:us-east-1:123456789012:secret:harness/hub-AbCdEf"
    )


def test_no_container_or_instance_pulls_from_docker_hub(example: Synth, three_fleets: Synth) -> None:
    for s in (example, three_fleets):
        for t in s.resources("AWS::ECS::TaskDefinition").values():
            for c in t["Properties"]["ContainerDefinitions"]:
                image = _joined(c["Image"])
                assert docker_hub_image(image) is None, (c["Name"], image)
        for lid, text in _user_data(s).items():
            pulled = DOCKER_PULL.findall(text)
            assert pulled, lid
            assert [p for p in pulled if docker_hub_image(p) is not None] == [], lid


def test_g6_pulls_its_pinned_image_from_the_cache_and_prometheus_runs_from_the_cache(example: Synth) -> None:
    # The tag-first fill of a tagged image is run in the boot sandbox (tests/boot/test_boot_script.py).
    m = load_manifest(example.manifest_path, check_files=False)
    g6 = m.fleet("g6")
    text = next(t for lid, t in _user_data(example).items() if lid.startswith("Fleetg6"))
    registry = f"<account>.dkr.ecr.{m.costs.region}.amazonaws.com"
    digest = g6.serving.image.rsplit("@", 1)[1]
    assert DOCKER_PULL.findall(text) == [f"{registry}/docker-hub/vllm/vllm-openai@{digest}"]  # the example has no tag
    assert f"docker login --username AWS --password-stdin {registry}" in text
    prometheus = [
        _joined(c["Image"])
        for t in example.resources("AWS::ECS::TaskDefinition").values()
        for c in t["Properties"]["ContainerDefinitions"]
        if c["Name"] == "prometheus"
    ]
    assert prometheus == [f"{registry}/docker-hub/prom/prometheus:v3.5.0"]


def _statements_on(s: Synth, role_id: str) -> list[dict[str, Any]]:
    return [
        st
        for p in s.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for st in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_roles_that_pull_through_the_cache_may_import_into_their_own_repositories_only(example: Synth) -> None:
    roles = example.resources("AWS::IAM::Role")
    by_repository: dict[str, set[str]] = {}
    for role_id in roles:
        for st in _statements_on(example, role_id):
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if "ecr:BatchImportUpstreamImage" not in actions:
                continue
            assert sorted(actions) == sorted(CACHE_PULL_ACTIONS)
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            for r in resources:
                by_repository.setdefault(_joined(r).rsplit(":repository/", 1)[1], set()).add(role_id)
    assert set(by_repository) == {
        "docker-hub/vllm/vllm-openai",
        "docker-hub/prom/prometheus",
        "ecr-public/neuron/pytorch-inference-vllm-neuronx",
    }
    (g6_role,) = by_repository["docker-hub/vllm/vllm-openai"]
    assert roles[g6_role]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "ec2.amazonaws.com"
    }
    (prometheus_role,) = by_repository["docker-hub/prom/prometheus"]
    execution = [
        t["Properties"]["ExecutionRoleArn"]
        for t in example.resources("AWS::ECS::TaskDefinition").values()
        if any(c["Name"] == "prometheus" for c in t["Properties"]["ContainerDefinitions"])
    ]
    assert execution == [{"Fn::GetAtt": [prometheus_role, "Arn"]}]  # Fargate pulls with the execution role


def test_whatever_pulls_through_the_cache_is_created_after_the_rules(example: Synth) -> None:
    rule_ids = set(example.resources("AWS::ECR::PullThroughCacheRule"))
    assert len(rule_ids) == 2
    pullers = {**example.resources("AWS::AutoScaling::AutoScalingGroup"), **example.resources("AWS::ECS::Service")}
    assert len(pullers) == 3  # both fleets' groups and the Prometheus service
    for lid, r in pullers.items():
        assert rule_ids <= set(r.get("DependsOn", [])), lid


def test_an_ecr_public_rule_without_credentials_and_the_neuron_fleet_pulls_through_it(example: Synth) -> None:
    """Issue 50, item 3: the Neuron image came from public.ecr.aws through the NAT gateway at every boot."""
    props = _rules(example).get("ecr-public", {}).get("Properties")
    assert props == {
        "EcrRepositoryPrefix": "ecr-public",
        "UpstreamRegistry": "ecr-public",
        "UpstreamRegistryUrl": "public.ecr.aws",
    }
    m = load_manifest(example.manifest_path, check_files=False)
    inf2 = m.fleet("inf2")
    text = next(t for lid, t in _user_data(example).items() if lid.startswith("Fleetinf2"))
    registry = f"<account>.dkr.ecr.{m.costs.region}.amazonaws.com"
    digest = inf2.serving.image.rsplit("@", 1)[1]
    assert f"{registry}/ecr-public/neuron/pytorch-inference-vllm-neuronx@{digest}" in DOCKER_PULL.findall(text)
    assert not [p for p in DOCKER_PULL.findall(text) if p.startswith("public.ecr.aws/")]
