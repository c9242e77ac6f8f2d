"""What ran against what was pinned: the digest ECS reports for each pinned task image.

The Prometheus task names its image by tag (the ECR pull-through cache fills only on a pull by
tag, aws/containers-roadmap#2837; stacks/observability.py), and ECS resolves that tag to one
digest per deployment ("Amazon ECS resolves container image names and any image tags specified in
the task definition to container image digests", ECS API reference, ContainerImage; ECS
developer guide, "Container image resolution"). The tag may have moved since the pin, so before a
run starts anything, `run` reads what each running task of a pinned image runs (DescribeTasks
`containers[].imageDigest`, "The container image manifest digest", ECS API reference, Container)
and compares it with the pin: a mismatch stops that task and the run, naming both digests. ECS
may leave the field out (moto does); that is said, and nothing is compared.

Not known offline: whether ECS reports a multi-arch tag's index digest (what the pin is) or its
linux/amd64 manifest's; only a run on an account shows it. A stop then names both, and the
platform digest, if that is what ECS reports, is what to pin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from campaign.aws.run_config import CloudRunError
from core.images import PROMETHEUS_IMAGE

# container name in the stack's task definitions -> the pinned reference it must run
PINNED_TASK_IMAGES: dict[str, str] = {"prometheus": PROMETHEUS_IMAGE}


class ImageDigestMismatch(CloudRunError):
    """A task runs another image than its pin; the message names both digests."""


def pinned_digest(reference: str) -> str:
    digest = reference.rpartition("@")[2]
    if not digest.startswith("sha256:"):
        raise ValueError(f"{reference!r} names no digest")
    return digest


def _running_tasks(ecs: Any, cluster: str) -> list[dict[str, Any]]:
    arns = [
        arn
        for page in ecs.get_paginator("list_tasks").paginate(cluster=cluster, desiredStatus="RUNNING")
        for arn in page.get("taskArns", [])
    ]
    tasks: list[dict[str, Any]] = []
    for i in range(0, len(arns), 100):  # DescribeTasks takes up to 100 tasks
        tasks += ecs.describe_tasks(cluster=cluster, tasks=arns[i : i + 100]).get("tasks", [])
    return tasks


def verify_task_images(
    ecs: Any,
    cluster: str,
    *,
    pins: Mapping[str, str] = PINNED_TASK_IMAGES,
    say: Callable[[str], None] = print,
) -> None:
    """Compare every running container named in `pins` with its pinned digest; on a mismatch stop
    that task (StopTask) and raise ImageDigestMismatch naming both."""
    seen: set[str] = set()
    for task in _running_tasks(ecs, cluster):
        task_id = str(task["taskArn"]).rsplit("/", 1)[-1]
        for c in task.get("containers", []):
            name = c.get("name")
            if name not in pins:
                continue
            seen.add(name)
            pinned = pinned_digest(pins[name])
            ran = c.get("imageDigest")
            if not ran:
                say(
                    f"{name} task {task_id}: image digest not reported by ECS (DescribeTasks containers[].imageDigest); "
                    f"runs {c.get('image', '?')}, pinned {pinned}: not compared"
                )
            elif ran != pinned:
                why = f"{name} runs image {ran}, not the pinned {pinned} ({pins[name]})"
                ecs.stop_task(cluster=cluster, task=task["taskArn"], reason=why[:255])
                raise ImageDigestMismatch(
                    f"{why}: task {task_id} stopped. The tag moved off the pin, or ECS reports the platform "
                    "manifest's digest; pin the digest that should run (Prometheus: core/images.py PROMETHEUS_IMAGE) and deploy again"
                )
            else:
                say(f"{name} task {task_id}: runs the pinned {pinned}")
    for name in sorted(set(pins) - seen):
        say(f"no running {name} task to compare with its pin {pinned_digest(pins[name])}: not reported")
