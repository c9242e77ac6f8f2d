"""Retained buckets keep their TLS-only policy after teardown (issue 25, item 5): the bucket
policy is a resource of its own, deleted with the stack unless it is retained too."""

from __future__ import annotations

from tests.stacks.conftest import Synth


def test_every_retained_bucket_keeps_its_tls_only_policy(example: Synth) -> None:
    buckets = {lid for lid, b in example.resources("AWS::S3::Bucket").items() if b.get("DeletionPolicy") == "Retain"}
    assert buckets
    policies = {p["Properties"]["Bucket"]["Ref"]: p for p in example.resources("AWS::S3::BucketPolicy").values()}
    for lid in buckets:
        policy = policies[lid]
        assert policy.get("DeletionPolicy") == "Retain", (
            f"{lid}: its policy is deleted with the stack, the kept bucket loses TLS-only"
        )
        assert any(
            s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
            for s in policy["Properties"]["PolicyDocument"]["Statement"]
        )
