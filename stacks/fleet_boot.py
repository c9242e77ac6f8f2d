"""The boot script of a fleet instance, rendered from the runtime's serving definition.

Order matters: mount the cache volume (weights, compile and engine caches live there), start
telemetry (so a failed boot is visible in CloudWatch), install the pinned Docker if the AMI has
none, log in to ECR and pull the image (a Docker Hub one through the ECR pull-through cache),
stage and verify the weights, fetch the fleet's compiled artifacts if an
instance published them, then `docker run` the serving container exactly as `core.serving`
renders it; once it serves, an instance that compiled publishes what it compiled.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from core.cloud_contract import health_grace_s
from core.images import CachedPull, cached_pull
from core.manifest import Fleet, Manifest
from core.serving import ServingDefinition, definition_for, render_docker_run
from stacks.fleet_paths import BOOT_LOG, CACHE_MOUNT, NEURON_MONITOR_CONFIG

_ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/(?P<repo>[^@:]+)"
)


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


# CloudWatch agent: one pinned release, its detached signature checked against the AWS key
# fingerprint before the package is installed (never the moving `latest` path).
# Versioned path: <bucket>/ubuntu/amd64/<version>/amazon-cloudwatch-agent.deb(.sig), the layout of
# the `latest` path the AWS install guide uses; key and fingerprint: "Verify the signature of the
# CloudWatch agent package", https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/verify-CloudWatch-Agent-Package-Signature.html
CLOUDWATCH_AGENT_VERSION = "1.300072.0b1766"
CLOUDWATCH_AGENT_KEY_FINGERPRINT = "937616F3450B7D806CBD9725D58167303B789C72"

# On a fresh instance apt-daily / unattended-upgrades may hold the dpkg lock for minutes; an
# apt-get or dpkg that finds it taken fails at once, and under `set -e` the boot with it. Every
# install waits up to APT_LOCK_WAIT_S instead (well inside the 30-min NVIDIA health grace), through
# apt's DPkg::Lock::Timeout: seconds debSystem::Lock waits for the dpkg frontend and database locks
# (Debian/apt apt-pkg/deb/debsystem.cc; added in apt 1.9.11, commit 93e156579 "apt(8): Wait for
# frontend and cache lock"; the DLAMIs' Ubuntu 24.04 ships apt 2.7.14, packages.ubuntu.com/noble/apt-doc).
# `apt-get update` takes only the lists lock (/var/lib/apt/lists/lock, pkgAcquire::GetLock in
# apt-pkg/acquire.cc), which that option does not cover: it is retried every APT_RETRY_EVERY_S
# for the same span.
APT_LOCK_WAIT_S = 900
APT_RETRY_EVERY_S = 10


def _apt_get(args: str) -> str:
    """One apt-get call that waits for the dpkg lock (APT_LOCK_WAIT_S), non-interactive."""
    return f"DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout={APT_LOCK_WAIT_S} {args}"


def _apt_get_update(indent: str = "") -> list[str]:
    """`apt-get update`, retried while another apt holds the lists lock (or a mirror fails)."""
    tries = APT_LOCK_WAIT_S // APT_RETRY_EVERY_S
    return [
        f"{indent}for APT_TRY in $(seq 1 {tries}); do",
        f"{indent}  {_apt_get('update -q')} && break",
        f'{indent}  [ "$APT_TRY" -lt {tries} ] || {{ echo "apt-get update failed {tries} times in {APT_LOCK_WAIT_S} s"; exit 1; }}',
        f"{indent}  sleep {APT_RETRY_EVERY_S}",
        f"{indent}done",
    ]


def _cloudwatch_agent(region: str, agent_param: str) -> list[str]:
    ctl = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
    bucket = f"https://amazoncloudwatch-agent-{region}.s3.{region}.amazonaws.com"
    deb = f"{bucket}/ubuntu/amd64/{CLOUDWATCH_AGENT_VERSION}/amazon-cloudwatch-agent.deb"
    return [
        f"if [ ! -x {ctl} ]; then",
        '  CW_DIR="$(mktemp -d)"',
        f'  curl -fsSL -o "$CW_DIR/agent.deb" {deb}',
        f'  curl -fsSL -o "$CW_DIR/agent.deb.sig" {deb}.sig',
        f'  curl -fsSL -o "$CW_DIR/agent.gpg" {bucket}/assets/amazon-cloudwatch-agent.gpg',
        '  export GNUPGHOME="$CW_DIR/gnupg"; mkdir -m 700 "$GNUPGHOME"',
        '  gpg --batch --quiet --import "$CW_DIR/agent.gpg"',
        # Captured, then matched: `gpg | grep -q` under pipefail fails when grep exits before gpg
        # has written its last line (SIGPIPE), i.e. whenever the match is not the last line.
        '  CW_FPRS="$(gpg --batch --with-colons --fingerprint)"',
        f'  case "$CW_FPRS" in *"fpr:::::::::{CLOUDWATCH_AGENT_KEY_FINGERPRINT}:"*) ;; '
        '*) echo "CloudWatch agent key fingerprint mismatch"; exit 1;; esac',
        '  gpg --batch --verify "$CW_DIR/agent.deb.sig" "$CW_DIR/agent.deb"',
        # Installed through apt-get (a path argument ending in .deb is a local package) so that it
        # waits for the dpkg lock as every other install here does (_apt_get).
        f'  {_apt_get("install -y -q")} "$CW_DIR/agent.deb"',
        '  unset GNUPGHOME; rm -rf "$CW_DIR"',
        "fi",
        f"{ctl} -a fetch-config -m ec2 -s -c ssm:{shlex.quote(agent_param)}",
    ]


# Docker on the host. The Base Neuron DLAMI's release notes list the Neuron driver, runtime and
# tools and no container engine, while the NVIDIA base DLAMI ships Docker Engine from Docker's
# own apt repository. So when the host has no `docker`, it is installed the way Docker's Ubuntu
# guide does it ("Install using the apt repository": download.docker.com, the repository key
# checked against Docker's published release-key fingerprint; "Install a specific version": the
# apt version string is 5:<version>-1~ubuntu.<VERSION_ID>~<codename>), at one pinned release:
# the docker-ce and containerd.io versions of the NVIDIA Deep Learning Base AMI with Single CUDA
# (Ubuntu 24.04) 20260717, the NVIDIA fleets' DLAMI (core.catalog.HOST_STACKS), so both fleets run
# the same engine on the same Ubuntu release (DOCKER_PIN_UBUNTU; the Neuron DLAMI is 24.04 too). A
# host that has docker keeps its own.
# Sources: https://docs.docker.com/engine/install/ubuntu/ ;
# https://docs.aws.amazon.com/dlami/latest/devguide/aws-deep-learning-ami-gpubasesinglecuda-ul2404-2026-07-17.html
# (docker-ce-cli 29.6.2-1~ubuntu.24.04~noble, containerd v2.2.6);
# Neuron DLAMI release notes: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/prev/by-component/dlami.html
DOCKER_PIN_UBUNTU = "24.04"  # the release of the DLAMI whose notes the two versions below come from
DOCKER_VERSION = "29.6.2"
CONTAINERD_VERSION = "2.2.6"
DOCKER_APT_URL = "https://download.docker.com/linux/ubuntu"
DOCKER_KEY_FINGERPRINT = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
DOCKER_KEYRING = "/etc/apt/keyrings/docker.asc"


def _docker_engine() -> list[str]:
    pkg = f"5:{DOCKER_VERSION}-1~ubuntu.${{OS_VERSION}}~${{OS_CODENAME}}"
    containerd = f"{CONTAINERD_VERSION}-1~ubuntu.${{OS_VERSION}}~${{OS_CODENAME}}"
    return [
        "if command -v docker >/dev/null 2>&1; then",
        '  echo "docker present: $(command -v docker)"',
        "else",
        f'  echo "no docker on this host: installing Docker Engine {DOCKER_VERSION}"',
        "  OS_CODENAME=\"$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release)\"",
        "  OS_VERSION=\"$(sed -n 's/^VERSION_ID=//p' /etc/os-release | tr -d '\"')\"",
        f"  install -m 0755 -d {DOCKER_KEYRING.rsplit('/', 1)[0]}",
        f"  curl -fsSL -o {DOCKER_KEYRING} {DOCKER_APT_URL}/gpg",
        f'  DOCKER_KEY_FPRS="$(gpg --batch --with-colons --show-keys --fingerprint {DOCKER_KEYRING})"',
        f'  case "$DOCKER_KEY_FPRS" in *"fpr:::::::::{DOCKER_KEY_FINGERPRINT}:"*) ;; '
        '*) echo "Docker apt key fingerprint mismatch"; exit 1;; esac',
        f'  echo "deb [arch=amd64 signed-by={DOCKER_KEYRING}] {DOCKER_APT_URL} $OS_CODENAME stable" > /etc/apt/sources.list.d/docker.list',
        *_apt_get_update(indent="  "),
        f'  {_apt_get("install -y -q")} "docker-ce={pkg}" "docker-ce-cli={pkg}" "containerd.io={containerd}"',
        "  systemctl enable --now docker",
        "fi",
    ]


def boot_definition(
    manifest: Manifest, fleet: Fleet, *, weights_s3_uri: str | None, cache_registry: str, region: str
) -> tuple[ServingDefinition, CachedPull | None]:
    """What a fleet's boot script renders: its serving definition with a Docker Hub image replaced by
    that image's pinned reference in the ECR pull-through cache at `cache_registry` (and how to pull
    it), or the manifest's definition as it is for an image of another registry."""
    cached = cached_pull(fleet.serving.image, registry=cache_registry, region=region)
    pull_image = cached.pinned if cached else None
    return definition_for(manifest, fleet, weights_s3_uri=weights_s3_uri, pull_image=pull_image), cached


