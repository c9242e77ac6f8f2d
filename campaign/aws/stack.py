"""The AWS path: deploy, teardown — and the check that nothing tagged is left running.

Teardown order is fixed by the product: the report is written first (so a failed destroy
never loses the evidence), then the load-generator tasks a run left are stopped and the
stack is deleted, then every resource still tagged with the campaign is listed through the
Resource Groups Tagging API. The results bucket is kept by design and is the one thing
allowed to remain. (`campaign run` itself is campaign/backends/fargate/fleets.py.)
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from core import naming
from core.cloud_contract import format_deadline, parse_deadline
from core.compile_host import CompileHost
from core.errors import EXIT_BAD_INPUT, EXIT_FAILED_STEP, CampaignError
from core.images import DOCKER_HUB_CACHE_PREFIX, ECR_PUBLIC_CACHE_PREFIX
from core.manifest import Manifest
from core.naming import RETAINED_TAG
from core.shipped import checkout_root


class AwsStepFailed(CampaignError, RuntimeError):
    exit_code = EXIT_FAILED_STEP


def stack_name(m: Manifest) -> str:
    return naming.stack_name(m.campaign)


def cdk_argv(action: str, manifest_path: Path, extra: Sequence[str] = ()) -> list[str]:
    npx = shutil.which("npx")
    if npx is None:
        raise AwsStepFailed("npx not found: install Node.js 20+ and run `npm ci` in the repository")
    return [npx, "cdk", action, "-c", f"manifest={manifest_path.resolve()}", *extra]


# The least time a deadline must leave when `deploy` starts: `cdk deploy` creates each fleet's group
# before its scheduled action, and EC2 Auto Scaling refuses an action scheduled in the past ("If you
# try to schedule your action in the past, Amazon EC2 Auto Scaling returns an error message", EC2 Auto
# Scaling API reference, PutScheduledUpdateGroupAction), which would fail the deploy midway.
DEADLINE_MARGIN = timedelta(minutes=30)


class DeadlineRefused(CampaignError, ValueError):
    """The deadline `deploy` would set is past or too close: refused before anything is deployed."""

    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class Deadline:
    at: datetime
    how: str  # where it comes from, for deploy's line

    @property
    def parameter(self) -> str:
        return format_deadline(self.at)


def utc_now() -> datetime:
    """The clock `deploy` sets the deadline from (a seam for tests)."""
    return datetime.now(UTC)


def deployed_deadline(cfn: Any, stack: str) -> datetime | None:
    """The CampaignDeadline the deployed stack holds; None when there is no stack or it has none."""
    from botocore.exceptions import ClientError

    try:
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    for p in stacks[0].get("Parameters", []) if stacks else []:
        if p.get("ParameterKey") == naming.CAMPAIGN_DEADLINE_PARAMETER:
            return parse_deadline(
                p["ParameterValue"], field_name=f"stack {stack}: {naming.CAMPAIGN_DEADLINE_PARAMETER}"
            )
    return None


def campaign_deadline(
    max_hours: float, *, now: datetime, deployed: datetime | None, extend_hours: float | None = None
) -> Deadline:
    """The deadline `deploy` sets: a new stack's is now + max_campaign_hours; a deployed stack keeps
    its own (a second `deploy` is no new campaign), moved by `extend_hours` when given. A deadline
    less than DEADLINE_MARGIN ahead is refused, naming both times."""
    if deployed is None:
        if extend_hours:
            raise DeadlineRefused(
                "--extend-hours: no deployed stack whose deadline it could move; raise max_campaign_hours instead"
            )
        at, how = now + timedelta(hours=max_hours), f"deploy time + max_campaign_hours ({max_hours:g} h)"
    elif extend_hours:
        at = deployed + timedelta(hours=extend_hours)
        how = f"the deployed stack's {format_deadline(deployed)} moved by --extend-hours {extend_hours:g}"
    else:
        at, how = deployed, "kept from the deployed stack (--extend-hours N moves it)"
    if at - now < DEADLINE_MARGIN:
        raise DeadlineRefused(
            f"deadline {format_deadline(at)} ({how}) is less than {DEADLINE_MARGIN.seconds // 60} min after now "
            f"({format_deadline(now)}): EC2 Auto Scaling refuses a scheduled action in the past; "
            "move it with `deploy --extend-hours N`"
        )
    return Deadline(at, how)


def deadline_parameter_args(deadline: Deadline) -> list[str]:
    """`cdk deploy` arguments filling the CampaignDeadline parameter."""
    return ["--parameters", f"{naming.CAMPAIGN_DEADLINE_PARAMETER}={deadline.parameter}"]


class QuotaTooLow(AwsStepFailed):
    """The account's Service Quotas cannot run what the manifest asks for: refused before any spend."""


