"""The conductor: `campaign run` as a Fargate task in the stack, so a campaign of hours outlives the
operator's terminal (a laptop that sleeps, a dropped VPN).

    operator: run MANIFEST --detach     uploads the inputs and the request (conductor.json) under
                                        the run's prefix, starts the conductor task, prints the run id
    conductor: python -m campaign conduct RUN_ID [--resume]
                                        stages the inputs as a load-generator task does, then runs
                                        run_campaign: the same stages, tasks and uploads as `run`
    operator: run MANIFEST --attach RUN_ID
                                        prints the run's progress lines as they reach the run's
                                        prefix (progress.log), until its record says it ended or
                                        the conductor stopped without ending it

A conductor that dies (or is stopped) leaves its run as a killed `run` would: `run --resume RUN_ID`,
detached or not, picks it up. Lambda-free: the conductor is one ECS task, started with RunTask.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from campaign.aws.run_config import CloudRunError, read_run_config
from campaign.backends.fargate.run import upload_inputs
from campaign.backends.fargate.tasks import TaskLauncher, TaskSpec
from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, EXIT_OK, BadArgument
from core.manifest import Manifest

# run.json's status once the run ended, one way or another (CloudRun.write_run_record).
ENDED = ("finished", "failed", "interrupted")
# What `run --attach` prints of a run's earlier lines (an hours-long campaign has thousands).
ATTACH_HISTORY_LINES = 40


@dataclass(frozen=True)
class ConductorRequest:
    """What `run --detach` was asked beside the manifest (conductor.json under the run's prefix)."""

    run_id: str
    resume: bool
    duration_s: float | None = None
    capacity: bool = True
    final_report: bool = True
    predicted: dict[str, float] | None = None  # --from-plan's boundaries
    planned_cost: dict[str, Any] | None = None  # --from-plan's campaign cost (analysis PlannedCost's fields)
    stage_minutes: dict[str, float] | None = None  # the plan's minutes per stage, for the stack's deadline
    requested_at: float = 0.0
    task: str = ""  # the conductor's task, once started

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> ConductorRequest:
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise CloudRunError(f"{where}: not a conductor request ({type(exc).__name__}: {exc})") from None


def _key(cfg: cc.RunConfig, run_id: str, name: str) -> tuple[str, str]:
    bucket, prefix = cc.split_s3_uri(cc.run_uri(cfg.results_uri, run_id))
    return bucket, f"{prefix}/{name}"


def _put_request(s3: Any, cfg: cc.RunConfig, request: ConductorRequest) -> None:
    bucket, key = _key(cfg, request.run_id, cc.CONDUCTOR_REQUEST)
    s3.put_object(Bucket=bucket, Key=key, Body=request.to_json().encode())


def read_request(s3: Any, cfg: cc.RunConfig, run_id: str) -> ConductorRequest:
    bucket, key = _key(cfg, run_id, cc.CONDUCTOR_REQUEST)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        raise BadArgument(
            f"run {run_id}: no {cc.CONDUCTOR_REQUEST} under s3://{bucket}/{key.rsplit('/', 1)[0]}/ "
            "(was it started with `run --detach`?)"
        ) from None
    return ConductorRequest.from_json(body.decode(), f"s3://{bucket}/{key}")


def detach(session: Any, m: Manifest, cfg: cc.RunConfig, launcher: TaskLauncher, request: ConductorRequest) -> str:
    """`run --detach`: the conductor started on `request` (a new run's inputs uploaded first; a
    resumed run's conductor, and whatever of the run is still alive, stopped first: two
    conductors must never drive one run); returns the conductor's task."""
    if not cfg.conductor_task_definition:
        raise CloudRunError(
            "the deployed stack has no conductor task definition (deployed before `run --detach` existed): deploy again"
        )
    s3 = session.client("s3")
    if request.resume:
        stopped = launcher.stop_run(request.run_id, f"campaign run --resume {request.run_id} --detach", conductor=True)
        if stopped:
            print(f"run {request.run_id}: {len(stopped)} task(s) of it still running stopped, its conductor included")
    else:
        upload_inputs(s3, m, cfg.results_uri, request.run_id)
    _put_request(s3, cfg, request)
    command = (cc.CONDUCT_COMMAND, request.run_id, *((cc.RESUME_FLAG,) if request.resume else ()))
    spec = TaskSpec("conductor", "", cfg.conductor_task_definition, {cc.ENV_RUN_ID: request.run_id}, command)
    task = launcher.start(spec)
    _put_request(s3, cfg, ConductorRequest(**{**asdict(request), "task": task}))
    return task


def conduct(
    session: Any,
    stack: str,
    run_id: str,
    work_dir: Path,
    *,
    resume: bool,
    launcher: TaskLauncher | None = None,
    concurrent: int | None = None,
    poll_s: float = 10.0,
    env: Mapping[str, str] = os.environ,
    stand_in: str | None = None,
) -> int:
    """`python -m campaign conduct RUN_ID [--resume]`, in the conductor task: the run's inputs
    staged and checked as a load-generator task stages them (the manifest digest the stack was
    deployed for, the trace's and tokenizer's sha256, the schedule), then the campaign, exactly as
    `run` runs it (`launcher`, `concurrent`, `poll_s` and `stand_in`: the offline run's, as for run_campaign)."""
    from analysis.report.inputs import PlannedCost
    from campaign.backends.fargate.campaign import run_campaign
    from core.manifest import load_manifest
    from loadgen.task_inputs import stage_inputs

    cc.check_run_id(run_id)
    cfg = read_run_config(session.client("cloudformation"), stack)
    s3 = session.client("s3")
    request = read_request(s3, cfg, run_id)
    staging = {
        cc.ENV_RESULTS_URI: cfg.results_uri,
        cc.ENV_RUN_ID: run_id,
        cc.ENV_MANIFEST_DIGEST: env.get(cc.ENV_MANIFEST_DIGEST, ""),
        cc.ENV_WORK_DIR: str(work_dir),
    }
    m = load_manifest(stage_inputs(staging, s3))
    minutes = request.stage_minutes
    result = run_campaign(
        session,
        m,
        work_dir / "runs",
        duration_s=request.duration_s,
        launcher=launcher,
        poll_s=poll_s,
        capacity=request.capacity,
        final_report=request.final_report,
        predicted=request.predicted,
        planned_cost=PlannedCost(**request.planned_cost) if request.planned_cost else None,
        concurrent=concurrent,
        stage_minutes=(lambda: minutes) if minutes is not None else None,
        run_id=run_id,
        resume_id=run_id if resume else None,
        in_conductor=True,
        stand_in=stand_in,
    )
    return result.exit_code


@dataclass
class Attached:
    """What `run --attach` follows: the run's progress log and record under its prefix."""

    s3: Any
    cfg: cc.RunConfig
    run_id: str
    history: int | None = None  # of the lines already there at the first read, the last this many (None: all)
    printed: int = 0  # bytes of progress.log printed so far

    def new_lines(self) -> str:
        bucket, key = _key(self.cfg, self.run_id, cc.PROGRESS_LOG)
        try:
            body: bytes = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return ""
        # a line put half-way (never: the log is put whole) would be held back to the next poll
        end = body.rfind(b"\n") + 1
        text = body[self.printed : end].decode("utf-8", errors="replace") if end > self.printed else ""
        first, self.printed = self.printed == 0, max(self.printed, end)
        lines = text.splitlines(keepends=True)
        if first and self.history is not None and len(lines) > self.history:
            skipped = len(lines) - self.history
            where = f"{cc.run_uri(self.cfg.results_uri, self.run_id)}/{cc.PROGRESS_LOG}"
            return f"... {skipped} earlier line(s): {where}\n" + "".join(lines[skipped:])
        return text

    def record(self) -> dict[str, Any]:
        bucket, key = _key(self.cfg, self.run_id, cc.RUN_RECORD)
        try:
            data: dict[str, Any] = json.loads(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except self.s3.exceptions.NoSuchKey:
            return {}
        return data


def attach(
    session: Any,
    cfg: cc.RunConfig,
    run_id: str,
    launcher: TaskLauncher,
    *,
    poll_s: float = 5.0,
    say: Callable[[str], None] = lambda text: print(text, end="", flush=True),
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """`run --attach RUN_ID`: the run's progress lines as they reach its prefix (the masters' web
    UI port-forward commands among them), until its record says it ended (its exit code: the
    decision's) or its conductor stopped without ending it (EXIT_FAILED_STEP, naming the
    resume). A run started in a terminal is followed too, with no conductor to watch. Closing
    this terminal stops nothing."""
    s3 = session.client("s3")
    follow = Attached(s3, cfg, run_id, history=ATTACH_HISTORY_LINES)
    try:
        task = read_request(s3, cfg, run_id).task
    except BadArgument:  # a run in someone's terminal: its lines, with no conductor to watch
        if not follow.record():
            raise BadArgument(
                f"--attach {run_id}: no such run under {cfg.results_uri}/ (`run` prints its id)"
            ) from None
        task = ""
    say(
        f"attached to run {run_id} (conductor {task or 'none: run from a terminal'}); Ctrl-C detaches, the run goes on\n"
    )
    while True:
        say(follow.new_lines())
        record = follow.record()
        if record.get("status") in ENDED:
            say(follow.new_lines())
            code = record.get("exit_code")
            say(f"run {run_id} {record['status']}" + (f" (exit {code})" if code is not None else "") + "\n")
            return (
                int(code)
                if isinstance(code, int)
                else (EXIT_OK if record["status"] == "finished" else EXIT_FAILED_STEP)
            )
        status = launcher.describe([task]).get(task) if task else None
        if status is not None and status.stopped and follow.record().get("status") not in ENDED:
            say(follow.new_lines())
            say(
                f"the conductor of run {run_id} stopped before the run ended (exit {status.exit_code}: "
                f"{status.reason or 'no reason given'}); `run --resume {run_id} --detach` picks the run up\n"
            )
            return EXIT_FAILED_STEP
        sleep(poll_s)
