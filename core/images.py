"""Container image references: which registry an image comes from, and the path the stacks pull a
Docker Hub image by instead (an ECR pull-through cache in the campaign's account and region).

Why: Docker Hub limits unauthenticated pulls per IPv4 address (Docker docs, "Usage and limits"),
and every fleet instance and Fargate task leaves the VPC through one NAT address, so a replacement
wave or ASG churn could exhaust it; the pull then fails under `set -e` and the instance is
replaced after its health grace, again and again. Through the cache, ECR pulls from Docker Hub
with the operator's credentials (a Secrets Manager secret whose name starts with
`ecr-pullthroughcache/`; Amazon ECR user guide, "Creating a pull through cache rule") and the
hosts pull from ECR through the VPC's ECR and S3 endpoints. Docker Hub official images live under
`library/` there ("Pulling an image with a pull through cache rule in Amazon ECR": "For Docker Hub
official images, the /library prefix must be included").

A pull-through cache fills on a pull by tag only: a first pull of an uncached manifest by digest
(or by tag and digest together) answers that the image does not exist (aws/containers-roadmap#2837,
open). So a host pulls by tag first and then by the manifest's digest, which fails if the tag no
longer points at the pinned image; a Docker Hub image deployed to the cloud must carry both
(campaign/aws/cloud_checks.py refuses one without its tag).

An Amazon ECR Public image (public.ecr.aws, the Neuron image) goes through a second rule of the
same kind, upstream public.ecr.aws, which needs no credentials (Amazon ECR user guide, "Sync an
upstream registry with an Amazon ECR private registry": "Amazon ECR Public, Kubernetes container
image registry, and Quay (doesn't require authentication)"): pulled directly, every boot's
multi-GB image crossed the NAT gateway, billed per GB; through the cache it is fetched once into the account and then comes through the VPC's ECR
endpoints. It needs its tag for the first fill, as a Docker Hub image does; an untagged one is
pulled as it is. Private ECR images are pulled as they are, with the role's own ECR permissions;
other registries (nvcr.io, ghcr.io) too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB_HOSTS = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
DOCKER_HUB_UPSTREAM_URL = "registry-1.docker.io"  # the rule's upstream (ECR API, CreatePullThroughCacheRule)
DOCKER_HUB_CACHE_PREFIX = "docker-hub"  # the ECR repository prefix of the cache rule
ECR_PUBLIC_HOST = "public.ecr.aws"  # also the second rule's upstream URL
ECR_PUBLIC_CACHE_PREFIX = "ecr-public"  # the ECR repository prefix of that rule
PULL_THROUGH_SECRET_PREFIX = "ecr-pullthroughcache/"
# CreatePullThroughCacheRule's credentialArn pattern (ECR API reference), with the account and region
# written out so a check can name what is wrong.
_SECRET_ARN = re.compile(
    r"^arn:aws[a-z-]*:secretsmanager:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):secret:ecr-pullthroughcache/[A-Za-z0-9/_+=.@-]+$"
)
# Prometheus, the one image the stacks run besides the fleets' (stacks/observability.py). Exact
# release and its multi-arch index digest. Upstream publishes no digest in its docs; this one is the
# digest of prom/prometheus:v3.5.0 as pinned independently by several public repositories (looked
# up 2026-12-03).
PROMETHEUS_IMAGE = "prom/prometheus:v3.5.0@sha256:63805ebb8d2b3920190daf1cb14a60871b16fd38bed42b857a3182bc621f4996"


@dataclass(frozen=True)
class DockerHubImage:
    repository: str  # as Docker Hub's registry API names it: library/<name> for an official image
    tag: str | None
    digest: str | None  # sha256:...


def docker_hub_image(image: str) -> DockerHubImage | None:
    """The Docker Hub repository, tag and digest of `image`, or None when it names another registry.
    A reference's first path component is a registry when it has a '.' or ':' or is 'localhost'
    (the distribution reference grammar); without one, the image is on Docker Hub."""
    name, _, digest = image.partition("@")
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        if first not in DOCKER_HUB_HOSTS:
            return None
        name = rest
    path, tag = name, None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
    if "/" not in path:
        path = f"library/{path}"
    return DockerHubImage(path, tag or None, digest or None)


def ecr_public_image(image: str) -> DockerHubImage | None:
    """The ECR Public repository, tag and digest of `image` (the same three parts as a Docker Hub
    image's), or None when it names another registry."""
    name, _, digest = image.partition("@")
    host, sep, path = name.partition("/")
    if host != ECR_PUBLIC_HOST or not sep:
        return None
    tag = None
    if ":" in path.rsplit("/", 1)[-1]:
        path, _, tag = path.rpartition(":")
    return DockerHubImage(path, tag or None, digest or None)


@dataclass(frozen=True)
class CachedPull:
    """How a host pulls a Docker Hub or ECR Public image through the ECR pull-through cache."""

    registry: str  # <account>.dkr.ecr.<region>.amazonaws.com, the host `docker login` needs
    region: str
    repository: str  # <rule prefix>/<upstream repository>, the ECR repository the cache creates
    by_tag: str | None  # pulled first: the cache fills on a pull by tag only
    pinned: str  # the reference the image runs by: the digest when the manifest pins one


def cached_pull(image: str, *, registry: str, region: str) -> CachedPull | None:
    """The cache references of a Docker Hub or tagged ECR Public `image`, or None for an image
    pulled as it is."""
    hub = docker_hub_image(image)
    prefix = DOCKER_HUB_CACHE_PREFIX
    if hub is None:
        hub = ecr_public_image(image)
        if hub is None or hub.tag is None:  # the cache fills on a pull by tag only
            return None
        prefix = ECR_PUBLIC_CACHE_PREFIX
    repository = f"{prefix}/{hub.repository}"
    base = f"{registry}/{repository}"
    by_tag = f"{base}:{hub.tag}" if hub.tag else None
    pinned = f"{base}@{hub.digest}" if hub.digest else (by_tag or base)
    return CachedPull(registry, region, repository, by_tag, pinned)


def secret_arn_issue(arn: str, region: str) -> str | None:
    """Why `arn` cannot be a Docker Hub pull-through cache rule's credential in `region`, or None."""
    m = _SECRET_ARN.match(arn)
    if m is None:
        return (
            f"{arn!r} is not the ARN of a Secrets Manager secret named {PULL_THROUGH_SECRET_PREFIX}...; "
            "ECR's pull-through cache reads Docker Hub credentials only from such a secret"
        )
    if m["region"] != region:
        return f"the secret is in {m['region']}; the cache rule is in costs.region {region}, and ECR needs both in one region"
    return None
