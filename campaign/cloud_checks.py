"""What a cloud deploy needs beyond a valid manifest: no illustrative value left in it.

The example manifests ship made-up weight hashes and image digests (the local campaign never
downloads either), a documentation-range operator CIDR, and a gated checkpoint without a hub
token. Deployed as they are, `sha256sum --check` fails under `set -e` on every instance and the
Auto Scaling groups replace billed instances after every grace period until teardown. So
`validate --for cloud` and `deploy` refuse them, each with the field to fill.
"""

from __future__ import annotations

import ipaddress

from core.manifest import Issue, Manifest

# The made-up values in manifests/*.yaml (tests/campaign/test_cloud_checks.py keeps this list
# complete): a copy of an example that still carries one is refused for a cloud deploy.
ILLUSTRATIVE_VALUES: frozenset[str] = frozenset(
    {
        "1f0a3b8a4ce0b1ab7cf0f4c9f8a5a6e18f7c9e0e1b2c3d4e5f60718293a4b5c6",
        "2a1b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809",
        "3b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a",
        "4c3d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b",
        "5e1d3a0c9b7f2e4d6a8c0b1e3f5a7c9d2b4e6f8a0c1d3e5f7a9b2c4d6e8f0a1b",
        "7c2e9a1b3d5f7081a2c4e6f8091b3d5f7a9c1e3b5d7f9a0c2e4b6d8f0a1c3e5d",
    }
)
# RFC 5737 (IPv4) and RFC 3849 (IPv6) documentation ranges: never a real operator network.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# Hugging Face gates every meta-llama repository behind its licence agreement: downloads need a token.
GATED_REPO_OWNERS = frozenset({"meta-llama"})


def cloud_issues(m: Manifest, *, weights_from_s3: bool = False) -> list[Issue]:
    """Every field a cloud deploy cannot use as it is, as `field.path: reason`."""
    issues: list[Issue] = []
    for name, digest in sorted(m.model.weight_files.items()):
        if digest in ILLUSTRATIVE_VALUES:
            issues.append(Issue(f"model.weight_files.{name}", "illustrative hash from the example; put `sha256sum` of this file at model.commit"))
    for i, f in enumerate(m.fleets):
        digest = f.serving.image.rsplit("@sha256:", 1)[-1]
        if digest in ILLUSTRATIVE_VALUES:
            issues.append(Issue(f"fleets[{i}].serving.image", "illustrative digest from the example; pin the image's real digest "
                                                               "(`docker buildx imagetools inspect IMAGE:TAG`)"))
        if f.replicas_per_instance > 1:
            issues.append(Issue(f"fleets[{i}].replicas_per_instance", "the fleet boot script starts one server per instance "
                                                                       "(core/serving.py); data parallel is emulated and planned only"))
    owner = m.model.repo.split("/", 1)[0]
    if owner in GATED_REPO_OWNERS and not m.model.hub_token_secret_arn and not weights_from_s3:
        issues.append(Issue("model.hub_token_secret_arn", f"{m.model.repo} is gated on the Hugging Face Hub: name the Secrets Manager "
                                                          "secret holding a read token, or stage the weights in S3 (--weights-s3-uri)"))
    net = ipaddress.ip_network(m.operator.cidr, strict=False)
    if any(net.version == d.version and net.subnet_of(d) for d in DOCUMENTATION_NETWORKS):  # type: ignore[arg-type]
        issues.append(Issue("operator.cidr", f"{m.operator.cidr} is a documentation range; set your office or VPN range"))
    return issues