def check_quotas(
    session: Any, m: Manifest, *, compiling: Sequence[CompileHost] | None = None, say: Any = print
) -> None:
    """Pre-flight: every vCPU quota the manifest needs (campaign.aws.cloud_checks.quota_needs, with the
    compile instances of `compiling`) against the account's applied value; QuotaTooLow names each
    short one with both numbers."""
    from campaign.aws.cloud_checks import quota_needs, quota_shortfalls, unchecked_families

    client = session.client("service-quotas")
    short = quota_shortfalls(m, client, compiling)
    if short:
        raise QuotaTooLow("Service Quotas too low for this manifest; nothing was deployed:\n  " + "\n  ".join(short))
    say(
        "Service Quotas: "
        + ", ".join(f"{n.name} needs {n.vcpus} vCPU" for n in quota_needs(m, compiling))
        + " - within the account's quotas"
    )
    for t in unchecked_families(m):
        say(f"Service Quotas: no vCPU quota mapped for {t} (campaign.aws.cloud_checks.EC2_VCPU_QUOTAS); not checked")


def deploy(
    manifest_path: Path,
    *,
    approve: bool = False,
    extra: Sequence[str] = (),
    session: Any = None,
    compiling: Sequence[CompileHost] | None = None,
    check_quota: bool = True,
) -> int:
    """`extra`: more `cdk deploy` arguments (the fleets' AMI parameters from campaign.aws.dlami, the
    compile phase's context). The account's Service Quotas are checked first, `compiling`'s compile
    instances included (QuotaTooLow before `cdk deploy` runs), unless `check_quota` is False (the
    compile phase's second `cdk deploy`: checked before its first)."""
    from core.manifest import load_manifest

    m = load_manifest(manifest_path)
    if session is None:
        import boto3

        session = boto3.session.Session(region_name=m.costs.region)
    if check_quota:
        check_quotas(session, m, compiling=compiling)
    root = checkout_root("deploy (cdk synthesizes the stacks from the repository's app.py)")
    argv = cdk_argv("deploy", manifest_path, [*(["--require-approval", "never"] if approve else []), *extra])
    return subprocess.call(argv, cwd=root)


def destroy(session: Any, stack: str, *, say: Any = print) -> int:
    """Delete the stack (what `cdk destroy` does) and wait; 0 when it is gone. Through the SDK
    rather than the CDK CLI: no synth, no Node, and a DELETE_FAILED names its resources."""
    from botocore.exceptions import ClientError, WaiterError

    cfn = session.client("cloudformation")
    try:
        cfn.describe_stacks(StackName=stack)
    except ClientError as exc:
        if "does not exist" in str(exc):
            say(f"stack {stack} does not exist (already destroyed)")
            return 0
        raise
    deregister_discovery_instances(session, cfn, stack, say=say)
    say(f"deleting stack {stack} ...")
    cfn.delete_stack(StackName=stack)
    try:
        cfn.get_waiter("stack_delete_complete").wait(StackName=stack, WaiterConfig={"Delay": 15, "MaxAttempts": 240})
    except WaiterError as exc:
        failed = []
        try:
            for e in cfn.describe_stack_events(StackName=stack).get("StackEvents", []):
                if e.get("ResourceStatus") == "DELETE_FAILED":
                    failed.append(f"{e.get('LogicalResourceId')}: {e.get('ResourceStatusReason')}")
        except ClientError:
            pass
        say(f"stack {stack} was not deleted: {exc}" + "".join(f"\n  {f}" for f in failed[:10]))
        return 1
    say(f"stack {stack} deleted")
    delete_container_insights_logs(session, stack, say=say)
    delete_cache_repositories(session, say=say)
    return 0


