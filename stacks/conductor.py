"""The conductor: `campaign run --detach`'s orchestration as one Fargate task in the stack.

`run --detach` starts it with RunTask and a command override `conduct <run id> [--resume]`; with
the image's ENTRYPOINT (`python -m campaign`, Dockerfile.conductor) that is `python -m campaign
conduct <run id>`, which reads this stack's LoadgenRunConfig output (the stack named by
HARNESS_STACK_NAME), stages the run's inputs under HARNESS_WORK_DIR and runs what `campaign run`
runs, so the operator's terminal may close. Nothing runs between runs: the task definition only.

Its task role may do exactly the calls `campaign run` and `run --resume` make (the boto3 calls of
campaign/backends/fargate/, campaign/aws/{run_config,readiness,s3_trees}.py and the report's
analysis/sources/: CloudWatch, time to ready, Cost Explorer, prices, the Prometheus workspace),
each scoped to this stack's resources wherever the action takes a resource. The action's
resource types and condition keys are the Service Authorization Reference's
(https://docs.aws.amazon.com/service-authorization/latest/reference/, one page per service,
named at each statement). Its execution role pulls the image and writes its log stream, as the
load generators' do.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Stack
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_servicediscovery as servicediscovery
from constructs import Construct

from core.cloud_contract import (
    CONDUCT_COMMAND,
    CONDUCTOR_TASK_MEMORY_GIB,
    CONDUCTOR_TASK_VCPU,
    CONTAINER_NAME,
    ENV_MANIFEST_DIGEST,
    ENV_RESULTS_URI,
    ENV_STACK_NAME,
    ENV_WORK_DIR,
    GATE_PREFIX,
)
from stacks.compliance import acknowledge, arn_placeholder
from stacks.load_generator import LoadGenerator, cluster_tasks_arn, nag_cluster_tasks, repo_image

CONDUCTOR_DOCKERFILE = "Dockerfile.conductor"
# The image's ENTRYPOINT (tests/stacks/test_conductor.py holds Dockerfile.conductor to it); the task
# definition names it too, so the template says what the task runs.
CONDUCTOR_ENTRYPOINT = ["python", "-m", "campaign"]
# Without the command override RunTask gives, the task prints the command's help and exits.
CONDUCTOR_DEFAULT_COMMAND = [CONDUCT_COMMAND, "--help"]
CONDUCTOR_WORK_DIR = "/data"  # the image's HARNESS_WORK_DIR, as the load-generator image's
ECS_TASKS_SERVICE = "ecs-tasks.amazonaws.com"

# Actions that define no resource type (Service Authorization Reference: Elastic Load Balancing V2,
# Amazon EC2 Auto Scaling, Amazon CloudWatch, AWS Cost Explorer Service, AWS Price List): "*" is
# the only resource they take. Read-only, all of them.
UNSCOPED_READS = (
    "elasticloadbalancing:DescribeTargetGroups",  # time to ready, readiness evidence: the fleets' groups by tag
    "elasticloadbalancing:DescribeTags",
    "elasticloadbalancing:DescribeTargetHealth",  # readiness, each step's instances (target_health.py)
    "autoscaling:DescribeAutoScalingGroups",  # the fleets' groups by tag (analysis/sources/cloudwatch.py)
    "autoscaling:DescribeScalingActivities",  # time to ready, a fleet never ready (campaign/aws/readiness.py)
    "cloudwatch:GetMetricData",  # the report's CloudWatch figures and HealthyHostCount
    "ce:GetCostAndUsage",  # the report's billed cost (analysis/sources/billing.py)
    "pricing:GetProducts",  # the report's prices (analysis/sources/pricing.py)
)
# What Cloud Map's RegisterInstance needs beside it that defines no resource type (Cloud Map API
# permissions reference; Service Authorization Reference, Amazon Route 53 and Amazon EC2).
CLOUD_MAP_UNSCOPED = ("route53:CreateHealthCheck", "ec2:DescribeInstances")


def conductor_image() -> ecs.ContainerImage:
    return repo_image(CONDUCTOR_DOCKERFILE, "the conductor image")


class Conductor(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        load_generator: LoadGenerator,
        manifest_digest: str,
        cluster: ecs.ICluster,
        namespace: servicediscovery.PrivateDnsNamespace,
        results: s3.IBucket,
        prometheus_workspace_arn: str,
    ) -> None:
        super().__init__(scope, cid)
        stack = Stack.of(self)
        self._lg = load_generator
        self.task = ecs.FargateTaskDefinition(
            self, "Task", cpu=1024 * CONDUCTOR_TASK_VCPU, memory_limit_mib=1024 * CONDUCTOR_TASK_MEMORY_GIB
        )
        self.task.add_container(
            CONTAINER_NAME,  # RunTask's containerOverrides name it, as for the load generators
            image=conductor_image(),
            entry_point=CONDUCTOR_ENTRYPOINT,
            command=CONDUCTOR_DEFAULT_COMMAND,
            environment={
                ENV_STACK_NAME: stack.stack_name,
                "AWS_DEFAULT_REGION": stack.region,
                ENV_WORK_DIR: CONDUCTOR_WORK_DIR,
                # the conductor stages a run's inputs as a load-generator task does
                # (loadgen.task_inputs.stage_inputs): only the manifest this stack was deployed for
                ENV_MANIFEST_DIGEST: manifest_digest,
                ENV_RESULTS_URI: load_generator.results_uri,
            },
            logging=ecs.LogDrivers.aws_logs(stream_prefix="conductor", log_group=load_generator.log_group),
        )
        acknowledge(
            self.task,
            "AwsSolutions-ECS2",
            "Environment holds the stack's name, its region, the staging directory, the manifest digest and the "
            "results prefix; no secrets.",
        )
        self._read_stack()
        self._start_and_stop_tasks(cluster)
        self._register_tasks(namespace)
        self._run_files(results)
        self._report_sources(prometheus_workspace_arn)

    def _allow(self, actions: list[str], resources: list[str], conditions: Mapping[str, object] | None = None) -> None:
        self.task.add_to_task_role_policy(
            iam.PolicyStatement(
                actions=actions, resources=resources, conditions=dict(conditions) if conditions else None
            )
        )

    def _read_stack(self) -> None:
        """The run config (campaign/aws/run_config.py): DescribeStacks, resource type `stack`
        (Service Authorization Reference, AWS CloudFormation); this stack's id is its ARN."""
        self._allow(["cloudformation:DescribeStacks"], [Stack.of(self).stack_id])

    def _start_and_stop_tasks(self, cluster: ecs.ICluster) -> None:
        """RunTask of the load generators' three definitions only, in this cluster; StopTask,
        DescribeTasks and ListTasks of this cluster's tasks (campaign/backends/fargate/ecs_tasks.py,
        `run --resume`'s stop_run_tasks and its TasksStopped waiter)."""
        stack = Stack.of(self)
        in_cluster = {"ArnEquals": {"ecs:cluster": cluster.cluster_arn}}
        tasks = [self._lg.master_task, self._lg.worker_task, self._lg.gate_task]
        # Amazon ECS: RunTask's resource is `task-definition` (with its revision), StopTask's and
        # DescribeTasks' `task`, each with the ecs:cluster condition key.
        self._allow(["ecs:RunTask"], [t.task_definition_arn for t in tasks], in_cluster)
        self._allow(["ecs:StopTask", "ecs:DescribeTasks"], [cluster_tasks_arn(cluster)], in_cluster)
        # ListTasks' resource type is `container-instance`, which a Fargate cluster has none of to
        # name: the ecs:cluster condition (a key ListTasks takes) is its scope.
        self._allow(["ecs:ListTasks"], ["*"], in_cluster)
        # RunTask with tags (run-id, fleet, role) also authorizes ecs:TagResource on the new task;
        # the ecs:CreateAction condition allows tagging only as part of RunTask (ECS developer guide,
        # "Grant permission to tag resources on creation").
        self._allow(
            ["ecs:TagResource"],
            [cluster_tasks_arn(cluster)],
            {"StringEquals": {"ecs:CreateAction": "RunTask"}},
        )
        # Starting a task whose definition names a task role and an execution role passes both
        # (ECS developer guide, "Amazon ECS task IAM role" and "task execution IAM role": the caller
        # needs iam:PassRole); only to ECS tasks (IAM user guide, iam:PassedToService).
        roles = [r.role_arn for t in tasks for r in (t.task_role, t.obtain_execution_role())]
        self._allow(["iam:PassRole"], roles, {"StringEquals": {"iam:PassedToService": ECS_TASKS_SERVICE}})
        nag_tasks = nag_cluster_tasks(stack, cluster)
        acknowledge(
            self.task,
            f"AwsSolutions-IAM5[Resource::{nag_tasks}]",
            "Stop, describe and tag (at RunTask only) this cluster's tasks; task ids are new for every run.",
        )
        acknowledge(
            self.task,
            "AwsSolutions-IAM5[Resource::*]",
            "ListTasks (only with the ecs:cluster condition: this cluster), ELB/Auto Scaling/CloudWatch "
            "Describe and Get calls, Cost Explorer and the Price List define no resource type; "
            "ecr:GetAuthorizationToken neither, nor route53:CreateHealthCheck and ec2:DescribeInstances, "
            "which Cloud Map's RegisterInstance needs.",
        )

    def _register_tasks(self, namespace: servicediscovery.PrivateDnsNamespace) -> None:
        """Each step's master and workers in their fleet's Cloud Map services, deregistered when
        the step ends; `run --resume` lists them (campaign/backends/fargate/run.py). Resource type
        `service` (Service Authorization Reference, AWS Cloud Map). Cloud Map acts in Route 53 (and
        EC2) with the caller's permission: its developer guide's "AWS Cloud Map API permissions
        reference" lists as required for RegisterInstance route53:GetHealthCheck,
        route53:CreateHealthCheck, route53:UpdateHealthCheck, route53:ChangeResourceRecordSets and
        ec2:DescribeInstances, and for DeregisterInstance route53:GetHealthCheck,
        route53:DeleteHealthCheck, route53:UpdateHealthCheck and route53:ChangeResourceRecordSets,
        without exception for a service that has no health check or an instance registered by
        AWS_INSTANCE_IPV4 (until issue 49 only ChangeResourceRecordSets was granted, on that
        reasoning: the first registration on an account could have been refused). Resource types
        (Service Authorization Reference, Amazon Route 53 and Amazon EC2): ChangeResourceRecordSets
        the namespace's hosted zone; Get/Update/DeleteHealthCheck `healthcheck` (the one Cloud Map
        would create has no name ahead: any); CreateHealthCheck and DescribeInstances none."""
        services = [*self._lg.master_discovery.values(), *self._lg.workers_discovery.values()]
        self._allow(
            [
                "servicediscovery:RegisterInstance",
                "servicediscovery:DeregisterInstance",
                "servicediscovery:ListInstances",
            ],
            [s.service_arn for s in services],
        )
        partition = Stack.of(self).partition
        zone = f"arn:{partition}:route53:::hostedzone/{namespace.namespace_hosted_zone_id}"
        self._allow(["route53:ChangeResourceRecordSets"], [zone])
        self._allow(
            ["route53:GetHealthCheck", "route53:UpdateHealthCheck", "route53:DeleteHealthCheck"],
            [f"arn:{partition}:route53:::healthcheck/*"],
        )
        self._allow(list(CLOUD_MAP_UNSCOPED), ["*"])
        acknowledge(
            self.task,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:route53:::healthcheck/*]",
            "Cloud Map's registrations act on Route 53 health checks with the caller's permission (Cloud Map API "
            "permissions reference); the one it would create has no name ahead.",
        )

    def _run_files(self, results: s3.IBucket) -> None:
        """The run's prefix, and only it: inputs up, records and step files read as they stream,
        the run directory put, `run --resume`'s moves (CopyObject: GetObject on the source,
        PutObject on the copy; then DeleteObject; S3 API reference, CopyObject). ListBucket
        (ListObjectsV2) only under the runs prefix (Amazon S3: the s3:prefix condition key). The
        gate's results stay the gate task's own to write (stacks/load_generator.py): an explicit
        Deny, so the conductor can read the verdict but never forge it."""
        runs = self._lg.runs_prefix
        objects = f"{results.bucket_arn}/{runs}/*"
        self._allow(["s3:ListBucket"], [results.bucket_arn], {"StringLike": {"s3:prefix": [f"{runs}/*"]}})
        # PutObject covers a multipart upload's parts (boto3's upload_file splits files over 8 MB).
        self._allow(["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"], [objects])
        self.task.add_to_task_role_policy(
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                actions=["s3:PutObject"],
                resources=[f"{results.bucket_arn}/{runs}/*/{GATE_PREFIX}*"],
            )
        )
        bucket = arn_placeholder(results.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            self.task,
            f"AwsSolutions-IAM5[Resource::{bucket}/{runs}/*]",
            "The run's files under the runs prefix, any run id: the conductor runs whichever run it is started for.",
        )

    def _report_sources(self, workspace_arn: str) -> None:
        """The report's sources (analysis/report/evidence.py on the cloud path) and the readiness
        evidence: the Prometheus workspace's queries (aps:QueryMetrics, resource type `workspace`:
        Amazon Managed Service for Prometheus; the AMP user guide's query APIs, query and
        query_range, both under QueryMetrics), and the reads that define no resource type."""
        self._allow(["aps:QueryMetrics"], [workspace_arn])
        self._allow(list(UNSCOPED_READS), ["*"])
