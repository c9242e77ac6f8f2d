"""The VPC: public subnets for the NAT gateway, private ones for everything else (nothing faces the internet)."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from core.cloud_contract import NAT_GATEWAYS

# Interface endpoints for the AWS APIs every instance and task calls on the hot path (image
# pulls, logs, metrics, SSM): that traffic then skips the NAT gateway's per-GB charge.
_INTERFACE_ENDPOINTS: tuple[tuple[str, ec2.InterfaceVpcEndpointAwsService], ...] = (
    ("EcrApi", ec2.InterfaceVpcEndpointAwsService.ECR),
    ("EcrDocker", ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER),
    ("Logs", ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS),
    ("Monitoring", ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING),
    ("Ssm", ec2.InterfaceVpcEndpointAwsService.SSM),
    ("SsmMessages", ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES),
    ("Ec2Messages", ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES),
)

VPC_CIDR = "10.40.0.0/16"
FLOW_LOG_PREFIX = "vpc-flow-logs"
PRIVATE = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)


class Network(Construct):
    def __init__(
        self, scope: Construct, cid: str, *, availability_zones: Sequence[str], flow_log_bucket: s3.IBucket
    ) -> None:
        super().__init__(scope, cid)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            availability_zones=list(availability_zones),
            # One NAT gateway: a campaign lasts days, and what still needs the internet (ECR Public
            # images, Hub weights) is a one-off download per instance. Docker Hub images come through
            # the ECR pull-through cache (stacks/image_cache.py); interface endpoints cover the rest.
            nat_gateways=NAT_GATEWAYS,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
            ],
            # True would add a Lambda-backed custom resource. Nothing is placed in the default
            # security group: every instance, task and load balancer gets its own (see tests).
            restrict_default_security_group=False,
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_s3(flow_log_bucket, f"{FLOW_LOG_PREFIX}/"),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )
        allow_flow_log_delivery(flow_log_bucket, FLOW_LOG_PREFIX)
        # One security group for all endpoints, HTTPS from the VPC's literal CIDR (a literal, not
        # the VPC's CidrBlock attribute, so cdk-nag can evaluate the rule instead of erroring).
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="Interface endpoints: HTTPS from inside the VPC",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(VPC_CIDR), ec2.Port.tcp(443), "AWS API calls from the VPC"
        )
        for name, service in _INTERFACE_ENDPOINTS:
            self.vpc.add_interface_endpoint(
                name,
                service=service,
                private_dns_enabled=True,
                subnets=PRIVATE,
                security_groups=[self.endpoint_security_group],
                open=False,
            )


def allow_flow_log_delivery(bucket: s3.IBucket, prefix: str) -> None:
    """The bucket policy flow-log delivery needs, written out instead of left to EC2 or to the
    unset `@aws-cdk/aws-s3:createDefaultLoggingPolicy` flag (Amazon VPC user guide, "Amazon S3
    bucket permissions for flow logs"): delivery.logs.amazonaws.com may write under the prefix
    for this account only, with the owner getting full control, and read the bucket ACL."""
    stack = Stack.of(bucket)
    principal = iam.ServicePrincipal("delivery.logs.amazonaws.com")
    source = {
        "StringEquals": {"aws:SourceAccount": stack.account},
        "ArnLike": {"aws:SourceArn": stack.format_arn(service="logs", resource="*")},
    }
    bucket.add_to_resource_policy(
        iam.PolicyStatement(
            sid="FlowLogDeliveryWrite",
            principals=[principal],
            actions=["s3:PutObject"],
            resources=[bucket.arn_for_objects(f"{prefix}/AWSLogs/{stack.account}/*")],
            conditions={
                **source,
                "StringEquals": {**source["StringEquals"], "s3:x-amz-acl": "bucket-owner-full-control"},
            },
        )
    )
    bucket.add_to_resource_policy(
        iam.PolicyStatement(
            sid="FlowLogDeliveryAclCheck",
            principals=[principal],
            actions=["s3:GetBucketAcl", "s3:ListBucket"],
            resources=[bucket.bucket_arn],
            conditions=source,
        )
    )
