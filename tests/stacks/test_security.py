"""Security checks over every synthesized template (both example manifests and one variant).

Each check is a plain function from a template dict to a list of violations, so it runs on the
synthesized templates (expecting none) and on small hand-made templates (expecting one): a
checker that cannot fail proves nothing.

The variant is the example manifest with a model-hub token secret ARN and another operator
CIDR: it proves the token only ever travels as a Secrets Manager ARN readable by the fleet
roles alone, and that the Locust UI session policy follows `operator.cidr`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from core.manifest import load_manifest
from stacks.network import VPC_CIDR
from tests.stacks.conftest import EXAMPLE_MANIFEST, REPO_ROOT, Synth, synthesize

Template = dict[str, Any]

# ---------------------------------------------------------------------------------------------
# Allowlists: every Allow on Resource "*" and every AWS-managed policy, each with its reason.
# A new entry in a template that is not listed here fails test_resource_star_grants_are_allowlisted.
# ---------------------------------------------------------------------------------------------
ACTIONS_ALLOWED_ON_STAR: dict[str, str] = {
    "ecr:GetAuthorizationToken": "ECR has no resource-level permission for the registry login token (fleet image pull, ECS execution roles)",
    "ec2:DescribeInstances": "Describe* calls have no resource-level permissions; Prometheus ec2_sd discovers fleet instances by tag, "
    "and Cloud Map's RegisterInstance needs it of the conductor (Cloud Map API permissions reference)",
    # The conductor's Cloud Map registrations: Cloud Map creates a service's Route 53 health check
    # with the caller's permission (Cloud Map API permissions reference, RegisterInstance).
    "route53:CreateHealthCheck": "Cloud Map's RegisterInstance requires it of the caller; CreateHealthCheck defines no resource type",
    "ec2:DescribeAvailabilityZones": "Describe* calls have no resource-level permissions; Prometheus ec2_sd labels targets by AZ",
    # Session Manager channels: the ssmmessages actions define no resource types (Service Authorization Reference,
    # https://docs.aws.amazon.com/service-authorization/latest/reference/list_ssmmessages.html).
    "ssmmessages:CreateControlChannel": "Session Manager: fleet hosts (instead of SSH) and ECS Exec in the loadgen tasks; no resource types",
    "ssmmessages:CreateDataChannel": "Session Manager: fleet hosts (instead of SSH) and ECS Exec in the loadgen tasks; no resource types",
    "ssmmessages:OpenControlChannel": "Session Manager: fleet hosts (instead of SSH) and ECS Exec in the loadgen tasks; no resource types",
    "ssmmessages:OpenDataChannel": "Session Manager: fleet hosts (instead of SSH) and ECS Exec in the loadgen tasks; no resource types",
    # Only with a cloudwatch:namespace condition naming the fleet's own namespaces (test_fleet_roles_are_scoped).
    "cloudwatch:PutMetricData": "PutMetricData defines no resource type; a cloudwatch:namespace condition scopes it to the fleet",
    # Only with servicediscovery:NamespaceName and servicediscovery:ServiceName conditions naming this
    # campaign's namespace and its fleets' master services (stacks/load_generator.py).
    "servicediscovery:DiscoverInstances": "a worker finds its step's master; the namespace and service-name condition keys scope it",
    # The conductor's (stacks/conductor.py) reads for readiness and the report: these actions define no
    # resource type (Service Authorization Reference: ELB v2, EC2 Auto Scaling, CloudWatch, Cost Explorer, Price List).
    "elasticloadbalancing:DescribeTargetGroups": "the conductor finds each fleet's target group by tag; no resource type",
    "elasticloadbalancing:DescribeTags": "the conductor reads the target groups' campaign and fleet tags; no resource type",
    "elasticloadbalancing:DescribeTargetHealth": "the conductor counts healthy targets (readiness, instances per step); no resource type",
    "autoscaling:DescribeAutoScalingGroups": "the conductor finds each fleet's group by tag (report, readiness evidence); no resource type",
    "autoscaling:DescribeScalingActivities": "the conductor reads launch activities (time to ready, a fleet never ready); no resource type",
    "cloudwatch:GetMetricData": "the conductor's report reads the fleets' CloudWatch figures; no resource type",
    "ce:GetCostAndUsage": "the conductor's report asks Cost Explorer what the campaign's tagged resources billed; no resource type",
    "pricing:GetProducts": "the conductor's report reads the Price List; no resource type",
    # Only with an ecs:cluster condition naming the campaign's cluster (tests/stacks/test_conductor.py).
    "ecs:ListTasks": "run --resume lists its tasks; no Fargate container instance to name, the ecs:cluster condition scopes it",
}
# No AWS-managed policy: AmazonSSMManagedInstanceCore grants ssm:GetParameter(s) on every parameter and
# CloudWatchAgentServerPolicy grants PutMetricData and log writes on '*'; the fleet roles carry inline,
# scoped statements instead.
AWS_MANAGED_POLICIES_ALLOWED: dict[str, str] = {}
POLICY_DOCUMENT_TYPES = (
    "AWS::IAM::Policy",
    "AWS::IAM::ManagedPolicy",
    "AWS::S3::BucketPolicy",
    "AWS::SQS::QueuePolicy",
    "AWS::SNS::TopicPolicy",
)

HUB_TOKEN_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:harness/hf-token-AbCdEf"
VARIANT_OPERATOR_CIDR = "198.51.100.0/24"
LOCUST_WEB_PORT = 8089

# Built by concatenation so this file itself never matches a repository secret scanner.
SECRET_PATTERNS: dict[str, re.Pattern[str]] = {
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    "AWS secret access key": re.compile(
        r"(?i)aws_secret_access_key|\baws.{0,20}secret.{0,20}[\"'=:\s][A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"
    ),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "private key": re.compile("-----BEGIN [A-Z ]*" + "PRIVATE KEY-----"),
    "password value": re.compile(r"(?i)\bpass(?:word|wd)\b[\"']?\s*[:=]\s*[\"']?[^\s\"',}{]+"),
}


# ---------------------------------------------------------------------------------------------
# Checkers
# ---------------------------------------------------------------------------------------------
def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _resources(template: Template, *types: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for logical_id, r in template.get("Resources", {}).items():
        if r.get("Type") in types:
            yield logical_id, r.get("Properties", {})


def policy_statements(template: Template) -> list[tuple[str, dict[str, Any]]]:
    """(logical id, statement) of every identity and resource policy (trust policies excluded)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for logical_id, props in _resources(template, *POLICY_DOCUMENT_TYPES):
        out += [(logical_id, s) for s in _as_list(props.get("PolicyDocument", {}).get("Statement"))]
    for logical_id, props in _resources(template, "AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group"):
        for inline in props.get("Policies", []):
            out += [
                (f"{logical_id}/{inline.get('PolicyName')}", s)
                for s in _as_list(inline["PolicyDocument"].get("Statement"))
            ]
    return out