def deregister_discovery_instances(session: Any, cfn: Any, stack: str, *, say: Any = print) -> list[str]:
    """Cloud Map instances a killed `run` left registered (it deregisters its own tasks when it
    ends): CloudFormation cannot delete a service that still has instances, so they go first."""
    from botocore.exceptions import ClientError

    from campaign.aws.run_config import read_run_config

    try:
        cfg = read_run_config(cfn, stack)
    except Exception as exc:  # a stack without the run config output has no discovery services of ours
        say(f"no Cloud Map services to clean ({type(exc).__name__}: {exc})")
        return []
    sd = session.client("servicediscovery")
    gone: list[str] = []
    for service in [*cfg.master_services.values(), *cfg.workers_services.values()]:
        if not service:
            continue
        try:
            for page in sd.get_paginator("list_instances").paginate(ServiceId=service):
                for inst in page.get("Instances", []):
                    sd.deregister_instance(ServiceId=service, InstanceId=inst["Id"])
                    gone.append(f"{service}/{inst['Id']}")
                    say(f"deregistered Cloud Map instance {inst['Id']} left in {service} by an earlier run")
        except ClientError as exc:
            say(f"Cloud Map service {service}: {exc}")
    return gone


def container_insights_log_groups(session: Any, stack: str) -> list[str]:
    """ECS creates /aws/ecs/containerinsights/<cluster>/performance itself: no stack resource, no
    campaign tag, so neither the stack's deletion nor the Tagging API sees it. The cluster's
    name is CloudFormation's generated <stack>-<logical id>-<suffix>."""
    logs = session.client("logs")
    prefix = f"/aws/ecs/containerinsights/{stack}-"
    return [
        g["logGroupName"]
        for page in logs.get_paginator("describe_log_groups").paginate(logGroupNamePrefix=prefix)
        for g in page.get("logGroups", [])
    ]


def delete_container_insights_logs(session: Any, stack: str, *, say: Any = print) -> None:
    for name in container_insights_log_groups(session, stack):
        session.client("logs").delete_log_group(logGroupName=name)
        say(f"deleted log group {name} (Container Insights, created by ECS outside the stack)")


# The ECR repository prefixes of the stack's pull-through cache rules (stacks/image_cache.py). The
# cache creates <prefix>/<upstream repository> on a first pull ("All repositories using this prefix
# become pull through cache-enabled repositories", Amazon ECR user guide, "Customizing repository
# prefixes for ECR to ECR pull through cache"); deleting the rule with the stack leaves those
# repositories and their images, which carry no tag of ours, so the Tagging API never lists them.
# A prefix has one rule per registry (CreatePullThroughCacheRule refuses another:
# PullThroughCacheRuleAlreadyExistsException), so while the stack held it every repository under it
# came through the campaign's rule; teardown deletes them after the stack.
CACHE_REPOSITORY_PREFIXES = (DOCKER_HUB_CACHE_PREFIX, ECR_PUBLIC_CACHE_PREFIX)


def cache_repositories(session: Any) -> list[str]:
    """The pull-through cache's repositories in the region (ECR DescribeRepositories)."""
    ecr = session.client("ecr")
    return sorted(
        r["repositoryName"]
        for page in ecr.get_paginator("describe_repositories").paginate()
        for r in page.get("repositories", [])
        if r["repositoryName"].startswith(tuple(f"{p}/" for p in CACHE_REPOSITORY_PREFIXES))
    )


def delete_cache_repositories(session: Any, *, say: Any = print) -> None:
    """After the stack (and its rule) is gone: each cache repository with its images (force)."""
    from botocore.exceptions import ClientError

    ecr = session.client("ecr")
    for name in cache_repositories(session):
        try:
            ecr.delete_repository(repositoryName=name, force=True)
            say(f"deleted ECR repository {name} (created by the pull-through cache outside the stack)")
        except ClientError as exc:  # the leftover check that follows lists it
            say(f"ECR repository {name} not deleted: {exc}")


