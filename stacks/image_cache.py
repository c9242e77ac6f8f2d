"""The ECR pull-through cache every Docker Hub and tagged ECR Public image is pulled through
(core/images.py says why).

A second rule (prefix ecr-public, upstream public.ecr.aws) needs no credential. The Docker Hub
`AWS::ECR::PullThroughCacheRule` (prefix docker-hub, upstream registry-1.docker.io) has one,
a template parameter: the ARN of the operator's Secrets Manager secret named
`ecr-pullthroughcache/...`, which `campaign deploy --docker-hub-credential-arn` fills (docs/cloud.md
says how to create it). Docker Hub upstreams require credentials (Amazon ECR user guide,
"Creating a pull through cache rule"), and neither the secret's value nor its ARN is in the
template. The repositories the cache creates on a first pull are named docker-hub/<repository>;
a role that pulls through it needs, besides the usual pull actions on them,
ecr:BatchImportUpstreamImage and ecr:CreateRepository ("IAM permissions required to sync an
upstream registry with an Amazon ECR private registry").
"""

from __future__ import annotations

from aws_cdk import CfnParameter, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct

from core.images import (
    DOCKER_HUB_CACHE_PREFIX,
    DOCKER_HUB_UPSTREAM_URL,
    ECR_PUBLIC_CACHE_PREFIX,
    ECR_PUBLIC_HOST,
    PULL_THROUGH_SECRET_PREFIX,
    CachedPull,
    cached_pull,
)
from core.naming import DOCKER_HUB_CREDENTIAL_PARAMETER

CREDENTIAL_PARAMETER = DOCKER_HUB_CREDENTIAL_PARAMETER
# CreatePullThroughCacheRule's credentialArn pattern (ECR API reference), so CloudFormation refuses
# another value before ECR does.
SECRET_ARN_PATTERN = (
    r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:ecr-pullthroughcache/[A-Za-z0-9/_+=.@-]+$"
)
# What pulling an image through the cache takes, on the cache's repository of that image.
CACHE_PULL_ACTIONS = [
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
    "ecr:BatchCheckLayerAvailability",
    "ecr:BatchImportUpstreamImage",  # the cache fetches the upstream image into it
    "ecr:CreateRepository",  # the first pull of an image creates its repository
]


class DockerHubCache(Construct):
    def __init__(self, scope: Construct, cid: str) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        self.credential_arn = CfnParameter(
            stack,
            CREDENTIAL_PARAMETER,
            type="String",
            allowed_pattern=SECRET_ARN_PATTERN,
            constraint_description=f"the ARN of a Secrets Manager secret named {PULL_THROUGH_SECRET_PREFIX}... in this region",
            description=(
                "Docker Hub credentials for the ECR pull-through cache (a Secrets Manager secret named "
                f"{PULL_THROUGH_SECRET_PREFIX}..., keys username and accessToken); filled by `campaign deploy`"
            ),
        )
        self.rule = ecr.CfnPullThroughCacheRule(
            self,
            "Rule",
            ecr_repository_prefix=DOCKER_HUB_CACHE_PREFIX,
            upstream_registry="docker-hub",
            upstream_registry_url=DOCKER_HUB_UPSTREAM_URL,
            credential_arn=self.credential_arn.value_as_string,
        )
        # ECR Public needs no credentials; the Neuron image then comes through the VPC's ECR
        # endpoints instead of the NAT gateway (core/images.py says why).
        self.public_rule = ecr.CfnPullThroughCacheRule(
            self,
            "EcrPublicRule",
            ecr_repository_prefix=ECR_PUBLIC_CACHE_PREFIX,
            upstream_registry="ecr-public",
            upstream_registry_url=ECR_PUBLIC_HOST,
        )
        self.region = stack.region
        self.registry = f"{stack.account}.dkr.ecr.{stack.region}.amazonaws.com"

    def pull(self, image: str) -> CachedPull | None:
        """How a host pulls `image` through this cache; None for an image of another registry."""
        return cached_pull(image, registry=self.registry, region=self.region)

    def needed_by(self, construct: Construct) -> None:
        """`construct` pulls through the cache: CloudFormation creates the rules first."""
        construct.node.add_dependency(self.rule, self.public_rule)

    def grant_pull(self, grantee: iam.IGrantable, pulls: list[CachedPull]) -> None:
        """Pull these images through the cache: the actions on their cache repositories only, plus
        the registry login token (which has no resource-level permission)."""
        if not pulls:
            return
        stack = Stack.of(self)
        repositories = sorted(
            {stack.format_arn(service="ecr", resource="repository", resource_name=p.repository) for p in pulls}
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=CACHE_PULL_ACTIONS, resources=repositories)
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"])
        )
