"""Issue 50, item 5: what a stack task runs, compared with its pin before `run` starts anything
(campaign/backends/fargate/image_pins.py), on ECS answers given by botocore's Stubber."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from campaign.backends.fargate.image_pins import (
    PINNED_TASK_IMAGES,
    ImageDigestMismatch,
    pinned_digest,
    verify_task_images,
)
from core.images import PROMETHEUS_IMAGE

CLUSTER = "harness-cluster"
TASK = f"arn:aws:ecs:us-east-1:123456789012:task/{CLUSTER}/0123456789abcdef"
PINNED = PROMETHEUS_IMAGE.rpartition("@")[2]
MOVED = "sha256:" + "d" * 64
CACHED_BY_TAG = "123456789012.dkr.ecr.us-east-1.amazonaws.com/docker-hub/prom/prometheus:v3.5.0"


def _ecs() -> Any:
    return boto3.session.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x").client(
        "ecs"
    )


def _describe(container: dict[str, Any]) -> dict[str, Any]:
    return {"tasks": [{"taskArn": TASK, "containers": [{"name": "prometheus", "image": CACHED_BY_TAG, **container}]}]}


def _stub_running(stub: Stubber, container: dict[str, Any]) -> None:
    stub.add_response("list_tasks", {"taskArns": [TASK]}, {"cluster": CLUSTER, "desiredStatus": "RUNNING"})
    stub.add_response("describe_tasks", _describe(container), {"cluster": CLUSTER, "tasks": [TASK]})


def test_the_pin_is_prometheus_index_digest() -> None:
    assert PINNED_TASK_IMAGES == {"prometheus": PROMETHEUS_IMAGE}
    assert pinned_digest(PROMETHEUS_IMAGE) == PINNED


def test_a_task_on_the_pinned_digest_passes() -> None:
    ecs, said = _ecs(), []
    with Stubber(ecs) as stub:
        _stub_running(stub, {"imageDigest": PINNED})
        verify_task_images(ecs, CLUSTER, say=said.append)
        stub.assert_no_pending_responses()
    assert said == [f"prometheus task 0123456789abcdef: runs the pinned {PINNED}"]


def test_a_task_on_another_digest_is_stopped_and_the_run_with_it_naming_both() -> None:
    ecs = _ecs()
    with Stubber(ecs) as stub:
        _stub_running(stub, {"imageDigest": MOVED})
        stub.add_response(
            "stop_task",
            {},
            {
                "cluster": CLUSTER,
                "task": TASK,
                "reason": f"prometheus runs image {MOVED}, not the pinned {PINNED} ({PROMETHEUS_IMAGE})"[:255],
            },
        )
        with pytest.raises(ImageDigestMismatch) as exc:
            verify_task_images(ecs, CLUSTER, say=lambda _: None)
        stub.assert_no_pending_responses()
    assert f"prometheus runs image {MOVED}, not the pinned {PINNED}" in str(exc.value)
    assert exc.value.exit_code == 1


def test_a_digest_ecs_does_not_report_is_said_not_compared() -> None:
    # moto, and ECS while a task is still pulling, leave imageDigest out.
    ecs, said = _ecs(), []
    with Stubber(ecs) as stub:
        _stub_running(stub, {})
        verify_task_images(ecs, CLUSTER, say=said.append)
    assert said == [
        "prometheus task 0123456789abcdef: image digest not reported by ECS (DescribeTasks containers[].imageDigest); "
        f"runs {CACHED_BY_TAG}, pinned {PINNED}: not compared"
    ]


def test_no_prometheus_task_running_is_said() -> None:
    ecs, said = _ecs(), []
    with Stubber(ecs) as stub:
        stub.add_response("list_tasks", {"taskArns": []}, {"cluster": CLUSTER, "desiredStatus": "RUNNING"})
        verify_task_images(ecs, CLUSTER, say=said.append)
    assert said == [f"no running prometheus task to compare with its pin {PINNED}: not reported"]


class _Ecs:
    """Enough of an ECS client for run_campaign's first calls: Prometheus runs a moved tag."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def get_paginator(self, name: str) -> Any:
        assert name == "list_tasks"

        class _P:
            def paginate(self, **kw: Any) -> list[dict[str, Any]]:
                return [{"taskArns": [TASK]}]

        return _P()

    def describe_tasks(self, **kw: Any) -> dict[str, Any]:
        return _describe({"imageDigest": MOVED})

    def stop_task(self, *, cluster: str, task: str, reason: str) -> dict[str, Any]:
        self.stopped.append(task)
        return {}


class _Cfn:
    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        from core.cloud_contract import RUN_CONFIG_OUTPUT

        cfg = {
            "region": "us-east-1",
            "cluster": CLUSTER,
            "master_task_definition": "m",
            "worker_task_definition": "w",
            "gate_task_definition": "g",
            "subnets": "s",
            "security_groups": "g",
            "results_uri": "s3://b/p",
            "targets": {},
            "workers": 2,
        }
        return {
            "Stacks": [
                {"StackName": StackName, "Outputs": [{"OutputKey": RUN_CONFIG_OUTPUT, "OutputValue": json.dumps(cfg)}]}
            ]
        }


class _Session:
    def __init__(self) -> None:
        self.ecs = _Ecs()

    def client(self, name: str) -> Any:
        if name == "ecs":
            return self.ecs
        if name == "cloudformation":
            return _Cfn()
        raise RuntimeError(f"not reached before the image check: {name}")


def test_run_compares_the_stack_tasks_images_before_it_starts_anything(
    example_manifest_path: Path, tmp_path: Path
) -> None:
    """On 17e73d2 nothing compared them: `run` went on (here into a client it has no stand-in for)
    and Prometheus kept scraping from the moved image."""
    from campaign.backends.fargate.campaign import run_campaign
    from core.manifest import load_manifest

    session = _Session()
    with pytest.raises(Exception) as exc:
        run_campaign(session, load_manifest(example_manifest_path, check_files=False), tmp_path)
    assert session.ecs.stopped == [TASK]
    assert isinstance(exc.value, ImageDigestMismatch)
