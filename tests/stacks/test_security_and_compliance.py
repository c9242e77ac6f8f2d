from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from core.manifest import load_manifest
from tests.stacks.conftest import EXAMPLE_MANIFEST, Synth

# cfn-lint checks skipped, each for a stated reason:
CFN_LINT_IGNORED = {
    "W3010": "AZs are literal on purpose: the frozen manifest pins them (fleets[*].availability_zones)",
    "W3005": "CDK adds a DependsOn from an ECS service to its ALB target group that a Ref already implies; harmless",
}


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    tags = resource.get("Properties", {}).get("Tags")
    if isinstance(tags, dict):  # e.g. AWS::SSM::Parameter uses a map
        return {str(k): str(v) for k, v in tags.items()}
    return {t["Key"]: t["Value"] for t in tags or []}


def test_no_lambda_anywhere(example: Synth, three_fleets: Synth, compile_phase: Synth) -> None:
    for s in (example, three_fleets, compile_phase):
        types = {r["Type"] for r in s.template_json["Resources"].values()}
        assert "AWS::Lambda::Function" not in types
        assert "AWS::Lambda::LayerVersion" not in types
        assert not [t for t in types if t.startswith("Custom::") or t == "AWS::CloudFormation::CustomResource"]


def test_no_security_group_is_open_to_the_world(example: Synth) -> None:
    rules: list[dict[str, Any]] = [
        r["Properties"] for r in example.resources("AWS::EC2::SecurityGroupIngress").values()
    ]
    for sg in example.resources("AWS::EC2::SecurityGroup").values():
        rules += sg["Properties"].get("SecurityGroupIngress", [])
    assert rules
    for rule in rules:
        assert rule.get("CidrIp") != "0.0.0.0/0", rule
        assert rule.get("CidrIpv6") != "::/0", rule


def test_nothing_is_reachable_by_cidr_but_the_vpc_itself(example: Synth) -> None:
    """The Locust UI has no inbound rule at all (Session Manager port forward); the only CIDR
    rules left are the interface endpoints' HTTPS from the VPC."""
    cidr_rules = []
    for sg in example.resources("AWS::EC2::SecurityGroup").values():
        cidr_rules += [r for r in sg["Properties"].get("SecurityGroupIngress", []) if "CidrIp" in r]
    cidr_rules += [
        r["Properties"]
        for r in example.resources("AWS::EC2::SecurityGroupIngress").values()
        if "CidrIp" in r["Properties"]
    ]
    assert cidr_rules and all(r["CidrIp"] == "10.40.0.0/16" and r["FromPort"] == 443 for r in cidr_rules)
    loadgen_sgs = [
        sg
        for sg in example.resources("AWS::EC2::SecurityGroup").values()
        if "Locust master and workers" in sg["Properties"]["GroupDescription"]
    ]
    assert len(loadgen_sgs) == 1
    assert not [r for r in loadgen_sgs[0]["Properties"].get("SecurityGroupIngress", []) if "CidrIp" in r]


def test_buckets_survive_teardown_encrypted_private_versioned(example: Synth) -> None:
    buckets = example.resources("AWS::S3::Bucket")
    assert len(buckets) == 2
    for b in buckets.values():
        assert b["DeletionPolicy"] == "Retain" and b["UpdateReplacePolicy"] == "Retain"
        props = b["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert all(
            props["PublicAccessBlockConfiguration"][k]
            for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
        )
        assert props["VersioningConfiguration"]["Status"] == "Enabled"
        assert _tags(b)["lifecycle"] == "retained"
    assert sum("LoggingConfiguration" in b["Properties"] for b in buckets.values()) == 1
    policies = json.dumps(list(example.resources("AWS::S3::BucketPolicy").values()))
    assert '"aws:SecureTransport": "false"' in policies


def test_every_taggable_resource_carries_campaign_and_digest(example: Synth) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    tagged = [(k, r) for k, r in example.template_json["Resources"].items() if "Tags" in r.get("Properties", {})]
    assert len(tagged) > 30
    for logical_id, r in tagged:
        tags = _tags(r)
        assert tags.get("campaign") == m.campaign, logical_id
        assert tags.get("manifest-digest") == m.digest, logical_id
    fleet_scoped = ("AWS::AutoScaling::AutoScalingGroup", "AWS::ElasticLoadBalancingV2::TargetGroup")
    for cfn_type in fleet_scoped:
        assert {
            _tags(r).get("fleet")
            for r in example.resources(cfn_type).values()
            if r["Properties"].get("Protocol") != "HTTP"
        } == {"inf2", "g6"}
    for lt in example.resources("AWS::EC2::LaunchTemplate").values():
        specs = lt["Properties"]["LaunchTemplateData"]["TagSpecifications"]
        for spec in specs:  # instances and their volumes are tagged at launch, not after
            keys = {t["Key"] for t in spec["Tags"]}
            # The serving definition's digest, not the manifest's: a manifest edit that changes no
            # serving flag must not make a new template version (tests/stacks/test_fleet_updates.py);
            # instances get manifest-digest from their group's tags.
            assert {"campaign", "serving-digest", "fleet"} <= keys and "manifest-digest" not in keys


@pytest.mark.parametrize("which", ["example", "rehearsal"])
def test_cdk_nag_has_no_unacknowledged_findings(which: str, request: pytest.FixtureRequest) -> None:
    # Synth would have raised ValidationFailed; the report must also hold no warnings.
    s: Synth = request.getfixturevalue(which)
    report_path = s.outdir / "validation-report.json"
    if report_path.exists():
        report = json.loads(report_path.read_text(encoding="utf-8"))
        for plugin in report["pluginReports"]:
            assert plugin["violations"] == [], (plugin["pluginName"], plugin["violations"])


def test_cdk_nag_is_live(tmp_path: Any) -> None:
    """Negative control: the same wiring fails synth on an unencrypted, log-less bucket."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_s3 as s3

    from stacks.compliance import add_nag_checks

    app = App(outdir=str(tmp_path))
    s3.Bucket(Stack(app, "Bad"), "Bucket")
    add_nag_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text(encoding="utf-8"))
    rules = {v["ruleName"] for p in report["pluginReports"] for v in p["violations"]}
    assert {"AwsSolutions-S1", "AwsSolutions-S10"} <= rules


def test_every_nag_acknowledgment_has_a_reason(example: Synth) -> None:
    metadata = json.loads((example.outdir / "Comparison.metadata.json").read_text(encoding="utf-8"))
    acks = [e["data"] for entries in metadata.values() for e in entries if e["type"] == "aws:cdk:acknowledged-rules"]
    assert acks
    for ack in acks:
        for rule, reason in ack.items():
            assert isinstance(reason, str) and len(reason) >= 20, rule


@pytest.mark.parametrize("which", ["example", "three_fleets", "compile_phase", "rehearsal"])
def test_cfn_lint_clean(which: str, request: pytest.FixtureRequest) -> None:
    s: Synth = request.getfixturevalue(which)
    region = load_manifest(s.manifest_path).costs.region
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "cfn-lint"),
            "--format",
            "json",
            "--regions",
            region,
            "--ignore-checks",
            *CFN_LINT_IGNORED,
            "--",
            str(s.template_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=1)[:4000]
    assert proc.returncode == 0, proc.stderr
