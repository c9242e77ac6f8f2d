"""What every fleet of a rehearsal (issue 51, `-c rehearsal=1`) runs on: one host type, one AMI
parameter, one emulator image and a small root disk; stacks/fleet.py builds each fleet with them.

A rehearsal fleet keeps every construct of the campaign's fleet that the campaign reads (its group,
target group, deadline action, log group, role, security group) and changes what it runs: the
emulator (stacks/rehearsal_boot.py) on `core.rehearsal.rehearsal_type`, from Amazon Linux 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import CfnParameter, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets

from core import rehearsal
from core.naming import REHEARSAL_AMI_PARAMETER
from stacks.load_generator import IMAGE_EXCLUDES
from stacks.rehearsal_boot import READY_GRACE_S
from stacks.settings import REPO_ROOT, SynthInputError

# The public parameter holding the newest Amazon Linux 2023 AMI (standard kernel, x86_64) of each
# region: Amazon Linux 2023 user guide, "Launching AL2023 using the SSM parameter and AWS CLI"
# (/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64). A rehearsal proves the
# AWS path, not a host stack, so the newest is what it wants; CloudFormation resolves the
# parameter at each deploy ("SSM parameter types", AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>).
AL2023_AMI_SSM_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
# Amazon Linux AMIs name their root device /dev/xvda (Amazon EC2 user guide, "Device names for
# volumes on Amazon EC2 instances"). 16 GiB: the OS (about 2 GiB used), Docker and the emulator
# image (about 1 GiB), the tokenizer files; no cache volume, nothing large is staged.
ROOT_DEVICE = "/dev/xvda"
ROOT_VOLUME_GIB = 16
EMULATOR_DOCKERFILE = "Dockerfile.emulator"


@dataclass(frozen=True)
class RehearsalHost:
    instance_type: str
    ami: CfnParameter
    image: ecr_assets.DockerImageAsset
    grace: Duration  # the groups' health-check grace: core.rehearsal.READY_MIN


def rehearsal_host(stack: Stack, region: str) -> RehearsalHost:
    """The stack's one AMI parameter and emulator image asset, and the rehearsal host type."""
    try:
        host = rehearsal.rehearsal_type(region)
    except rehearsal.NoRehearsalType as exc:
        raise SynthInputError(f"costs.region: {exc}") from None
    if not (REPO_ROOT / EMULATOR_DOCKERFILE).is_file():
        raise SynthInputError(f"{EMULATOR_DOCKERFILE}: the emulator image is built from it; it is missing")
    ami = CfnParameter(
        stack,
        REHEARSAL_AMI_PARAMETER,
        type="AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
        default=AL2023_AMI_SSM_PARAMETER,
        description="every rehearsal fleet's AMI: Amazon Linux 2023 (x86_64), resolved by CloudFormation from "
        "the public SSM parameter at deploy",
    )
    image = ecr_assets.DockerImageAsset(
        stack,
        "EmulatorImage",
        directory=str(REPO_ROOT),
        file=EMULATOR_DOCKERFILE,
        exclude=IMAGE_EXCLUDES,
        platform=ecr_assets.Platform.LINUX_AMD64,
    )
    return RehearsalHost(host.name, ami, image, Duration.seconds(READY_GRACE_S))


def block_devices() -> list[ec2.BlockDevice]:
    return [
        ec2.BlockDevice(
            device_name=ROOT_DEVICE,
            volume=ec2.BlockDeviceVolume.ebs(ROOT_VOLUME_GIB, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3),
        )
    ]