def _is_wildcard_action(action: Any) -> bool:
    return isinstance(action, str) and (action == "*" or action.endswith(":*"))


def _is_public_principal(principal: Any) -> bool:
    return principal == "*" or (isinstance(principal, dict) and "*" in _as_list(principal.get("AWS")))


def iam_violations(template: Template) -> list[str]:
    """Allow statements: no '*'/'service:*' actions, no NotAction/NotResource, no public principal,
    and every action on Resource '*' allowlisted. Deny statements (the TLS-only bucket policies) are fine."""
    found: list[str] = []
    for where, st in policy_statements(template):
        if st.get("Effect") != "Allow":
            continue
        for key in ("NotAction", "NotResource", "NotPrincipal"):
            if key in st:
                found.append(f"{where}: Allow with {key} {st[key]!r}")
        actions = _as_list(st.get("Action"))
        found += [
            f"{where}: wildcard action {a!r} on {st.get('Resource')!r}" for a in actions if _is_wildcard_action(a)
        ]
        if "*" in _as_list(st.get("Resource")):
            found += [
                f"{where}: {a!r} on Resource '*' is not allowlisted"
                for a in actions
                if a not in ACTIONS_ALLOWED_ON_STAR
            ]
        if _is_public_principal(st.get("Principal")):
            found.append(f"{where}: Allow to a public principal {st['Principal']!r}")
    for logical_id, props in _resources(template, "AWS::IAM::Role"):
        for st in _as_list(props.get("AssumeRolePolicyDocument", {}).get("Statement")):
            if st.get("Effect") == "Allow" and _is_public_principal(st.get("Principal")):
                found.append(f"{logical_id}: trust policy lets anyone assume the role")
    return found


