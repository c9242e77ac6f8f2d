"""Every image reference a deploy pulls, checked to exist before anything starts (issue 51).

- A private ECR image (<account>.dkr.ecr.<region>.amazonaws.com/<repository>): ECR's
  DescribeImages with the reference's digest (or tag) as its imageId (Amazon ECR API reference,
  DescribeImages: ImageNotFoundException "The image requested does not exist in the specified
  repository"), with the operator's credentials.
- Any other registry (Docker Hub, ECR Public): the OCI Distribution Specification's manifest HEAD,
  `HEAD /v2/<name>/manifests/<reference>`, <reference> the pinned digest where there is one, else
  the tag ("Checking if content exists in the registry": 200 when it exists, 404 when it does not;
  opencontainers/distribution-spec, spec.md), anonymously (campaign.pin.registry's token flow).

`mirrors` maps a registry host to another (host[:port]): the test seam that points Docker Hub or
ECR Public at a loopback registry stand-in (no network there). From the CLI it is the
MIRRORS_ENV variable, `host=mirror` pairs separated by commas.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from campaign.aws.rehearsal_report import IMAGES, Seam, failed
from campaign.pin.errors import PinFailed
from campaign.pin.registry import ImageTag, resolve_digest
from core.images import DOCKER_HUB_UPSTREAM_URL, PROMETHEUS_IMAGE, docker_hub_image
from core.manifest import Manifest

MIRRORS_ENV = "HARNESS_REGISTRY_MIRRORS"
_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")


@dataclass(frozen=True)
class ImageCheck:
    image: str
    where: str  # what was asked: "ECR DescribeImages ..." or "HEAD https://.../manifests/..."
    error: str = ""  # "" when the image exists

    @property
    def exists(self) -> bool:
        return not self.error


def image_references(m: Manifest) -> list[str]:
    """Every image reference the stacks pull for `m`: each fleet's serving image and Prometheus's."""
    return list(dict.fromkeys([*(f.serving.image for f in m.fleets), PROMETHEUS_IMAGE]))


def mirrors_from_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    text = env.get(MIRRORS_ENV, "")
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    bad = [p for p in pairs if len(p) != 2 or not p[0] or not p[1]]
    if bad:
        raise ValueError(f"{MIRRORS_ENV}: expected host=mirror pairs separated by commas, got {text!r}")
    return {k.strip(): v.strip() for k, v in pairs}


def image_parts(image: str) -> tuple[str, str, str | None, str | None]:
    """(registry host, repository, tag, digest) of `image`."""
    hub = docker_hub_image(image)
    if hub is not None:
        return DOCKER_HUB_UPSTREAM_URL, hub.repository, hub.tag, hub.digest
    name, _, digest = image.partition("@")
    host, _, path = name.partition("/")
    tag = None
    if ":" in path.rsplit("/", 1)[-1]:
        path, _, tag = path.rpartition(":")
    return host, path, tag, digest or None


def check_image(image: str, *, ecr: Any = None, mirrors: Mapping[str, str] | None = None) -> ImageCheck:
    host, repository, tag, digest = image_parts(image)
    reference = digest or tag or "latest"
    if _ECR.match(host):
        where = f"ECR DescribeImages {repository} {reference}"
        image_id = {"imageDigest": digest} if digest else {"imageTag": reference}
        try:
            ecr.describe_images(repositoryName=repository, imageIds=[image_id])
        except Exception as exc:  # botocore: ImageNotFoundException, RepositoryNotFoundException, AccessDenied
            return ImageCheck(image, where, f"{type(exc).__name__}: {exc}")
        return ImageCheck(image, where)
    ref = ImageTag((mirrors or {}).get(host, host), repository, tag or "latest")
    where = f"HEAD {ref.base_url}/v2/{repository}/manifests/{reference}"
    try:
        found = resolve_digest(ref, reference)
    except PinFailed as exc:
        return ImageCheck(image, where, str(exc))
    if digest and found != digest:
        return ImageCheck(image, where, f"the registry answered the digest {found}, not {digest}")
    return ImageCheck(image, where)


def check_images(
    images: Sequence[str], *, ecr: Any = None, mirrors: Mapping[str, str] | None = None
) -> list[ImageCheck]:
    return [check_image(i, ecr=ecr, mirrors=mirrors) for i in images]


def images_seam(checks: Sequence[ImageCheck]) -> Seam:
    """The rehearsal report's images seam (campaign.aws.rehearsal_report): the first missing image
    with what its registry answered, or every image found."""
    missing = [c for c in checks if not c.exists]
    if missing:
        c = missing[0]
        return failed(
            IMAGES,
            f"{len(missing)} of {len(checks)} image reference(s) not found: {', '.join(x.image for x in missing)}",
            f"{c.where}: {c.error}",
            "pin an image that exists (`campaign pin MANIFEST` resolves each tag's digest) or push it",
        )
    return Seam(IMAGES, True, f"all {len(checks)} image reference(s) exist: " + "; ".join(c.where for c in checks))
