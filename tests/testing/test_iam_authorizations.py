"""testing.iam_policy: every call shape the offline runs record is turned into authorizations the
evaluator takes (iam-simulate refuses an action with a resource type the Service Authorization
Reference does not give it: `must.use.wildcard`, `no.resource.types`), so a run's enforcement never
stops on a request of ours instead of on a denial."""

from __future__ import annotations

from typing import Any

from testing.iam_policy import Bindings, Call, Evaluator, IamCheckError, offline_authorizations

ACCOUNT, REGION, BUCKET = "123456789012", "us-east-1", "offline-comparison-results-stand-in"
STACK = f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/c-comparison/1"
BINDINGS = Bindings(
    account=ACCOUNT,
    region=REGION,
    stack_name="c-comparison",
    stack_id=STACK,
    bucket=BUCKET,
    cluster="cluster",
    namespace="c.harness.internal",
    namespace_arn=f"arn:aws:servicediscovery:{REGION}:{ACCOUNT}:namespace/ns-1",
    hosted_zone="Z1",
    services={"master-g6": f"arn:aws:servicediscovery:{REGION}:{ACCOUNT}:service/srv-1"},
    workspace_arn=f"arn:aws:aps:{REGION}:{ACCOUNT}:workspace/ws-stand-in",
)
# (service, operation, parameters) of each call the offline runs record (the operator's `run`,
# `report` and `teardown`, the tasks', the AMP stand-in's)
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("cloudformation", op, {"StackName": "c-comparison"})
    for op in ("DescribeStacks", "DescribeStackEvents", "ListStackResources", "GetTemplate", "DeleteStack")
] + [
    ("s3", "GetObject", {"Bucket": BUCKET, "Key": "campaigns/c/runs/r/inputs/schedule.json"}),
    ("s3", "HeadObject", {"Bucket": BUCKET, "Key": "campaigns/c/runs/r/inputs/schedule.json"}),
    ("s3", "PutObject", {"Bucket": BUCKET, "Key": "campaigns/c/runs/r/run.json"}),
    ("s3", "ListObjectsV2", {"Bucket": BUCKET, "Prefix": "campaigns/c/runs/r/"}),
    ("s3", "CopyObject", {"Bucket": BUCKET, "Key": "b", "CopySource": {"Bucket": BUCKET, "Key": "a"}}),
    ("s3", "DeleteObject", {"Bucket": BUCKET, "Key": "a"}),
    ("s3", "GetBucketPolicy", {"Bucket": BUCKET}),
    ("servicediscovery", "RegisterInstance", {"ServiceId": "srv-1", "InstanceId": "i"}),
    ("servicediscovery", "DeregisterInstance", {"ServiceId": "srv-1", "InstanceId": "i"}),
    ("servicediscovery", "ListInstances", {"ServiceId": "srv-1"}),
    ("servicediscovery", "DiscoverInstances", {"NamespaceName": "c.harness.internal", "ServiceName": "master-g6"}),
    ("ecs", "ListTasks", {"cluster": "cluster"}),
    ("elbv2", "DescribeTargetHealth", {"TargetGroupArn": "tg"}),
    ("elbv2", "DescribeTargetGroups", {}),
    ("elbv2", "DescribeTags", {"ResourceArns": ["tg"]}),
    ("autoscaling", "DescribeAutoScalingGroups", {}),
    ("autoscaling", "DescribeScalingActivities", {}),
    ("autoscaling", "DescribeScheduledActions", {"AutoScalingGroupName": "g"}),  # the rehearsal's deadline seam
    ("service-quotas", "GetServiceQuota", {"ServiceCode": "ec2", "QuotaCode": "L-1216C47A"}),  # its quotas seam
    ("autoscaling", "SetDesiredCapacity", {"AutoScalingGroupName": "g", "DesiredCapacity": 1}),
    ("autoscaling", "UpdateAutoScalingGroup", {"AutoScalingGroupName": "g", "MinSize": 0}),
    ("cloudwatch", "GetMetricData", {}),
    ("ce", "GetCostAndUsage", {}),
    ("pricing", "GetProducts", {}),
    ("ec2", "DescribeInstances", {}),
    ("ec2", "GetConsoleOutput", {"InstanceId": "i-1"}),
    ("resourcegroupstaggingapi", "GetResources", {}),
    ("logs", "DescribeLogGroups", {"logGroupNamePrefix": "/harness/c"}),
    ("logs", "DeleteLogGroup", {"logGroupName": "/harness/c/g6"}),
    ("logs", "GetLogEvents", {"logGroupName": "/harness/c/g6", "logStreamName": "i-1/boot"}),
    ("ecr", "DescribeRepositories", {}),
    ("ecr", "DeleteRepository", {"repositoryName": "docker-hub/vllm/vllm-openai", "force": True}),
    ("aps", "QueryMetrics", {"path": "/api/v1/query"}),
    ("aps", "RemoteWrite", {"path": "/api/v1/remote_write"}),
    ("sts", "GetCallerIdentity", {}),
]
EVERYTHING = [{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}]


def test_every_recorded_call_shape_is_one_the_evaluator_takes() -> None:
    world = BINDINGS.world()
    refused = []
    with Evaluator(ACCOUNT) as iam:
        for service, operation, params in CALLS:
            call = Call("operator", service, operation, params)
            try:
                assert iam.check(call, offline_authorizations(call, world, BINDINGS), EVERYTHING, world) == []
            except IamCheckError as exc:
                refused.append(f"{service} {operation}: {exc}")
    assert refused == []
