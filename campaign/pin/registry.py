"""An image tag's manifest digest, from its registry: the OCI distribution API.

The OCI Distribution Specification (opencontainers/distribution-spec, spec.md): `HEAD
/v2/<name>/manifests/<tag>` ("Checking if content exists in the registry": a successful response
MUST carry the manifest's digest in `Docker-Content-Digest`), with an `Accept` header listing the
manifest media types the client takes ("Pulling manifests"). A multi-arch image's digest is its
index's (OCI image index, Docker manifest list), the digest `docker pull IMAGE@sha256:...` and the
fleets' boot script pin, so those types come first in `Accept`.

A registry that wants a token answers 401 with `WWW-Authenticate: Bearer realm="...",service="...",
scope="..."`; the client GETs `realm?service=...&scope=...` (anonymously for a public image) and
retries with `Authorization: Bearer <token>`, the token in the answer's `token` (or `access_token`)
field (CNCF Distribution, "Token Authentication Specification", "Token Response Fields",
https://distribution.github.io/distribution/spec/auth/token; its example is Docker Hub's,
https://auth.docker.io/token?service=registry.docker.io&scope=repository:...:pull).

Docker Hub's registry is registry-1.docker.io, an official image under library/ (core/images.py).
A registry on a loopback address is spoken to over plain HTTP, as dockerd does ("By default, local
registries (::1/128 and 127.0.0.0/8) are configured as insecure": Docker Engine API,
RegistryServiceConfig.InsecureRegistryCIDRs); every other over HTTPS.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from campaign.pin.errors import PinFailed
from core.images import DOCKER_HUB_UPSTREAM_URL, docker_hub_image

MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
LOOPBACK_HOSTS = ("localhost", "127.", "[::1]")
TIMEOUT_S = 30.0
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_AUTH_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class ImageTag:
    """Where a tagged image's manifest is: registry host, repository, tag."""

    registry: str
    repository: str
    tag: str

    @property
    def base_url(self) -> str:
        scheme = "http" if self.registry.startswith(LOOPBACK_HOSTS) else "https"
        return f"{scheme}://{self.registry}"


def image_tag(image: str) -> ImageTag | None:
    """The registry, repository and tag of `image` (REGISTRY/REPOSITORY:TAG[@sha256:...]); None without a tag."""
    hub = docker_hub_image(image)
    if hub is not None:
        return ImageTag(DOCKER_HUB_UPSTREAM_URL, hub.repository, hub.tag) if hub.tag else None
    name = image.partition("@")[0]
    registry, _, path = name.partition("/")
    repository, colon, tag = path.rpartition(":")
    if not colon or "/" in tag:
        return None
    return ImageTag(registry, repository, tag)


def resolve_digest(ref: ImageTag, reference: str | None = None) -> str:
    """The tag's manifest digest now (sha256:...): HEAD, then the anonymous token flow on a 401.
    `reference`: a digest (or another tag) to HEAD in place of the tag, the spec's `<reference>`
    ("either (a) the digest of the manifest or (b) a tag"): whether that manifest exists."""
    url = f"{ref.base_url}/v2/{ref.repository}/manifests/{reference or ref.tag}"
    try:
        try:
            return _manifest_digest(url, None)
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            challenge = exc.headers.get("WWW-Authenticate", "")
        return _manifest_digest(url, _bearer_token(ref, challenge))
    except urllib.error.HTTPError as exc:
        raise _failed(ref, exc, reference) from None
    except OSError as exc:  # refused, unresolvable, timed out
        raise PinFailed(f"{ref.registry}: cannot reach the registry: {exc}") from None


def _manifest_digest(url: str, token: str | None) -> str:
    headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD", headers=headers), timeout=TIMEOUT_S) as r:
        digest = r.headers.get("Docker-Content-Digest")
    if digest is None:
        # Registries of earlier spec versions may leave the header out; the digest is then the sha256
        # of the manifest's bytes exactly as served (distribution-spec, the implementers' note there).
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as r:
            digest = "sha256:" + hashlib.sha256(r.read()).hexdigest()
    if not _DIGEST.match(digest):
        raise PinFailed(f"{url}: Docker-Content-Digest {digest!r} is not a sha256 digest")
    return str(digest)


def _bearer_token(ref: ImageTag, challenge: str) -> str:
    scheme, _, params_text = challenge.partition(" ")
    params = dict(_AUTH_PARAM.findall(params_text))
    if scheme.lower() != "bearer" or "realm" not in params:
        raise PinFailed(f"{ref.registry}: answered 401 without a Bearer challenge (WWW-Authenticate: {challenge!r})")
    query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
    url = f"{params['realm']}?{query}" if query else params["realm"]
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise PinFailed(
            f"{ref.registry}/{ref.repository}: the token service {params['realm']} refused an anonymous token "
            f"(HTTP {exc.code}); the image is not public"
        ) from None
    except (OSError, ValueError) as exc:
        raise PinFailed(f"{ref.registry}: no token from {params['realm']}: {exc}") from None
    token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise PinFailed(f"{ref.registry}: the token service {params['realm']} answered no token")
    return token


def _failed(ref: ImageTag, exc: urllib.error.HTTPError, reference: str | None = None) -> PinFailed:
    what = f"manifest {reference}" if reference else f"tag {ref.tag!r}"
    if exc.code == 404:
        return PinFailed(f"{ref.registry}/{ref.repository}: no {what} (HTTP 404)")
    return PinFailed(f"{ref.registry}/{ref.repository} {what}: the registry answered HTTP {exc.code}")
