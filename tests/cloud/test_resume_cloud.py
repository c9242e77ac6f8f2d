"""`campaign run --resume` on the AWS side (moto): the cut-off run's leftover tasks stopped and its
Cloud Map registrations removed, its directory fetched, a different manifest, schedule or plan
refused naming both values, and an interrupted step's objects moved aside under its prefix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from analysis.capacity.steps import SearchStep, Verdict
from campaign.backends.fargate.campaign import check_same_run, resume_run
from campaign.backends.fargate.ecs_tasks import STARTED_BY_PREFIX, EcsTaskLauncher, started_by
from campaign.stages import resume
from core import cloud_contract as cc
from core.errors import BadArgument
from core.manifest import load_manifest
from core.schedule import build_schedule, schedule_digest
from tests.cloud.test_cloud_steps import Aws, Launcher, _run
from tests.conftest import EXAMPLE_MANIFEST


@pytest.fixture
def cloud() -> Iterator[Aws]:
    with mock_aws():
        yield Aws()


class Ecs:
    """ListTasks / DescribeTasks / StopTask over a few tasks of two runs."""

    def __init__(self, tasks: dict[str, str]) -> None:
        self.tasks, self.stopped, self.waited = tasks, [], []  # type: dict[str, str], list[str], list[str]

    def get_paginator(self, name: str) -> Any:
        outer = self

        class P:
            def paginate(self, **kw: Any) -> list[dict[str, Any]]:
                return [{"taskArns": list(outer.tasks)}] if kw["desiredStatus"] == "RUNNING" else [{}]

        return P()

    def describe_tasks(self, cluster: str, tasks: list[str]) -> dict[str, Any]:
        return {"tasks": [{"taskArn": t, "startedBy": self.tasks[t]} for t in tasks]}

    def stop_task(self, cluster: str, task: str, reason: str) -> None:
        self.stopped.append(task)

    def get_waiter(self, name: str) -> Any:
        outer = self

        class W:
            def wait(self, cluster: str, tasks: list[str]) -> None:
                assert name == "tasks_stopped" and set(tasks) <= set(outer.stopped)
                outer.waited += tasks

        return W()


class Session:
    def __init__(self, aws: Aws, ecs: Ecs) -> None:
        self.clients = {"s3": aws.s3, "ecs": ecs}

    def client(self, name: str) -> Any:
        return self.clients[name]


def _step(label: str, k: float) -> SearchStep:
    return SearchStep(label, k, "start", 10.0, Verdict.HELD, 80, 10.0, 8.0, 1.0, 0.5, 0.05, 0.0, "ok", took_s=12.0)


def _put(aws: Aws, uri: str, rel: str, body: str) -> None:
    bucket, prefix = cc.split_s3_uri(uri)
    aws.s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=body.encode())


def _keys(aws: Aws, uri: str) -> set[str]:
    bucket, prefix = cc.split_s3_uri(uri)
    listed = aws.s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    return {o["Key"][len(prefix) + 1 :] for o in listed}


def _inputs(m: Any, **change: str) -> cc.RunInputs:
    base = {
        "manifest_digest": m.digest,
        "trace_path": "t",
        "trace_file": "t",
        "schedule_digest": schedule_digest(build_schedule(m)),
        "requests": 1,
    }
    return cc.RunInputs(**{**base, **change})  # type: ignore[arg-type]


def test_a_run_is_resumed_only_with_its_own_manifest_schedule_and_plan() -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    check_same_run(m, _inputs(m), {"predicted": {"g6": 0.6}}, {"g6": 0.6})  # the same: no complaint
    with pytest.raises(BadArgument, match=f"manifest digest: the run's {'a' * 64}, this manifest's {m.digest}"):
        check_same_run(m, _inputs(m, manifest_digest="a" * 64), {"predicted": None}, None)
    with pytest.raises(BadArgument, match=f"schedule digest: the run's {'b' * 64}"):
        check_same_run(m, _inputs(m, schedule_digest="b" * 64), {"predicted": None}, None)
    with pytest.raises(BadArgument, match=r"plan .*the run's \{'g6': 0.6\}, now None"):
        check_same_run(m, _inputs(m), {"predicted": {"g6": 0.6}}, None)


def test_resume_stops_its_tasks_drops_its_registrations_and_sets_its_cut_step_aside(cloud: Aws, tmp_path: Path) -> None:
    aws = cloud
    run = _run(aws, Launcher(aws), tmp_path)
    other = "20261201T000000Z-abcdef"
    m = run.m
    # what the orchestrator cut off mid-search left under its prefix
    _put(aws, run.uri, cc.RUN_RECORD, json.dumps({"run_id": run.run_id, "started_at": 1.0, "predicted": None}))
    _put(aws, run.uri, f"{cc.INPUTS_DIR}/{cc.INPUT_SCHEDULE}", _inputs(m).to_json())
    quality = {f.name: {"passed": True, "layers": {"distribution": {}}} for f in m.fleets}
    _put(aws, run.uri, "quality.json", json.dumps(quality))
    _put(aws, run.uri, "campaign.json", json.dumps({"instances_measured": {}}))
    for f in m.fleets:
        _put(aws, run.uri, f"records/records-{f.name}-w0-p0.jsonl", "{}\n")
    _put(aws, run.uri, "capacity/g6/x1/step.json", _step("x1", 1.0).model_dump_json())
    _put(aws, run.uri, "capacity/g6/x1/records-g6-w0-p0.jsonl", "{}\n")
    _put(aws, run.uri, "capacity/g6/x2/records-g6-w0-p0.jsonl", "cut\n")  # no verdict: cut off
    ecs = Ecs(
        {
            "arn:task/mine": f"{STARTED_BY_PREFIX}{run.run_id}",
            "arn:task/theirs": f"{STARTED_BY_PREFIX}{other}",
            "arn:task/my-conductor": started_by(run.run_id, conductor=True),
            "arn:task/their-conductor": started_by(other, conductor=True),
        }
    )
    run.launcher = EcsTaskLauncher(ecs, run.cfg, run.run_id)
    for iid, step in (("mine", f"{run.run_id}/capacity/g6/x2"), ("theirs", f"{other}/capacity/g6/x1")):
        aws.sd.register_instance(
            ServiceId=aws.masters["g6"],
            InstanceId=iid,
            Attributes={"AWS_INSTANCE_IPV4": "10.0.0.1", cc.STEP_ATTRIBUTE: step},
        )

    # the conductor taking the run up: this run's load generators, not itself, not another run's
    state = resume_run(Session(aws, ecs), run, None, stop_conductor=False)

    assert ecs.stopped == ecs.waited == ["arn:task/mine"]  # only this run's task, waited for until it stopped
    left = [i["Id"] for i in aws.sd.list_instances(ServiceId=aws.masters["g6"])["Instances"]]
    assert left == ["theirs"]
    assert state.stage == resume.SEARCH and state.carried_over() == ["g6/x1"] and state.interrupted() == []
    keys = _keys(aws, run.uri)
    assert "capacity/g6/x2/records-g6-w0-p0.jsonl" not in keys
    assert "interrupted/capacity/g6/x2-1/records-g6-w0-p0.jsonl" in keys
    assert (run.run_dir / "interrupted/capacity/g6/x2-1/records-g6-w0-p0.jsonl").read_text() == "cut\n"
    run.write_run_record("running")
    bucket, prefix = cc.split_s3_uri(run.uri)
    record = json.loads(aws.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.RUN_RECORD}")["Body"].read())
    assert record["resumed"] == {
        "at": resume.SEARCH,
        "carried_over": ["g6/x1"],
        "stopped_tasks": 1,
        "first_started_at": 1.0,
    }
    # `run --resume` from the operator's terminal: this run's conductor too (one still alive
    # would go on driving the run beside the resumed one)
    ecs.stopped, ecs.waited = [], []
    resume_run(Session(aws, ecs), run, None)
    assert sorted(ecs.stopped) == ["arn:task/mine", "arn:task/my-conductor"]


def test_a_run_id_with_nothing_under_it_is_refused(cloud: Aws, tmp_path: Path) -> None:
    run = _run(cloud, Launcher(cloud), tmp_path)
    run.launcher = EcsTaskLauncher(Ecs({}), run.cfg, run.run_id)
    with pytest.raises(BadArgument, match="no run record or inputs"):
        resume_run(Session(cloud, Ecs({})), run, None)