def _ecr_login(region: str, registry: str) -> str:
    return f"aws ecr get-login-password --region {region} | docker login --username AWS --password-stdin {registry}"


def _image_pull(defn: ServingDefinition, cached: CachedPull | None) -> list[str]:
    """The serving image onto the host before anything runs it. Through the Docker Hub cache: the
    tag first (the cache fills on a pull by tag only, core.images), then the pinned digest, which
    the cache serves only if that tag still points at it."""
    q = shlex.quote
    if cached is None:
        ecr = ecr_image(defn.image)
        login = [_ecr_login(ecr.region, ecr.registry)] if ecr else []
        return [*login, f"docker pull {q(defn.image)}"]
    if cached.pinned != defn.image:
        raise ValueError(f"the definition runs {defn.image}, the cache pull pins {cached.pinned}")
    lines = [_ecr_login(cached.region, cached.registry)]
    if cached.by_tag and cached.by_tag != cached.pinned:
        lines.append(f"docker pull {q(cached.by_tag)}")
    moved = f"{cached.pinned} is not in the cache after pulling its tag: the tag no longer points at the pinned digest"
    lines.append(f"docker pull {q(cached.pinned)} || {{ echo {q(moved)}; exit 1; }}")
    return lines


def weights_staging(defn: ServingDefinition) -> list[str]:
    """The pinned checkpoint files (and only those) onto the cache volume, hashes checked
    (core.serving builds the lines, from the Hub or from S3 as the fleet's definition says)."""
    return list(defn.weights_staging)


