"""What served each fleet of a cloud run: the report's `systems_under_test` (kept in campaign.json).

Per fleet, from the manifest the stack was deployed for (`run` refuses another: CloudRun checks
the stack's fleets): the serving stack, the image by its digest, and the engine's command line,
as core.serving.definition_for gives them and the stack renders them into every instance's user
data (stacks/fleet.py); the driver or Neuron SDK the instances run, which the boot script checks
against the manifest's serving.driver_version before it starts the server (core/serving.py's
sources, core.catalog.HOST_STACKS); and from the deployed stack, the AMI `deploy` filled each
fleet's AMI parameter with (campaign.aws.dlami). An offline run says what stood in for the fleets.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from core.manifest import Fleet, Manifest
from core.naming import ami_parameter_name
from core.serving import definition_for


def stack_amis(cfn: Any, stack: str, m: Manifest) -> dict[str, str]:
    """fleet -> the AMI id of its template parameter in the deployed stack (DescribeStacks'
    Parameters); a fleet whose parameter is not there (a stand-in stack) is left out."""
    try:
        described = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    except Exception:  # botocore: read_run_config already failed loudly on a stack it cannot read
        return {}
    params = {
        p["ParameterKey"]: p.get("ResolvedValue") or p.get("ParameterValue", "")
        for p in described.get("Parameters", [])
    }
    return {f.name: params[ami_parameter_name(f.name)] for f in m.fleets if params.get(ami_parameter_name(f.name))}


def fleet_system(m: Manifest, fleet: Fleet, ami: str | None) -> str:
    """One fleet as it is deployed: stack, image, engine command line, AMI, driver or SDK."""
    defn = definition_for(m, fleet)
    host = defn.host
    if host.vendor == "aws-neuron":
        sdk = f"Neuron SDK {host.sdk_version} (driver aws-neuronx-dkms {fleet.serving.driver_version}, runtime {host.runtime})"
    else:
        sdk = f"NVIDIA driver {fleet.serving.driver_version} (CUDA {host.sdk_version})"
    where = (
        f"AMI {ami} (stack parameter {ami_parameter_name(fleet.name)})"
        if ami
        else f"AMI not in the stack's parameters ({ami_parameter_name(fleet.name)})"
    )
    return (
        f"{fleet.name} on {fleet.instance_type}: {defn.stack}, image {defn.image}, "
        f"engine `{shlex.join(defn.command)}`, {where}, {sdk}"
    )


def systems_under_test(m: Manifest, amis: Mapping[str, str], stand_in: str | None = None) -> str:
    """Every fleet as deployed; `stand_in`: what served them instead (an offline run), said first."""
    deployed = "; ".join(fleet_system(m, f, amis.get(f.name)) for f in m.fleets)
    if stand_in is None:
        return f"Systems under test, as deployed: {deployed}."
    return f"{stand_in} They stood in for what the stack deploys: {deployed}."
