"""Teardown reports the stack's CDK assets the bootstrap still stores (shared: not deleted)."""

from __future__ import annotations

import json

import boto3

from campaign.aws.cdk_assets import CdkAsset, assets_in_template, gc_command, stack_assets, still_stored
from tests.conftest import moto_server

TAG = "0952" * 16
KEY = "ab12" * 16 + ".zip"
REPO = "cdk-hnb659fds-container-assets-${AWS::AccountId}-us-east-1"
BUCKET = "cdk-hnb659fds-assets-${AWS::AccountId}-us-east-1"
TEMPLATE = {
    "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
    # Where CDK's default synthesizer puts them: an image inside an Fn::Sub, a file as S3Bucket/S3Key.
    "Metadata": {
        "Image": {"Fn::Sub": "${AWS::AccountId}.dkr.ecr.us-east-1.${AWS::URLSuffix}/" + f"{REPO}:{TAG}"},
        "Code": {"S3Bucket": {"Fn::Sub": BUCKET}, "S3Key": KEY},
        "NotAnAsset": {"S3Bucket": "my-own-bucket", "S3Key": "x.zip"},
    },
}


def test_the_template_names_its_image_and_file_assets() -> None:
    assert assets_in_template(TEMPLATE, "123456789012") == [
        CdkAsset("image", "cdk-hnb659fds-container-assets-123456789012-us-east-1", TAG),
        CdkAsset("file", "cdk-hnb659fds-assets-123456789012-us-east-1", KEY),
    ]


def test_after_the_stack_is_gone_what_is_still_stored_is_reported() -> None:
    with moto_server("us-east-1"):
        s = boto3.session.Session(region_name="us-east-1")
        account = s.client("sts").get_caller_identity()["Account"]
        repo = REPO.replace("${AWS::AccountId}", account)
        ecr = s.client("ecr")
        ecr.create_repository(repositoryName=repo)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "digest": "sha256:" + "1" * 64,
                "size": 1,
                "mediaType": "application/vnd.docker.container.image.v1+json",
            },
            "layers": [],
        }
        ecr.put_image(repositoryName=repo, imageManifest=json.dumps(manifest), imageTag=TAG)
        cfn = s.client("cloudformation")
        cfn.create_stack(StackName="st", TemplateBody=json.dumps(TEMPLATE))
        assets = stack_assets(s, "st")
        assert [str(a) for a in assets] == [
            f"ecr {repo}:{TAG}",
            f"s3://{BUCKET.replace('${AWS::AccountId}', account)}/{KEY}",
        ]
        cfn.delete_stack(StackName="st")
        assert stack_assets(s, "st") == []  # gone: nothing to read any more
        stored = still_stored(s, assets)
        assert [a for a, _ in stored] == [assets[0]]  # the image is stored; the file never was
        ecr.batch_delete_image(repositoryName=repo, imageIds=[{"imageTag": TAG}])
        assert still_stored(s, assets) == []
        assert gc_command(s) == f"cdk gc aws://{account}/us-east-1 --unstable=gc"
