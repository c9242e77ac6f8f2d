"""Teardown's asset report reads the template CDK synthesizes: every image asset the cloud
assembly publishes is found in it (campaign.aws.cdk_assets), so none is missed after destroy."""

from __future__ import annotations

import json

import pytest

from campaign.aws.cdk_assets import assets_in_template
from tests.stacks.conftest import Synth


@pytest.mark.parametrize("which", ["example", "rehearsal"])
def test_every_published_image_asset_is_named_by_the_template(which: str, request: pytest.FixtureRequest) -> None:
    example: Synth = request.getfixturevalue(which)  # the rehearsal's: the emulator image too
    manifest = json.loads(
        example.template_path.with_name(
            example.template_path.name.replace(".template.json", ".assets.json")
        ).read_text()
    )
    published = {
        (d["repositoryName"].replace("${AWS::AccountId}", "123456789012"), d["imageTag"])
        for image in manifest["dockerImages"].values()
        for d in image["destinations"].values()
    }
    assert published  # the load generator's image
    found = {
        (a.container, a.name) for a in assets_in_template(example.template_json, "123456789012") if a.kind == "image"
    }
    assert found == published