def star_grants(template: Template) -> set[str]:
    """Every action granted on Resource '*' (printed by the test, so a new one is visible)."""
    return {
        a
        for _, st in policy_statements(template)
        if st.get("Effect") == "Allow" and "*" in _as_list(st.get("Resource"))
        for a in _as_list(st.get("Action"))
    }


def _managed_policy_name(arn: Any) -> str | None:
    """`arn:${Partition}:iam::aws:policy/NAME` (literal or CDK's Fn::Join) -> NAME; None if customer-managed."""
    text = json.dumps(arn) if not isinstance(arn, str) else arn
    m = re.search(r":iam::aws:policy/([\w+=,.@/-]+)", text)
    return m.group(1).rsplit("/", 1)[-1] if m else None


def managed_policy_violations(template: Template) -> list[str]:
    found: list[str] = []
    for logical_id, props in _resources(template, "AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group"):
        for arn in props.get("ManagedPolicyArns", []):
            name = _managed_policy_name(arn)
            if name is None:
                if not (
                    isinstance(arn, dict) and "Ref" in arn
                ):  # a Ref is an AWS::IAM::ManagedPolicy of this template, checked above
                    found.append(f"{logical_id}: managed policy {arn!r} is neither AWS-managed nor from this template")
            elif name not in AWS_MANAGED_POLICIES_ALLOWED:
                found.append(f"{logical_id}: AWS-managed policy {name} is not allowlisted")
    return found


def secret_findings(text: str) -> list[str]:
    return [
        f"{label}: {m.group(0)[:24]}..." for label, pattern in SECRET_PATTERNS.items() for m in pattern.finditer(text)
    ]


def _ingress_rules(template: Template) -> list[tuple[str, dict[str, Any]]]:
    rules = [(lid, p) for lid, p in _resources(template, "AWS::EC2::SecurityGroupIngress")]
    for lid, p in _resources(template, "AWS::EC2::SecurityGroup"):
        rules += [(lid, r) for r in p.get("SecurityGroupIngress", [])]
    return rules


def open_ingress_violations(template: Template, allowed_cidrs: set[str]) -> list[str]:
    found: list[str] = []
    for lid, rule in _ingress_rules(template):
        if rule.get("CidrIp") == "0.0.0.0/0" or rule.get("CidrIpv6") == "::/0":
            found.append(f"{lid}: ingress open to the world {rule!r}")
        elif "CidrIpv6" in rule or ("CidrIp" in rule and rule["CidrIp"] not in allowed_cidrs):
            found.append(
                f"{lid}: ingress from {rule.get('CidrIp') or rule.get('CidrIpv6')} is neither the operator nor the VPC CIDR"
            )
    return found


def imds_violations(template: Template) -> list[str]:
    found: list[str] = []
    for lid, p in _resources(template, "AWS::EC2::LaunchTemplate"):
        if p.get("LaunchTemplateData", {}).get("MetadataOptions", {}).get("HttpTokens") != "required":
            found.append(f"{lid}: launch template without IMDSv2 (HttpTokens: required)")
    for lid, p in _resources(template, "AWS::AutoScaling::LaunchConfiguration"):
        if p.get("MetadataOptions", {}).get("HttpTokens") != "required":
            found.append(f"{lid}: launch configuration without IMDSv2")
    for lid, p in _resources(template, "AWS::EC2::Instance"):
        if "LaunchTemplate" not in p:  # instance metadata options can only be set through a launch template
            found.append(f"{lid}: instance without a launch template cannot require IMDSv2")
    return found


