"""Fleet-side security on the synthesized example template: each check fails on the old stacks.

Fleet roles carry scoped inline statements instead of AmazonSSMManagedInstanceCore (ssm:GetParameter
on every parameter) and CloudWatchAgentServerPolicy (metrics and log writes on '*'), so one fleet
can neither read other parameters nor forge the other fleet's metrics or logs.
"""

from __future__ import annotations

import json
from typing import Any

from core.images import PROMETHEUS_IMAGE
from core.manifest import load_manifest
from stacks.accelerator_telemetry import cloudwatch_namespace, neuron_namespace
from stacks.results import NONCURRENT_RESULTS_DAYS
from tests.stacks.conftest import Synth


def _as_list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else [v]


def _fleet_role_ids(example: Synth) -> dict[str, str]:
    roles = example.resources("AWS::IAM::Role")
    out = {}
    for lid, r in roles.items():
        principal = r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
        if principal.get("Service") == "ec2.amazonaws.com":
            out[next(t["Value"] for t in r["Properties"]["Tags"] if t["Key"] == "fleet")] = lid
    return out


def _statements_of(example: Synth, role_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in example.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in p["Properties"]["Roles"]:
            out += _as_list(p["Properties"]["PolicyDocument"]["Statement"])
    return out


def test_fleet_roles_are_scoped(example: Synth) -> None:
    m = load_manifest(example.manifest_path, check_files=False)
    roles = _fleet_role_ids(example)
    assert set(roles) == {"inf2", "g6"}
    all_roles = example.resources("AWS::IAM::Role")
    for fleet, role_id in roles.items():
        assert "ManagedPolicyArns" not in all_roles[role_id]["Properties"], f"{fleet}: AWS-managed policy attached"
        statements = _statements_of(example, role_id)
        expected_ns = {cloudwatch_namespace(m.campaign, fleet)} | (
            {neuron_namespace(m.campaign, fleet)} if fleet == "inf2" else set()
        )
        for st in statements:
            actions = set(_as_list(st["Action"]))
            text = json.dumps(st)
            if "cloudwatch:PutMetricData" in actions:
                assert set(_as_list(st["Condition"]["StringEquals"]["cloudwatch:namespace"])) == expected_ns
            if any(a.startswith("logs:") for a in actions):
                own_group = next(
                    k for k in example.resources("AWS::Logs::LogGroup") if k.startswith(f"Fleet{fleet}Logs")
                )
                assert st["Resource"] != "*" and own_group in text
                assert not (actions - {"logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"})
            if any(a.startswith("ssm:GetParameter") for a in actions):
                assert st["Resource"] != "*" and f"Fleet{fleet}" in text  # only the fleet's own config parameters
        session = {a for st in statements for a in _as_list(st["Action"]) if a.startswith(("ssm:", "ssmmessages:"))}
        assert {
            "ssm:UpdateInstanceInformation",
            "ssmmessages:OpenDataChannel",
            "ssmmessages:CreateControlChannel",
        } <= session


def test_flow_log_delivery_is_allowed_explicitly(example: Synth) -> None:
    flow = next(iter(example.resources("AWS::EC2::FlowLog").values()))["Properties"]
    bucket_id = flow["LogDestination"]["Fn::Join"][1][0]["Fn::GetAtt"][
        0
    ]  # {"Fn::Join": ["", [{"Fn::GetAtt": [ID, "Arn"]}, "/vpc-flow-logs/"]]}
    policy = next(
        p
        for p in example.resources("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": bucket_id}
    )
    statements = {st.get("Sid"): st for st in policy["Properties"]["PolicyDocument"]["Statement"]}
    write = statements["FlowLogDeliveryWrite"]
    assert write["Principal"] == {"Service": "delivery.logs.amazonaws.com"} and write["Action"] == "s3:PutObject"
    assert "vpc-flow-logs/AWSLogs/" in json.dumps(write["Resource"])
    assert write["Condition"]["StringEquals"]["s3:x-amz-acl"] == "bucket-owner-full-control"
    assert write["Condition"]["StringEquals"]["aws:SourceAccount"] == {"Ref": "AWS::AccountId"}
    assert set(_as_list(statements["FlowLogDeliveryAclCheck"]["Action"])) == {"s3:GetBucketAcl", "s3:ListBucket"}


def test_results_bucket_expires_noncurrent_versions(example: Synth) -> None:
    results = next(
        r for k, r in example.resources("AWS::S3::Bucket").items() if k.startswith("Results") and "AccessLogs" not in k
    )
    assert results["Properties"]["VersioningConfiguration"]["Status"] == "Enabled"
    rules = results["Properties"]["LifecycleConfiguration"]["Rules"]
    assert [r["NoncurrentVersionExpiration"]["NoncurrentDays"] for r in rules] == [NONCURRENT_RESULTS_DAYS]
    assert all("ExpirationInDays" not in r for r in rules)  # the current evidence never expires


def test_prometheus_image_comes_through_the_docker_hub_cache_at_its_pinned_release(example: Synth) -> None:
    # Fargate cannot pull a tag first, so the task names the pinned tag in the cache (stacks/observability.py).
    images = [
        c["Image"]
        for t in example.resources("AWS::ECS::TaskDefinition").values()
        for c in t["Properties"]["ContainerDefinitions"]
        if c["Name"] == "prometheus"
    ]
    region = load_manifest(example.manifest_path, check_files=False).costs.region
    assert images == [
        {
            "Fn::Join": [
                "",
                [{"Ref": "AWS::AccountId"}, f".dkr.ecr.{region}.amazonaws.com/docker-hub/prom/prometheus:v3.5.0"],
            ]
        }
    ]
    assert "@sha256:" in PROMETHEUS_IMAGE and PROMETHEUS_IMAGE.startswith("prom/prometheus:v3.5.0@")


def test_template_user_data_is_the_boot_script_the_boot_tests_run(example: Synth) -> None:
    # tests/boot runs boot_script(...) in a sandbox; this ties that script to the synthesized launch templates.
    from core.serving import definition_digest, definition_for
    from stacks.fleet_boot import boot_definition, boot_script

    m = load_manifest(example.manifest_path, check_files=False)
    account = "123456789012"
    registry = f"{account}.dkr.ecr.{m.costs.region}.amazonaws.com"
    params = {lid: r["Properties"]["Name"] for lid, r in example.resources("AWS::SSM::Parameter").items()}
    for lt in example.resources("AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        # The Refs are the fleet's SSM parameters, the results bucket (its name, in the compiled/ URI)
        # and the account (in the Docker Hub cache's registry).
        names = {
            **params,
            **{lid: "results-bucket" for lid in example.resources("AWS::S3::Bucket")},
            "AWS::AccountId": account,
        }
        text = "".join(p if isinstance(p, str) else names[p["Ref"]] for p in parts)
        fleet = next(f for f in m.fleets if f"/{f.name}/cloudwatch-agent" in text)
        neuron = fleet.name == "inf2"
        boot_defn, cached = boot_definition(
            m, fleet, weights_s3_uri=None, cache_registry=registry, region=m.costs.region
        )
        # A token at synth (parameter names, the account) made shlex.quote quote the word: the same in bash.
        for word in [*params.values(), *([cached.pinned, cached.by_tag or ""] if cached else [])]:
            text = text.replace(f"'{word}'", word)
        defn = definition_for(m, fleet)
        expected = boot_script(
            boot_defn,
            campaign=m.campaign,
            serving_digest=definition_digest(defn),
            cached=cached,
            driver_version=fleet.serving.driver_version,
            region=m.costs.region,
            agent_param=f"/harness/{m.campaign}/{fleet.name}/cloudwatch-agent",
            neuron_monitor_param=f"/harness/{m.campaign}/{fleet.name}/neuron-monitor" if neuron else None,
            neuron_namespace=neuron_namespace(m.campaign, fleet.name),
            compiled_uri="s3://results-bucket/compiled" if neuron else None,
        )
        assert text == "#!/bin/bash\n" + "\n".join(expected)


def test_prometheus_scrapes_each_stack_at_its_own_metrics_path(example: Synth) -> None:
    from types import SimpleNamespace

    from core.serving import definition_for
    from stacks.observability import prometheus_config

    m = load_manifest(example.manifest_path, check_files=False)
    g6 = m.fleet("g6")
    trt = g6.model_copy(update={"name": "g6trt", "serving": g6.serving.model_copy(update={"stack": "tensorrt-llm"})})
    fleets = [SimpleNamespace(fleet=f, definition=definition_for(m, f)) for f in (m.fleet("inf2"), trt)]
    config = prometheus_config(manifest=m, fleets=fleets, namespace="ns", region="us-east-1", remote_write_url="u")  # type: ignore[arg-type]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["serving-inf2"]["metrics_path"] == "/metrics"
    assert jobs["serving-g6trt"]["metrics_path"] == "/prometheus/metrics"


def test_neuron_instances_share_compiled_artifacts_under_their_own_key_only(example: Synth) -> None:
    """inf2's role reads and writes only the results bucket's compiled/<inf2's key>/ (fetch or publish
    what that fleet compiles) and lists only that prefix; not all of compiled/, so it can neither load
    nor overwrite another fleet's sets. g6 compiles nothing to share and gets nothing."""
    from core.serving import definition_for

    m = load_manifest(example.manifest_path, check_files=False)
    roles = _fleet_role_ids(example)
    results_id = next(
        k for k in example.resources("AWS::S3::Bucket") if k.startswith("Results") and "AccessLogs" not in k
    )
    for fleet, role_id in roles.items():
        shared = [st for st in _statements_of(example, role_id) if "compiled" in json.dumps(st)]
        if fleet == "g6":
            assert not shared
            continue
        compiled = definition_for(m, m.fleet(fleet)).compiled
        assert compiled is not None
        by_actions = {tuple(sorted(_as_list(st["Action"]))): st for st in shared}
        assert set(by_actions) == {("s3:GetObject", "s3:PutObject"), ("s3:ListBucket",)}
        rw = json.dumps(by_actions[("s3:GetObject", "s3:PutObject")]["Resource"])
        assert results_id in rw and f'"/compiled/{compiled.key}/*"' in rw
        listing = by_actions[("s3:ListBucket",)]
        assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"compiled/{compiled.key}/*"]}}
        assert not any("s3:DeleteObject" in _as_list(st["Action"]) for st in _statements_of(example, role_id))
    user_data = json.dumps(example.resources("AWS::EC2::LaunchTemplate"))
    assert user_data.count("/compiled") >= 1 and "compiled artifacts fetched from" in user_data
