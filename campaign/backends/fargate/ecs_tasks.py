"""The ECS side of `campaign run`: one Fargate task per Locust process, started with RunTask.

Tasks carry the run id in `startedBy` and as a tag, so teardown can stop whatever a run left.
ECS Exec is enabled on each task: it is how the operator reaches the master's web UI, which
listens on the task's loopback only (Session Manager port forwarding,
https://docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs-exec.html).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate.tasks import TaskSpec, TaskStatus
from core import cloud_contract as cc

STARTED_BY_PREFIX = "run-"  # startedBy: up to 36 letters, digits, hyphens, underscores
# A conductor's startedBy: its run's, and this (run-<23-character run id>-c: 29 characters), so a
# conductor resuming its run stops the run's load generators but not itself.
CONDUCTOR_SUFFIX = "-c"
# RunTask is retried when Fargate has no capacity for the task right now: "Capacity is
# unavailable at this time. Please try again later or in a different availability zone" (AWS
# Knowledge Center, "ecs-fargate-runtask-capacity": wait and retry), a RESOURCE:* failure (ECS
# developer guide, "Amazon ECS API failure reasons": not enough CPU, memory, ENIs ... for the
# task), or the API's own throttling. Anything else (a missing task definition, a bad subnet) is
# not retried: it fails the same way again.
RETRYABLE_FAILURES = ("Capacity is unavailable", "RESOURCE:")
RETRYABLE_ERRORS = ("ThrottlingException", "ServerException", "LimitExceededException")
RUN_TASK_TRIES = 6
RUN_TASK_BACKOFF_S = 5.0  # doubled after each try: 5, 10, 20, 40, 80 s, about 2.5 min in all


def _retryable(reasons: Sequence[str]) -> bool:
    return any(any(marker in r for marker in RETRYABLE_FAILURES) for r in reasons)


class EcsTaskLauncher:
    def __init__(
        self,
        ecs: Any,
        cfg: cc.RunConfig,
        run_id: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
    ) -> None:
        self.ecs = ecs
        self.cfg = cfg
        self.run_id = run_id
        self.sleep = sleep
        self.say = say

    def start(self, spec: TaskSpec) -> str:
        network = {
            "subnets": list(self.cfg.subnets),
            "securityGroups": list(self.cfg.security_groups),
            "assignPublicIp": "DISABLED",
        }
        environment = [{"name": k, "value": v} for k, v in spec.environment.items()]
        container: dict[str, Any] = {"name": cc.CONTAINER_NAME, "environment": environment}
        if spec.command is not None:  # a command override (the definition's own Command otherwise)
            container["command"] = list(spec.command)
        request = dict(
            cluster=self.cfg.cluster,
            taskDefinition=spec.task_definition,
            launchType="FARGATE",
            count=1,
            networkConfiguration={"awsvpcConfiguration": network},
            overrides={"containerOverrides": [container]},
            # ECS Exec reaches a master's web UI; the conductor serves none, and its role has no
            # ssmmessages:* actions, which Exec's agent needs from the task role (ECS developer
            # guide, "Monitor Amazon ECS containers with ECS Exec", IAM permissions required)
            enableExecuteCommand=spec.role != "conductor",
            startedBy=started_by(self.run_id, conductor=spec.role == "conductor"),
            propagateTags="TASK_DEFINITION",
            tags=[
                {"key": "run-id", "value": self.run_id},
                {"key": "fleet", "value": spec.fleet},
                {"key": "loadgen-role", "value": spec.role},
            ],
        )
        wait = RUN_TASK_BACKOFF_S
        for attempt in range(1, RUN_TASK_TRIES + 1):
            arn, failed, retry = self._run_task(request)
            if arn is not None:
                return arn
            if attempt == RUN_TASK_TRIES or not retry:
                raise CloudRunError(f"RunTask for the {spec.fleet} {spec.role} failed (try {attempt}): {failed}")
            self.say(f"RunTask for the {spec.fleet} {spec.role}: {failed}; trying again in {wait:.0f} s")
            self.sleep(wait)
            wait *= 2
        raise AssertionError("not reached")

    def _run_task(self, request: dict[str, Any]) -> tuple[str | None, str, bool]:
        """(the task's ARN, "", False), or (None, why it failed, whether to try again)."""
        from botocore.exceptions import ClientError

        try:
            resp = self.ecs.run_task(**request)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = str(error.get("Code", "")), str(error.get("Message", ""))
            return None, f"{code}: {message}", code in RETRYABLE_ERRORS or _retryable([message])
        failures = resp.get("failures") or []
        tasks = resp.get("tasks") or []
        if failures or not tasks:
            reasons = [f"{f.get('reason', '')} {f.get('detail', '')}" for f in failures]
            return None, json.dumps(failures) if failures else "no task started", _retryable(reasons)
        return str(tasks[0]["taskArn"]), "", False

    def describe(self, handles: Sequence[str]) -> dict[str, TaskStatus]:
        out: dict[str, TaskStatus] = {}
        for i in range(0, len(handles), 100):  # DescribeTasks takes up to 100 tasks
            resp = self.ecs.describe_tasks(cluster=self.cfg.cluster, tasks=list(handles[i : i + 100]))
            for task in resp.get("tasks", []):
                out[task["taskArn"]] = self._status(task)
        return out

    def _status(self, task: dict[str, Any]) -> TaskStatus:
        container: dict[str, Any] = next(
            (c for c in task.get("containers", []) if c.get("name") == cc.CONTAINER_NAME), {}
        )
        address = None
        for att in task.get("attachments", []):
            for d in att.get("details", []):
                if d.get("name") == "privateIPv4Address":
                    address = d.get("value")
        reason = task.get("stoppedReason") or container.get("reason") or ""
        task_id = task["taskArn"].rsplit("/", 1)[-1]
        runtime = container.get("runtimeId")
        hint = ""
        if runtime:
            hint = port_forward_command(self.cfg.region, self.cfg.cluster, task_id, runtime)
        return TaskStatus(
            str(task.get("lastStatus", "PROVISIONING")), container.get("exitCode"), reason, address, {}, hint
        )

    def stop(self, handle: str, reason: str) -> None:
        self.ecs.stop_task(cluster=self.cfg.cluster, task=handle, reason=reason[:255])

    def stop_run(self, run_id: str, reason: str, *, conductor: bool) -> list[str]:
        stopped = stop_run_tasks(self.ecs, self.cfg.cluster, reason, run_id=run_id, conductor=conductor)
        # A stopped worker still flushes and uploads its last records (SIGTERM, then SIGKILL after
        # the stop timeout: ECS API reference, StopTask). boto3's TasksStopped waiter polls
        # DescribeTasks every 6 s, 100 times, up to 100 tasks a call.
        for i in range(0, len(stopped), 100):
            self.ecs.get_waiter("tasks_stopped").wait(cluster=self.cfg.cluster, tasks=stopped[i : i + 100])
        return stopped


def port_forward_command(
    region: str, cluster: str, task_id: str, runtime_id: str, local_port: int = cc.LOCUST_WEB_PORT
) -> str:
    """The Session Manager port forward to the master's UI (needs the session-manager-plugin and
    the stack's OperatorUiPolicyArn on the caller): then open http://localhost:<local_port>."""
    params = json.dumps({"portNumber": [str(cc.LOCUST_WEB_PORT)], "localPortNumber": [str(local_port)]})
    target = f"ecs:{cluster}_{task_id}_{runtime_id}"
    return (
        f"aws ssm start-session --region {region} --target {target} --document-name AWS-StartPortForwardingSession "
        f"--parameters {shlex.quote(params)}  # then open http://localhost:{local_port}"
    )


def started_by(run_id: str, *, conductor: bool = False) -> str:
    return f"{STARTED_BY_PREFIX}{run_id}{CONDUCTOR_SUFFIX if conductor else ''}"[:36]


def stop_run_tasks(
    ecs: Any, cluster: str, reason: str = "campaign teardown", run_id: str | None = None, *, conductor: bool = True
) -> list[str]:
    """Stop every task a `run` started that is still alive in the cluster, conductors included
    (only run `run_id`'s, when given: `run --resume`, and its conductor only when `conductor`);
    returns their ARNs."""

    def ours(by: str) -> bool:
        if run_id is None:
            return by.startswith(STARTED_BY_PREFIX)
        return by == started_by(run_id) or (conductor and by == started_by(run_id, conductor=True))

    stopped: list[str] = []
    arns: list[str] = []
    for status in ("RUNNING", "PENDING"):
        for page in ecs.get_paginator("list_tasks").paginate(cluster=cluster, desiredStatus=status):
            arns += page.get("taskArns", [])
    for i in range(0, len(arns), 100):
        for task in ecs.describe_tasks(cluster=cluster, tasks=arns[i : i + 100]).get("tasks", []):
            if ours(str(task.get("startedBy", ""))):
                ecs.stop_task(cluster=cluster, task=task["taskArn"], reason=reason)
                stopped.append(task["taskArn"])
    return stopped
