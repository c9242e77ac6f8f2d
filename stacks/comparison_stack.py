"""The comparison environment: network, results, every manifest fleet behind one NLB, loadgen, observability."""

from __future__ import annotations

from aws_cdk import CfnOutput, CfnParameter, Stack, Tags
from constructs import Construct

from core.cloud_contract import DEADLINE_PATTERN, PROMETHEUS_QUERY_OUTPUT
from core.compile_host import compile_host
from core.naming import (
    CAMPAIGN_DEADLINE_PARAMETER,
    MANIFEST_DIGEST_TAG,
    REHEARSAL_OUTPUT,
    REHEARSAL_OUTPUT_VALUE,
    REHEARSAL_TAG,
)
from stacks.compile_boot import COMPILE_PHASE_OUTPUT
from stacks.compile_instance import CompileInstance
from stacks.conductor import Conductor
from stacks.fleet import ServingFleet
from stacks.image_cache import DockerHubCache
from stacks.load_balancer import FleetLoadBalancer
from stacks.load_generator import LoadGenerator
from stacks.loadgen_contract import RUN_CONFIG_OUTPUT
from stacks.network import Network
from stacks.observability import Observability
from stacks.rehearsal_fleet import rehearsal_host
from stacks.results import ResultsStore
from stacks.settings import SynthSettings


