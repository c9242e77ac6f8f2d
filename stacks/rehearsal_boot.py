"""The boot script of a rehearsal fleet instance (issue 51): the fleet's emulator in place of its server.

The host is Amazon Linux 2023 on the rehearsal host type (core.rehearsal), not a DLAMI: no driver,
no accelerator, no weights, no compile, no cache volume. In order: the CloudWatch agent (with the
fleet's own configuration, so a failed boot is visible in the fleet's log group as in a campaign),
Docker, ECR login and the emulator image's pull (built from this repository, Dockerfile.emulator),
the manifest's pinned tokenizer files staged where and as a campaign's fleet stages them
(core.serving.tokenizer_staging: the same weights directory, from the Hub or S3, hashes checked),
the manifest written for the emulator, `docker run` of the emulator on the fleet's port, and the
wait until its health path answers, as a campaign's boot waits for its server.
"""

from __future__ import annotations

import json
import shlex
from pathlib import PurePosixPath

from core import rehearsal
from core.manifest import Fleet, Manifest
from core.serving import CACHE_MOUNT, ServingDefinition, tokenizer_staging, weights_dir_for
from stacks.fleet_paths import BOOT_LOG

EMULATOR_MANIFEST = f"{CACHE_MOUNT}/rehearsal/manifest.json"
CONTAINER_NAME = "llm"  # as the campaign's server container (core.serving.render_docker_run)
# The ASG's health-check grace and the script's own bound on the wait for the emulator (seconds
# from the script's start), as core.cloud_contract.health_grace_s is a campaign fleet's.
READY_GRACE_S = round(rehearsal.READY_MIN * 60)

# The CloudWatch agent and Docker from the Amazon Linux 2023 repositories, whose packages are
# those of the AMI's release (AL2023 "deterministic upgrades": the repository version is locked to
# the release the AMI was built from), so no package moves under a given AMI.
# Sources: Amazon CloudWatch user guide, "Install the CloudWatch agent on Amazon Linux 2023"
# (`dnf install amazon-cloudwatch-agent`); Amazon ECS developer guide, "Creating a container image
# for use on Amazon ECS" (Docker on AL2023: `dnf install docker`, then start the service);
# Amazon Linux 2023 user guide, "Deterministic upgrades through versioned repositories".
CLOUDWATCH_AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"


def emulator_manifest(manifest: Manifest) -> str:
    """The manifest as the emulator reads it on the instance: every field as given (a round trip
    to the same digest, core.manifest), a huggingface tokenizer's path pointing at the file staged
    in the weights directory (the manifest's own path is relative to the operator's checkout)."""
    data = manifest.model_dump(mode="json", exclude_unset=True)
    path = manifest.tokenizer.path
    if manifest.tokenizer.kind == "huggingface" and path is not None:
        data["tokenizer"]["path"] = f"{weights_dir_for(manifest)}/{PurePosixPath(path).name}"
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _cloudwatch_agent(region: str, agent_param: str) -> list[str]:
    return [
        f"[ -x {CLOUDWATCH_AGENT_CTL} ] || dnf install -y -q amazon-cloudwatch-agent",
        f"{CLOUDWATCH_AGENT_CTL} -a fetch-config -m ec2 -s -c ssm:{shlex.quote(agent_param)}",
    ]


def _docker_engine() -> list[str]:
    return [
        "if command -v docker >/dev/null 2>&1; then",
        '  echo "docker present: $(command -v docker)"',
        "else",
        "  dnf install -y -q docker",
        "  systemctl enable --now docker",
        "fi",
    ]


def emulator_run(fleet: Fleet, defn: ServingDefinition) -> str:
    """One shell line: the emulator of `fleet`, detached, restarted as the server is, on the port
    and with the model id its server has, reading the staged files through the same mount."""
    parts = [
        "docker run -d",
        f"--name {CONTAINER_NAME}",
        "--restart unless-stopped",
        f"-p {defn.port}:{defn.port}",
        f"-v {CACHE_MOUNT}:{CACHE_MOUNT}:ro",
        '"$EMULATOR_IMAGE"',
        f"--manifest {EMULATOR_MANIFEST}",
        f"--fleet {shlex.quote(fleet.name)}",
        "--host 0.0.0.0",
        f"--port {defn.port}",
        # The trace and the tokenizer files of the operator's checkout are not on the instance; the
        # staged tokenizer files were checked against their pins above.
        "--no-check-files",
    ]
    return " ".join(parts)


def _health_wait(defn: ServingDefinition) -> list[str]:
    url = f"http://127.0.0.1:{defn.port}{defn.health_path}"
    return [
        "READY_START=$SECONDS",
        f"until curl -fsS -o /dev/null {url}; do",
        f'  if [ "$SECONDS" -ge {READY_GRACE_S} ]; then echo "emulator not healthy $SECONDS s into the boot '
        f'(the health-check grace is {READY_GRACE_S} s: core.rehearsal.READY_MIN)"; exit 1; fi',
        "  sleep 5",
        "done",
        'echo "emulator healthy after $((SECONDS - READY_START)) s"',
    ]


def rehearsal_boot_script(
    manifest: Manifest,
    fleet: Fleet,
    defn: ServingDefinition,
    *,
    image: str,
    serving_digest: str,
    weights_s3_uri: str | None,
    region: str,
    agent_param: str,
) -> list[str]:
    """`defn`: the fleet's serving definition (its port and health path, which the NLB checks);
    `image`: the emulator image's URI in the stack's region (an ECR repository of the account);
    `weights_s3_uri`: where the tokenizer files come from when a campaign's weights would."""
    q = shlex.quote
    return [
        "set -euo pipefail",
        f"exec > >(tee -a {BOOT_LOG}) 2>&1",
        f"echo {q(f'boot: rehearsal of campaign {manifest.campaign}, fleet {fleet.name} emulated (serving definition {serving_digest})')}",
        f"mkdir -p {CACHE_MOUNT}",  # no cache volume: tokenizer files and manifest are small
        *_cloudwatch_agent(region, agent_param),
        *_docker_engine(),
        f"EMULATOR_IMAGE={image}",
        f'aws ecr get-login-password --region {region} | docker login --username AWS --password-stdin "${{EMULATOR_IMAGE%%/*}}"',
        'docker pull "$EMULATOR_IMAGE"',
        *tokenizer_staging(manifest, image, weights_s3_uri),
        f"mkdir -p {PurePosixPath(EMULATOR_MANIFEST).parent}",
        f"printf %s {q(emulator_manifest(manifest))} > {EMULATOR_MANIFEST}",
        emulator_run(fleet, defn),
        *_health_wait(defn),
    ]
