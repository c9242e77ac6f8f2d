"""deploy's compile phase: one instance of a larger type compiles an at-risk fleet's model first.

Synthesized only when `deploy` asks for it (`-c compile_fleets=<fleet>[,<fleet>]`,
campaign/aws/compile_phase.py); every fleet's group is then at 0, and per named fleet this adds:
- a launch template: the compile instance type (core.compile_host), and of the fleet its AMI
  parameter, role, security group and volumes; user data = stacks/compile_boot.compile_script,
  the fleet's own boot script that publishes under the fleet's key and then terminates;
- an Auto Scaling group of at most one instance over the fleet's AZs, created empty: `deploy`
  sets its desired capacity to 1 once the stack is up, and the instance's own termination takes
  it back to 0. A group rather than an AWS::EC2::Instance: it launches in whichever of the AZs has
  the capacity, a failed launch is an activity `deploy` can show instead of a failed stack, and a
  compile that ended is never re-run by a later `cdk deploy` of the same template;
- the fleets' scheduled action at the campaign's deadline (min, max and desired 0), so a compile
  instance nobody watches stops billing then at the latest (its boot is bounded too:
  stacks/compile_boot.py's whole-boot timeout);
- a policy on the fleet's role allowing autoscaling:TerminateInstanceInAutoScalingGroup on that
  group only (Service Authorization Reference, Amazon EC2 Auto Scaling: resource type
  autoScalingGroup).
The next plain `cdk deploy` removes all of it (and `teardown`'s stack deletion, if it comes first):
CloudFormation resources only, no Lambda.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from core.compile_host import CompileHost
from core.manifest import Manifest
from stacks.accelerator_telemetry import neuron_namespace
from stacks.compile_boot import compile_script
from stacks.compliance import acknowledge
from stacks.fleet import ServingFleet, fleet_block_devices, stop_at_deadline

COMPILE_FOR_TAG = "compile-for"  # not `fleet`: the fleet's own group is the one tagged `fleet` (analysis.sources.cloudwatch.discover_asgs)


class CompileInstance(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        manifest: Manifest,
        fleet: ServingFleet,
        host: CompileHost,
        vpc: ec2.IVpc,
        weights_s3_uri: str | None,
        deadline: str,
    ) -> None:
        super().__init__(scope, cid)
        f = fleet.fleet
        if host.instance_type is None or fleet.compiled_uri is None:
            raise ValueError(f"{f.name}: no compile instance type, or no results bucket to publish to")
        region = Stack.of(self).region
        self.host = host
        Tags.of(self).add(COMPILE_FOR_TAG, f.name)
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(
            *compile_script(
                fleet.boot_definition,
                campaign=manifest.campaign,
                serving_digest=fleet.serving_digest,
                cached=fleet.cached_pull,
                weights_s3_uri=weights_s3_uri,
                driver_version=f.serving.driver_version,
                region=region,
                agent_param=fleet.agent_param.parameter_name,
                neuron_namespace=neuron_namespace(manifest.campaign, f.name),
                compiled_uri=fleet.compiled_uri,
            )
        )
        launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(host.instance_type),
            machine_image=ec2.MachineImage.generic_linux({region: fleet.ami.value_as_string}),
            user_data=user_data,
            role=fleet.role,
            security_group=fleet.security_group,
            require_imdsv2=True,
            http_put_response_hop_limit=1,  # as the fleet's: only the host reaches IMDS
            detailed_monitoring=True,
            block_devices=fleet_block_devices(f),
        )
        # No desired capacity in the template: created at 0 (its MinSize), and a later `cdk deploy`
        # of the same phase never resets what `deploy` and the instance set.
        self.asg = autoscaling.AutoScalingGroup(
            self,
            "Asg",
            vpc=vpc,
            launch_template=launch_template,
            min_capacity=0,
            max_capacity=1,
            vpc_subnets=ec2.SubnetSelection(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=list(f.availability_zones)
            ),
        )
        # The same one-time action as each fleet's: the group to 0 at the CampaignDeadline parameter.
        stop_at_deadline(self, self.asg, deadline)
        acknowledge(
            self.asg,
            "AwsSolutions-AS3",
            "One short-lived compile instance; deploy reads the group's activities and prints the failure, no SNS subscriber exists.",
        )
        group_arn = Stack.of(self).format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{self.asg.auto_scaling_group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        policy = iam.Policy(
            self,
            "TerminateItself",
            roles=[fleet.role],
            statements=[
                iam.PolicyStatement(actions=["autoscaling:TerminateInstanceInAutoScalingGroup"], resources=[group_arn])
            ],
        )
        group_ref = Stack.of(self).resolve(self.asg.node.default_child.logical_id)  # type: ignore[union-attr]
        acknowledge(
            policy,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:{region}:<AWS::AccountId>:autoScalingGroup:*:"
            f"autoScalingGroupName/<{group_ref}>]",
            "The group's ARN carries a UUID known only after creation; the group name (its Ref) pins it to this group.",
        )
