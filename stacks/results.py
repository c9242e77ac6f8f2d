"""Where the evidence lives: a results bucket that outlives `cdk destroy`, plus its log sink."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Tags
from aws_cdk import aws_s3 as s3
from constructs import Construct

from core.naming import RETAINED_TAG  # teardown accepts only resources with this tag as "kept by design"
from stacks.compliance import acknowledge

NONCURRENT_RESULTS_DAYS = 90


def _locked_bucket(scope: Construct, cid: str, **kwargs: object) -> s3.Bucket:
    # No auto_delete_objects: it is a Lambda-backed custom resource, and the data must stay.
    return s3.Bucket(
        scope,
        cid,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        versioned=True,
        removal_policy=RemovalPolicy.RETAIN,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        **kwargs,  # type: ignore[arg-type]
    )


class ResultsStore(Construct):
    """`results`: manifest, trace, per-request records, reports. `logs`: access and flow logs."""

    def __init__(self, scope: Construct, cid: str) -> None:
        super().__init__(scope, cid)
        self.logs = _locked_bucket(
            self,
            "AccessLogs",
            # Logs are evidence for a finished campaign, not forever.
            lifecycle_rules=[
                s3.LifecycleRule(expiration=Duration.days(400), noncurrent_version_expiration=Duration.days(30))
            ],
        )
        acknowledge(
            self.logs,
            "AwsSolutions-S1",
            "This bucket is the server-access-log sink; logging it into itself would loop.",
        )
        self.results = _locked_bucket(
            self,
            "Results",
            server_access_logs_bucket=self.logs,
            server_access_logs_prefix="s3-access/results/",
            # Current objects (the evidence) never expire; a version replaced or deleted is kept
            # 90 days to undo a mistake, then goes, so versioning cannot grow without bound.
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(NONCURRENT_RESULTS_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                )
            ],
        )
        for bucket in (self.logs, self.results):
            Tags.of(bucket).add(*RETAINED_TAG)
            # The bucket outlives the stack, and so must its policy (TLS-only deny, the log
            # delivery grant): the AWS::S3::BucketPolicy is a resource of its own, deleted with
            # the stack unless retained, which would leave the kept evidence without TLS-only.
            assert bucket.policy is not None  # enforce_ssl=True created it
            bucket.policy.apply_removal_policy(RemovalPolicy.RETAIN)

    @staticmethod
    def campaign_prefix(campaign: str, digest: str) -> str:
        """Everything of one frozen manifest sits under one prefix: a changed manifest never overwrites."""
        return f"campaigns/{campaign}/{digest[:12]}"