def _driver_check(defn: ServingDefinition, driver_version: str) -> list[str]:
    """Refuse to start the server on a host whose driver is not the one the manifest pins."""
    q = shlex.quote
    if defn.host.vendor == "aws-neuron":
        probe = "modinfo -F version neuron"
    else:
        probe = "nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1"
    return [
        f'HOST_DRIVER="$({probe})"',
        f'case "$HOST_DRIVER" in {q(driver_version)}|{q(driver_version)}.*) echo "host driver $HOST_DRIVER";; '
        f'*) echo "host driver $HOST_DRIVER is not the pinned {driver_version} (SDK {defn.host.sdk_version}); '
        'not starting the server"; exit 1;; esac',
    ]


def _config_files(defn: ServingDefinition) -> list[str]:
    q = shlex.quote
    lines: list[str] = []
    for path, content in sorted(defn.config_files.items()):
        lines += [f"mkdir -p {q(path.rsplit('/', 1)[0])}", f"printf %s {q(content)} > {q(path)}"]
    return lines


def _health_wait(defn: ServingDefinition) -> list[str]:
    # The NLB health check decides what serves; this wait puts "ready after N s" in the boot log
    # (time to ready, per instance) and fails the boot script if the server never comes up. Its
    # bound is the ASG's health-check grace counted from the script's start ($SECONDS): the grace
    # starts when the instance enters InService, just before user data runs ("Set the health check
    # grace period", https://docs.aws.amazon.com/autoscaling/ec2/userguide/health-check-grace-period.html),
    # and past it the group replaces an instance that is still not healthy anyway.
    url = f"http://127.0.0.1:{defn.port}{defn.health_path}"
    grace = health_grace_s(defn.host.vendor)
    return [
        "READY_START=$SECONDS",
        f"until curl -fsS -o /dev/null {url}; do",
        f'  if [ "$SECONDS" -ge {grace} ]; then echo "server not healthy $SECONDS s into the boot '
        f'(the health-check grace is {grace} s: core.cloud_contract.HEALTH_GRACE_MIN)"; exit 1; fi',
        "  sleep 10",
        "done",
        'echo "server healthy after $((SECONDS - READY_START)) s"',
    ]


