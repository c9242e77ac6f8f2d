"""campaign.aws.dlami: each fleet's AMI pinned to its SDK release through describe-images (botocore Stubber)."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from campaign.aws.dlami import AmiNotFound, ami_parameter_name, cdk_parameter_args, parse_ami_overrides, resolve_amis
from core.manifest import load_manifest

NEURON_NAME = "Deep Learning Base Neuron AMI (Ubuntu 24.04)"
NEURON_FILTERS = [
    {"Name": "name", "Values": [f"{NEURON_NAME} *"]},
    {"Name": "description", "Values": ["*Neuron SDK 2.28.0*"]},
    {"Name": "architecture", "Values": ["x86_64"]},
    {"Name": "state", "Values": ["available"]},
]


def _ec2() -> object:
    return boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def test_parameter_names_are_cloudformation_safe() -> None:
    assert ami_parameter_name("inf2") == "AmiInf2"
    assert ami_parameter_name("g6-big_one") == "AmiG6BigOne"


def test_neuron_ami_is_the_newest_build_of_the_pinned_sdk_and_gpu_ami_is_given(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path, check_files=False)
    ec2 = _ec2()
    with Stubber(ec2) as stub:  # type: ignore[arg-type]
        neuron_images = [
            {
                "ImageId": "ami-0000000000000aaaa",
                "Name": f"{NEURON_NAME} 20260226",
                "CreationDate": "2026-02-26T00:00:00Z",
            },
            {
                "ImageId": "ami-0000000000000bbbb",
                "Name": f"{NEURON_NAME} 20260310",
                "CreationDate": "2026-03-10T00:00:00Z",
            },
        ]
        stub.add_response(
            "describe_images", {"Images": neuron_images}, {"Owners": ["amazon"], "Filters": NEURON_FILTERS}
        )
        given = {"ImageId": "ami-0123456789abcdef0", "Name": "Deep Learning Base OSS Nvidia Driver GPU AMI"}
        stub.add_response("describe_images", {"Images": [given]}, {"ImageIds": ["ami-0123456789abcdef0"]})
        resolved = resolve_amis(m, ec2, {"g6": "ami-0123456789abcdef0"})
        stub.assert_no_pending_responses()
    by = {r.fleet: r for r in resolved}
    assert by["inf2"].image_id == "ami-0000000000000bbbb" and "Neuron SDK 2.28.0" in by["inf2"].how
    assert by["g6"].how == "given with --ami"
    assert cdk_parameter_args(resolved) == [
        "--parameters",
        "AmiInf2=ami-0000000000000bbbb",
        "--parameters",
        "AmiG6=ami-0123456789abcdef0",
    ]


def test_gpu_fleet_without_an_ami_is_refused_by_name(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path, check_files=False)
    ec2 = _ec2()
    with Stubber(ec2) as stub:  # type: ignore[arg-type]
        stub.add_response(
            "describe_images", {"Images": [{"ImageId": "ami-0000000000000aaaa", "CreationDate": "2026-02-26"}]}
        )
        with pytest.raises(AmiNotFound, match=r"fleets\[1\] \(g6\): .*nvidia_driver 595.71.05 and pass --ami g6=ami-"):
            resolve_amis(m, ec2)


def test_no_neuron_ami_of_that_release_is_refused(example_manifest_path: Path) -> None:
    m = load_manifest(example_manifest_path, check_files=False)
    ec2 = _ec2()
    with Stubber(ec2) as stub:  # type: ignore[arg-type]
        stub.add_response("describe_images", {"Images": []})
        with pytest.raises(
            AmiNotFound, match=r"fleets\[0\] \(inf2\): no Amazon AMI named .*'\*Neuron SDK 2.28.0\*' in us-east-1"
        ):
            resolve_amis(m, ec2)


@pytest.mark.parametrize("raw", ["g6", "nope=ami-0123456789abcdef0", "g6=ami-xyz"])
def test_bad_ami_override_names_the_value(raw: str) -> None:
    with pytest.raises(AmiNotFound, match="--ami"):
        parse_ami_overrides([raw], ["inf2", "g6"])