def _encrypted(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def _mapping_violations(lid: str, mappings: list[dict[str, Any]]) -> list[str]:
    if not mappings:
        return [f"{lid}: no block device mappings (the AMI's root volume settings would apply unchecked)"]
    return [
        f"{lid}: unencrypted EBS volume {m.get('DeviceName')}"
        for m in mappings
        if "Ebs" in m and not _encrypted(m["Ebs"].get("Encrypted"))
    ]


def encryption_violations(template: Template) -> list[str]:
    found: list[str] = []
    for lid, p in _resources(template, "AWS::EC2::LaunchTemplate"):
        found += _mapping_violations(lid, p.get("LaunchTemplateData", {}).get("BlockDeviceMappings", []))
    for lid, p in _resources(template, "AWS::AutoScaling::LaunchConfiguration"):
        found += _mapping_violations(lid, p.get("BlockDeviceMappings", []))
    for lid, p in _resources(template, "AWS::EC2::Instance"):
        if "BlockDeviceMappings" in p:
            found += _mapping_violations(lid, p["BlockDeviceMappings"])
    for lid, p in _resources(template, "AWS::EC2::Volume", "AWS::EFS::FileSystem"):
        if not _encrypted(p.get("Encrypted")):
            found.append(f"{lid}: not encrypted at rest")
    for lid, p in _resources(template, "AWS::S3::Bucket"):
        rules = p.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
        algos = {r.get("ServerSideEncryptionByDefault", {}).get("SSEAlgorithm") for r in rules}
        if not rules or not algos <= {"AES256", "aws:kms", "aws:kms:dsse"}:
            found.append(f"{lid}: bucket without default encryption")
    for lid, p in _resources(template, "AWS::Logs::LogGroup"):
        # CloudWatch Logs always encrypts at rest; where a KMS key is named it must be a real reference.
        if "KmsKeyId" in p and not p["KmsKeyId"]:
            found.append(f"{lid}: empty KmsKeyId")
    return found


def _bucket_arn_refs(resources: list[Any], bucket_id: str) -> set[str]:
    text = {json.dumps(r, sort_keys=True) for r in resources}
    arn = json.dumps({"Fn::GetAtt": [bucket_id, "Arn"]}, sort_keys=True)
    objects = json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, "/*"]]}, sort_keys=True)
    return {name for name, t in (("bucket", arn), ("objects", objects)) if t in text}


