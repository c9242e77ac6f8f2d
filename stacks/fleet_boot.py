"""The boot script of a fleet instance, rendered from the runtime's serving definition.

Order matters: mount the cache volume (weights, compile and engine caches live there), start
telemetry (so a failed boot is visible in CloudWatch), log in to ECR, stage and verify the
weights, then `docker run` the serving container exactly as `runtime.serving` renders it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from runtime.serving import ServingDefinition, render_docker_run
from stacks.fleet_paths import BOOT_LOG, CACHE_MOUNT, NEURON_MONITOR_CONFIG

_ECR_IMAGE = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[^@:]+)")


@dataclass(frozen=True)
class EcrImage:
    account: str
    region: str
    repository: str

    @property
    def registry(self) -> str:
        return f"{self.account}.dkr.ecr.{self.region}.amazonaws.com"


def ecr_image(image: str) -> EcrImage | None:
    """The ECR repository of a pinned image, or None for a public registry (Docker Hub, ghcr)."""
    m = _ECR_IMAGE.match(image)
    return EcrImage(m["account"], m["region"], m["repo"]) if m else None


def _mount_cache_volume() -> list[str]:
    # The cache volume is the EBS disk that is not the root disk; instance-store NVMe disks
    # (g6/g5) report a different model string, so they are never picked by mistake.
    return [
        'ROOT_DISK="/dev/$(lsblk -no PKNAME "$(findmnt -no SOURCE /)")"',
        'CACHE_DEV=""',
        "for _ in $(seq 1 60); do",
        '  CACHE_DEV="$(lsblk -dnpo NAME,MODEL | awk -v root="$ROOT_DISK" \'$1 != root && /Amazon Elastic Block Store/ {print $1; exit}\')"',
        '  [ -n "$CACHE_DEV" ] && break; sleep 5',
        "done",
        '[ -n "$CACHE_DEV" ] || { echo "cache EBS volume not attached"; exit 1; }',
        'blkid "$CACHE_DEV" >/dev/null || mkfs.ext4 -q -L harness-cache "$CACHE_DEV"',
        f"mkdir -p {CACHE_MOUNT}",
        f'grep -q " {CACHE_MOUNT} " /etc/fstab || echo "LABEL=harness-cache {CACHE_MOUNT} ext4 defaults,noatime,nofail 0 2" >> /etc/fstab',
        f"mountpoint -q {CACHE_MOUNT} || mount {CACHE_MOUNT}",
    ]


def _cloudwatch_agent(region: str, agent_param: str) -> list[str]:
    ctl = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
    deb = f"https://amazoncloudwatch-agent-{region}.s3.{region}.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb"
    return [
        f"if [ ! -x {ctl} ]; then curl -fsSL -o /tmp/cwagent.deb {deb} && dpkg -i -E /tmp/cwagent.deb; fi",
        f"{ctl} -a fetch-config -m ec2 -s -c ssm:{shlex.quote(agent_param)}",
    ]


def _neuron_monitor(region: str, config_param: str, namespace: str) -> list[str]:
    unit = (
        "[Unit]\nDescription=neuron-monitor to CloudWatch\nAfter=network-online.target\n"
        "[Service]\n"
        f"ExecStart=/bin/bash -c '/opt/aws/neuron/bin/neuron-monitor -c {NEURON_MONITOR_CONFIG} | "
        f"/opt/aws/neuron/bin/neuron-monitor-cloudwatch.py --namespace {namespace} --region {region}'\n"
        "Restart=always\n[Install]\nWantedBy=multi-user.target\n"
    )
    return [
        f"mkdir -p {shlex.quote(NEURON_MONITOR_CONFIG.rsplit('/', 1)[0])}",
        f"aws ssm get-parameter --region {region} --name {shlex.quote(config_param)} --query Parameter.Value --output text > {NEURON_MONITOR_CONFIG}",
        f"printf %s {shlex.quote(unit)} > /etc/systemd/system/neuron-monitor.service",
        "systemctl daemon-reload && systemctl enable --now neuron-monitor.service",
    ]


def boot_script(
    defn: ServingDefinition,
    *,
    region: str,
    agent_param: str,
    neuron_monitor_param: str | None,
    neuron_namespace: str,
) -> list[str]:
    lines = [
        "set -euo pipefail",
        f"exec > >(tee -a {BOOT_LOG}) 2>&1",
        *_mount_cache_volume(),
        *_cloudwatch_agent(region, agent_param),
    ]
    if neuron_monitor_param:
        lines += _neuron_monitor(region, neuron_monitor_param, neuron_namespace)
    ecr = ecr_image(defn.image)
    if ecr:
        lines.append(f"aws ecr get-login-password --region {ecr.region} | docker login --username AWS --password-stdin {ecr.registry}")
    lines += [f"docker pull {shlex.quote(defn.image)}", *defn.weights_staging, f"mkdir -p {shlex.quote(defn.cache_dir)}"]
    lines.append(render_docker_run(defn))
    return lines
