"""One construct for every fleet of the manifest: Inf2, G6 and G5 differ only through data.

Why user data + `docker run` and not ECS on EC2: see `SERVING_ON_EC2_RATIONALE`. In a rehearsal
(`rehearsal`, stacks/rehearsal_fleet.py) the same construct runs the fleet's emulator instead: the
same group, role, log group and deadline action, another host, AMI, disk and boot script.
"""

from __future__ import annotations

from aws_cdk import Annotations, CfnParameter, Duration, RemovalPolicy, Stack, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from core import catalog
from core.cloud_contract import HEALTH_GRACE_MIN
from core.manifest import Fleet, Manifest
from core.naming import MANIFEST_DIGEST_TAG, SERVING_DIGEST_TAG, ami_parameter_name
from core.serving import definition_digest, definition_for
from stacks.accelerator_telemetry import (
    as_json,
    cloudwatch_agent_config,
    cloudwatch_namespace,
    neuron_monitor_config,
    neuron_namespace,
)
from stacks.compliance import acknowledge, arn_placeholder
from stacks.fleet_boot import boot_definition, boot_script, ecr_image
from stacks.fleet_paths import COMPILED_PREFIX
from stacks.image_cache import DockerHubCache
from stacks.rehearsal_boot import rehearsal_boot_script
from stacks.rehearsal_fleet import RehearsalHost
from stacks.rehearsal_fleet import block_devices as rehearsal_block_devices

SERVING_ON_EC2_RATIONALE = """\
The serving container runs from user data (`docker run`, rendered by core.serving) on a
plain Auto Scaling group instead of ECS on EC2. The comparison needs the exact, pinned host
stack of each accelerator (Neuron driver + tools DLAMI vs NVIDIA driver DLAMI) with device
flags (`--device=/dev/neuronN`, `--gpus all`) and an EBS cache mounted before start; ECS would
add its own agent, AMI constraints (ECS-optimized Neuron/GPU AMIs on their own release cadence)
and a per-task placement layer between the NLB and the accelerator, all of which are one more
variable in a cost-per-token measurement. One container per instance needs no scheduler: the
ASG replaces failed instances and the NLB health check on the server's health path takes an
instance out of rotation."""

ROOT_DEVICE = "/dev/sda1"  # root device name of the Ubuntu DLAMIs
CACHE_DEVICE = "/dev/sdf"
# The load balancer health check must not kill a first boot that is still downloading or compiling (core.cloud_contract).
HEALTH_GRACE = {vendor: Duration.minutes(minutes) for vendor, minutes in HEALTH_GRACE_MIN.items()}


def fleet_block_devices(fleet: Fleet) -> list[ec2.BlockDevice]:
    """Root and cache volumes of a fleet's instances (and of its compile instance), encrypted gp3."""
    return [
        ec2.BlockDevice(
            device_name=ROOT_DEVICE,
            volume=ec2.BlockDeviceVolume.ebs(
                catalog.ROOT_VOLUME_GIB, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3
            ),
        ),
        # Weights + Neuron compile cache / TensorRT engine cache, mounted by the boot script.
        ec2.BlockDevice(
            device_name=CACHE_DEVICE,
            volume=ec2.BlockDeviceVolume.ebs(
                fleet.ebs_cache_gib,
                encrypted=True,
                volume_type=ec2.EbsDeviceVolumeType.GP3,
                delete_on_termination=True,
            ),
        ),
    ]


