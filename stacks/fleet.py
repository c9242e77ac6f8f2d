"""One construct for every fleet of the manifest: Inf2, G6 and G5 differ only through data.

Why user data + `docker run` and not ECS on EC2: see `SERVING_ON_EC2_RATIONALE`.
"""

from __future__ import annotations

from aws_cdk import Annotations, Duration, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from campaign import catalog
from campaign.manifest import Fleet, Manifest
from runtime.serving import GPU_AMI_SSM, NEURON_AMI_SSM, ServingDefinition, definition_for
from stacks.accelerator_telemetry import as_json, cloudwatch_agent_config, neuron_monitor_config, neuron_namespace
from stacks.compliance import acknowledge
from stacks.fleet_boot import boot_script, ecr_image
from stacks.settings import SynthInputError

SERVING_ON_EC2_RATIONALE = """\
The serving container runs from user data (`docker run`, rendered by runtime.serving) on a
plain Auto Scaling group instead of ECS on EC2. The comparison needs the exact, pinned host
stack of each accelerator (Neuron driver + tools DLAMI vs NVIDIA driver DLAMI) with device
flags (`--device=/dev/neuronN`, `--gpus all`) and an EBS cache mounted before start; ECS would
add its own agent, AMI constraints (ECS-optimized Neuron/GPU AMIs on their own release cadence)
and a per-task placement layer between the NLB and the accelerator, all of which are one more
variable in a cost-per-token measurement. One container per instance needs no scheduler: the
ASG replaces failed instances and the NLB health check on the server's health path takes an
instance out of rotation."""

# Instance family -> the public SSM parameter of the AMI its serving stacks need. Families not
# listed here (e.g. Graviton g5g, which would need an arm64 image) fail synth by name.
AMI_PARAMETER_BY_FAMILY: dict[str, str] = {"inf2": NEURON_AMI_SSM, "g6": GPU_AMI_SSM, "g5": GPU_AMI_SSM}

ROOT_VOLUME_GIB = 150  # DLAMI root + container images (the vLLM images are 10-20 GB each)
ROOT_DEVICE = "/dev/sda1"  # root device name of the Ubuntu DLAMIs
CACHE_DEVICE = "/dev/sdf"
# First boot downloads ~16 GB of weights; Neuron then compiles every sequence bucket (tens of
# minutes for an 8B model), so the load balancer health check must not kill it meanwhile.
HEALTH_GRACE = {"aws-neuron": Duration.minutes(75), "nvidia": Duration.minutes(30)}


def ami_parameter_for(manifest: Manifest, index: int, defn: ServingDefinition) -> str:
    fleet = manifest.fleets[index]
    family = fleet.instance_type.split(".", 1)[0]
    expected = AMI_PARAMETER_BY_FAMILY.get(family)
    if expected is None:
        raise SynthInputError(
            f"fleets[{index}].instance_type: no AMI mapping for {fleet.instance_type!r} "
            f"(families with an AMI: {', '.join(sorted(AMI_PARAMETER_BY_FAMILY))})"
        )
    if defn.ami_ssm_parameter != expected:
        raise SynthInputError(
            f"fleets[{index}].serving.stack: {fleet.serving.stack} expects the AMI {defn.ami_ssm_parameter}, "
            f"but {fleet.instance_type} needs {expected}"
        )
    return expected