class ComparisonStack(Stack):
    def __init__(self, scope: Construct, cid: str, *, settings: SynthSettings, **kwargs: object) -> None:
        m = settings.manifest
        description = f"{m.campaign}: {m.description} (manifest {m.short_digest})"[:1024]
        super().__init__(scope, cid, description=description, **kwargs)  # type: ignore[arg-type]
        Tags.of(self).add("campaign", m.campaign)
        Tags.of(self).add(MANIFEST_DIGEST_TAG, m.digest)

        store = ResultsStore(self, "Results")
        image_cache = DockerHubCache(self, "DockerHubCache")
        network = Network(self, "Network", availability_zones=settings.vpc_azs, flow_log_bucket=store.logs)
        deadline = self._deadline_parameter(m.max_campaign_hours)
        # A rehearsal (issue 51): every fleet its emulator on one cheap host type; nothing else changes.
        rehearsal = rehearsal_host(self, m.costs.region) if settings.rehearsal else None
        if rehearsal is not None:
            Tags.of(self).add(*REHEARSAL_TAG)
        fleets = []
        for i, f in enumerate(m.fleets):
            fleet = ServingFleet(
                self,
                f"Fleet-{f.name}",
                manifest=m,
                index=i,
                vpc=network.vpc,
                weights_s3_uri=settings.weights_s3_uri,
                results=store.results,
                image_cache=image_cache,
                deadline=deadline,
                held_at_zero=bool(settings.compile_fleets),  # nothing to measure until every fleet can serve
                rehearsal=rehearsal,
            )
            Tags.of(fleet).add("fleet", f.name)
            fleets.append(fleet)
        compiles = [
            CompileInstance(
                self,
                f"Compile-{fleet.fleet.name}",
                manifest=m,
                fleet=fleet,
                host=host,
                vpc=network.vpc,
                weights_s3_uri=settings.weights_s3_uri,
                deadline=deadline,
            )
            for fleet in fleets
            if fleet.fleet.name in settings.compile_fleets and (host := compile_host(m, fleet.fleet)) is not None
        ]

        nlb = FleetLoadBalancer(self, "FleetNlb", vpc=network.vpc)
        nlb.add_fleets(fleets)
        obs = Observability(self, "Observability", manifest=m, vpc=network.vpc, image_cache=image_cache)
        obs.add_prometheus(fleets)
        prefix = ResultsStore.campaign_prefix(m.campaign, m.digest)
        loadgen = LoadGenerator(
            self,
            "LoadGenerator",
            manifest=m,
            vpc=network.vpc,
            cluster=obs.cluster,
            namespace=obs.namespace,
            results=store.results,
            campaign_prefix=prefix,
            targets=nlb.endpoints,
            target_groups=nlb.target_group_arns,
            prometheus_security_group=obs.prometheus_security_group,
            deadline=deadline,
        )
        nlb.allow_clients(loadgen.security_group)
        # `run --detach`: the orchestration as a task in the stack (started by `run`, none between runs).
        conductor = Conductor(
            self,
            "Conductor",
            load_generator=loadgen,
            manifest_digest=m.digest,
            cluster=obs.cluster,
            namespace=obs.namespace,
            results=store.results,
            prometheus_workspace_arn=obs.workspace.attr_arn,
        )

        CfnOutput(
            self,
            "ResultsBucketName",
            value=store.results.bucket_name,
            description="kept after teardown (RemovalPolicy.RETAIN)",
        )
        # `campaign run` reads this: cluster, task definitions (the conductor's too), subnets, results prefix, fleet endpoints.
        CfnOutput(
            self,
            RUN_CONFIG_OUTPUT,
            value=loadgen.run_config(conductor.task.task_definition_arn),
            description="what `python -m campaign run` starts tasks with",
        )
        CfnOutput(
            self,
            "OperatorUiPolicyArn",
            value=loadgen.operator_policy.managed_policy_arn,
            description=f"attach to the operator's role: Locust UI port forward from {m.operator.cidr} only",
        )
        if compiles:
            # `deploy` starts each compile instance's group and waits for the fleet's set, then brings
            # one instance of the fleet's own group up and waits for it in the fleet's target group
            # (campaign/aws/compile_phase.py run and prove_on_fleet_type).
            by_name = {f.fleet.name: f for f in fleets}
            CfnOutput(
                self,
                COMPILE_PHASE_OUTPUT,
                value=Stack.of(self).to_json_string(
                    {
                        c.host.fleet: {
                            "group": c.asg.auto_scaling_group_name,
                            "instance_type": c.host.instance_type,
                            "log_group": by_name[c.host.fleet].log_group.log_group_name,
                            "fleet_group": by_name[c.host.fleet].asg.auto_scaling_group_name,
                            "target_group": nlb.target_group_arns[c.host.fleet],
                        }
                        for c in compiles
                    }
                ),
                description="the compile phase: per fleet, its compile instance's group and boot log group, and the "
                "fleet's own group and target group for the one-instance check",
            )
        if rehearsal is not None:
            # The campaign reads it from DescribeStacks: `run` on this stack is a rehearsal.
            CfnOutput(
                self,
                REHEARSAL_OUTPUT,
                value=REHEARSAL_OUTPUT_VALUE,
                description=f"a rehearsal: every fleet runs its emulator on {rehearsal.instance_type}",
            )
        CfnOutput(self, "PrometheusWorkspaceId", value=obs.workspace.attr_workspace_id)
        # `run` and `report --run-id` read it (campaign/aws/run_config.py): the report's histograms.
        CfnOutput(
            self,
            PROMETHEUS_QUERY_OUTPUT,
            value=obs.query_url,
            description="the workspace's query URL; the analysis role needs aps:QueryMetrics on the workspace",
        )
        for fleet in fleets:
            name = fleet.fleet.name
            CfnOutput(
                self,
                f"Endpoint{name.replace('-', '')}",
                value=nlb.endpoints[name],
                description=f"{name} OpenAI-compatible endpoint (internal NLB)",
            )

    def _deadline_parameter(self, hours: float | None) -> str:
        """The campaign's deadline as a parameter without a default: the template is the same at every
        synth (tests, checkov), each fleet's scheduled action is always in it, and a deploy that does not
        name a deadline is refused by CloudFormation itself, never scheduled at some stale default time."""
        within = (
            f"deploy time + max_campaign_hours ({hours:g} h)"
            if hours is not None
            else "deploy time + max_campaign_hours"
        )
        return CfnParameter(
            self,
            CAMPAIGN_DEADLINE_PARAMETER,
            type="String",
            allowed_pattern=DEADLINE_PATTERN,
            constraint_description="a UTC time as YYYY-MM-DDThh:mm:ssZ",
            description=f"When every fleet's Auto Scaling group is set to 0: {within}; filled by `campaign deploy`",
        ).value_as_string
