"""The load generator: Fargate task definitions for a Locust master and its workers, started per run.

Nothing runs between campaigns: `campaign run` starts a fresh master and `loadgen.workers`
workers per fleet with ECS RunTask (fleet, host and run id as environment overrides), so
every run has its own processes and its own record prefix. The master starts the replay by
itself once its workers are connected (`--autostart`); its web UI listens on the task's
loopback only and is reached through an ECS Exec / Session Manager port forward: no load
balancer, no inbound rule, and only an identity holding the operator policy (from the
operator's CIDR) may open the session.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_servicediscovery as servicediscovery
from constructs import Construct

from core.manifest import Manifest
from stacks import loadgen_contract as lg
from stacks.compliance import acknowledge, arn_placeholder
from stacks.network import PRIVATE
from stacks.settings import REPO_ROOT, SynthInputError

# Keep the image context small and the asset hash stable: none of these belong in the image.
IMAGE_EXCLUDES = [
    ".venv",
    "node_modules",
    "cdk.out",
    ".git",
    "runs",
    "**/__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
]
# The master gives up when its workers have not all connected after this long (Fargate
# provisioning takes a minute or two), instead of waiting forever.
EXPECT_WORKERS_MAX_WAIT_S = 900
# ECS Exec's agent talks to Session Manager over these; they have no resource-level
# permissions (https://docs.aws.amazon.com/service-authorization/latest/reference/list_ssmmessages.html).
ECS_EXEC_ACTIONS = [
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
]
PORT_FORWARD_DOCUMENT = "AWS-StartPortForwardingSession"
# The run files (<name>-*, core.cloud_contract's layout) each role writes, and what they hold.
WRITE_PURPOSE = {
    "records": "record files (workers)",
    "summary": "run summaries (workers)",
    "progress": "live progress (master)",
    "gate": "readiness and quality result (gate task)",
}
LOCUST_WRITES = ("records", "summary", "progress")
GATE_WRITES = ("gate",)


def repo_image(dockerfile: str, what: str) -> ecs.ContainerImage:
    """An image built from `dockerfile` at the repository root, the repository as its context (less
    IMAGE_EXCLUDES); `cdk deploy` builds and publishes it as an asset (campaign/aws/cdk_assets.py)."""
    if not (REPO_ROOT / dockerfile).is_file():
        raise SynthInputError(f"{dockerfile}: {what} is built from {REPO_ROOT / dockerfile}, which does not exist")
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT), file=dockerfile, exclude=IMAGE_EXCLUDES, platform=ecr_assets.Platform.LINUX_AMD64
    )


def loadgen_image() -> ecs.ContainerImage:
    return repo_image("Dockerfile", "the load-generator image")


def cluster_tasks_arn(cluster: ecs.ICluster) -> str:
    """Every task of `cluster` (task ids are new for every run)."""
    stack = Stack.of(cluster)
    return f"arn:{stack.partition}:ecs:{stack.region}:{stack.account}:task/{cluster.cluster_name}/*"


def nag_cluster_tasks(stack: Stack, cluster: ecs.ICluster) -> str:
    """cluster_tasks_arn as cdk-nag spells it in an AwsSolutions-IAM5 finding id."""
    cluster_ref = f"<{stack.resolve((cluster.node.default_child).logical_id)}>"  # type: ignore[union-attr]
    return f"arn:<AWS::Partition>:ecs:{stack.region}:<AWS::AccountId>:task/{cluster_ref}/*"


class LoadGenerator(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        manifest: Manifest,
        vpc: ec2.IVpc,
        cluster: ecs.ICluster,
        namespace: servicediscovery.INamespace,
        results: s3.IBucket,
        campaign_prefix: str,
        targets: Mapping[str, str],
        target_groups: Mapping[str, str],
        prometheus_security_group: ec2.ISecurityGroup,
        deadline: str,
    ) -> None:
        """`deadline`: the campaign's deadline (CampaignDeadline), in the run config for `run`'s check."""
        super().__init__(scope, cid)
        self.runs_prefix = f"{campaign_prefix}/runs"
        self.results_uri = f"s3://{results.bucket_name}/{self.runs_prefix}"
        workers = manifest.loadgen.workers
        common_env = {
            lg.ENV_RESULTS_URI: self.results_uri,
            lg.ENV_MANIFEST_DIGEST: manifest.digest,
            # The locustfile uploads each worker's records to <LOADGEN_S3_URI>/<run id>/.
            "LOADGEN_S3_URI": self.results_uri,
            "LOADGEN_METRICS_PORT": str(lg.METRICS_PORT),
            "LOADGEN_METRICS_ADDR": "0.0.0.0",
            "LOCUST_EXIT_CODE_ON_ERROR": "0",  # failed requests are records, not a failed task
            "LOCUST_STOP_TIMEOUT": "5",
        }
        master_env = {
            **common_env,
            lg.ENV_ROLE: "master",
            # Headless-with-UI: the replay starts by itself once every worker is connected; the UI
            # stays up for UI_LINGER_S after the run, then the task exits.
            "LOCUST_AUTOSTART": "true",
            "LOCUST_AUTOQUIT": str(lg.UI_LINGER_S),
            "LOCUST_USERS": str(workers),  # one ReplayUser per worker, each replays its share
            "LOCUST_SPAWN_RATE": str(workers),
            "LOCUST_EXPECT_WORKERS": str(workers),
            "LOCUST_EXPECT_WORKERS_MAX_WAIT": str(EXPECT_WORKERS_MAX_WAIT_S),
            "LOCUST_WEB_HOST": "127.0.0.1",  # reached only through the Session Manager port forward
            "LOCUST_WEB_PORT": str(lg.LOCUST_WEB_PORT),
            "LOCUST_MASTER_BIND_PORT": str(lg.LOCUST_MASTER_PORT),
        }
        worker_env = {**common_env, lg.ENV_ROLE: "worker", lg.ENV_MASTER_PORT: str(lg.LOCUST_MASTER_PORT)}
        # The gate (loadgen/gate_task.py) stages and checks the run's inputs like the others, then
        # probes and tests its fleet; no Locust setting applies to it.
        gate_env = {
            lg.ENV_RESULTS_URI: self.results_uri,
            lg.ENV_MANIFEST_DIGEST: manifest.digest,
            lg.ENV_ROLE: "gate",
        }

        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, description="Locust master and workers", allow_all_outbound=True
        )
        self.security_group.add_ingress_rule(
            self.security_group, ec2.Port.tcp(lg.LOCUST_MASTER_PORT), "workers to master"
        )
        self.security_group.add_ingress_rule(
            prometheus_security_group,
            ec2.Port.tcp_range(lg.METRICS_PORT, lg.METRICS_PORT + workers),
            "Prometheus scrapes loadgen histograms (worker i serves METRICS_PORT + i)",
        )
        image = loadgen_image()
        self.log_group = logs.LogGroup(
            self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        # Each role writes only its own files under a run's prefix (IAM's * spans "/", so a capacity
        # step's capacity/<fleet>/x<k>/records-* is covered): the master its progress, the workers
        # their records and summaries, the gate its gate-<fleet>.json, which the run's verdict is read
        # from, so neither Locust role can forge it. The gate's own task role is where its
        # readiness wait's further grants go.
        self.master_task = self._task(
            "Master", image, master_env, ["--master"], results, LOCUST_WRITES, [lg.LOCUST_MASTER_PORT, lg.METRICS_PORT]
        )
        self.worker_task = self._task(
            "Worker", image, worker_env, ["--worker"], results, LOCUST_WRITES, [lg.METRICS_PORT]
        )
        self.gate_task = self._task("Gate", image, gate_env, ["--gate"], results, GATE_WRITES, [])
        # Tasks started by `run` are no service members: `run` registers each task's address in
        # its fleet's services (master-<fleet>, workers-<fleet>), so that each fleet's workers,
        # started beside their master, find their own master (loadgen/task_inputs.py asks Cloud
        # Map's DiscoverInstances), and Prometheus's dns_sd finds both; `run` deregisters a
        # step's tasks when the step ends. One service per fleet: fleets run side by side.
        self.master_discovery: dict[str, servicediscovery.Service] = {}
        self.workers_discovery: dict[str, servicediscovery.Service] = {}
        for f in manifest.fleets:
            self.master_discovery[f.name] = servicediscovery.Service(
                self,
                f"MasterDiscovery-{f.name}",
                namespace=namespace,
                name=lg.master_service_name(f.name),
                dns_record_type=servicediscovery.DnsRecordType.A,
            )
            self.workers_discovery[f.name] = servicediscovery.Service(
                self,
                f"WorkersDiscovery-{f.name}",
                namespace=namespace,
                name=lg.workers_service_name(f.name),
                dns_record_type=servicediscovery.DnsRecordType.A,
            )
        self._allow_master_discovery(namespace, [lg.master_service_name(f.name) for f in manifest.fleets])
        self.operator_policy = self._operator_policy(cluster, manifest.operator.cidr)
        stack = Stack.of(self)
        subnets = vpc.select_subnets(subnet_type=PRIVATE.subnet_type).subnet_ids
        self._run_config = {
            "region": stack.region,
            "cluster": cluster.cluster_name,
            "master_task_definition": self.master_task.task_definition_arn,
            "worker_task_definition": self.worker_task.task_definition_arn,
            "gate_task_definition": self.gate_task.task_definition_arn,
            "subnets": ",".join(subnets),
            "security_groups": self.security_group.security_group_id,
            "results_uri": self.results_uri,
            "targets": dict(targets),
            "target_groups": dict(target_groups),
            "workers": workers,
            "namespace": namespace.namespace_name,
            "master_services": {name: s.service_id for name, s in self.master_discovery.items()},
            "workers_services": {name: s.service_id for name, s in self.workers_discovery.items()},
            "deadline": deadline,
        }

    def run_config(self, conductor_task_definition: str) -> str:
        """The LoadgenRunConfig output's JSON (core.cloud_contract.RunConfig), with the conductor's
        task definition (stacks/conductor.py), which `run --detach` starts."""
        return Stack.of(self).to_json_string(
            {**self._run_config, "conductor_task_definition": conductor_task_definition}
        )

    def _task(
        self,
        cid: str,
        image: ecs.ContainerImage,
        environment: dict[str, str],
        command: list[str],
        results: s3.IBucket,
        writes: tuple[str, ...],
        ports: list[int],
    ) -> ecs.FargateTaskDefinition:
        """A task definition of the load-generator image in one role; its task role may read the
        run's inputs and write only the run files named `writes` (<name>-*)."""
        # One Locust process per task and 1 vCPU each: gevent is single-threaded, so a worker
        # that shares a core would add its own scheduling lag to every timestamp.
        task = ecs.FargateTaskDefinition(
            self, f"{cid}Task", cpu=1024 * lg.LOADGEN_TASK_VCPU, memory_limit_mib=1024 * lg.LOADGEN_TASK_MEMORY_GIB
        )
        task.add_container(
            lg.CONTAINER_NAME,
            image=image,
            environment=environment,
            command=command,  # the image's ENTRYPOINT stages the run's inputs, then runs Locust in this role
            logging=ecs.LogDrivers.aws_logs(stream_prefix=cid.lower(), log_group=self.log_group),
            port_mappings=[ecs.PortMapping(container_port=p) for p in ports],
        )
        bucket_arn = results.bucket_arn
        # Read: the run's inputs only. Write: this role's own files only; no List, no Delete, so a
        # task can neither read another prefix nor overwrite the inputs it was given.
        task.add_to_task_role_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{self.runs_prefix}/*/inputs/*"])
        )
        task.add_to_task_role_policy(
            iam.PolicyStatement(
                actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                resources=[f"{bucket_arn}/{self.runs_prefix}/*/{name}-*" for name in writes],
            )
        )
        task.add_to_task_role_policy(iam.PolicyStatement(actions=ECS_EXEC_ACTIONS, resources=["*"]))
        bucket = arn_placeholder(results.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "Environment holds the S3 results URI, the manifest digest and Locust settings; no secrets.",
        )
        acknowledge(
            task,
            f"AwsSolutions-IAM5[Resource::{bucket}/{self.runs_prefix}/*/inputs/*]",
            "GetObject on the inputs `run` uploaded, any run id.",
        )
        for name in writes:
            acknowledge(
                task,
                f"AwsSolutions-IAM5[Resource::{bucket}/{self.runs_prefix}/*/{name}-*]",
                f"PutObject of this role's {WRITE_PURPOSE[name]}, any run id.",
            )
        acknowledge(
            task,
            "AwsSolutions-IAM5[Resource::*]",
            "ssmmessages:* (ECS Exec's port forward to the UI) and ecr:GetAuthorizationToken have no resource-level permissions.",
        )
        return task

    def _allow_master_discovery(self, namespace: servicediscovery.INamespace, services: list[str]) -> None:
        """A worker task asks Cloud Map where its fleet's master is: DiscoverInstances in this
        namespace, of the master services only. The Service Authorization Reference (AWS Cloud
        Map) scopes DiscoverInstances with the servicediscovery:NamespaceName and
        servicediscovery:ServiceName condition keys, so the resource is "*" and the conditions
        carry the scope."""
        self.worker_task.add_to_task_role_policy(
            iam.PolicyStatement(
                actions=["servicediscovery:DiscoverInstances"],
                resources=["*"],
                conditions={
                    "StringEquals": {
                        "servicediscovery:NamespaceName": namespace.namespace_name,
                        "servicediscovery:ServiceName": services,
                    }
                },
            )
        )

    def _operator_policy(self, cluster: ecs.ICluster, operator_cidr: str) -> iam.ManagedPolicy:
        """Attach to the operator's role: port-forward to a load-generator task, from operator.cidr only."""
        stack = Stack.of(self)
        from_operator = {"IpAddress": {"aws:SourceIp": operator_cidr}}
        tasks = cluster_tasks_arn(cluster)
        document = f"arn:{stack.partition}:ssm:{stack.region}::document/{PORT_FORWARD_DOCUMENT}"
        policy = iam.ManagedPolicy(
            self,
            "OperatorUiAccess",
            description=f"Open a Session Manager port forward to the Locust UI of a load-generator task, from {operator_cidr} only",
            statements=[
                iam.PolicyStatement(
                    actions=["ecs:ExecuteCommand", "ecs:DescribeTasks"],
                    resources=[tasks, cluster.cluster_arn],
                    conditions=from_operator,
                ),
                iam.PolicyStatement(
                    actions=["ssm:StartSession"], resources=[tasks, document], conditions=from_operator
                ),
                iam.PolicyStatement(
                    actions=["ssm:TerminateSession", "ssm:ResumeSession"],
                    resources=[f"arn:{stack.partition}:ssm:{stack.region}:{stack.account}:session/${{aws:userid}}-*"],
                ),
            ],
        )
        acknowledge(
            policy,
            f"AwsSolutions-IAM5[Resource::{nag_cluster_tasks(stack, cluster)}]",
            "Task ids are new for every run; the wildcard stays inside this campaign's cluster.",
        )
        acknowledge(
            policy,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ssm:{stack.region}:<AWS::AccountId>:session/<aws:userid>-*]",
            "Terminate or resume only the caller's own Session Manager sessions (their ids start with the caller's user id).",
        )
        return policy
