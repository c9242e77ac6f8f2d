"""Each AWS call an actor makes, checked against the policies its synthesized role carries, by a
real policy evaluator: @cloud-copilot/iam-simulate (npm, a dev dependency; testing/iam_simulate.mjs).

Why not moto's own enforcement (INITIAL_NO_AUTH_ACTION_COUNT): moto 5.2.5 (moto/iam/access_control.py
and moto/core/authorization.py) evaluates the action, but the resource only for S3, SQS, IAM and STS;
every other service (ECS, Cloud Map, ELB, Auto Scaling, CloudFormation, CloudWatch, Route 53, ...)
is evaluated against the resource "*", which a statement scoped to an ARN never matches (its
matcher is a regex of the statement's Resource), so the stacks' scoped grants would all be refused;
and in an identity policy every Condition counts as met (no request context is given to it; only
StringEquals exists at all, for trust policies), so a condition-scoped grant passes anything and a
conditional Deny denies always. It also checks no action a call needs beside its own (Route 53's
for Cloud Map). So moto answers the calls; this module decides whether the actor may make them.

What an authorization needs that the call does not say (which resource ARN, which condition keys
AWS sets) is the Service Authorization Reference's, per action, in `authorizations`; a call it does
not know is an error naming it, never a pass.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIMULATOR = Path(__file__).with_name("iam_simulate.mjs")
ECS_TASKS_SERVICE = "ecs-tasks.amazonaws.com"


class IamCheckError(RuntimeError):
    """A call or a policy this check cannot evaluate (not a denial)."""


# ---------------------------------------------------------------------------------------------
# The synthesized policies, resolved


def resolve(value: Any, refs: Mapping[str, str], attrs: Mapping[tuple[str, str], str]) -> Any:
    """`value` from a template with Ref, Fn::GetAtt and Fn::Join resolved: `refs` for Ref (pseudo
    parameters included), `attrs` for (logical id, attribute). An unknown reference is an error
    naming it: a policy is never evaluated with a guess in it."""
    if isinstance(value, list):
        return [resolve(v, refs, attrs) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        if value["Ref"] not in refs:
            raise IamCheckError(f"no physical value for Ref {value['Ref']}")
        return refs[value["Ref"]]
    if set(value) == {"Fn::GetAtt"}:
        logical, attribute = value["Fn::GetAtt"]
        if (logical, attribute) not in attrs:
            raise IamCheckError(f"no physical value for Fn::GetAtt {logical}.{attribute}")
        return attrs[(logical, attribute)]
    if set(value) == {"Fn::Join"}:
        sep, parts = value["Fn::Join"]
        return sep.join(str(resolve(p, refs, attrs)) for p in parts)
    if any(k.startswith("Fn::") for k in value):
        raise IamCheckError(f"intrinsic function {sorted(value)} is not resolved here")
    return {k: resolve(v, refs, attrs) for k, v in value.items()}


def role_policies(template: Mapping[str, Any], role: str) -> list[dict[str, Any]]:
    """The policy documents (unresolved) attached to the template's role `role` (logical id): its
    AWS::IAM::Policy resources and inline Policies. A managed policy is refused: its document is
    not in the template."""
    resources = template["Resources"]
    props = resources[role]["Properties"]
    if props.get("ManagedPolicyArns"):
        raise IamCheckError(f"role {role} has managed policies, whose documents the template does not hold")
    docs = [p["PolicyDocument"] for p in props.get("Policies", [])]
    for r in resources.values():
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"].get("Roles", []):
            docs.append(r["Properties"]["PolicyDocument"])
    return docs


def without_statement(docs: Sequence[Mapping[str, Any]], doc: int, statement: int) -> list[dict[str, Any]]:
    """`docs` with one statement removed (for the tests that show each statement is needed)."""
    out = [json.loads(json.dumps(d)) for d in docs]
    del out[doc]["Statement"][statement]
    return out


def statement_with(docs: Sequence[Mapping[str, Any]], action: str) -> tuple[int, int]:
    """(document, statement) of the first Allow statement in `docs` that names `action`."""
    for i, doc in enumerate(docs):
        for j, st in enumerate(doc["Statement"]):
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if action in actions and st["Effect"] == "Allow":
                return i, j
    raise IamCheckError(f"no statement allows {action}")


# ---------------------------------------------------------------------------------------------
# What AWS authorizes for each call


@dataclass(frozen=True)
class Authorization:
    action: str
    resource: str
    context: Mapping[str, str | list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
    actor: str
    service: str  # boto3's client name
    operation: str  # the API's, e.g. RunTask
    params: Mapping[str, Any]


@dataclass
class World:
    """What turns a call's names into the ARNs AWS authorizes: the account and region, and the
    lookups a call's parameters need (a Cloud Map service's namespace's hosted zone, a task
    definition's roles, a stack's id)."""

    account: str
    region: str
    hosted_zone_of_service: Callable[[str], str]
    task_definition: Callable[[str], str]  # a family, family:revision or ARN -> the ARN RunTask runs
    roles_of_task_definition: Callable[[str], list[str]]
    discovery_arns: Callable[[str, str], tuple[str, str]]  # (namespace name, service name) -> their ARNs
    stack_arn: Callable[[str], str]
    partition: str = "aws"
    instance_group: Callable[[str], str] | None = None  # an instance id -> its Auto Scaling group's ARN

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return f"arn:{self.partition}:{service}:{self.region if region else ''}:{self.account if account else ''}:{resource}"

    def cluster_arn(self, cluster: str) -> str:
        return cluster if cluster.startswith("arn:") else self.arn("ecs", f"cluster/{cluster}")

    def task_arn(self, cluster: str, task: str) -> str:
        return task if task.startswith("arn:") else self.arn("ecs", f"task/{cluster.split('/')[-1]}/{task}")

    def service_arn(self, service_id: str) -> str:
        return self.arn("servicediscovery", f"service/{service_id}")

    def s3(self, bucket: str, key: str | None = None) -> str:
        return f"arn:{self.partition}:s3:::{bucket}" + (f"/{key}" if key is not None else "")


# The reads that define no resource type (Service Authorization Reference: each action's
# "Resource types" column is empty), authorized on "*".
UNSCOPED = {
    ("elbv2", "DescribeTargetGroups"): "elasticloadbalancing:DescribeTargetGroups",
    ("elbv2", "DescribeTags"): "elasticloadbalancing:DescribeTags",
    ("elbv2", "DescribeTargetHealth"): "elasticloadbalancing:DescribeTargetHealth",
    ("autoscaling", "DescribeAutoScalingGroups"): "autoscaling:DescribeAutoScalingGroups",
    ("autoscaling", "DescribeScalingActivities"): "autoscaling:DescribeScalingActivities",
    ("autoscaling", "DescribeScheduledActions"): "autoscaling:DescribeScheduledActions",
    # the rehearsal's quota check (campaign/aws/rehearsal_seams.py), on "*" as docs/operator-policy.json
    # grants them (whether the reference gives them a quota resource type was not checked here)
    ("service-quotas", "GetServiceQuota"): "servicequotas:GetServiceQuota",
    ("service-quotas", "GetAWSDefaultServiceQuota"): "servicequotas:GetAWSDefaultServiceQuota",
    ("cloudwatch", "GetMetricData"): "cloudwatch:GetMetricData",
    ("ce", "GetCostAndUsage"): "ce:GetCostAndUsage",
    ("ce", "ListCostAllocationTags"): "ce:ListCostAllocationTags",
    ("pricing", "GetProducts"): "pricing:GetProducts",
    ("ec2", "DescribeInstances"): "ec2:DescribeInstances",
    ("ec2", "DescribeImages"): "ec2:DescribeImages",
    ("resourcegroupstaggingapi", "GetResources"): "tag:GetResources",
    ("logs", "DescribeLogGroups"): "logs:DescribeLogGroups",
}
# S3 API operation -> the action that authorizes it (Amazon S3 user guide, "Required permissions
# for Amazon S3 API operations": HeadObject needs s3:GetObject; a multipart upload's operations
# s3:PutObject; ListObjectsV2 s3:ListBucket).
_S3_OBJECT = {
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObject": "s3:DeleteObject",
}


def authorizations(call: Call, world: World) -> list[Authorization]:
    """Every authorization AWS makes for `call` (Service Authorization Reference, per action: its
    resource type and the condition keys AWS sets; plus what the service does with the caller's
    permission on its behalf, where its guide says so)."""
    p, op = call.params, call.operation
    if (call.service, op) in UNSCOPED:
        return [Authorization(UNSCOPED[(call.service, op)], "*")]
    if call.service == "ecs":
        cluster = world.cluster_arn(p["cluster"])
        in_cluster = {"ecs:cluster": cluster}
        if op == "RunTask":
            # RunTask: resource type task-definition, condition key ecs:cluster; with tags, also
            # ecs:TagResource on the new task with ecs:CreateAction = RunTask (ECS developer guide,
            # "Grant permission to tag resources on creation"); and iam:PassRole of the definition's
            # task and execution roles (ECS developer guide, "Task IAM role", "Task execution IAM role").
            definition = world.task_definition(p["taskDefinition"])
            out = [Authorization("ecs:RunTask", definition, in_cluster)]
            if p.get("tags"):
                new_task = world.task_arn(cluster, "new-task-id")
                out.append(Authorization("ecs:TagResource", new_task, {**in_cluster, "ecs:CreateAction": "RunTask"}))
            out += [
                Authorization("iam:PassRole", role, {"iam:PassedToService": ECS_TASKS_SERVICE})
                for role in world.roles_of_task_definition(definition)
            ]
            return out
        if op == "StopTask":
            return [Authorization("ecs:StopTask", world.task_arn(cluster, p["task"]), in_cluster)]
        if op == "DescribeTasks":
            return [Authorization("ecs:DescribeTasks", world.task_arn(cluster, t), in_cluster) for t in p["tasks"]]
        if op == "ListTasks":
            # resource type container-instance, which a Fargate cluster has none of: "*", with ecs:cluster
            return [Authorization("ecs:ListTasks", "*", in_cluster)]
    if call.service == "servicediscovery" and op in ("RegisterInstance", "DeregisterInstance", "ListInstances"):
        service = world.service_arn(p["ServiceId"])
        out = [Authorization(f"servicediscovery:{op}", service)]
        if op == "ListInstances":
            return out
        # Cloud Map acts with the caller's permission in Route 53 (and EC2): the Cloud Map developer
        # guide, "AWS Cloud Map API permissions reference", lists as required for RegisterInstance
        # route53:GetHealthCheck, route53:CreateHealthCheck, route53:UpdateHealthCheck,
        # route53:ChangeResourceRecordSets and ec2:DescribeInstances; for DeregisterInstance
        # route53:GetHealthCheck, route53:DeleteHealthCheck, route53:UpdateHealthCheck and
        # route53:ChangeResourceRecordSets; whatever the service's health-check configuration.
        # Resource types (Service Authorization Reference, Route 53 and EC2): ChangeResourceRecordSets
        # the hosted zone, Get/Update/DeleteHealthCheck a health check (none exists yet: any),
        # CreateHealthCheck and DescribeInstances none.
        zone = f"arn:{world.partition}:route53:::hostedzone/{world.hosted_zone_of_service(p['ServiceId'])}"
        health_check = f"arn:{world.partition}:route53:::healthcheck/*"
        out.append(Authorization("route53:ChangeResourceRecordSets", zone))
        out += [Authorization(f"route53:{a}", health_check) for a in ("GetHealthCheck", "UpdateHealthCheck")]
        if op == "RegisterInstance":
            out += [Authorization("route53:CreateHealthCheck", "*"), Authorization("ec2:DescribeInstances", "*")]
        else:
            out.append(Authorization("route53:DeleteHealthCheck", health_check))
        return out
    if call.service == "servicediscovery" and op == "DiscoverInstances":
        # resource types namespace and service, both required; condition keys
        # servicediscovery:NamespaceName and servicediscovery:ServiceName
        namespace, service = world.discovery_arns(p["NamespaceName"], p["ServiceName"])
        names = {"servicediscovery:NamespaceName": p["NamespaceName"], "servicediscovery:ServiceName": p["ServiceName"]}
        return [Authorization("servicediscovery:DiscoverInstances", arn, names) for arn in (namespace, service)]
    if call.service == "cloudformation" and op in (
        "DescribeStacks",
        "DescribeStackEvents",
        "DescribeStackResources",
        "ListStackResources",
        "GetTemplate",
        "DeleteStack",
    ):
        # each: resource type stack
        return [Authorization(f"cloudformation:{op}", world.stack_arn(p["StackName"]))]
    if call.service == "logs" and op == "DeleteLogGroup":  # resource type log-group
        return [Authorization("logs:DeleteLogGroup", world.arn("logs", f"log-group:{p['logGroupName']}"))]
    if call.service == "logs" and op == "GetLogEvents":  # resource type log-stream
        stream = f"log-group:{p['logGroupName']}:log-stream:{p['logStreamName']}"
        return [Authorization("logs:GetLogEvents", world.arn("logs", stream))]
    if call.service == "ecr" and op == "DescribeRepositories":
        # resource type repository; an unfiltered listing is authorized on every repository
        repositories = p.get("repositoryNames") or ["*"]
        return [Authorization("ecr:DescribeRepositories", world.arn("ecr", f"repository/{n}")) for n in repositories]
    if call.service == "ecr" and op in ("DeleteRepository", "DescribeImages"):
        return [Authorization(f"ecr:{op}", world.arn("ecr", f"repository/{p['repositoryName']}"))]
    if call.service == "ec2" and op == "GetConsoleOutput":
        return [Authorization("ec2:GetConsoleOutput", world.arn("ec2", f"instance/{p['InstanceId']}"))]
    if call.service == "autoscaling" and op in ("SetDesiredCapacity", "UpdateAutoScalingGroup"):
        # resource type autoScalingGroup (its id is not in the call: any)
        group = world.arn("autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{p['AutoScalingGroupName']}")
        return [Authorization(f"autoscaling:{op}", group)]
    if call.service == "s3":
        bucket = p["Bucket"]
        if op in _S3_OBJECT:
            return [Authorization(_S3_OBJECT[op], world.s3(bucket, p["Key"]))]
        if op in ("ListObjectsV2", "ListObjects"):
            return [Authorization("s3:ListBucket", world.s3(bucket), {"s3:prefix": p.get("Prefix", "")})]
        if op == "CopyObject":
            source = p["CopySource"]
            src = f"{source['Bucket']}/{source['Key']}" if isinstance(source, Mapping) else source.lstrip("/")
            src_bucket, _, src_key = src.partition("/")
            return [
                Authorization("s3:GetObject", world.s3(src_bucket, src_key)),
                Authorization("s3:PutObject", world.s3(bucket, p["Key"])),
            ]
        if op in ("GetBucketPolicy", "PutBucketPolicy", "DeleteBucketPolicy"):
            return [Authorization(f"s3:{op}", world.s3(bucket))]
        if op == "DeleteObjects":
            return [Authorization("s3:DeleteObject", world.s3(bucket, o["Key"])) for o in p["Delete"]["Objects"]]
    raise IamCheckError(
        f"no authorization known for {call.service} {op} (add it from the Service Authorization Reference)"
    )


# ---------------------------------------------------------------------------------------------
# Recording an actor's calls


class Recorded:
    """A boto3 client (or a stand-in with the same method names) whose API calls, paginators'
    pages and waiters' polls are recorded as `Call`s of `actor`, then made."""

    # a waiter's polling operation (botocore's waiter models: ecs tasks_stopped polls DescribeTasks)
    WAITERS: Mapping[tuple[str, str], str] = {("ecs", "tasks_stopped"): "DescribeTasks"}
    # boto3's S3 transfer methods (positional arguments) -> the operation whose action authorizes
    # them (a multipart upload's parts are s3:PutObject, a download's HeadObject s3:GetObject)
    TRANSFERS: Mapping[str, tuple[str, tuple[str, ...]]] = {
        "upload_file": ("PutObject", ("Filename", "Bucket", "Key")),
        "upload_fileobj": ("PutObject", ("Fileobj", "Bucket", "Key")),
        "download_file": ("GetObject", ("Bucket", "Key", "Filename")),
        "download_fileobj": ("GetObject", ("Bucket", "Key", "Fileobj")),
        "copy": ("CopyObject", ("CopySource", "Bucket", "Key")),
    }

    def __init__(self, client: Any, service: str, actor: str, calls: list[Call]) -> None:
        self._client, self._service, self._actor, self._calls = client, service, actor, calls

    def _record(self, operation: str, params: Mapping[str, Any]) -> None:
        self._calls.append(Call(self._actor, self._service, operation, dict(params)))

    def get_paginator(self, method: str) -> Any:
        outer, paginator = self, self._client.get_paginator(method)
        operation = "".join(w.capitalize() for w in method.split("_"))

        class Paginator:
            def paginate(self, **kw: Any) -> Any:
                outer._record(operation, kw)
                return paginator.paginate(**kw)

        return Paginator()

    def get_waiter(self, name: str) -> Any:
        outer, waiter = self, self._client.get_waiter(name)
        if (self._service, name) not in self.WAITERS:
            raise IamCheckError(f"the operation {self._service}'s waiter {name} polls is not known here")
        operation = self.WAITERS[(self._service, name)]

        class Waiter:
            def wait(self, **kw: Any) -> Any:
                outer._record(operation, {k: v for k, v in kw.items() if k != "WaiterConfig"})
                return waiter.wait(**kw)

        return Waiter()

    def __getattr__(self, method: str) -> Any:
        target = getattr(self._client, method)
        if not callable(target) or method.startswith("_") or method in ("meta", "exceptions", "can_paginate"):
            return target
        operation = "".join(w.capitalize() for w in method.split("_"))

        def call(*args: Any, **kw: Any) -> Any:
            if method in self.TRANSFERS:
                name, positional = self.TRANSFERS[method]
                self._record(name, {**dict(zip(positional, args, strict=False)), **kw})
            else:
                self._record(operation, kw)
            return target(*args, **kw)

        return call


