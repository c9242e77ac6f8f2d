"""One internal Network Load Balancer; one TCP listener + target group per fleet."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from constructs import Construct

from stacks.compliance import acknowledge
from stacks.fleet import ServingFleet
from stacks.network import PRIVATE

FIRST_LISTENER_PORT = 8000  # fleet i listens on 8000 + i, in manifest order
# Cross-zone load balancing is on for every measured target group, whatever
# costs.network.nlb_cross_zone says (that field describes the production deployment the analysis
# prices). Off, each NLB node sends only to targets in its own AZ, so the load generators' DNS
# answer decides which AZ's instances get the load; and since the fleets share this NLB, an AZ
# stays in its DNS only while every target group has a healthy target there, so an inf2 AZ still
# compiling also took that AZ out for g6. On, a node spreads over the targets of every AZ, and an
# AZ is healthy while each target group has a healthy target in any AZ (all unhealthy: the NLB
# fails open). The target group's attribute load_balancing.cross_zone.enabled decides for its
# traffic, whatever the load balancer's. Sources: ELB user guide, "Cross-zone load balancing for
# target groups" (docs.aws.amazon.com/elasticloadbalancing/latest/network/target-group-cross-zone.html)
# and "Target group health"; AWS re:Post knowledge center, "elb-dns-cross-zone-balance-configuration".
# So one NLB still serves both fleets without coupling their AZs; aws-cdk-lib NetworkTargetGroup's
# cross_zone_enabled renders that attribute (default: the load balancer's setting).
MEASURED_CROSS_ZONE = True
# Client IP preservation is off on every measured target group. An instance target group keeps
# the client's address by default, and with it a client that connects to several addresses of
# the same NLB (cross-zone on, and the load generators open a new connection per request to
# whichever node address DNS gave) can reach the same target from the same source IP and port
# through two nodes; the target then sees a duplicate 5-tuple and the connection fails, more
# often the higher the connection rate. ELB user guide, Network Load Balancers, "Troubleshoot
# your Network Load Balancer" > "Intermittent connection failure when client IP preservation is
# enabled" (its remedy: disable preservation), and "Edit target group attributes" > "Client IP
# preservation" (attribute preserve_client_ip.enabled; disabled, "the source IP address is the
# private IP address of the Network Load Balancer"). The servers log nothing per client, so
# nothing is lost. The fleets' ingress rule names the NLB's security group, which those private
# addresses carry, so it still admits traffic and health checks (AWS re:Post knowledge center,
# "security-group-load-balancer": with preservation off, allow the NLB's security group on the
# target's).
MEASURED_PRESERVE_CLIENT_IP = False


class FleetLoadBalancer(Construct):
    def __init__(self, scope: Construct, cid: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(scope, cid)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="fleet NLB: load generator in, fleets out",
            allow_all_outbound=True,
        )
        self.nlb = elbv2.NetworkLoadBalancer(
            self,
            "Nlb",
            vpc=vpc,
            internet_facing=False,
            vpc_subnets=PRIVATE,
            security_groups=[self.security_group],
            # The load balancer's own default, for any target group that does not set it (each
            # fleet's does: MEASURED_CROSS_ZONE); inter-AZ transfer is billed either way it flows.
            cross_zone_enabled=MEASURED_CROSS_ZONE,
        )
        acknowledge(
            self.nlb,
            "AwsSolutions-ELB2",
            "NLB access logs exist only for TLS listeners; these are TCP, so per-request evidence comes from the load generator records.",
        )
        self.endpoints: dict[str, str] = {}
        self.target_group_arns: dict[str, str] = {}  # `run` reads each fleet's target health there
        self.listener_ports: dict[str, int] = {}

    def add_fleets(self, fleets: Sequence[ServingFleet]) -> None:
        for i, fleet in enumerate(fleets):
            self._add_fleet(fleet, FIRST_LISTENER_PORT + i)

    def _add_fleet(self, fleet: ServingFleet, listener_port: int) -> None:
        name = fleet.fleet.name
        defn = fleet.definition
        scope = Construct(self, f"Fleet-{name}")
        Tags.of(scope).add("fleet", name)
        target_group = elbv2.NetworkTargetGroup(
            scope,
            "TargetGroup",
            vpc=self.nlb.vpc,
            port=defn.port,
            protocol=elbv2.Protocol.TCP,
            targets=[fleet.asg],
            cross_zone_enabled=MEASURED_CROSS_ZONE,
            preserve_client_ip=MEASURED_PRESERVE_CLIENT_IP,
            deregistration_delay=Duration.seconds(30),
            health_check=elbv2.HealthCheck(
                protocol=elbv2.Protocol.HTTP,
                path=defn.health_path,
                port="traffic-port",
                interval=Duration.seconds(15),
                healthy_threshold_count=2,
                unhealthy_threshold_count=3,
            ),
        )
        elbv2.NetworkListener(
            scope,
            "Listener",
            load_balancer=self.nlb,
            port=listener_port,
            protocol=elbv2.Protocol.TCP,
            default_target_groups=[target_group],
        )
        # Targets see the NLB's security group as the source (health checks and traffic; with
        # client IP preservation off, every packet comes from the NLB's own private addresses).
        fleet.security_group.add_ingress_rule(
            self.security_group, ec2.Port.tcp(defn.port), f"NLB to {name} serving port"
        )
        self.listener_ports[name] = listener_port
        self.target_group_arns[name] = target_group.target_group_arn
        self.endpoints[name] = f"http://{self.nlb.load_balancer_dns_name}:{listener_port}"

    def allow_clients(self, client: ec2.ISecurityGroup) -> None:
        for name, port in self.listener_ports.items():
            self.security_group.add_ingress_rule(client, ec2.Port.tcp(port), f"load generator to {name} listener")
