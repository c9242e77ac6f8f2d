"""The ECS launcher's requests and its reading of DescribeTasks, against botocore's Stubber
(the request shapes are validated against the real ECS API model)."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate.ecs_tasks import EcsTaskLauncher, stop_run_tasks
from campaign.backends.fargate.tasks import TaskSpec
from core import cloud_contract as cc

CFG = cc.RunConfig(
    region="us-east-1",
    cluster="harness-cluster",
    master_task_definition="arn:td/master:3",
    worker_task_definition="arn:td/worker:3",
    gate_task_definition="arn:td/gate:3",
    subnets=("subnet-a", "subnet-b"),
    security_groups=("sg-1",),
    results_uri="s3://b/campaigns/c/d/runs",
    targets={"inf2": "http://nlb:8000"},
    workers=2,
)
RUN_ID = "20261203T143000Z-1a2b3c"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/harness-cluster/0123456789abcdef"


@pytest.fixture
def ecs() -> Any:
    return boto3.client("ecs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")


def test_run_task_request_is_a_private_fargate_task_with_exec_and_the_run_overrides(ecs: Any) -> None:
    spec = TaskSpec(
        "master",
        "inf2",
        CFG.master_task_definition,
        {cc.ENV_RUN_ID: RUN_ID, cc.ENV_FLEET: "inf2", cc.ENV_HOST: "http://nlb:8000"},
    )
    expected = {
        "cluster": "harness-cluster",
        "taskDefinition": "arn:td/master:3",
        "launchType": "FARGATE",
        "count": 1,
        "networkConfiguration": {
            "awsvpcConfiguration": {
                "subnets": ["subnet-a", "subnet-b"],
                "securityGroups": ["sg-1"],
                "assignPublicIp": "DISABLED",
            }
        },
        "overrides": {
            "containerOverrides": [
                {
                    "name": "locust",
                    "environment": [
                        {"name": "LOADGEN_RUN_ID", "value": RUN_ID},
                        {"name": "LOADGEN_FLEET", "value": "inf2"},
                        {"name": "LOCUST_HOST", "value": "http://nlb:8000"},
                    ],
                }
            ]
        },
        "enableExecuteCommand": True,
        "startedBy": f"run-{RUN_ID}",
        "propagateTags": "TASK_DEFINITION",
        "tags": [
            {"key": "run-id", "value": RUN_ID},
            {"key": "fleet", "value": "inf2"},
            {"key": "loadgen-role", "value": "master"},
        ],
    }
    with Stubber(ecs) as stub:
        stub.add_response("run_task", {"tasks": [{"taskArn": TASK}], "failures": []}, expected)
        assert EcsTaskLauncher(ecs, CFG, RUN_ID).start(spec) == TASK
        stub.add_response("run_task", {"tasks": [], "failures": [{"reason": "MISSING"}]}, expected)
        with pytest.raises(CloudRunError, match="MISSING"):  # not a capacity failure: not tried again
            EcsTaskLauncher(ecs, CFG, RUN_ID, sleep=_no_sleep).start(spec)
        stub.assert_no_pending_responses()


def test_the_conductor_is_started_as_its_runs_with_its_own_started_by_and_no_exec(ecs: Any) -> None:
    """`run --detach`: startedBy run-<id>-c (a resuming conductor stops the run's load generators, not
    itself; teardown stops both), and no ECS Exec (no web UI; its role has no ssmmessages)."""
    spec = TaskSpec("conductor", "", "arn:td/conductor:1", {cc.ENV_RUN_ID: RUN_ID}, (cc.CONDUCT_COMMAND, RUN_ID))
    calls: list[dict[str, Any]] = []
    ecs.meta.events.register("provide-client-params.ecs.RunTask", lambda params, **kw: calls.append(dict(params)))
    with Stubber(ecs) as stub:
        stub.add_response("run_task", {"tasks": [{"taskArn": TASK}], "failures": []})
        EcsTaskLauncher(ecs, CFG, RUN_ID).start(spec)
    (call,) = calls
    assert call["startedBy"] == f"run-{RUN_ID}-c" and len(call["startedBy"]) <= 36
    assert call["enableExecuteCommand"] is False
    assert call["overrides"]["containerOverrides"][0]["command"] == [cc.CONDUCT_COMMAND, RUN_ID]


def _no_sleep(s: float) -> None:
    raise AssertionError(f"slept {s} s: a failure that is not about capacity must not be retried")


def _spec() -> TaskSpec:
    return TaskSpec("worker", "g6", CFG.worker_task_definition, {cc.ENV_RUN_ID: RUN_ID})


def test_run_task_is_retried_with_backoff_while_fargate_has_no_capacity(ecs: Any) -> None:
    slept: list[float] = []
    said: list[str] = []
    launcher = EcsTaskLauncher(ecs, CFG, RUN_ID, sleep=slept.append, say=said.append)
    capacity = "Capacity is unavailable at this time. Please try again later or in a different availability zone"
    with Stubber(ecs) as stub:
        stub.add_response("run_task", {"tasks": [], "failures": [{"reason": "RESOURCE:ENI"}]})
        stub.add_client_error("run_task", "ThrottlingException", "Rate exceeded")
        stub.add_client_error("run_task", "ServerException", capacity, http_status_code=500)
        stub.add_response("run_task", {"tasks": [{"taskArn": TASK}], "failures": []})
        assert launcher.start(_spec()) == TASK
        stub.assert_no_pending_responses()
    assert slept == [5.0, 10.0, 20.0]  # doubled after each try
    assert "RESOURCE:ENI" in said[0] and "trying again in 5 s" in said[0] and "Capacity is unavailable" in said[2]


def test_run_task_gives_up_after_its_tries_naming_the_last_failure(ecs: Any) -> None:
    slept: list[float] = []
    launcher = EcsTaskLauncher(ecs, CFG, RUN_ID, sleep=slept.append, say=lambda line: None)
    with Stubber(ecs) as stub:
        for _ in range(6):
            stub.add_response("run_task", {"tasks": [], "failures": [{"reason": "RESOURCE:CPU"}]})
        with pytest.raises(CloudRunError, match=r"failed \(try 6\).*RESOURCE:CPU"):
            launcher.start(_spec())
        stub.assert_no_pending_responses()
    assert len(slept) == 5


def test_a_request_error_is_not_retried(ecs: Any) -> None:
    with Stubber(ecs) as stub:
        stub.add_client_error("run_task", "InvalidParameterException", "No Fargate configuration exists")
        with pytest.raises(CloudRunError, match="InvalidParameterException"):
            EcsTaskLauncher(ecs, CFG, RUN_ID, sleep=_no_sleep).start(_spec())


def test_describe_reads_state_address_exit_code_and_the_port_forward(ecs: Any) -> None:
    running = {
        "taskArn": TASK,
        "lastStatus": "RUNNING",
        "attachments": [
            {"type": "ElasticNetworkInterface", "details": [{"name": "privateIPv4Address", "value": "10.40.3.7"}]}
        ],
        "containers": [{"name": "locust", "runtimeId": "0123456789abcdef-1234"}],
    }
    stopped = {
        "taskArn": TASK + "0",
        "lastStatus": "STOPPED",
        "stoppedReason": "Essential container exited",
        "containers": [{"name": "locust", "exitCode": 3}],
    }
    with Stubber(ecs) as stub:
        stub.add_response(
            "describe_tasks", {"tasks": [running, stopped]}, {"cluster": "harness-cluster", "tasks": [TASK, TASK + "0"]}
        )
        got = EcsTaskLauncher(ecs, CFG, RUN_ID).describe([TASK, TASK + "0"])
    assert got[TASK].state == "RUNNING" and got[TASK].address == "10.40.3.7"
    assert "--target ecs:harness-cluster_0123456789abcdef_0123456789abcdef-1234" in got[TASK].ui_hint
    assert "AWS-StartPortForwardingSession" in got[TASK].ui_hint and '"portNumber": ["8089"]' in got[TASK].ui_hint
    assert (
        got[TASK + "0"].stopped
        and got[TASK + "0"].exit_code == 3
        and got[TASK + "0"].reason == "Essential container exited"
    )


def test_teardown_stops_only_tasks_a_run_started(ecs: Any) -> None:
    other = TASK.replace("0123", "9999")
    with Stubber(ecs) as stub:
        stub.add_response("list_tasks", {"taskArns": [TASK, other]}, {"cluster": "c", "desiredStatus": "RUNNING"})
        stub.add_response("list_tasks", {"taskArns": []}, {"cluster": "c", "desiredStatus": "PENDING"})
        stub.add_response(
            "describe_tasks",
            {
                "tasks": [
                    {"taskArn": TASK, "startedBy": f"run-{RUN_ID}"},
                    {"taskArn": other, "startedBy": "ecs-svc/123"},
                ]
            },
            {"cluster": "c", "tasks": [TASK, other]},
        )
        stub.add_response(
            "stop_task", {"task": {"taskArn": TASK}}, {"cluster": "c", "task": TASK, "reason": "campaign teardown"}
        )
        assert stop_run_tasks(ecs, "c") == [TASK]
        stub.assert_no_pending_responses()
