"""`run --detach`, the conductor's request and `run --attach`, against moto's S3 and a launcher the
test drives; the conductor itself runs end to end in the offline cloud run
(tests/faults/test_cloud_kills.py, `make cloud-offline-resume`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from campaign.aws.run_config import CloudRunError
from campaign.backends.fargate import conductor
from campaign.backends.fargate.run import CloudRun
from campaign.backends.fargate.tasks import TaskSpec, TaskStatus
from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, BadArgument
from core.manifest import load_manifest
from tests.cloud.test_cloud_steps import BUCKET, REGION, run_config
from tests.conftest import EXAMPLE_MANIFEST

RUN_ID = "20261205T230000Z-abc123"


class Session:
    def __init__(self) -> None:
        self.s3 = boto3.client("s3", region_name=REGION)

    def client(self, name: str) -> Any:
        assert name == "s3", name
        return self.s3


@pytest.fixture
def session() -> Iterator[Session]:
    with mock_aws():
        s = Session()
        s.s3.create_bucket(Bucket=BUCKET)
        yield s


def _cfg(conductor_definition: str = "conductor-td") -> cc.RunConfig:
    return run_config(conductor_task_definition=conductor_definition)


class Launcher:
    """Starts nothing; records what it was asked; its tasks' states are set by the test."""

    def __init__(self) -> None:
        self.started: list[TaskSpec] = []
        self.stopped_runs: list[tuple[str, bool]] = []
        self.states: dict[str, TaskStatus] = {}

    def start(self, spec: TaskSpec) -> str:
        self.started.append(spec)
        handle = f"arn:task/{spec.role}-{len(self.started)}"
        self.states[handle] = TaskStatus("RUNNING")
        return handle

    def describe(self, handles: Sequence[str]) -> dict[str, TaskStatus]:
        return {h: self.states[h] for h in handles}

    def stop(self, handle: str, reason: str) -> None:
        self.states[handle] = TaskStatus("STOPPED", 143, reason)

    def stop_run(self, run_id: str, reason: str, *, conductor: bool) -> list[str]:
        self.stopped_runs.append((run_id, conductor))
        return []


def _keys(s3: Any, run_id: str = RUN_ID) -> set[str]:
    bucket, prefix = cc.split_s3_uri(cc.run_uri(_cfg().results_uri, run_id))
    return {o["Key"][len(prefix) + 1 :] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}


def test_detach_uploads_the_inputs_and_the_request_then_starts_the_conductor(session: Session) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    launcher = Launcher()
    request = conductor.ConductorRequest(RUN_ID, False, duration_s=30.0, predicted={"g6": 0.6}, requested_at=1.0)
    task = conductor.detach(session, m, _cfg(), launcher, request)

    (spec,) = launcher.started
    assert spec.role == "conductor" and spec.task_definition == "conductor-td"
    assert spec.command == (cc.CONDUCT_COMMAND, RUN_ID)
    assert {f"{cc.INPUTS_DIR}/{cc.INPUT_MANIFEST}", f"{cc.INPUTS_DIR}/{cc.INPUT_SCHEDULE}"} <= _keys(session.s3)
    got = conductor.read_request(session.s3, _cfg(), RUN_ID)
    assert got == replace(request, task=task)  # what the conductor reads: the request, and which task it is
    assert launcher.stopped_runs == []  # a new run has nothing to stop


def test_a_detached_resume_stops_what_is_left_of_the_run_its_old_conductor_included(session: Session) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    launcher = Launcher()
    conductor.detach(session, m, _cfg(), launcher, conductor.ConductorRequest(RUN_ID, True))
    assert launcher.stopped_runs == [(RUN_ID, True)]
    (spec,) = launcher.started
    assert spec.command == (cc.CONDUCT_COMMAND, RUN_ID, cc.RESUME_FLAG)
    assert f"{cc.INPUTS_DIR}/{cc.INPUT_MANIFEST}" not in _keys(session.s3)  # the run's own inputs stay


def test_detach_refuses_a_stack_without_a_conductor(session: Session) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    with pytest.raises(CloudRunError, match=r"no conductor task definition .* deploy again"):
        conductor.detach(session, m, _cfg(""), Launcher(), conductor.ConductorRequest(RUN_ID, False))


def test_a_request_that_is_not_one_is_refused_naming_its_object(session: Session) -> None:
    bucket, prefix = cc.split_s3_uri(cc.run_uri(_cfg().results_uri, RUN_ID))
    with pytest.raises(BadArgument, match=r"no conductor\.json under s3://.*`run --detach`"):
        conductor.read_request(session.s3, _cfg(), RUN_ID)
    session.s3.put_object(Bucket=bucket, Key=f"{prefix}/{cc.CONDUCTOR_REQUEST}", Body=b'{"run_id": 1, "bogus": 2}')
    with pytest.raises(CloudRunError, match=f"s3://{bucket}/{prefix}/conductor.json: not a conductor request"):
        conductor.read_request(session.s3, _cfg(), RUN_ID)


def _cloud_run(session: Session, tmp_path: Path) -> CloudRun:
    return CloudRun(
        load_manifest(EXAMPLE_MANIFEST),
        _cfg(),
        Launcher(),
        session.s3,
        out_dir=tmp_path,
        say=lambda line: None,
        run_id=RUN_ID,
    )