COMPLETE_MARKER = "COMPLETE"  # written last: a half-uploaded set of artifacts is never fetched
LOCAL_MARKER = ".harness-complete"  # this cache volume holds a complete set (compiled or fetched)


def complete_marker_pattern(key_prefix: str) -> str:
    """The object key of a complete set's marker under `key_prefix` (compiled/<key>): one publisher
    directory deep. An extended regular expression that grep -E (the boot script's fetch) and
    Python's re (deploy's compile phase, campaign/aws/compile_phase.py) read alike."""
    return f"^{key_prefix}/[^/]+/{COMPLETE_MARKER}$"


def compiled_fetch(defn: ServingDefinition, compiled_uri: str, *, region: str) -> list[str]:
    """Before the server starts: the compiled artifacts from the cache volume if a previous boot
    left a complete set, else a complete set some instance published to the results bucket
    (timed in the boot log), else this instance compiles (and publishes after it serves:
    compiled_publish). Each publisher writes its own <key>/<publisher>/ prefix, marker last, so
    instances that compile at the same time (a new fleet's first boots) never mix their files."""
    c = defn.compiled
    if c is None:
        return []
    uri = f"{compiled_uri}/{c.key}"
    bucket, _, key_prefix = uri.removeprefix("s3://").partition("/")
    return [
        f"COMPILED_URI={uri}",
        f"mkdir -p {c.directory}",
        f"if [ -f {c.directory}/{LOCAL_MARKER} ]; then",
        '  COMPILED_FROM=volume; echo "compiled artifacts: on the cache volume"',
        "else",
        '  COMPILED_SET=""',
        # One listing of the key's prefix, whose exit status tells "nothing complete published yet"
        # from "could not read the bucket" (denied, throttled, unreachable; the AWS error goes to the
        # boot log). Either way this instance compiles: it must boot.
        f'  if COMPILED_LISTING="$(aws s3api list-objects-v2 --region {region} --bucket {bucket} --prefix {key_prefix}/ '
        "--query 'Contents[].[Key]' --output text 2>&1)\"; then",
        f'    MARKER_KEY="$(grep -m 1 -E \'{complete_marker_pattern(key_prefix)}\' <<< "$COMPILED_LISTING" || true)"',
        f'    [ -z "$MARKER_KEY" ] || COMPILED_SET="s3://{bucket}/${{MARKER_KEY%/{COMPLETE_MARKER}}}"',
        '    COMPILED_MISSING="no complete set in $COMPILED_URI"',
        "  else",
        "    COMPILED_MISSING=\"could not read $COMPILED_URI (${COMPILED_LISTING//$'\\n'/ })\"",
        "  fi",
        '  if [ -n "$COMPILED_SET" ]; then',
        "    FETCH_START=$SECONDS",
        # A failed or partial download must not stop the boot (set -e) nor be loaded: start clean, compile.
        f'    if aws s3 cp --region {region} --recursive --only-show-errors --exclude {COMPLETE_MARKER} "$COMPILED_SET/" {c.directory}/; then',
        f"      touch {c.directory}/{LOCAL_MARKER}",
        '      COMPILED_FROM=s3; echo "compiled artifacts fetched from $COMPILED_SET in $((SECONDS - FETCH_START)) s"',
        "    else",
        f"      find {c.directory} -mindepth 1 -delete",
        '      COMPILED_FROM=compile; echo "compiled artifacts: fetching $COMPILED_SET failed; this instance compiles"',
        "    fi",
        "  else",
        '    COMPILED_FROM=compile; echo "compiled artifacts: $COMPILED_MISSING; this instance compiles"',
        "  fi",
        "fi",
    ]