def ami_parameter(scope: Construct, fleet: Fleet, defn_host: catalog.HostStack) -> CfnParameter:
    """The fleet's AMI as a deploy-time parameter: never an unpinned `latest` SSM alias."""
    how = (
        f"name {defn_host.ami_name_filter!r}, description {defn_host.ami_description_filter!r}"
        if defn_host.ami_description_filter
        else f"name {defn_host.ami_name_filter!r} whose release notes list driver {fleet.serving.driver_version}"
    )
    return CfnParameter(
        Stack.of(scope),
        ami_parameter_name(fleet.name),
        type="AWS::EC2::Image::Id",
        description=f"{fleet.name}: DLAMI for {defn_host.vendor} SDK {defn_host.sdk_version} ({how}); filled by `campaign deploy`"[
            :4000
        ],
    )


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
        results: s3.IBucket | None = None,
        image_cache: DockerHubCache,
        deadline: str,
        held_at_zero: bool = False,
        rehearsal: RehearsalHost | None = None,
    ) -> None:
        """`results`: the results bucket, where instances share what they compile (compiled/<key>/).
        `image_cache`: a Docker Hub serving image is pulled through it, never anonymously.
        `deadline`: the campaign's deadline (the CampaignDeadline parameter), when the group goes to 0.
        `held_at_zero`: deploy's compile phase (stacks/compile_instance.py): no instance until the
        fleets' compiled sets are published.
        `rehearsal`: the fleet's emulator on the rehearsal host (no accelerator telemetry, no weights,
        no compiled artifacts)."""
        super().__init__(scope, cid)
        self.rehearsal = rehearsal
        fleet: Fleet = manifest.fleets[index]
        self.fleet = fleet
        # The definition as the manifest gives it (what serves: the digest and compiled key name it);
        # the boot script runs the same image by its cache reference when it comes from Docker Hub.
        self.definition = defn = definition_for(manifest, fleet, weights_s3_uri=weights_s3_uri)
        self.serving_digest = definition_digest(defn)
        boot_defn, cached = boot_definition(
            manifest,
            fleet,
            weights_s3_uri=weights_s3_uri,
            cache_registry=image_cache.registry,
            region=image_cache.region,
        )
        if rehearsal is not None:
            cached = None  # the instances pull the emulator, never the serving image
        # what the boot script runs and how it pulls the image (the compile instance runs the same)
        self.boot_definition, self.cached_pull = boot_defn, cached
        self.ami = rehearsal.ami if rehearsal else ami_parameter(self, fleet, defn.host)
        vendor = catalog.instance(fleet.instance_type).accelerator.vendor
        region = Stack.of(self).region
        neuron_param = self._telemetry_config(manifest.campaign, fleet.name, vendor, accelerator=rehearsal is None)
        self.role = self._instance_role(manifest, vendor, region, neuron_param, image_cache, weights_s3_uri, results)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description=f"{fleet.name} serving instances ({fleet.instance_type})",
            allow_all_outbound=True,
        )
        user_data = ec2.UserData.for_linux()
        if rehearsal is not None:
            user_data.add_commands(
                *rehearsal_boot_script(
                    manifest,
                    fleet,
                    defn,
                    image=rehearsal.image.image_uri,
                    serving_digest=self.serving_digest,
                    weights_s3_uri=weights_s3_uri,
                    region=region,
                    agent_param=self.agent_param.parameter_name,
                )
            )
        else:
            user_data.add_commands(
                *boot_script(
                    boot_defn,
                    campaign=manifest.campaign,
                    serving_digest=self.serving_digest,
                    weights_s3_uri=weights_s3_uri,
                    driver_version=fleet.serving.driver_version,
                    region=region,
                    agent_param=self.agent_param.parameter_name,
                    neuron_monitor_param=neuron_param.parameter_name if neuron_param else None,
                    neuron_namespace=neuron_namespace(manifest.campaign, fleet.name),
                    compiled_uri=self.compiled_uri,
                    cached=cached,
                )
            )
        self.launch_template = self._launch_template(region, user_data)
        self.asg = self._auto_scaling_group(vpc, vendor, held_at_zero)
        self.deadline_action = stop_at_deadline(self, self.asg, deadline)
        if cached:
            image_cache.needed_by(self.asg)

    def _telemetry_config(
        self, campaign: str, fleet: str, vendor: str, *, accelerator: bool
    ) -> ssm.StringParameter | None:
        """The fleet's log group and the agents' configurations its instances read at boot: the
        CloudWatch agent's, and on Neuron neuron-monitor's (returned; None elsewhere). Without
        `accelerator` (a rehearsal's emulator host) neither GPU nor Neuron telemetry."""
        self.log_group = logs.LogGroup(
            self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        self.agent_param = ssm.StringParameter(
            self,
            "CloudWatchAgentConfig",
            parameter_name=f"/harness/{campaign}/{fleet}/cloudwatch-agent",
            string_value=as_json(
                cloudwatch_agent_config(
                    campaign=campaign,
                    fleet=fleet,
                    gpu=accelerator and vendor == "nvidia",
                    log_group=self.log_group.log_group_name,
                )
            ),
        )
        if not accelerator or vendor != "aws-neuron":
            return None
        return ssm.StringParameter(
            self,
            "NeuronMonitorConfig",
            parameter_name=f"/harness/{campaign}/{fleet}/neuron-monitor",
            string_value=as_json(neuron_monitor_config()),
        )

    def _instance_role(
        self,
        manifest: Manifest,
        vendor: str,
        region: str,
        neuron_param: ssm.StringParameter | None,
        image_cache: DockerHubCache,
        weights_s3_uri: str | None,
        results: s3.IBucket | None,
    ) -> iam.Role:
        """The instances' role, granted what the boot script and the agents use and nothing more;
        sets `compiled_uri` where the fleet shares compiled artifacts through `results`."""
        fleet, defn = self.fleet, self.definition
        role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"{fleet.name} serving instances: Session Manager, its own logs and metrics, image pull, weights",
        )
        namespaces = [cloudwatch_namespace(manifest.campaign, fleet.name)]
        if neuron_param:
            namespaces.append(neuron_namespace(manifest.campaign, fleet.name))
        self._grant_session_manager(role, region)
        self._grant_telemetry(role, self.log_group, namespaces)
        self.agent_param.grant_read(role)
        if neuron_param:
            neuron_param.grant_read(role)
        self.compiled_uri: str | None = None
        if self.rehearsal is not None:
            self._grant_rehearsal(role, manifest, weights_s3_uri)
            return role
        if self.cached_pull:
            image_cache.grant_pull(role, [self.cached_pull])
        else:
            self._grant_image_pull(role, defn.image)
        if manifest.model.hub_token_secret_arn:
            self._grant_hub_token(role, manifest.model.hub_token_secret_arn)
        if weights_s3_uri:
            self._grant_weights_read(role, weights_s3_uri, manifest.model.commit)
        if results is not None and defn.compiled is not None:
            self.compiled_uri = f"s3://{results.bucket_name}/{COMPILED_PREFIX}"
            self._grant_compiled_share(role, results, defn.compiled.key)
        return role

    def _grant_rehearsal(self, role: iam.Role, manifest: Manifest, weights_s3_uri: str | None) -> None:
        """What a rehearsal instance's boot uses besides telemetry (stacks/rehearsal_boot.py): the
        emulator image's pull, and the pinned tokenizer files from where the fleet's weights would
        come (S3: those objects only, never the weights; the Hub: its token when the manifest names
        one)."""
        assert self.rehearsal is not None
        self.rehearsal.image.repository.grant_pull(role)
        files = manifest.tokenizer.files
        if not files:
            return
        if weights_s3_uri:
            self._grant_tokenizer_read(role, weights_s3_uri, manifest.model.commit, sorted(files))
        elif manifest.model.hub_token_secret_arn:
            self._grant_hub_token(role, manifest.model.hub_token_secret_arn)

    @staticmethod
    def _grant_hub_token(role: iam.Role, secret_arn: str) -> None:
        role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"], resources=[secret_arn]))

    def _launch_template(self, region: str, user_data: ec2.UserData) -> ec2.LaunchTemplate:
        fleet = self.fleet
        rehearsal = self.rehearsal
        template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(rehearsal.instance_type if rehearsal else fleet.instance_type),
            machine_image=ec2.MachineImage.generic_linux({region: self.ami.value_as_string}),
            user_data=user_data,
            role=self.role,
            security_group=self.security_group,
            require_imdsv2=True,
            # 1 hop: only the host (CloudWatch agent, aws CLI) reaches IMDS; no container needs the role.
            http_put_response_hop_limit=1,
            detailed_monitoring=True,
            block_devices=rehearsal_block_devices() if rehearsal else fleet_block_devices(fleet),
        )
        # The launch template's data is all CloudFormation compares: its tags at launch name the serving
        # definition, not the manifest (the stack-wide manifest-digest tag would make every manifest
        # edit a new template version); instances still get manifest-digest from the group's tags,
        # which CloudFormation updates without replacing an instance.
        Tags.of(template).remove(MANIFEST_DIGEST_TAG)
        Tags.of(template).add(SERVING_DIGEST_TAG, self.serving_digest)
        return template

    def _auto_scaling_group(self, vpc: ec2.IVpc, vendor: str, held_at_zero: bool) -> autoscaling.AutoScalingGroup:
        fleet = self.fleet
        asg = autoscaling.AutoScalingGroup(
            self,
            "Asg",
            vpc=vpc,
            launch_template=self.launch_template,
            min_capacity=0 if held_at_zero else fleet.asg.min,
            max_capacity=fleet.asg.max,
            # The campaign measures fleets[].measure_instances behind the NLB (default asg.desired):
            # the group starts with that many in service, never fewer than asg.desired.
            desired_capacity=0 if held_at_zero else fleet.instances_deployed,
            vpc_subnets=ec2.SubnetSelection(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=list(fleet.availability_zones)
            ),
            health_checks=autoscaling.HealthChecks.with_additional_checks(
                additional_types=[autoscaling.AdditionalHealthCheckType.ELB],
                grace_period=self.rehearsal.grace if self.rehearsal else HEALTH_GRACE[vendor],
            ),
            # A changed serving definition is a new launch template version (its digest is in the user
            # data, stacks/fleet_boot.py), and CloudFormation's AutoScalingRollingUpdate replaces every
            # instance of the old version on `deploy` (a change of the group's LaunchTemplate is one of
            # the changes that trigger it; CloudFormation template reference, "UpdatePolicy attribute"):
            # all at once (no instance of the old definition keeps serving), without waiting for signals
            # (the NLB health check and the health grace decide when a new one serves). Without it, a
            # redeploy changes the template and leaves the running instances on the old one. A manifest
            # edit outside the serving definition (an SLO, loadgen.workers) changes no template.
            update_policy=autoscaling.UpdatePolicy.rolling_update(
                max_batch_size=fleet.asg.max, min_instances_in_service=0, pause_time=Duration.seconds(0)
            ),
        )
        # The manifest pins desired; a redeploy resetting it to the manifest value is the intent.
        Annotations.of(asg).acknowledge_warning(
            "@aws-cdk/aws-autoscaling:desiredCapacitySet",
            "desired comes from the frozen manifest; resetting it on deploy is intended",
        )
        acknowledge(
            asg,
            "AwsSolutions-AS3",
            "Scaling events of a supervised benchmark are read from the ASG activity history and CloudTrail; no SNS subscriber exists.",
        )
        return asg

    @staticmethod
    def _grant_session_manager(role: iam.Role, region: str) -> None:
        # The Session Manager instance-profile actions (AWS Systems Manager user guide, "Create a
        # custom IAM instance profile for Session Manager"; the same five as the AWS-managed
        # AWSCloud9SSMInstanceProfile), instead of AmazonSSMManagedInstanceCore, which also
        # grants ssm:GetParameter(s) on every parameter of the account.
        stack = Stack.of(role)
        instances = stack.format_arn(service="ec2", region=region, resource="instance", resource_name="*")
        role.add_to_policy(iam.PolicyStatement(actions=["ssm:UpdateInstanceInformation"], resources=[instances]))
        role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ssmmessages:CreateControlChannel",
                    "ssmmessages:CreateDataChannel",
                    "ssmmessages:OpenControlChannel",
                    "ssmmessages:OpenDataChannel",
                ],
                resources=["*"],
            )
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "ssmmessages:* (Session Manager channels) and ecr:GetAuthorizationToken define no resource types in the "
            "Service Authorization Reference; PutMetricData is limited by a cloudwatch:namespace condition.",
        )
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:{region}:<AWS::AccountId>:instance/*]",
            "ssm:UpdateInstanceInformation is called by the instance's own SSM agent; the instance id is not known before launch.",
        )

    @staticmethod
    def _grant_telemetry(role: iam.Role, log_group: logs.LogGroup, namespaces: list[str]) -> None:
        # What the CloudWatch agent and neuron-monitor-cloudwatch.py do here, instead of
        # CloudWatchAgentServerPolicy (PutMetricData and log writes on "*"): metrics only into this
        # fleet's namespaces, logs only into this fleet's group.
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],  # PutMetricData has no resource type; the namespace condition scopes it
                conditions={"StringEquals": {"cloudwatch:namespace": namespaces}},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[log_group.log_group_arn, f"{log_group.log_group_arn}:log-stream:*"],
            )
        )
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::{arn_placeholder(log_group.node.default_child)}:log-stream:*]",  # type: ignore[arg-type]
            "The CloudWatch agent names one stream per instance ({instance_id}/serving, /boot) inside the fleet's own log group.",
        )

    @staticmethod
    def _grant_image_pull(role: iam.Role, image: str) -> None:
        ecr = ecr_image(image)
        if ecr is None:
            return  # ECR Public or another public registry (not Docker Hub: core.images): no IAM involved
        stack = Stack.of(role)
        repo_arn = stack.format_arn(
            service="ecr", region=ecr.region, account=ecr.account, resource="repository", resource_name=ecr.repository
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                resources=[repo_arn],
            )
        )
        role.add_to_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))

    @staticmethod
    def _grant_compiled_share(role: iam.Role, results: s3.IBucket, key: str) -> None:
        """Read and write under this fleet's own compiled/<key>/ only (fetch what another of its
        instances compiled, publish what this one compiled); list that prefix only (the boot
        script's list-objects-v2 --prefix compiled/<key>/ and `aws s3 cp --recursive` list); no
        delete. Another fleet's sets (another key) are neither readable nor writable: a fleet can
        neither load nor overwrite what another instance type or server configuration compiled."""
        prefix = f"{COMPILED_PREFIX}/{key}"
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject"], resources=[f"{results.bucket_arn}/{prefix}/*"]
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[results.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}/*"]}},
            )
        )
        bucket = arn_placeholder(results.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::{bucket}/{prefix}/*]",
            "Read and write of this fleet's own compiled artifacts (compiled/<its key>/<publisher>/), keyed by what shapes them.",
        )

    @staticmethod
    def _grant_tokenizer_read(role: iam.Role, weights_s3_uri: str, commit: str, files: list[str]) -> None:
        """A rehearsal's `aws s3 sync` of the tokenizer files (core.serving.tokenizer_staging): each
        of those objects, and the listing the sync makes of the commit's prefix (key names only);
        no other object of the prefix is readable."""
        bucket, _, prefix = weights_s3_uri.removeprefix("s3://").partition("/")
        key_prefix = f"{prefix.strip('/')}/{commit}".lstrip("/")
        bucket_arn = Stack.of(role).format_arn(service="s3", region="", account="", resource=bucket)
        role.add_to_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{key_prefix}/{f}" for f in files])
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{key_prefix}/*"]}},
            )
        )

    @staticmethod
    def _grant_weights_read(role: iam.Role, weights_s3_uri: str, commit: str) -> None:
        bucket, _, prefix = weights_s3_uri.removeprefix("s3://").partition("/")
        key_prefix = f"{prefix.strip('/')}/{commit}".lstrip("/")
        stack = Stack.of(role)
        bucket_arn = stack.format_arn(service="s3", region="", account="", resource=bucket)
        role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/{key_prefix}/*"]))
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{key_prefix}/*"]}},
            )
        )
        # The finding id as cdk-nag spells the ARN (the partition a token: `<AWS::Partition>`); the
        # ARN itself there made synth fail: an unresolved token in a metadata key (KeyMustResolveToString).
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket}/{key_prefix}/*]",
            "Read-only on the pinned checkpoint commit's prefix.",
        )


def stop_at_deadline(
    scope: Construct, asg: autoscaling.AutoScalingGroup, deadline: str
) -> autoscaling.CfnScheduledAction:
    """A one-time scheduled action (StartTime, no Recurrence) that sets the group's min, max and
    desired to 0 at the campaign's deadline, so a forgotten campaign stops billing its instances
    (each fleet's group, and the compile phase's). StartTime is "YYYY-MM-DDThh:mm:ssZ ... UTC/GMT
    only"; a time in the past is refused ("If you try to schedule your action in the past, Amazon EC2
    Auto Scaling returns an error message", EC2 Auto Scaling API reference,
    PutScheduledUpdateGroupAction; AWS::AutoScaling::ScheduledAction in the CloudFormation template
    reference is that call): `campaign deploy` computes a future deadline and refuses a past one
    (campaign/aws/stack.py). The group's rolling update suspends ScheduledActions while it replaces
    instances (CDK's rolling_update default), as the same page asks."""
    return autoscaling.CfnScheduledAction(
        scope,
        "StopAtDeadline",
        auto_scaling_group_name=asg.auto_scaling_group_name,
        start_time=deadline,
        min_size=0,
        max_size=0,
        desired_capacity=0,
    )
