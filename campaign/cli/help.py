"""Help texts more than one command group shows (every command module imports them from here,
so no command module imports the parser's)."""

import sys
from pathlib import Path

CONSOLE_SCRIPT = "inf2-vs-g6"  # pyproject's [project.scripts] entry: the same main as `python -m campaign`


def prog() -> str:
    """The name the user called: the console script's, else `python -m campaign`."""
    return CONSOLE_SCRIPT if Path(sys.argv[0]).name == CONSOLE_SCRIPT else "python -m campaign"


# validate --for cloud and deploy take the same flag (campaign.aws.cloud_checks, stacks/image_cache.py).
DOCKER_HUB_CREDENTIAL_HELP = (
    "with --for cloud / deploy: ARN of the Secrets Manager secret (named ecr-pullthroughcache/..., in the manifest's "
    "region) holding Docker Hub credentials; the stack's ECR pull-through cache pulls every Docker Hub image "
    "(vLLM, Prometheus) with them instead of anonymously (docs/cloud.md)"
)

# The positional every campaign command takes (report_cmds and aws_cmds register theirs with it too).
MANIFEST_HELP = "the campaign's manifest (YAML: model, fleets, workload trace, SLOs, prices; e.g. manifests/llama3-8b-inf2-vs-g6.yaml)"

FROM_PLAN_HELP = (
    "a plan saved by `campaign plan MANIFEST --save FILE` for this manifest: each fleet's capacity search "
    "looks first at the boundary the plan predicted (its simulated search's highest hold); every verdict is still measured"
)
