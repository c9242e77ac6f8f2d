"""Container Insights for the load generator, and one Prometheus path for every histogram.

Prometheus runs as one Fargate task: it discovers fleet instances by their campaign/fleet
tags (ec2_sd) and load-generator tasks through Cloud Map (dns_sd), scrapes server and loadgen
histograms, and remote-writes everything to an Amazon Managed Service for Prometheus
workspace, which keeps the series after the task (and the stack's compute) is gone and is
queried with SigV4 by the analysis.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_aps as aps
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_servicediscovery as servicediscovery
from constructs import Construct

from core.cloud_contract import PROMETHEUS_SCRAPE_INTERVAL_S, PROMETHEUS_TASK_MEMORY_GIB, PROMETHEUS_TASK_VCPU
from core.images import PROMETHEUS_IMAGE, CachedPull
from core.manifest import Manifest
from stacks import loadgen_contract as lg
from stacks.compliance import acknowledge
from stacks.fleet import ServingFleet
from stacks.image_cache import DockerHubCache
from stacks.network import PRIVATE

__all__ = ["PROMETHEUS_IMAGE", "Observability", "prometheus_config", "prometheus_pull"]

PROMETHEUS_CONFIG_PATH = "/prometheus/prometheus.yml"
SCRAPE_INTERVAL = f"{PROMETHEUS_SCRAPE_INTERVAL_S}s"  # core.cloud_contract says why it is short


def prometheus_config(
    *, manifest: Manifest, fleets: Sequence[ServingFleet], namespace: str, region: str, remote_write_url: str
) -> dict[str, Any]:
    jobs: list[dict[str, Any]] = []
    for f in fleets:
        jobs.append(
            {
                "job_name": f"serving-{f.fleet.name}",
                "metrics_path": f.definition.metrics_path,
                "ec2_sd_configs": [
                    {
                        "region": region,
                        "port": f.definition.port,
                        "filters": [
                            {"name": "tag:campaign", "values": [manifest.campaign]},
                            {"name": "tag:fleet", "values": [f.fleet.name]},
                            {"name": "instance-state-name", "values": ["running"]},
                        ],
                    }
                ],
                "relabel_configs": [
                    {"source_labels": ["__meta_ec2_tag_fleet"], "target_label": "fleet"},
                    {"source_labels": ["__meta_ec2_instance_id"], "target_label": "instance_id"},
                    {"source_labels": ["__meta_ec2_instance_type"], "target_label": "instance_type"},
                    {"source_labels": ["__meta_ec2_availability_zone"], "target_label": "az"},
                ],
            }
        )
    # Locust worker i serves METRICS_PORT + i; every worker task is probed on each of those
    # ports (the ones a task does not serve show up=0 and carry no series).
    worker_ports = range(lg.METRICS_PORT, lg.METRICS_PORT + manifest.loadgen.workers)
    # Each fleet's tasks register in that fleet's own services (stacks/load_generator.py).
    for role, service_of, ports in (
        ("master", lg.master_service_name, [lg.METRICS_PORT]),
        ("worker", lg.workers_service_name, worker_ports),
    ):
        names = [f"{service_of(f.fleet.name)}.{namespace}" for f in fleets]
        jobs.append(
            {
                "job_name": f"loadgen-{role}",
                "dns_sd_configs": [{"names": names, "type": "A", "port": port} for port in ports],
                "relabel_configs": [{"target_label": "loadgen_role", "replacement": role}],
            }
        )
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "external_labels": {"campaign": manifest.campaign, "manifest_digest": manifest.digest},
        },
        "scrape_configs": jobs,
        "remote_write": [{"url": remote_write_url, "sigv4": {"region": region}}],
    }


def prometheus_pull(image_cache: DockerHubCache) -> CachedPull:
    """PROMETHEUS_IMAGE through the Docker Hub cache, by its release tag. Fargate pulls the task
    definition's reference as it is, and a reference with a digest (with or without its tag) is
    pulled by the digest, which the cache answers as missing until a pull by tag filled it
    (aws/containers-roadmap#2837); no step of ours can pull the tag first on Fargate. So the task
    names the pinned release tag, and ECS resolves it to one digest per deployment that every task of
    the service then runs (Amazon ECS API reference, ContainerImage: "Container image resolution")."""
    cached = image_cache.pull(PROMETHEUS_IMAGE)
    if cached is None or cached.by_tag is None:
        raise ValueError(f"PROMETHEUS_IMAGE {PROMETHEUS_IMAGE} must be a Docker Hub image with a tag")
    return cached


class Observability(Construct):
    def __init__(
        self, scope: Construct, cid: str, *, manifest: Manifest, vpc: ec2.IVpc, image_cache: DockerHubCache
    ) -> None:
        super().__init__(scope, cid)
        self._manifest = manifest
        self._vpc = vpc
        self._image_cache = image_cache
        # ENHANCED: per-task and per-container CPU, memory, network, so a saturated load
        # generator (which would measure the client instead of the server) shows up.
        self.cluster = ecs.Cluster(self, "Cluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENHANCED)
        self.namespace = servicediscovery.PrivateDnsNamespace(
            self, "Namespace", name=f"{manifest.campaign}.harness.internal", vpc=vpc
        )
        self.workspace = aps.CfnWorkspace(self, "Prometheus", alias=f"{manifest.campaign}-{manifest.short_digest}")
        self.prometheus_security_group = ec2.SecurityGroup(
            self,
            "PrometheusSecurityGroup",
            vpc=vpc,
            description="Prometheus scraper (egress only)",
            allow_all_outbound=True,
        )

    @property
    def query_url(self) -> str:
        """The workspace's Prometheus-compatible query URL, which the analysis queries with SigV4
        (service aps): <its PrometheusEndpoint>api/v1/query, the endpoint ending in a slash
        (AWS::APS::Workspace return values, PrometheusEndpoint; AMP user guide, "Use awscurl to
        query with Prometheus-compatible APIs": .../workspaces/<id>/api/v1/query)."""
        return f"{self.workspace.attr_prometheus_endpoint}api/v1/query"

    def add_prometheus(self, fleets: Sequence[ServingFleet]) -> ecs.FargateService:
        stack = Stack.of(self)
        remote_write = f"{self.workspace.attr_prometheus_endpoint}api/v1/remote_write"
        config = prometheus_config(
            manifest=self._manifest,
            fleets=fleets,
            namespace=self.namespace.namespace_name,
            region=stack.region,
            remote_write_url=remote_write,
        )
        task = ecs.FargateTaskDefinition(
            self, "PrometheusTask", cpu=1024 * PROMETHEUS_TASK_VCPU, memory_limit_mib=1024 * PROMETHEUS_TASK_MEMORY_GIB
        )
        task.add_to_task_role_policy(
            iam.PolicyStatement(actions=["aps:RemoteWrite"], resources=[self.workspace.attr_arn])
        )
        task.add_to_task_role_policy(
            iam.PolicyStatement(actions=["ec2:DescribeInstances", "ec2:DescribeAvailabilityZones"], resources=["*"])
        )
        acknowledge(
            task,
            "AwsSolutions-IAM5[Resource::*]",
            "ec2:Describe* (ec2_sd discovery) and ecr:GetAuthorizationToken have no resource-level permissions.",
        )
        log_group = logs.LogGroup(
            self, "PrometheusLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        prometheus = prometheus_pull(self._image_cache)
        self._image_cache.grant_pull(task.obtain_execution_role(), [prometheus])  # Fargate pulls with it
        task.add_container(
            "prometheus",
            image=ecs.ContainerImage.from_registry(str(prometheus.by_tag)),
            # The config holds deploy-time values (workspace URL, Cloud Map name), so it travels in
            # the environment and is written to disk at start: no config file asset, no Lambda.
            entry_point=["/bin/sh", "-c"],
            command=[
                f'printf "%s" "$PROMETHEUS_CONFIG" > {PROMETHEUS_CONFIG_PATH} && exec /bin/prometheus '
                f"--config.file={PROMETHEUS_CONFIG_PATH} --storage.tsdb.path=/prometheus --storage.tsdb.retention.time=7d"
            ],
            environment={"PROMETHEUS_CONFIG": json.dumps(config, sort_keys=True)},
            logging=ecs.LogDrivers.aws_logs(stream_prefix="prometheus", log_group=log_group),
            port_mappings=[ecs.PortMapping(container_port=9090)],
        )
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "Environment holds only the scrape config (no secrets): tags, DNS names, the workspace URL.",
        )
        service = ecs.FargateService(
            self,
            "PrometheusService",
            cluster=self.cluster,
            task_definition=task,
            desired_count=1,
            vpc_subnets=PRIVATE,
            security_groups=[self.prometheus_security_group],
            min_healthy_percent=0,  # one scraper: replacing it briefly stops scraping, never doubles it
            max_healthy_percent=100,
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
        )
        self._image_cache.needed_by(service)
        for f in fleets:
            f.security_group.add_ingress_rule(
                self.prometheus_security_group,
                ec2.Port.tcp(f.definition.port),
                f"Prometheus scrapes {f.fleet.name} metrics",
            )
        return service
