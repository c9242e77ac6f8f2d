"""What a cloud deploy needs beyond a valid manifest: no illustrative value left in it.

The example manifests ship made-up weight hashes and image digests (the local campaign never
downloads either), a documentation-range operator CIDR, a gated checkpoint without a hub
token, and the emulator's word tokenizer. Deployed as they are, `sha256sum --check` fails under `set -e` on every instance and the
Auto Scaling groups replace billed instances after every grace period until teardown. So
`validate --for cloud` and `deploy` refuse them, each with the field to fill; likewise a deploy
without the Docker Hub credentials every Docker Hub image is pulled with (--docker-hub-credential-arn).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.compile_host import CompileHost
from core.images import PROMETHEUS_IMAGE, PULL_THROUGH_SECRET_PREFIX, docker_hub_image, secret_arn_issue
from core.manifest import CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG, Issue, Manifest

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
        "8e3f1a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f",
    }
)
# RFC 5737 (IPv4) and RFC 3849 (IPv6) documentation ranges: never a real operator network.
DOCUMENTATION_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# Hugging Face gates every meta-llama repository behind its licence agreement: downloads need a token.
GATED_REPO_OWNERS = frozenset({"meta-llama"})


DOCKER_HUB_CREDENTIAL_FLAG = "--docker-hub-credential-arn"


def cloud_issues(
    m: Manifest, *, weights_from_s3: bool = False, docker_hub_credential_arn: str | None = None
) -> list[Issue]:
    """Every field a cloud deploy cannot use as it is, as `field.path: reason`."""
    issues: list[Issue] = image_issues(m, docker_hub_credential_arn)
    for name, digest in sorted(m.model.weight_files.items()):
        if digest in ILLUSTRATIVE_VALUES:
            issues.append(
                Issue(
                    f"model.weight_files.{name}",
                    "illustrative hash from the example; `inf2-vs-g6 pin MANIFEST` writes the Hub's sha256 of this "
                    "file at model.commit (no download)",
                )
            )
    for i, f in enumerate(m.fleets):
        digest = f.serving.image.rsplit("@sha256:", 1)[-1]
        if digest in ILLUSTRATIVE_VALUES:
            issues.append(
                Issue(
                    f"fleets[{i}].serving.image",
                    "illustrative digest from the example; `inf2-vs-g6 pin MANIFEST` writes the digest its tag has "
                    "now in its registry (the image written REPOSITORY:TAG@sha256:...)",
                )
            )
        if f.replicas_per_instance > 1:
            issues.append(
                Issue(
                    f"fleets[{i}].replicas_per_instance",
                    "the fleet boot script starts one server per instance "
                    "(core/serving.py); data parallel is emulated and planned only",
                )
            )
    issues += tokenizer_issues(m)
    owner = m.model.repo.split("/", 1)[0]
    if owner in GATED_REPO_OWNERS and not m.model.hub_token_secret_arn and not weights_from_s3:
        issues.append(
            Issue(
                "model.hub_token_secret_arn",
                f"{m.model.repo} is gated on the Hugging Face Hub: name the Secrets Manager "
                "secret holding a read token, or stage the weights in S3 (--weights-s3-uri)",
            )
        )
    if m.max_campaign_hours is None:
        issues.append(
            Issue(
                "max_campaign_hours",
                "a cloud campaign needs a deadline: the hours after `deploy` at which every fleet's group is set to 0 "
                "(at least the plan's campaign minutes, compile phase included; `campaign plan` prints them)",
            )
        )
    net = ipaddress.ip_network(m.operator.cidr, strict=False)
    if any(net.version == d.version and net.subnet_of(d) for d in DOCUMENTATION_NETWORKS):  # type: ignore[arg-type]
        issues.append(
            Issue("operator.cidr", f"{m.operator.cidr} is a documentation range; set your office or VPN range")
        )
    return issues


def tokenizer_issues(m: Manifest) -> list[Issue]:
    """The load generators must count tokens as the served model does: its own tokenizer files at
    model.commit, pinned so that every task stages and checks the same bytes. (That the manifest's
    chat template is the checkpoint's is checked with the files, core.manifest.tokenizer_file_issues.)"""
    t = m.tokenizer
    if t.kind == "emulator":
        return [
            Issue(
                "tokenizer",
                "kind emulator counts words, not the served model's tokens: every worker's /tokenize check "
                "against the real server would fail; use kind huggingface with the tokenizer files of "
                f"{m.model.repo} at model.commit pinned in tokenizer.files",
            )
        ]
    if not t.files:
        return [
            Issue(
                "tokenizer.files",
                f"not pinned: list tokenizer.json and {TOKENIZER_CONFIG} here and run `inf2-vs-g6 pin MANIFEST`, which "
                f"downloads them (and {CHAT_TEMPLATE_FILE} when the checkpoint has one) of {m.model.repo} at "
                "model.commit beside tokenizer.path and writes their sha256; the load-generator tasks stage exactly "
                "these and check them",
            )
        ]
    return []


def image_issues(m: Manifest, docker_hub_credential_arn: str | None) -> list[Issue]:
    """The stacks pull every Docker Hub image through an ECR pull-through cache, never anonymously
    (core/images.py): that needs the operator's Docker Hub credentials, and a tag beside each such
    fleet image's digest (the cache fills on a pull by tag only)."""
    issues: list[Issue] = []
    from_hub: list[str] = []
    for i, f in enumerate(m.fleets):
        hub = docker_hub_image(f.serving.image)
        if hub is None:
            continue
        from_hub.append(f"fleets[{i}].serving.image")
        if hub.tag is None:
            issues.append(
                Issue(
                    f"fleets[{i}].serving.image",
                    "a Docker Hub image is pulled through the stack's ECR pull-through cache, which fills on a pull "
                    "by tag only (aws/containers-roadmap#2837): write its tag beside the digest (REPOSITORY:TAG@sha256:...)",
                )
            )
    from_hub.append(f"Prometheus ({PROMETHEUS_IMAGE.split('@')[0]})")
    if docker_hub_credential_arn is None:
        issues.append(
            Issue(
                DOCKER_HUB_CREDENTIAL_FLAG,
                f"{', '.join(from_hub)} come from Docker Hub, pulled through an ECR pull-through cache that needs "
                f"Docker Hub credentials: create a Secrets Manager secret named {PULL_THROUGH_SECRET_PREFIX}<name> in "
                f"{m.costs.region} (docs/cloud.md, 'Before the first deploy') and pass its ARN",
            )
        )
    else:
        problem = secret_arn_issue(docker_hub_credential_arn, m.costs.region)
        if problem:
            issues.append(Issue(DOCKER_HUB_CREDENTIAL_FLAG, problem))
    return issues


# --- Service Quotas pre-flight: what the manifest needs against what the account may run ---------
# Quota codes (Service Quotas, `aws service-quotas get-service-quota --service-code ... --quota-code ...`):
#   ec2 L-1945791B  Running On-Demand Inf instances (vCPUs)
#   ec2 L-DB2E81BA  Running On-Demand G and VT instances (vCPUs)
#   fargate L-3032A538  Fargate On-Demand vCPU resource count
# Names and codes as the Service Quotas console and API list them; the Fargate one is the quota
# https://docs.aws.amazon.com/AmazonECS/latest/developerguide/service-quotas.html#service-quotas-fargate
# names; the EC2 codes cross-checked with aws-quota-checker's EC2 checks (github.com/brennerm/aws-quota-checker).
EC2_VCPU_QUOTAS: dict[str, tuple[str, str]] = {
    "inf": ("L-1945791B", "Running On-Demand Inf instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "vt": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
}
FARGATE_VCPU_QUOTA = ("L-3032A538", "Fargate On-Demand vCPU resource count")


@dataclass(frozen=True)
class QuotaNeed:
    service: str
    code: str
    name: str
    vcpus: int
    why: str


def quota_needs(m: Manifest, compiling: Sequence[CompileHost] | None = None) -> list[QuotaNeed]:
    """vCPUs per quota: asg.max x the instance's vCPUs per fleet family, plus one compile instance per
    fleet `deploy` compiles first (None: every at-risk fleet a larger host can compile, as `plan`
    shows them), counted as if it ran beside the fleets: a bound, since its phase ends before they
    start; one vCPU per load-generator task, Prometheus's and the conductor's (`run --detach`), which
    runs beside the load generators it starts."""
    from core import catalog
    from core.cloud_contract import CONDUCTOR_TASK_VCPU, LOADGEN_TASK_VCPU, PROMETHEUS_TASK_VCPU
    from core.compile_host import compile_hosts

    if compiling is None:
        compiling = compile_hosts(m)
    ec2_needs = [(f.instance_type, f.asg.max, f"{f.name}: asg.max {f.asg.max}") for f in m.fleets]
    ec2_needs += [(h.instance_type, 1, f"{h.fleet} compile phase: 1") for h in compiling if h.instance_type]
    by_code: dict[str, QuotaNeed] = {}
    for instance_type, count, what in ec2_needs:
        fam = _family(instance_type)
        if fam not in EC2_VCPU_QUOTAS:
            continue  # no quota mapped for this family: `deploy` says so (unchecked_families)
        code, name = EC2_VCPU_QUOTAS[fam]
        per = catalog.instance(instance_type).vcpus
        why = f"{what} x {per} vCPU ({instance_type})"
        prev = by_code.get(code)
        by_code[code] = QuotaNeed(
            "ec2", code, name, count * per + (prev.vcpus if prev else 0), f"{prev.why} + {why}" if prev else why
        )
    tasks = len(m.fleets) * (1 + m.loadgen.workers)
    fargate = tasks * LOADGEN_TASK_VCPU + PROMETHEUS_TASK_VCPU + CONDUCTOR_TASK_VCPU
    why = (
        f"{len(m.fleets)} fleets x (1 master + {m.loadgen.workers} workers) x {LOADGEN_TASK_VCPU} vCPU"
        f" + Prometheus {PROMETHEUS_TASK_VCPU} vCPU + the conductor {CONDUCTOR_TASK_VCPU} vCPU (run --detach)"
    )
    return [*by_code.values(), QuotaNeed("fargate", FARGATE_VCPU_QUOTA[0], FARGATE_VCPU_QUOTA[1], fargate, why)]


def _family(instance_type: str) -> str:
    """The quota family: the type's leading letters ("inf2.xlarge" -> "inf", "g6e.xlarge" -> "g")."""
    match = re.match(r"[a-z]*", instance_type)
    return match[0] if match else ""


def unchecked_families(m: Manifest) -> list[str]:
    return sorted({f.instance_type for f in m.fleets if _family(f.instance_type) not in EC2_VCPU_QUOTAS})


def quota_value(client: Any, service: str, code: str) -> float:
    """The account's applied value; AWS's default where the account has none applied (NoSuchResourceException)."""
    try:
        return float(client.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])
    except client.exceptions.NoSuchResourceException:
        return float(client.get_aws_default_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])


def quota_shortfalls(m: Manifest, client: Any, compiling: Sequence[CompileHost] | None = None) -> list[str]:
    """One line per quota below what the manifest needs, with both numbers; empty when all fit.
    The quotas bound vCPUs running at once in the region, so anything else running there counts too."""
    short = []
    for need in quota_needs(m, compiling):
        have = quota_value(client, need.service, need.code)
        if have < need.vcpus:
            short.append(
                f"{need.name} ({need.service} {need.code}): the manifest needs {need.vcpus} vCPU ({need.why}), "
                f"the account's quota in {m.costs.region} is {have:g}; request an increase in Service Quotas or lower asg.max / loadgen.workers"
            )
    return short
