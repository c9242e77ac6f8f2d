"""The load generator: a Locust master (web UI) and N workers on Fargate, image from the root Dockerfile."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_servicediscovery as servicediscovery
from constructs import Construct

from campaign.manifest import Manifest
from stacks import loadgen_contract as lg
from stacks.compliance import acknowledge, arn_placeholder
from stacks.network import PRIVATE
from stacks.settings import REPO_ROOT, SynthInputError

# Keep the image context small and the asset hash stable: none of these belong in the image.
IMAGE_EXCLUDES = [
    ".venv", "node_modules", "cdk.out", ".git", "runs", "**/__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
]  # fmt: skip


IMAGE_APP_DIR = "/app"  # WORKDIR of the root Dockerfile


def loadgen_image() -> ecs.ContainerImage:
    if not (REPO_ROOT / "Dockerfile").is_file():
        raise SynthInputError(f"Dockerfile: the load-generator image is built from {REPO_ROOT / 'Dockerfile'}, which does not exist")
    return ecs.ContainerImage.from_asset(str(REPO_ROOT), exclude=IMAGE_EXCLUDES, platform=ecr_assets.Platform.LINUX_AMD64)


def in_image_manifest_path(manifest: Manifest) -> str:
    """Where the image (COPY manifests/ /app/manifests/) holds this manifest."""
    src = manifest.source
    if src is None or src.parent != REPO_ROOT / "manifests":
        raise SynthInputError(f"manifest: the load-generator image bakes manifests/ at build time; put {src} under {REPO_ROOT / 'manifests'}")
    return f"{IMAGE_APP_DIR}/manifests/{src.name}"


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
        access_logs: s3.IBucket,
        campaign_prefix: str,
        targets: Mapping[str, str],
        prometheus_security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, cid)
        trace_name = manifest.trace_path.name
        self.inputs_prefix = f"{campaign_prefix}/inputs"
        self.runs_prefix = f"{campaign_prefix}/runs"
        bucket = results.bucket_name
        self.manifest_uri = f"s3://{bucket}/{self.inputs_prefix}/manifest.yaml"
        self.trace_uri = f"s3://{bucket}/{self.inputs_prefix}/{trace_name}"
        common_env = {
            lg.ENV_MANIFEST_URI: self.manifest_uri,
            lg.ENV_TRACE_URI: self.trace_uri,
            lg.ENV_RESULTS_URI: f"s3://{bucket}/{self.runs_prefix}/",
            lg.ENV_TARGETS: json.dumps(dict(targets), sort_keys=True),
            lg.ENV_MANIFEST_DIGEST: manifest.digest,
            lg.ENV_METRICS_PORT: str(lg.METRICS_PORT),
            # The loadgen's own settings (loadgen/locustfile.py): the image bakes manifests/ and
            # data/traces/, so an in-repo manifest is read from the image; records go to S3.
            "LOADGEN_MANIFEST": in_image_manifest_path(manifest),
            "LOADGEN_S3_URI": f"s3://{bucket}/{self.runs_prefix}",
            "LOADGEN_METRICS_PORT": str(lg.METRICS_PORT),
            "LOADGEN_METRICS_ADDR": "0.0.0.0",
            # Default fleet of a run (the candidate); the web UI can switch fleet and host per run.
            "LOADGEN_FLEET": manifest.comparison.candidate,
            "LOCUST_HOST": targets[manifest.comparison.candidate],
        }
        self.security_group = ec2.SecurityGroup(self, "SecurityGroup", vpc=vpc, description="Locust master and workers", allow_all_outbound=True)
        self.security_group.add_ingress_rule(self.security_group, ec2.Port.tcp(lg.LOCUST_MASTER_PORT), "workers to master")
        self.security_group.add_ingress_rule(
            prometheus_security_group,
            ec2.Port.tcp_range(lg.METRICS_PORT, lg.METRICS_PORT + manifest.loadgen.workers),
            "Prometheus scrapes loadgen histograms (worker i serves METRICS_PORT + i)",
        )

        image = loadgen_image()
        log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY)
        master_env = {
            **common_env,
            lg.ENV_ROLE: "master",
            "LOCUST_EXPECT_WORKERS": str(manifest.loadgen.workers),
            "LOCUST_WEB_PORT": str(lg.LOCUST_WEB_PORT),
        }
        worker_env = {
            **common_env,
            lg.ENV_ROLE: "worker",
            "LOCUST_MASTER_NODE_HOST": f"{lg.MASTER_SERVICE_NAME}.{namespace.namespace_name}",
            "LOCUST_MASTER_NODE_PORT": str(lg.LOCUST_MASTER_PORT),
        }
        self.master = self._service(
            "Master",
            image,
            master_env,
            ["--master"],  # the image's CMD is --help: the role must be given
            log_group,
            cluster,
            namespace,
            lg.MASTER_SERVICE_NAME,
            1,
            results,
            [lg.LOCUST_WEB_PORT, lg.LOCUST_MASTER_PORT],
        )
        self.workers = self._service(
            "Worker", image, worker_env, ["--worker"], log_group, cluster, namespace, lg.WORKERS_SERVICE_NAME, manifest.loadgen.workers, results, []
        )
        self.ui_url = self._web_ui(vpc, manifest.operator.cidr, access_logs)

    def _service(
        self,
        cid: str,
        image: ecs.ContainerImage,
        environment: dict[str, str],
        command: list[str],
        log_group: logs.ILogGroup,
        cluster: ecs.ICluster,
        namespace: servicediscovery.INamespace,
        dns_name: str,
        count: int,
        results: s3.IBucket,
        ports: list[int],
    ) -> ecs.FargateService:
        # One Locust process per task and 1 vCPU each: gevent is single-threaded, so a worker
        # that shares a core would add its own scheduling lag to every timestamp.
        task = ecs.FargateTaskDefinition(self, f"{cid}Task", cpu=1024, memory_limit_mib=2048)
        task.add_container(
            "locust",
            image=image,
            environment=environment,
            command=command,
            logging=ecs.LogDrivers.aws_logs(stream_prefix=dns_name, log_group=log_group),
            port_mappings=[ecs.PortMapping(container_port=p) for p in [*ports, lg.METRICS_PORT]],
        )
        results.grant_read(task.task_role, f"{self.inputs_prefix}/*")
        results.grant_put(task.task_role, f"{self.runs_prefix}/*")
        acknowledge(task, "AwsSolutions-ECS2", "Environment holds S3 URIs, fleet endpoints and Locust settings; no secrets.")
        acknowledge(
            task,
            "AwsSolutions-IAM5[Action::s3:GetBucket*]",
            "CDK's read grant; scoped to the results bucket, objects limited to this manifest's inputs prefix.",
        )
        acknowledge(task, "AwsSolutions-IAM5[Action::s3:GetObject*]", "Read-only on this manifest's inputs prefix.")
        acknowledge(task, "AwsSolutions-IAM5[Action::s3:List*]", "Listing the results bucket; objects stay limited to this manifest's prefixes.")
        acknowledge(task, "AwsSolutions-IAM5[Action::s3:Abort*]", "Aborting the task's own multipart record uploads.")
        acknowledge(task, "AwsSolutions-IAM5[Resource::*]", "ecr:GetAuthorizationToken (image pull) has no resource-level permissions.")
        bucket_arn = arn_placeholder(results.node.default_child)  # type: ignore[arg-type]
        acknowledge(task, f"AwsSolutions-IAM5[Resource::{bucket_arn}/{self.inputs_prefix}/*]", "Objects under this manifest's inputs prefix only.")
        acknowledge(task, f"AwsSolutions-IAM5[Resource::{bucket_arn}/{self.runs_prefix}/*]", "Record uploads under this manifest's runs prefix only.")
        return ecs.FargateService(
            self,
            f"{cid}Service",
            cluster=cluster,
            task_definition=task,
            desired_count=count,
            vpc_subnets=PRIVATE,
            security_groups=[self.security_group],
            cloud_map_options=ecs.CloudMapOptions(name=dns_name, cloud_map_namespace=namespace, dns_record_type=servicediscovery.DnsRecordType.A),
            min_healthy_percent=0,  # a load generator is restarted between runs, never rolled
            max_healthy_percent=100,
            # A broken image fails the deploy in minutes instead of CloudFormation's 3-hour wait.
            # (The container must wait for its S3 inputs rather than exit when they are missing.)
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
        )

    def _web_ui(self, vpc: ec2.IVpc, operator_cidr: str, access_logs: s3.IBucket) -> str:
        """Internet-facing ALB in front of the master's web UI, open to the operator's CIDR only."""
        sg = ec2.SecurityGroup(self, "UiSecurityGroup", vpc=vpc, description="Locust web UI: operator CIDR only", allow_all_outbound=False)
        sg.add_ingress_rule(ec2.Peer.ipv4(operator_cidr), ec2.Port.tcp(lg.LOCUST_WEB_PORT), "operator to Locust web UI")
        alb = elbv2.ApplicationLoadBalancer(
            self,
            "UiAlb",
            vpc=vpc,
            internet_facing=True,
            security_group=sg,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            drop_invalid_header_fields=True,
        )
        alb.log_access_logs(access_logs, "alb/locust-ui")
        listener = alb.add_listener("Ui", port=lg.LOCUST_WEB_PORT, protocol=elbv2.ApplicationProtocol.HTTP, open=False)
        listener.add_targets(
            "Master",
            port=lg.LOCUST_WEB_PORT,
            protocol=elbv2.ApplicationProtocol.HTTP,
            targets=[self.master.load_balancer_target(container_name="locust", container_port=lg.LOCUST_WEB_PORT)],
            health_check=elbv2.HealthCheck(path="/", healthy_http_codes="200", interval=Duration.seconds(30)),
            deregistration_delay=Duration.seconds(10),
        )
        return f"http://{alb.load_balancer_dns_name}:{lg.LOCUST_WEB_PORT}"