class ServingFleet(Construct):
    def __init__(
        self,
        scope: Construct,
        cid: str,
        *,
        manifest: Manifest,
        index: int,
        vpc: ec2.IVpc,
        weights_s3_uri: str | None,
    ) -> None:
        super().__init__(scope, cid)
        fleet: Fleet = manifest.fleets[index]
        self.fleet = fleet
        self.definition = defn = definition_for(manifest, fleet, weights_s3_uri=weights_s3_uri)
        ami_parameter = ami_parameter_for(manifest, index, defn)
        vendor = catalog.instance(fleet.instance_type).accelerator.vendor
        region = Stack.of(self).region

        self.log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY)
        agent_param = ssm.StringParameter(
            self,
            "CloudWatchAgentConfig",
            parameter_name=f"/harness/{manifest.campaign}/{fleet.name}/cloudwatch-agent",
            string_value=as_json(
                cloudwatch_agent_config(campaign=manifest.campaign, fleet=fleet.name, gpu=vendor == "nvidia", log_group=self.log_group.log_group_name)
            ),
        )
        neuron_param = None
        if vendor == "aws-neuron":
            neuron_param = ssm.StringParameter(
                self,
                "NeuronMonitorConfig",
                parameter_name=f"/harness/{manifest.campaign}/{fleet.name}/neuron-monitor",
                string_value=as_json(neuron_monitor_config()),
            )

        role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"{fleet.name} serving instances: SSM access, CloudWatch agent, image pull, weights",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore"),
                iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy"),
            ],
        )
        acknowledge(
            role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            "Session Manager replaces SSH on the fleet; the AWS-maintained policy tracks the SSM agent's needs.",
        )
        acknowledge(
            role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/CloudWatchAgentServerPolicy]",
            "The CloudWatch agent ships accelerator metrics and container logs; AWS maintains its exact permission set.",
        )
        agent_param.grant_read(role)
        if neuron_param:
            neuron_param.grant_read(role)
        self._grant_image_pull(role, defn.image)
        if manifest.model.hub_token_secret_arn:
            role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"], resources=[manifest.model.hub_token_secret_arn]))
        if weights_s3_uri:
            self._grant_weights_read(role, weights_s3_uri, manifest.model.commit)

        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, description=f"{fleet.name} serving instances ({fleet.instance_type})", allow_all_outbound=True
        )
        user_data = ec2.UserData.for_linux()
        user_data.add_commands(
            *boot_script(
                defn,
                region=region,
                agent_param=agent_param.parameter_name,
                neuron_monitor_param=neuron_param.parameter_name if neuron_param else None,
                neuron_namespace=neuron_namespace(manifest.campaign),
            )
        )
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(fleet.instance_type),
            machine_image=ec2.MachineImage.from_ssm_parameter(ami_parameter, os=ec2.OperatingSystemType.LINUX),
            user_data=user_data,
            role=role,
            security_group=self.security_group,
            require_imdsv2=True,
            detailed_monitoring=True,
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(ROOT_VOLUME_GIB, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3),
                ),
                # Weights + Neuron compile cache / TensorRT engine cache, mounted by the boot script.
                ec2.BlockDevice(
                    device_name=CACHE_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        fleet.ebs_cache_gib, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3, delete_on_termination=True
                    ),
                ),
            ],
        )
        self.asg = autoscaling.AutoScalingGroup(
            self,
            "Asg",
            vpc=vpc,
            launch_template=self.launch_template,
            min_capacity=fleet.asg.min,
            max_capacity=fleet.asg.max,
            desired_capacity=fleet.asg.desired,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=list(fleet.availability_zones)),
            health_checks=autoscaling.HealthChecks.with_additional_checks(
                additional_types=[autoscaling.AdditionalHealthCheckType.ELB], grace_period=HEALTH_GRACE[vendor]
            ),
        )
        # The manifest pins desired; a redeploy resetting it to the manifest value is the intent.
        Annotations.of(self.asg).acknowledge_warning(
            "@aws-cdk/aws-autoscaling:desiredCapacitySet", "desired comes from the frozen manifest; resetting it on deploy is intended"
        )
        acknowledge(
            self.asg,
            "AwsSolutions-AS3",
            "Scaling events of a supervised benchmark are read from the ASG activity history and CloudTrail; no SNS subscriber exists.",
        )

    @staticmethod
    def _grant_image_pull(role: iam.Role, image: str) -> None:
        ecr = ecr_image(image)
        if ecr is None:
            return  # public registry: pulled through the NAT gateway, no IAM involved
        stack = Stack.of(role)
        repo_arn = stack.format_arn(service="ecr", region=ecr.region, account=ecr.account, resource="repository", resource_name=ecr.repository)
        role.add_to_policy(
            iam.PolicyStatement(actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"], resources=[repo_arn])
        )
        role.add_to_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken has no resource-level permissions; pulls are scoped to the pinned repository.",
        )

    @staticmethod
    def _grant_weights_read(role: iam.Role, weights_s3_uri: str, commit: str) -> None:
        bucket, _, prefix = weights_s3_uri.removeprefix("s3://").partition("/")
        key_prefix = f"{prefix.strip('/')}/{commit}".lstrip("/")
        stack = Stack.of(role)
        bucket_arn = stack.format_arn(service="s3", region="", account="", resource=bucket)
        role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{key_prefix}/*"]))
        role.add_to_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket_arn], conditions={"StringLike": {"s3:prefix": [f"{key_prefix}/*"]}})
        )
        acknowledge(role, f"AwsSolutions-IAM5[Resource::{bucket_arn}/{key_prefix}/*]", "Read-only on the pinned checkpoint commit's prefix.")
