"""testing.cloud_offline.enforce_roles over a small recorded run (no campaign): each call is
evaluated against its caller's policies (a role of the template, by its access key, or the
operator's published minimum), the stand-ins' calls are not, and one denial fails the run naming
the role, the action and the resource; a run whose operator recorded nothing fails too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testing.cloud_offline import IAM_DIR, OPERATOR, STAND_IN_KEY, denied_without, enforce_roles

BUCKET = "offline-comparison-results-stand-in"
ACCOUNT, REGION = "123456789012", "us-east-1"
ROLE = "WorkerTaskRoleC535C8C7"
TEMPLATE: dict[str, Any] = {
    "Resources": {
        "Results6A1CEFEC": {"Type": "AWS::S3::Bucket", "Properties": {}},
        ROLE: {"Type": "AWS::IAM::Role", "Properties": {}},
        "WorkerPolicy": {
            "Type": "AWS::IAM::Policy",
            "Properties": {
                "Roles": [{"Ref": ROLE}],
                "PolicyDocument": {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": "s3:GetObject",
                            "Resource": {
                                "Fn::Join": ["", [{"Fn::GetAtt": ["Results6A1CEFEC", "Arn"]}, "/runs/*/inputs/*"]]
                            },
                        },
                        {
                            "Effect": "Allow",
                            "Action": "s3:PutObject",
                            "Resource": {
                                "Fn::Join": ["", [{"Fn::GetAtt": ["Results6A1CEFEC", "Arn"]}, "/runs/*/records-*"]]
                            },
                        },
                    ],
                },
            },
        },
    },
    "Outputs": {"ResultsBucketName": {"Value": {"Ref": "Results6A1CEFEC"}}},
}


def _recorded(out: Path, calls: list[tuple[str, str, str, dict[str, Any]]]) -> Path:
    (out / "cdk.out").mkdir(parents=True)
    (out / "cdk.out" / "Comparison.template.json").write_text(json.dumps(TEMPLATE), encoding="utf-8")
    (out / IAM_DIR / "calls").mkdir(parents=True)
    bindings = {
        "account": ACCOUNT,
        "region": REGION,
        "stack_name": "c-comparison",
        "stack_id": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/c-comparison/1",
        "bucket": BUCKET,
        "cluster": "cluster",
        "namespace": "c.harness.internal",
        "namespace_arn": f"arn:aws:servicediscovery:{REGION}:{ACCOUNT}:namespace/ns-1",
        "hosted_zone": "Z1",
        "services": {},
        "workspace_arn": f"arn:aws:aps:{REGION}:{ACCOUNT}:workspace/ws-stand-in",
    }
    (out / IAM_DIR / "bindings.json").write_text(json.dumps(bindings), encoding="utf-8")
    lines = [{"actor": a, "service": s, "operation": o, "params": p} for a, s, o, p in calls]
    (out / IAM_DIR / "calls" / "calls-1.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8"
    )
    return out


ALLOWED = [
    (ROLE, "s3", "GetObject", {"Bucket": BUCKET, "Key": "runs/r1/inputs/schedule.json"}),
    (ROLE, "s3", "PutObject", {"Bucket": BUCKET, "Key": "runs/r1/records-g6-w0-p000001.jsonl"}),
    (OPERATOR, "s3", "GetObject", {"Bucket": BUCKET, "Key": "campaigns/c/runs/r1/report.json"}),
    (OPERATOR, "aps", "QueryMetrics", {"path": "/api/v1/query"}),
    (STAND_IN_KEY, "s3", "PutBucketTagging", {"Bucket": BUCKET}),  # AWS's own: not held to a role
]


def test_a_run_whose_calls_are_each_allowed_passes(tmp_path: Path) -> None:
    said: list[str] = []
    enforce_roles(_recorded(tmp_path, ALLOWED), said.append)
    assert said == [
        "IAM: the run's 4 distinct authorizations are each allowed by the caller's role (testing/iam_policy.py)"
    ]


def test_a_denied_call_fails_the_run_naming_role_action_and_resource(tmp_path: Path) -> None:
    outside = (ROLE, "s3", "PutObject", {"Bucket": BUCKET, "Key": "runs/r1/report.json"})
    with pytest.raises(RuntimeError) as caught:
        enforce_roles(_recorded(tmp_path, [*ALLOWED, outside]), lambda _: None)
    assert str(caught.value).splitlines() == [
        "IAM: 1 of the run's calls are denied by the caller's role:",
        f"  {ROLE} may not s3:PutObject on arn:aws:s3:::{BUCKET}/runs/r1/report.json (s3 PutObject: ImplicitlyDenied)",
    ]


def test_a_statement_removed_denies_the_calls_that_needed_it(tmp_path: Path) -> None:
    assert denied_without(_recorded(tmp_path, ALLOWED), ROLE, "s3:GetObject") == [
        f"{ROLE} may not s3:GetObject on arn:aws:s3:::{BUCKET}/runs/r1/inputs/schedule.json (s3 GetObject: ImplicitlyDenied)"
    ]


def test_a_run_whose_operator_recorded_nothing_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no call of the operator's recorded"):
        enforce_roles(_recorded(tmp_path, ALLOWED[:2]), lambda _: None)