def compiled_publish(defn: ServingDefinition, *, region: str) -> list[str]:
    """After the server is healthy, an instance that compiled uploads what it compiled under its
    own prefix, marker last. A failed upload is logged, not fatal: the server already serves."""
    c = defn.compiled
    if c is None:
        return []
    return [
        'if [ "$COMPILED_FROM" = compile ]; then',
        '  PUBLISH_URI="$COMPILED_URI/$(hostname)-$(date +%s)"',
        f'  if aws s3 cp --region {region} --recursive --only-show-errors --exclude {LOCAL_MARKER} {c.directory}/ "$PUBLISH_URI/" '
        f'&& echo {c.key} | aws s3 cp --region {region} - "$PUBLISH_URI/{COMPLETE_MARKER}"; then',
        f'    touch {c.directory}/{LOCAL_MARKER}; echo "compiled artifacts published to $PUBLISH_URI"',
        '  else echo "compiled artifacts: publishing to $PUBLISH_URI failed; later instances compile too"; fi',
        "fi",
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
    campaign: str,
    serving_digest: str,
    weights_s3_uri: str | None = None,
    driver_version: str,
    region: str,
    agent_param: str,
    neuron_monitor_param: str | None,
    neuron_namespace: str,
    compiled_uri: str | None = None,
    cached: CachedPull | None = None,
) -> list[str]:
    """`cached`: how the host pulls a Docker Hub image through the ECR pull-through cache (then
    `defn.image` is its pinned cache reference). `serving_digest`: core.serving.definition_digest of the fleet's definition as the manifest
    gives it. `compiled_uri`: s3://<results bucket>/compiled, where a fleet's instances share what they compile."""
    lines = [
        "set -euo pipefail",
        f"exec > >(tee -a {BOOT_LOG}) 2>&1",
        # Keyed by the serving definition, not the manifest: the script changes (a new launch template
        # version, which the ASG's rolling update in stacks/fleet.py rolls out) only when what the
        # instance serves does; an SLO or loadgen edit leaves the instances alone.
        f"echo {shlex.quote(f'boot: campaign {campaign}, serving definition {serving_digest}')}",
        *_mount_cache_volume(),
        *_cloudwatch_agent(region, agent_param),
        *_driver_check(defn, driver_version),
        *_docker_engine(),
    ]
    if neuron_monitor_param:
        lines += _neuron_monitor(region, neuron_monitor_param, neuron_namespace)
    lines += _image_pull(defn, cached)
    lines += [
        *weights_staging(defn),
        f"mkdir -p {shlex.quote(defn.cache_dir)}",
    ]
    lines += _config_files(defn)
    if compiled_uri:
        lines += compiled_fetch(defn, compiled_uri, region=region)
    lines.append(render_docker_run(defn))
    lines += _health_wait(defn)
    if compiled_uri:
        lines += compiled_publish(defn, region=region)
    return lines