# ---------------------------------------------------------------------------------------------
# Deciding


@dataclass(frozen=True)
class Denial:
    call: Call
    authorization: Authorization
    result: str

    def __str__(self) -> str:
        a = self.authorization
        ctx = f" with {dict(a.context)}" if a.context else ""
        return (
            f"{self.call.actor} may not {a.action} on {a.resource}{ctx} "
            f"({self.call.service} {self.call.operation}: {self.result})"
        )


class Evaluator:
    """A running iam-simulate (node), one decision per request; `with Evaluator(...) as iam:`."""

    def __init__(self, account: str) -> None:
        self.account = account
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Evaluator:
        if not (ROOT / "node_modules" / "@cloud-copilot" / "iam-simulate").is_dir():
            raise IamCheckError("@cloud-copilot/iam-simulate is not installed: run `npm ci` (make install)")
        self._proc = subprocess.Popen(
            ["node", str(SIMULATOR)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=10)

    def decide(self, policies: Sequence[Mapping[str, Any]], principal: str, auth: Authorization) -> str:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None, "use `with Evaluator(...)`"
        ask = {
            "policies": list(policies),
            "principal": principal,
            "account": self.account,
            "action": auth.action,
            "resource": auth.resource,
            "context": dict(auth.context),
        }
        proc.stdin.write(json.dumps(ask) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        if "error" in answer:
            raise IamCheckError(
                f"{auth.action} on {auth.resource}: the evaluator refused the request: {answer['error']}"
            )
        return str(answer["result"])

    def denials(
        self, calls: Sequence[Call], policies: Mapping[str, Sequence[Mapping[str, Any]]], world: World
    ) -> list[Denial]:
        """Each authorization of `calls` that the actor's `policies` do not allow."""
        return [d for call in calls for d in self.check(call, authorizations(call, world), policies[call.actor], world)]

    def check(
        self, call: Call, auths: Sequence[Authorization], policies: Sequence[Mapping[str, Any]], world: World
    ) -> list[Denial]:
        """Each of `auths` (what `call` needs) that `policies` do not allow."""
        principal = world.arn("iam", f"role/{call.actor}", region=False)
        out = []
        for auth in auths:
            result = self.decide(policies, principal, auth)
            if result != "Allowed":
                out.append(Denial(call, auth, result))
        return out


@contextmanager
def evaluator(account: str) -> Iterator[Evaluator]:
    with Evaluator(account) as iam:
        yield iam


# ---------------------------------------------------------------------------------------------
# An instance's boot: its `aws` CLI calls and its image pulls from ECR

# The CLI's options that take no value (AWS CLI command reference: s3 cp / sync, ssm get-parameter).
_CLI_FLAGS = {"--recursive", "--quiet", "--only-show-errors", "--no-progress", "--with-decryption", "--no-paginate"}


def _cli_options(args: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    opts: dict[str, list[str]] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and a not in _CLI_FLAGS and i + 1 < len(args):
            opts.setdefault(a, []).append(args[i + 1])
            i += 2
            continue
        if a.startswith("--"):
            opts.setdefault(a, []).append("")
        else:
            positional.append(a)
        i += 1
    return opts, positional


def _s3_uri(uri: str) -> tuple[str, str] | None:
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def cli_authorizations(argv: Sequence[str], world: World) -> list[Authorization]:
    """What AWS authorizes for one `aws ...` command line (argv without `aws`), as the CLI makes
    its calls: `s3 cp --recursive` and `s3 sync` list the source prefix (s3:ListBucket with
    s3:prefix) and get or put each object under it (AWS CLI command reference, s3 cp / s3 sync;
    an object under a prefix is authorized as `prefix/*` here, the objects' names being the
    script's). A command not known here is an error naming it."""
    service, command, rest = argv[0], argv[1], list(argv[2:])
    opts, positional = _cli_options(rest)

    def one(name: str) -> str:
        return opts[name][0]

    if (service, command) == ("ecr", "get-login-password"):
        return [Authorization("ecr:GetAuthorizationToken", "*")]
    if (service, command) == ("ssm", "get-parameter"):
        name = one("--name")
        return [
            Authorization(
                "ssm:GetParameter", world.arn("ssm", "parameter" + (name if name.startswith("/") else f"/{name}"))
            )
        ]
    if (service, command) == ("secretsmanager", "get-secret-value"):
        return [Authorization("secretsmanager:GetSecretValue", one("--secret-id"))]
    if (service, command) == ("s3api", "list-objects-v2"):
        return [Authorization("s3:ListBucket", world.s3(one("--bucket")), {"s3:prefix": opts.get("--prefix", [""])[0]})]
    if service == "s3" and command in ("cp", "sync", "ls"):
        out: list[Authorization] = []
        recursive = "--recursive" in opts or command == "sync"
        for n, uri in enumerate(positional):
            where = _s3_uri(uri)
            if where is None:
                continue
            bucket, key = where
            source = command == "ls" or (n == 0 and len(positional) > 1)
            if recursive or command == "ls":
                prefix = key.rstrip("/") + "/" if key else ""
                out.append(Authorization("s3:ListBucket", world.s3(bucket), {"s3:prefix": prefix}))
                if command != "ls":
                    out.append(
                        Authorization("s3:GetObject" if source else "s3:PutObject", world.s3(bucket, prefix + "*"))
                    )
            else:
                if not source and key.endswith("/"):
                    key += Path(positional[0]).name
                out.append(Authorization("s3:GetObject" if source else "s3:PutObject", world.s3(bucket, key)))
        return out
    if (service, command) == ("autoscaling", "terminate-instance-in-auto-scaling-group") and world.instance_group:
        return [
            Authorization("autoscaling:TerminateInstanceInAutoScalingGroup", world.instance_group(one("--instance-id")))
        ]
    raise IamCheckError(
        f"no authorization known for `aws {service} {command}` (add it from the Service Authorization Reference)"
    )


def image_pull_authorizations(image: str, world: World) -> list[Authorization]:
    """A `docker pull` of an image in this account's ECR (nothing for another registry): the
    repository's BatchGetImage, GetDownloadUrlForLayer and BatchCheckLayerAvailability (ECR user
    guide, "Private repository policies" / image pulls), and for a pull-through cache's repository
    (`docker-hub/...`) BatchImportUpstreamImage and CreateRepository as well, which a first pull of
    an image not yet cached needs (ECR user guide, "Creating a pull through cache rule", IAM
    permissions)."""
    host, _, path = image.partition("/")
    if host != f"{world.account}.dkr.ecr.{world.region}.amazonaws.com":
        return []
    repository = re.split(r"[@:]", path, maxsplit=1)[0]
    arn = world.arn("ecr", f"repository/{repository}")
    actions = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
    if repository.startswith("docker-hub/"):
        actions += ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
    return [Authorization(a, arn) for a in actions]


# ---------------------------------------------------------------------------------------------
# An offline run's calls (testing/cloud_offline.py, recorded by testing/iam_recorder.py)

# The operator's minimum policy for deploy / run / report / teardown, as docs/cloud.md publishes it.
OPERATOR_POLICY = ROOT / "docs" / "operator-policy.json"


@dataclass(frozen=True)
class Bindings:
    """What a template's references are in the account an offline run stands up (its stand-in
    stack, bucket, Cloud Map namespace and services, AMP workspace): testing.cloud_offline writes
    them to <out>/iam/bindings.json."""

    account: str
    region: str
    stack_name: str
    stack_id: str
    bucket: str
    cluster: str
    namespace: str
    namespace_arn: str
    hosted_zone: str
    services: Mapping[str, str]  # Cloud Map service name -> its ARN
    workspace_arn: str

    def arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{self.account}:{resource}"

    def references(self, template: Mapping[str, Any]) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
        """Ref and Fn::GetAtt values of the template's resources that the task roles' policies name."""
        refs = {
            "AWS::Partition": "aws",
            "AWS::AccountId": self.account,
            "AWS::Region": self.region,
            "AWS::StackId": self.stack_id,
            "AWS::StackName": self.stack_name,
        }
        attrs: dict[tuple[str, str], str] = {}
        results = template["Outputs"]["ResultsBucketName"]["Value"]["Ref"]
        refs[results], attrs[(results, "Arn")] = self.bucket, f"arn:aws:s3:::{self.bucket}"
        for logical, r in template["Resources"].items():
            kind, props = r["Type"], r.get("Properties", {})
            if kind == "AWS::IAM::Role":
                attrs[(logical, "Arn")] = f"arn:aws:iam::{self.account}:role/{logical}"
            elif kind == "AWS::ECS::Cluster":
                refs[logical] = self.cluster
                attrs[(logical, "Arn")] = self.arn("ecs", f"cluster/{self.cluster}")
            elif kind == "AWS::ECS::TaskDefinition":
                refs[logical] = self.arn("ecs", f"task-definition/{props['Family']}:1")
            elif kind == "AWS::ServiceDiscovery::PrivateDnsNamespace":
                attrs[(logical, "Arn")], attrs[(logical, "HostedZoneId")] = self.namespace_arn, self.hosted_zone
            elif kind == "AWS::ServiceDiscovery::Service" and props.get("Name") in self.services:
                attrs[(logical, "Arn")] = self.services[props["Name"]]
            elif kind == "AWS::APS::Workspace":
                attrs[(logical, "Arn")] = self.workspace_arn
        return refs, attrs

    def world(self) -> World:
        def discovery_arns(namespace: str, service: str) -> tuple[str, str]:
            if namespace != self.namespace or service not in self.services:
                raise IamCheckError(f"no Cloud Map namespace {namespace} with a service {service} in the offline run")
            return self.namespace_arn, self.services[service]

        def stack_arn(name: str) -> str:
            if name not in (self.stack_name, self.stack_id):
                raise IamCheckError(f"no stack {name} in the offline run")
            return self.stack_id

        def not_offline(name: str) -> Any:
            raise IamCheckError(f"the offline run starts no ECS task ({name}): its launcher stands in for RunTask")

        return World(
            account=self.account,
            region=self.region,
            hosted_zone_of_service=lambda _sid: self.hosted_zone,  # one namespace holds every service
            task_definition=not_offline,
            roles_of_task_definition=not_offline,
            discovery_arns=discovery_arns,
            stack_arn=stack_arn,
        )


def recorded_calls(calls_dir: Path) -> list[Call]:
    """The calls testing/iam_recorder.py recorded in `calls_dir`, each its access key's."""
    from testing import iam_recorder

    return [Call(c["actor"], c["service"], c["operation"], c["params"]) for c in iam_recorder.read(calls_dir)]


def offline_policies(
    template: Mapping[str, Any], bindings: Bindings, actors: Sequence[str], operator: str
) -> dict[str, list[dict[str, Any]]]:
    """Each actor's policies: `operator`'s the published minimum (OPERATOR_POLICY), each other's its
    role's (the actor is the role's logical id), its references bound to the offline run's."""
    refs, attrs = bindings.references(template)
    out: dict[str, list[dict[str, Any]]] = {}
    for actor in actors:
        if actor == operator:
            out[actor] = [json.loads(OPERATOR_POLICY.read_text(encoding="utf-8"))]
        elif actor in template["Resources"] and template["Resources"][actor]["Type"] == "AWS::IAM::Role":
            out[actor] = [resolve(doc, refs, attrs) for doc in role_policies(template, actor)]
        else:
            raise IamCheckError(f"calls made with access key {actor!r}, which is no role of the stack nor the operator")
    return out


def offline_denials(
    iam_dir: Path,
    template: Mapping[str, Any],
    *,
    operator: str,
    ignored: set[str],
    without: tuple[str, str] | None = None,
) -> tuple[list[Denial], int]:
    """Each distinct authorization the calls recorded in `iam_dir` need (calls/, bindings.json),
    evaluated in one evaluator process against the caller's policies (`offline_policies`); the
    calls of `ignored` keys (the stand-ins for AWS itself) are not. `without` (actor, action):
    that actor's statement that allows the action removed first (the tests that show each
    statement is needed). Returns the denials (one per distinct authorization and actor, naming
    the first call that needed it) and how many distinct authorizations it evaluated."""
    data = json.loads((iam_dir / "bindings.json").read_text(encoding="utf-8"))
    bindings = Bindings(**data)
    world = bindings.world()
    calls = [c for c in recorded_calls(iam_dir / "calls") if c.actor not in ignored]
    if without is not None:  # the others' calls are evaluated as they were
        calls = [c for c in calls if c.actor == without[0]]
        if not calls:
            raise IamCheckError(f"{without[0]} made no call in this run")
    actors = sorted({c.actor for c in calls})
    policies = offline_policies(template, bindings, actors, operator)
    if without is not None:
        actor, action = without
        policies[actor] = without_statement(policies[actor], *statement_with(policies[actor], action))
    seen: dict[tuple[str, str, str, str], tuple[Call, Authorization]] = {}
    for call in calls:
        for auth in offline_authorizations(call, world, bindings):
            key = (call.actor, auth.action, auth.resource, json.dumps(dict(auth.context), sort_keys=True))
            seen.setdefault(key, (call, auth))
    denied = []
    with Evaluator(bindings.account) as iam:
        for call, auth in seen.values():
            denied += iam.check(call, [auth], policies[call.actor], world)
    return denied, len(seen)


def offline_authorizations(call: Call, world: World, bindings: Bindings) -> list[Authorization]:
    """`authorizations`, and what only an offline run records: the AMP workspace's own calls
    (testing.cloud_offline.stand_in_workspace: Service Authorization Reference, Amazon Managed
    Service for Prometheus: RemoteWrite and QueryMetrics, resource type workspace) and
    GetCallerIdentity, which needs no permission (STS API reference, GetCallerIdentity: "No
    permissions are required to perform this operation")."""
    if call.service == "aps":
        return [Authorization(f"aps:{call.operation}", bindings.workspace_arn)]
    if (call.service, call.operation) == ("sts", "GetCallerIdentity"):
        return []
    return authorizations(call, world)
