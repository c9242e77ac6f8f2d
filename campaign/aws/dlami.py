"""The DLAMI of each fleet, pinned to the SDK release its manifest names.

The public `.../latest/image_id` SSM parameters move with every Neuron release: an SDK 2.31+
AMI's driver needs a newer Neuron runtime than the SDK 2.28 container ships, and `nrt_init()`
fails. So the template takes each fleet's AMI as a parameter (type AWS::EC2::Image::Id) and
`deploy` fills it here: `describe-images` owned by Amazon, filtered by the DLAMI name and the
description naming the SDK version (core.catalog.HOST_STACKS, with its source), newest
build of that release. Where the DLAMI description names no version (the NVIDIA base DLAMI),
the operator passes the AMI id picked from the DLAMI release notes; the boot script checks
the driver either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core import catalog
from core.errors import EXIT_BAD_INPUT, CampaignError
from core.manifest import Manifest
from core.naming import ami_parameter_name

_AMI_ID = re.compile(r"^ami-[0-9a-f]{8,17}$")


class AmiNotFound(CampaignError, ValueError):
    """No AMI for a fleet; the message names the fleet and what to do."""

    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class ResolvedAmi:
    fleet: str
    parameter: str  # the template parameter it fills
    image_id: str
    name: str
    how: str  # provenance: the filters used, or "given with --ami"


def parse_ami_overrides(values: list[str] | None, fleet_names: list[str]) -> dict[str, str]:
    """`--ami FLEET=ami-...` values, each checked against the manifest's fleets."""
    out: dict[str, str] = {}
    for raw in values or []:
        fleet, sep, ami = raw.partition("=")
        if not sep or fleet not in fleet_names:
            raise AmiNotFound(f"--ami {raw!r}: expected FLEET=ami-..., FLEET one of {fleet_names}")
        if not _AMI_ID.fullmatch(ami):
            raise AmiNotFound(f"--ami {raw!r}: {ami!r} is not an AMI id (ami- and 8 or 17 hex digits)")
        out[fleet] = ami
    return out


def resolve_amis(m: Manifest, ec2: Any, overrides: Mapping[str, str] | None = None) -> list[ResolvedAmi]:
    """One pinned AMI per fleet; raises AmiNotFound naming the fleet when none can be pinned."""
    from core.serving import host_stack_for

    out: list[ResolvedAmi] = []
    for i, fleet in enumerate(m.fleets):
        param = ami_parameter_name(fleet.name)
        given = (overrides or {}).get(fleet.name)
        if given:
            images = ec2.describe_images(ImageIds=[given]).get("Images", [])
            if not images:
                raise AmiNotFound(f"fleets[{i}] ({fleet.name}): --ami {given} does not exist in {m.costs.region}")
            out.append(ResolvedAmi(fleet.name, param, given, images[0].get("Name", ""), "given with --ami"))
            continue
        row: catalog.HostStack = host_stack_for(fleet)
        if row.ami_description_filter is None:
            raise AmiNotFound(
                f"fleets[{i}] ({fleet.name}): the {row.ami_name_filter.rstrip(' *')} description names no driver version; "
                f"pick the AMI whose release notes list nvidia_driver {fleet.serving.driver_version} and pass "
                f"--ami {fleet.name}=ami-..."
            )
        filters = [
            {"Name": "name", "Values": [row.ami_name_filter]},
            {"Name": "description", "Values": [row.ami_description_filter]},
            {"Name": "architecture", "Values": ["x86_64"]},
            {"Name": "state", "Values": ["available"]},
        ]
        images = ec2.describe_images(Owners=["amazon"], Filters=filters).get("Images", [])
        if not images:
            raise AmiNotFound(
                f"fleets[{i}] ({fleet.name}): no Amazon AMI named {row.ami_name_filter!r} with description "
                f"{row.ami_description_filter!r} in {m.costs.region}; pass --ami {fleet.name}=ami-..."
            )
        newest = max(images, key=lambda img: img.get("CreationDate", ""))
        how = f"describe-images owner amazon, name {row.ami_name_filter!r}, description {row.ami_description_filter!r}, newest"
        out.append(ResolvedAmi(fleet.name, param, newest["ImageId"], newest.get("Name", ""), how))
    return out


def cdk_parameter_args(resolved: list[ResolvedAmi]) -> list[str]:
    """`cdk deploy` arguments that fill the AMI parameters."""
    args: list[str] = []
    for r in resolved:
        args += ["--parameters", f"{r.parameter}={r.image_id}"]
    return args