def s3_violations(template: Template) -> list[str]:
    found: list[str] = []
    policies: dict[str, list[dict[str, Any]]] = {}
    for _, p in _resources(template, "AWS::S3::BucketPolicy"):
        ref = p.get("Bucket", {}).get("Ref") if isinstance(p.get("Bucket"), dict) else None
        policies.setdefault(str(ref), []).extend(_as_list(p.get("PolicyDocument", {}).get("Statement")))
    for lid, p in _resources(template, "AWS::S3::Bucket"):
        block = p.get("PublicAccessBlockConfiguration", {})
        missing = [
            k
            for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
            if not _encrypted(block.get(k))
        ]
        if missing:
            found.append(f"{lid}: public access not blocked ({', '.join(missing)})")
        tls_denies = [
            st
            for st in policies.get(lid, [])
            if st.get("Effect") == "Deny"
            and _is_public_principal(st.get("Principal"))
            and "s3:*" in _as_list(st.get("Action"))
            and str(st.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")).lower() == "false"
            and _bucket_arn_refs(_as_list(st.get("Resource")), lid) == {"bucket", "objects"}
        ]
        if not tls_denies:
            found.append(
                f"{lid}: no bucket policy denying s3:* on the bucket and its objects when aws:SecureTransport is false"
            )
    return found


# ---------------------------------------------------------------------------------------------
# Fixtures: the session synths from conftest, plus one variant synthesized once for this module
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The example manifest with a hub-token secret ARN and another operator CIDR (the image
    bakes no manifest, so the variant can live anywhere)."""
    root = tmp_path_factory.mktemp("variant-root")
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str(load_manifest(EXAMPLE_MANIFEST).trace_path)
    data["model"]["hub_token_secret_arn"] = HUB_TOKEN_ARN
    data["operator"]["cidr"] = VARIANT_OPERATOR_CIDR
    path = root / EXAMPLE_MANIFEST.name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return synthesize(path, tmp_path_factory.mktemp("variant") / "cdk.out")


SYNTHS = ["example", "three_fleets", "variant"]


def _synth(request: pytest.FixtureRequest, which: str) -> Synth:
    s: Synth = request.getfixturevalue(which)
    return s


# ---------------------------------------------------------------------------------------------
# Checks on every synthesized template
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", SYNTHS)
def test_iam_is_least_privilege(which: str, request: pytest.FixtureRequest) -> None:
    t = _synth(request, which).template_json
    assert len(policy_statements(t)) > 10  # the walk really sees the policies
    assert iam_violations(t) == []
    assert managed_policy_violations(t) == []


def test_resource_star_grants_are_allowlisted(example: Synth, three_fleets: Synth, variant: Synth) -> None:
    per_template = {
        s.manifest_path.name + ("(variant)" if s is variant else ""): star_grants(s.template_json)
        for s in (example, three_fleets, variant)
    }
    print("Allow on Resource '*':", json.dumps({k: sorted(v) for k, v in per_template.items()}, indent=1))
    granted = set().union(*per_template.values())
    assert granted <= set(ACTIONS_ALLOWED_ON_STAR), (
        f"new Resource '*' grants: {sorted(granted - set(ACTIONS_ALLOWED_ON_STAR))}"
    )
    # The allowlist stays minimal: an entry no template needs any more is removed.
    assert set(ACTIONS_ALLOWED_ON_STAR) <= granted, (
        f"stale allowlist entries: {sorted(set(ACTIONS_ALLOWED_ON_STAR) - granted)}"
    )
    assert all(
        len(reason) >= 20 for reason in (*ACTIONS_ALLOWED_ON_STAR.values(), *AWS_MANAGED_POLICIES_ALLOWED.values())
    )


@pytest.mark.parametrize("which", SYNTHS)
def test_no_secrets_in_templates(which: str, request: pytest.FixtureRequest) -> None:
    s = _synth(request, which)
    templates = sorted(s.outdir.glob("*.template.json"))
    assert s.template_path in templates
    for path in templates:
        assert secret_findings(path.read_text(encoding="utf-8")) == [], path
    assert secret_findings(s.manifest_path.read_text(encoding="utf-8")) == []


def test_no_secrets_in_manifests() -> None:
    manifests = sorted((REPO_ROOT / "manifests").glob("*.y*ml"))
    assert len(manifests) >= 2
    for path in manifests:
        assert secret_findings(path.read_text(encoding="utf-8")) == [], path


def test_hub_token_travels_only_as_a_secret_arn_readable_by_the_fleets(example: Synth, variant: Synth) -> None:
    t = variant.template_json
    assert HUB_TOKEN_ARN in json.dumps(t)  # user data reads it at boot; the value itself is never in the template
    reads = [
        (lid, st)
        for lid, st in policy_statements(t)
        if any(str(a).startswith("secretsmanager:") for a in _as_list(st.get("Action")))
    ]
    assert len(reads) == len(load_manifest(variant.manifest_path).fleets)
    resources = t["Resources"]
    for lid, st in reads:
        assert st["Effect"] == "Allow" and st["Action"] == "secretsmanager:GetSecretValue"
        assert st["Resource"] == HUB_TOKEN_ARN  # exactly that ARN: not '*', not a wildcard
        roles = [resources[r["Ref"]] for r in resources[lid]["Properties"]["Roles"]]
        assert roles and all(
            role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
            == {"Service": "ec2.amazonaws.com"}
            for role in roles
        ), "only the fleet instance roles may read the token"
    user_data = json.dumps(
        [
            lt["Properties"]["LaunchTemplateData"]["UserData"]
            for lt in variant.resources("AWS::EC2::LaunchTemplate").values()
        ]
    )
    assert user_data.count(f"get-secret-value --region us-east-1 --secret-id {HUB_TOKEN_ARN}") == len(reads)
    # Without a token in the manifest nothing may touch Secrets Manager.
    assert "secretsmanager" not in json.dumps([st for _, st in policy_statements(example.template_json)])


@pytest.mark.parametrize("which", SYNTHS)
def test_no_ingress_open_to_the_world(which: str, request: pytest.FixtureRequest) -> None:
    s = _synth(request, which)
    t = s.template_json
    assert _ingress_rules(t)
    assert open_ingress_violations(t, {load_manifest(s.manifest_path).operator.cidr, VPC_CIDR}) == []


def _operator_policy_cidrs(s: Synth) -> set[str]:
    cidrs: set[str] = set()
    for _, props in _resources(s.template_json, "AWS::IAM::ManagedPolicy"):
        for st in _as_list(props["PolicyDocument"]["Statement"]):
            cond = st.get("Condition", {}).get("IpAddress", {}).get("aws:SourceIp")
            if cond is not None:
                assert {"ecs:ExecuteCommand", "ssm:StartSession"} & set(_as_list(st["Action"])), st
                cidrs.add(cond)
    return cidrs


def test_locust_ui_has_no_network_path_and_its_session_follows_the_operator_cidr(
    example: Synth, variant: Synth
) -> None:
    for s in (example, variant):
        # No load balancer in front of the UI, no rule that lets anything reach port 8089.
        albs = [
            p
            for _, p in _resources(s.template_json, "AWS::ElasticLoadBalancingV2::LoadBalancer")
            if p.get("Type") != "network"
        ]
        assert albs == []
        assert [
            r
            for _, r in _ingress_rules(s.template_json)
            if r.get("FromPort", -1) <= LOCUST_WEB_PORT <= r.get("ToPort", -1)
        ] == []
        (master,) = [
            c
            for _, t in _resources(s.template_json, "AWS::ECS::TaskDefinition")
            for c in t["ContainerDefinitions"]
            if {"Name": "HARNESS_LOADGEN_ROLE", "Value": "master"} in c["Environment"]
        ]
        assert {"Name": "LOCUST_WEB_HOST", "Value": "127.0.0.1"} in master["Environment"]
    # The port-forward session may only be opened from the manifest's operator range.
    assert _operator_policy_cidrs(example) == {load_manifest(EXAMPLE_MANIFEST).operator.cidr}
    assert _operator_policy_cidrs(variant) == {VARIANT_OPERATOR_CIDR}
    assert load_manifest(EXAMPLE_MANIFEST).operator.cidr not in json.dumps(variant.template_json)


@pytest.mark.parametrize("which", SYNTHS)
def test_imdsv2_required_on_every_launch_template(which: str, request: pytest.FixtureRequest) -> None:
    s = _synth(request, which)
    assert len(s.resources("AWS::EC2::LaunchTemplate")) == len(load_manifest(s.manifest_path).fleets)
    assert imds_violations(s.template_json) == []


@pytest.mark.parametrize("which", SYNTHS)
def test_encryption_at_rest_everywhere(which: str, request: pytest.FixtureRequest) -> None:
    s = _synth(request, which)
    for lt in s.resources("AWS::EC2::LaunchTemplate").values():
        assert len(lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]) == 2  # root + cache, both checked
    assert s.resources("AWS::S3::Bucket") and s.resources("AWS::Logs::LogGroup")
    assert encryption_violations(s.template_json) == []


@pytest.mark.parametrize("which", SYNTHS)
def test_buckets_block_public_access_and_enforce_tls(which: str, request: pytest.FixtureRequest) -> None:
    s = _synth(request, which)
    assert len(s.resources("AWS::S3::Bucket")) == 2
    assert s3_violations(s.template_json) == []


# ---------------------------------------------------------------------------------------------
# Negative controls: every checker flags a hand-made violation
# ---------------------------------------------------------------------------------------------
def _tpl(*resources: tuple[str, str, dict[str, Any]]) -> Template:
    return {"Resources": {lid: {"Type": t, "Properties": p} for lid, t, p in resources}}


def _policy(*statements: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    return (
        "P",
        "AWS::IAM::Policy",
        {"PolicyDocument": {"Version": "2012-10-17", "Statement": list(statements)}, "Roles": [{"Ref": "R"}]},
    )


@pytest.mark.parametrize(
    "statement, expect",
    [
        ({"Effect": "Allow", "Action": "*", "Resource": "*"}, "wildcard action"),
        ({"Effect": "Allow", "Action": ["s3:GetObject", "s3:*"], "Resource": "*"}, "wildcard action"),
        ({"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*"}, "not allowlisted"),
        ({"Effect": "Allow", "NotAction": "iam:*", "Resource": "arn:aws:s3:::b"}, "NotAction"),
        (
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*", "Principal": {"AWS": "*"}},
            "public principal",
        ),
    ],
)
def test_iam_checker_flags(statement: dict[str, Any], expect: str) -> None:
    found = iam_violations(_tpl(_policy(statement)))
    assert found and expect in found[0]
    inline = _tpl(
        (
            "R",
            "AWS::IAM::Role",
            {
                "AssumeRolePolicyDocument": {"Statement": []},
                "Policies": [{"PolicyName": "x", "PolicyDocument": {"Statement": [statement]}}],
            },
        )
    )
    assert iam_violations(inline)
    managed = _tpl(("M", "AWS::IAM::ManagedPolicy", {"PolicyDocument": {"Statement": [statement]}}))
    assert iam_violations(managed)


def test_iam_checker_accepts_deny_and_allowlisted_star() -> None:
    ok = _tpl(
        _policy(
            {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
            {"Effect": "Deny", "Action": "s3:*", "Resource": "*", "Principal": {"AWS": "*"}},
        )
    )
    assert iam_violations(ok) == []
    assert star_grants(ok) == {"ecr:GetAuthorizationToken"}


def test_iam_checker_flags_an_open_trust_policy_and_unlisted_managed_policy() -> None:
    role = {
        "AssumeRolePolicyDocument": {
            "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": "*"}}]
        },
        "ManagedPolicyArns": [
            {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/AdministratorAccess"]]}
        ],
    }
    t = _tpl(("R", "AWS::IAM::Role", role))
    assert iam_violations(t) == ["R: trust policy lets anyone assume the role"]
    assert managed_policy_violations(t) == ["R: AWS-managed policy AdministratorAccess is not allowlisted"]
    # The fleet roles used to carry these two; neither is allowed any more (wildcard grants).
    role["ManagedPolicyArns"] = [
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
        "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy",
    ]
    assert managed_policy_violations(t) == [
        "R: AWS-managed policy AmazonSSMManagedInstanceCore is not allowlisted",
        "R: AWS-managed policy CloudWatchAgentServerPolicy is not allowlisted",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "AKIA" + "ABCDEFGHIJKLMNOP",
        '{"Value": "ASIA' + 'ABCDEFGHIJKLMNOP"}',
        "aws_secret_access_key" + " = x",
        "token: hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7",
        "-----BEGIN RSA " + "PRIVATE KEY-----\nMII...",
        "-----BEGIN " + "PRIVATE KEY-----",
        "db:\n  password: hunter2",
        '{"Password": "hunter2"}',
    ],
)
def test_secret_scanner_flags(text: str) -> None:
    assert secret_findings(text)


def test_secret_scanner_ignores_arns_and_password_stdin() -> None:
    assert (
        secret_findings(
            f"docker login --username AWS --password-stdin x; aws secretsmanager get-secret-value --secret-id {HUB_TOKEN_ARN}"
        )
        == []
    )


def test_ingress_checker_flags() -> None:
    allowed = {"203.0.113.0/24", VPC_CIDR}
    world = _tpl(
        (
            "SG",
            "AWS::EC2::SecurityGroup",
            {"SecurityGroupIngress": [{"CidrIp": "0.0.0.0/0", "FromPort": 8089, "ToPort": 8089}]},
        )
    )
    world6 = _tpl(
        ("I", "AWS::EC2::SecurityGroupIngress", {"CidrIpv6": "::/0", "FromPort": 8089, "ToPort": 8089, "GroupId": "sg"})
    )
    other = _tpl(
        (
            "I",
            "AWS::EC2::SecurityGroupIngress",
            {"CidrIp": "192.0.2.0/24", "FromPort": 8089, "ToPort": 8089, "GroupId": "sg"},
        )
    )
    fine = _tpl(
        (
            "I",
            "AWS::EC2::SecurityGroupIngress",
            {"CidrIp": "203.0.113.0/24", "FromPort": 8089, "ToPort": 8089, "GroupId": "sg"},
        )
    )
    assert "open to the world" in open_ingress_violations(world, allowed)[0]
    assert "open to the world" in open_ingress_violations(world6, allowed)[0]
    assert open_ingress_violations(other, allowed)
    assert open_ingress_violations(fine, allowed) == []


def test_imds_checker_flags() -> None:
    assert imds_violations(
        _tpl(
            ("LT", "AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {"MetadataOptions": {"HttpTokens": "optional"}}})
        )
    )
    assert imds_violations(_tpl(("LT", "AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {}})))
    assert imds_violations(_tpl(("LC", "AWS::AutoScaling::LaunchConfiguration", {})))
    assert imds_violations(_tpl(("I", "AWS::EC2::Instance", {"ImageId": "ami-1"})))
    assert (
        imds_violations(
            _tpl(
                (
                    "LT",
                    "AWS::EC2::LaunchTemplate",
                    {"LaunchTemplateData": {"MetadataOptions": {"HttpTokens": "required"}}},
                )
            )
        )
        == []
    )


@pytest.mark.parametrize(
    "resource",
    [
        (
            "LT",
            "AWS::EC2::LaunchTemplate",
            {"LaunchTemplateData": {"BlockDeviceMappings": [{"DeviceName": "/dev/sdf", "Ebs": {"VolumeSize": 10}}]}},
        ),
        ("LT", "AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {}}),
        ("V", "AWS::EC2::Volume", {"Size": 10, "Encrypted": False}),
        ("F", "AWS::EFS::FileSystem", {}),
        ("B", "AWS::S3::Bucket", {}),
        ("L", "AWS::Logs::LogGroup", {"KmsKeyId": ""}),
    ],
)
def test_encryption_checker_flags(resource: tuple[str, str, dict[str, Any]]) -> None:
    assert encryption_violations(_tpl(resource))


def test_s3_checker_flags_public_and_plain_http_buckets() -> None:
    bucket: dict[str, Any] = {
        "BucketEncryption": {
            "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
        },
        "PublicAccessBlockConfiguration": {
            k: True for k in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
        },
    }
    deny: dict[str, Any] = {
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "s3:*",
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        "Resource": [{"Fn::GetAtt": ["B", "Arn"]}, {"Fn::Join": ["", [{"Fn::GetAtt": ["B", "Arn"]}, "/*"]]}],
    }
    policy = ("BP", "AWS::S3::BucketPolicy", {"Bucket": {"Ref": "B"}, "PolicyDocument": {"Statement": [deny]}})
    assert s3_violations(_tpl(("B", "AWS::S3::Bucket", bucket), policy)) == []
    assert encryption_violations(_tpl(("B", "AWS::S3::Bucket", bucket))) == []
    assert "no bucket policy" in s3_violations(_tpl(("B", "AWS::S3::Bucket", bucket)))[0]  # TLS not enforced
    public = {**bucket, "PublicAccessBlockConfiguration": {"BlockPublicAcls": True}}
    assert "public access not blocked" in s3_violations(_tpl(("B", "AWS::S3::Bucket", public), policy))[0]
    objects_only = {**deny, "Resource": deny["Resource"][1:]}
    partial = ("BP", "AWS::S3::BucketPolicy", {"Bucket": {"Ref": "B"}, "PolicyDocument": {"Statement": [objects_only]}})
    assert s3_violations(_tpl(("B", "AWS::S3::Bucket", bucket), partial))


def test_checkers_see_a_bad_resource_inside_a_real_template(example: Synth) -> None:
    """A violation injected into the real synthesized template is caught next to everything else."""
    t = json.loads(json.dumps(example.template_json))
    lt_id = next(k for k, r in t["Resources"].items() if r["Type"] == "AWS::EC2::LaunchTemplate")
    data = t["Resources"][lt_id]["Properties"]["LaunchTemplateData"]
    data["MetadataOptions"]["HttpTokens"] = "optional"
    data["BlockDeviceMappings"][1]["Ebs"]["Encrypted"] = False
    sg_id = next(k for k, r in t["Resources"].items() if r["Type"] == "AWS::EC2::SecurityGroup")
    t["Resources"][sg_id]["Properties"].setdefault("SecurityGroupIngress", []).append(
        {"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 8089}
    )
    pol_id = next(k for k, r in t["Resources"].items() if r["Type"] == "AWS::IAM::Policy")
    t["Resources"][pol_id]["Properties"]["PolicyDocument"]["Statement"].append(
        {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    )
    assert [v for v in imds_violations(t) if lt_id in v]
    assert [v for v in encryption_violations(t) if lt_id in v]
    assert [v for v in open_ingress_violations(t, {"203.0.113.0/24", VPC_CIDR}) if sg_id in v]
    assert [v for v in iam_violations(t) if pol_id in v]