def test_attach_prints_the_progress_lines_as_they_come_and_ends_with_the_runs_exit_code(
    session: Session, tmp_path: Path
) -> None:
    launcher = Launcher()
    conductor.detach(
        session, load_manifest(EXAMPLE_MANIFEST), _cfg(), launcher, conductor.ConductorRequest(RUN_ID, False)
    )
    run = _cloud_run(session, tmp_path)  # what the conductor's run_campaign does meanwhile
    out: list[str] = []
    script = iter(
        [
            lambda: run.say("inf2 [replay]: master arn:x; web UI: aws ssm start-session --target ecs:c_x_y"),
            lambda: (run.say("g6: step x2 held"), run.write_run_record("running", stage="capacity search")),
            lambda: (run.say("decision: GO"), setattr(run, "exit_code", 0), run.write_run_record("finished")),
        ]
    )
    code = conductor.attach(session, _cfg(), RUN_ID, launcher, say=out.append, sleep=lambda s: next(script)())
    text = "".join(out)
    assert code == 0
    # every line once, in order, the web UI's port forward among them, then the end
    lines = [line for line in text.splitlines() if "Z " in line]
    assert [line.split("Z ", 1)[1] for line in lines] == [
        "inf2 [replay]: master arn:x; web UI: aws ssm start-session --target ecs:c_x_y",
        "g6: step x2 held",
        "decision: GO",
    ]
    assert text.rstrip().endswith(f"run {RUN_ID} finished (exit 0)")


def test_attach_says_how_to_resume_when_the_conductor_stopped_before_the_run_ended(
    session: Session, tmp_path: Path
) -> None:
    launcher = Launcher()
    task = conductor.detach(
        session, load_manifest(EXAMPLE_MANIFEST), _cfg(), launcher, conductor.ConductorRequest(RUN_ID, False)
    )
    run = _cloud_run(session, tmp_path)
    run.say("inf2: step x2 ...")
    run.write_run_record("running", stage="capacity search")

    def dies(_: float) -> None:
        launcher.states[task] = TaskStatus("STOPPED", 137, "OutOfMemoryError: container killed")

    out: list[str] = []
    code = conductor.attach(session, _cfg(), RUN_ID, launcher, say=out.append, sleep=dies)
    assert code == EXIT_FAILED_STEP
    assert "inf2: step x2 ..." in "".join(out)
    assert (
        f"stopped before the run ended (exit 137: OutOfMemoryError: container killed); `run --resume {RUN_ID} --detach`"
        in "".join(out)
    )


def test_the_run_record_carries_the_exit_code_and_the_progress_log_is_there_first(
    session: Session, tmp_path: Path
) -> None:
    run = _cloud_run(session, tmp_path)
    run.say("a line said just now")  # put at once (the first), then at most every few seconds
    run.say("a line said right after")
    run.exit_code = 10
    run.write_run_record("finished")
    bucket, prefix = cc.split_s3_uri(run.uri)
    record = json.loads(session.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.RUN_RECORD}")["Body"].read())
    assert record["exit_code"] == 10 and record["status"] == "finished"
    log = session.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.PROGRESS_LOG}")["Body"].read().decode()
    assert "a line said right after" in log  # the record's put put the log first


def test_a_resumed_runs_progress_lines_go_on_after_the_cut_off_runs(session: Session, tmp_path: Path) -> None:
    """`run --attach` reads progress.log by offset: a resume must add to it, never start it again.
    Failed before resume_run fetched it: the resume's first line put a log of that line alone."""
    from campaign.backends.fargate.campaign import resume_run

    first = _cloud_run(session, tmp_path / "first")
    first.say("the cut-off run's line")
    first.write_run_record("running", stage="capacity search")
    follow = conductor.Attached(session.s3, _cfg(), RUN_ID)
    assert "the cut-off run's line" in follow.new_lines()
    again = _cloud_run(session, tmp_path / "again")  # the resumed run: another machine, no local copy
    with pytest.raises(BadArgument):  # no inputs under the prefix: refused, after stopping and saying so
        resume_run(session, again, None)
    later = follow.new_lines()
    assert "task(s) of it still running stopped" in later and "cut-off" not in later
    bucket, prefix = cc.split_s3_uri(again.uri)
    log = session.s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.PROGRESS_LOG}")["Body"].read().decode()
    assert log.index("the cut-off run's line") < log.index("task(s) of it still running stopped")


def test_attach_prints_only_the_last_lines_of_a_long_history_then_every_new_one(
    session: Session, tmp_path: Path
) -> None:
    run = _cloud_run(session, tmp_path)
    for i in range(conductor.ATTACH_HISTORY_LINES + 10):
        run.say(f"line {i}")
    run.write_run_record("running", stage="capacity search")
    follow = conductor.Attached(session.s3, _cfg(), RUN_ID, history=conductor.ATTACH_HISTORY_LINES)
    first = follow.new_lines().splitlines()
    assert first[0].startswith("... 10 earlier line(s): s3://") and first[0].endswith("/progress.log")
    assert first[1].endswith(" line 10") and first[-1].endswith(f" line {conductor.ATTACH_HISTORY_LINES + 9}")
    run.say("one more")
    run.write_run_record("running", stage="capacity search")
    assert [line.split("Z ", 1)[1] for line in follow.new_lines().splitlines()] == ["one more"]


def test_attach_follows_a_run_started_in_a_terminal_and_refuses_an_unknown_one(
    session: Session, tmp_path: Path
) -> None:
    with pytest.raises(BadArgument, match=f"--attach {RUN_ID}: no such run under s3://"):
        conductor.attach(session, _cfg(), RUN_ID, Launcher(), say=lambda text: None, sleep=lambda s: None)
    run = _cloud_run(session, tmp_path)  # `run` in someone's terminal: no conductor.json
    run.say("inf2: step x2 held")
    run.write_run_record("running", stage="capacity search")
    out: list[str] = []

    def ends(_: float) -> None:
        run.exit_code = 11
        run.write_run_record("finished")

    assert conductor.attach(session, _cfg(), RUN_ID, Launcher(), say=out.append, sleep=ends) == 11
    assert "conductor none: run from a terminal" in out[0] and "inf2: step x2 held" in "".join(out)
