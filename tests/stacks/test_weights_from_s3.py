"""`deploy --weights-s3-uri`: the fleets read the checkpoint from the operator's bucket, read-only and
only under the pinned commit's prefix."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import App, Stack
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from stacks.compliance import add_nag_checks
from stacks.fleet import ServingFleet

COMMIT = "339ce92d052f002cdbac4a4bd551d1c61dd8345e"


def test_the_weights_read_grant_synthesizes_with_its_cdk_nag_acknowledgment(tmp_path: Path) -> None:
    """Failed before the fix: synth raised KeyMustResolveToString (the acknowledged finding id held
    the partition's token), so `deploy --weights-s3-uri` could not synthesize at all."""
    app = App(outdir=str(tmp_path))
    add_nag_checks(app)  # an unacknowledged finding fails the synth (ValidationFailed)
    stack = Stack(app, "S")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    ServingFleet._grant_weights_read(role, "s3://my-weights/llama/", COMMIT)
    app.synth()
    statements = [
        st
        for policy in Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    get = next(st for st in statements if st["Action"] == "s3:GetObject")
    assert get["Resource"] == {
        "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":s3:::my-weights/llama/{COMMIT}/*"]]
    }
    listing = next(st for st in statements if st["Action"] == "s3:ListBucket")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"llama/{COMMIT}/*"]}}