@dataclass(frozen=True)
class Leftover:
    arn: str
    tags: dict[str, str]

    @property
    def retained(self) -> bool:
        return self.tags.get(RETAINED_TAG[0]) == RETAINED_TAG[1]


def _instance_id(arn: str) -> str | None:
    # arn:aws:ec2:region:acct:instance/i-0123...
    if ":ec2:" in arn and ":instance/" in arn:
        return arn.rsplit("/", 1)[1]
    return None


def tagged_leftovers(session: Any, campaign: str) -> list[Leftover]:
    """Everything the Tagging API still lists for the campaign, minus terminated instances.

    The Tagging API keeps terminated EC2 instances visible for a while after they are gone;
    they cost nothing, so they are checked against EC2 and dropped.
    """
    tagging = session.client("resourcegroupstaggingapi")
    found: list[Leftover] = []
    for page in tagging.get_paginator("get_resources").paginate(TagFilters=[{"Key": "campaign", "Values": [campaign]}]):
        for r in page.get("ResourceTagMappingList", []):
            found.append(Leftover(r["ResourceARN"], {t["Key"]: t["Value"] for t in r.get("Tags", [])}))
    ids = [i for i in (_instance_id(x.arn) for x in found) if i]
    gone: set[str] = set()
    if ids:
        ec2 = session.client("ec2")
        for res in ec2.describe_instances(InstanceIds=ids).get("Reservations", []):
            for inst in res.get("Instances", []):
                if inst["State"]["Name"] == "terminated":
                    gone.add(inst["InstanceId"])
    return [x for x in found if _instance_id(x.arn) not in gone]


def untagged_api_instances(session: Any, campaign: str, seen: set[str]) -> list[Leftover]:
    """Instances EC2 itself lists with the campaign tag in any state but terminated, that the
    Tagging API (which lags behind EC2) did not list."""
    ec2 = session.client("ec2")
    states = ["pending", "running", "shutting-down", "stopping", "stopped"]
    out = []
    filters = [{"Name": "tag:campaign", "Values": [campaign]}, {"Name": "instance-state-name", "Values": states}]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for res in page.get("Reservations", []):
            for inst in res.get("Instances", []):
                if inst["InstanceId"] not in seen:
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    tags["state"] = inst["State"]["Name"]
                    out.append(Leftover(f"arn:aws:ec2:{ec2.meta.region_name}::instance/{inst['InstanceId']}", tags))
    return out


def unprotected_retained_buckets(session: Any, kept: list[Leftover]) -> list[Leftover]:
    """Retained buckets whose policy no longer denies plain-HTTP access (aws:SecureTransport false)."""
    from botocore.exceptions import ClientError

    s3 = session.client("s3")
    bad = []
    for x in kept:
        if not x.arn.startswith("arn:aws:s3:::"):
            continue
        try:
            policy = s3.get_bucket_policy(Bucket=x.arn.rsplit(":", 1)[1])["Policy"]
        except ClientError:
            policy = ""
        if '"aws:SecureTransport"' not in policy or '"Deny"' not in policy:
            bad.append(Leftover(x.arn, {**x.tags, "problem": "retained without its TLS-only bucket policy"}))
    return bad


def check_nothing_left(session: Any, campaign: str) -> tuple[list[Leftover], list[Leftover]]:
    """(left running, kept by design). Left: whatever the Tagging API lists with the campaign tag
    (terminated instances dropped), instances EC2 lists with the tag that are not terminated, the
    cluster's Container Insights log group, the pull-through cache's repositories, and a retained
    bucket that lost its TLS-only policy."""
    tagged = tagged_leftovers(session, campaign)
    left = [x for x in tagged if not x.retained]
    kept = [x for x in tagged if x.retained]
    left += untagged_api_instances(session, campaign, {i for i in (_instance_id(x.arn) for x in tagged) if i})
    insights = container_insights_log_groups(session, naming.stack_name(campaign))
    left += [Leftover(f"log-group:{g}", {"created-by": "ECS Container Insights"}) for g in insights]
    left += [
        Leftover(f"ecr-repository:{r}", {"created-by": "the ECR pull-through cache"})
        for r in cache_repositories(session)
    ]
    left += unprotected_retained_buckets(session, kept)
    return left, kept
