"""Names the stacks and the CLI must agree on: the stack, the fleets' AMI parameters, the tags."""

from __future__ import annotations

import re

# The stacks tag the results bucket with this, and teardown leaves it in place.
RETAINED_TAG = ("lifecycle", "retained")
# Every resource carries the manifest's digest; a fleet's launch template (so its instances and
# volumes at launch) carries its serving definition's instead (stacks/fleet.py says why).
MANIFEST_DIGEST_TAG = "manifest-digest"
SERVING_DIGEST_TAG = "serving-digest"
# Template parameter of the Docker Hub pull-through cache's credential (stacks/image_cache.py), filled
# by `campaign deploy --docker-hub-credential-arn`. A name with "secret" in it would read as a password
# to CloudFormation validation (W2509), and an ARN is none.
DOCKER_HUB_CREDENTIAL_PARAMETER = "DockerHubCredentialArn"
# Template parameter of the campaign's deadline (an ISO-8601 UTC time, core.cloud_contract.DEADLINE_FORMAT):
# each fleet's scheduled action sets its group to 0 then (stacks/fleet.py); `campaign deploy` fills it.
CAMPAIGN_DEADLINE_PARAMETER = "CampaignDeadline"


def stack_name(campaign: str) -> str:
    """The CloudFormation stack: deploy synthesizes it under this name; run and teardown find it by it."""
    return f"{campaign}-comparison"


def ami_parameter_name(fleet: str) -> str:
    """Template parameter of a fleet's AMI: `Ami` + the fleet name in CamelCase (CFN allows [A-Za-z0-9])."""
    return "Ami" + "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", fleet) if part)


# The rehearsal (issue 51, core/rehearsal.py): `cdk synth -c rehearsal=1` replaces every fleet by
# its emulator on the rehearsal host type. The stack says so where DescribeStacks shows it: an
# Output (value REHEARSAL_OUTPUT_VALUE) and a tag on the stack and every resource; in a campaign's
# stack neither is there. Every rehearsal fleet boots the AMI of one parameter, which CloudFormation
# resolves from the public Amazon Linux 2023 SSM parameter (no value for `deploy` to fill).
REHEARSAL_CONTEXT = "rehearsal"
REHEARSAL_OUTPUT = "Rehearsal"
REHEARSAL_OUTPUT_VALUE = "true"
REHEARSAL_TAG = ("rehearsal", "true")
REHEARSAL_AMI_PARAMETER = "RehearsalAmi"
