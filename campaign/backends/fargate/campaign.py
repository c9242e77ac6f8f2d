"""`campaign run` on AWS: the campaign's stages (campaign.stages.run.run_stages) on the
deployed fleets through Fargate tasks (campaign.backends.fargate.fleets.CloudFleets), and a finished run's
directory fetched back from the results bucket (`report --run-id`, `teardown`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from campaign.aws import stack as aws
from campaign.aws.run_config import read_run_config
from campaign.aws.s3_trees import download_tree
from campaign.backends.fargate.fleets import CloudFleets
from campaign.backends.fargate.run import CloudRun, CloudRunResult
from campaign.backends.fargate.tasks import TaskLauncher
from campaign.stages.deadline import GATE_STAGE, StackDeadline, utc_now
from core import cloud_contract as cc
from core.errors import EXIT_BY_DECISION, EXIT_OK, BadArgument
from core.manifest import Manifest

if TYPE_CHECKING:
    from analysis.report.inputs import PlannedCost
    from campaign.stages.resume import RunState


def run_campaign(
    session: Any,
    m: Manifest,
    out_dir: Path,
    *,
    duration_s: float | None = None,
    launcher: TaskLauncher | None = None,
    poll_s: float = 10.0,
    capacity: bool = True,
    final_report: bool = True,
    predicted: Mapping[str, float] | None = None,
    planned_cost: PlannedCost | None = None,
    concurrent: int | None = None,
    stage_minutes: Callable[[], Mapping[str, float]] | None = None,
    clock: Callable[[], datetime] = utc_now,
    run_id: str | None = None,
    resume_id: str | None = None,
    in_conductor: bool = False,
    stand_in: str | None = None,
) -> CloudRunResult:
    """What `campaign run` does: the campaign's stages (campaign.stages.run) on the deployed
    fleets, the run directory uploaded under the run's prefix; `launcher` replaces ECS RunTask
    (the offline cloud-path test); `concurrent`: fleets measured at once (default all; the
    offline run with CPU engines measures one at a time). `stage_minutes`: the plan's minutes per
    stage, asked for only when the stack has a deadline, which the quality gate and the replay
    must then end before; each capacity step and settle segment must too, by its own estimate
    (campaign.stages.deadline; the deadline is read from the stack again before each, `clock`
    tells the time). `resume_id`: `run --resume`, the run to
    continue under its own id and prefix (resume_run). `stand_in`: what serves the fleets in place
    of the stack's instances (the offline cloud run's emulators or CPU engines), for the report."""
    from campaign.aws.readiness import not_ready_evidence
    from campaign.backends.fargate.ecs_tasks import EcsTaskLauncher
    from campaign.backends.fargate.systems import stack_amis, systems_under_test
    from campaign.stages.run import run_stages

    cfn = session.client("cloudformation")
    cfg = read_run_config(cfn, aws.stack_name(m))
    deadline = stack_deadline(cfn, aws.stack_name(m), cfg, stage_minutes, clock)
    deadline.stage(GATE_STAGE)  # before anything is uploaded or started
    run_id = resume_id or run_id or cc.new_run_id()
    if launcher is None:
        from campaign.backends.fargate.image_pins import verify_task_images

        # The stack's own tasks (Prometheus) run by tag: what ran is compared with the pin first.
        verify_task_images(session.client("ecs"), cfg.cluster)
        launcher = EcsTaskLauncher(session.client("ecs"), cfg, run_id)
    run = CloudRun(
        m,
        cfg,
        launcher,
        session.client("s3"),
        out_dir=out_dir,
        poll_s=poll_s,
        discovery=session.client("servicediscovery"),
        elbv2=session.client("elbv2"),
        run_id=run_id,
    )
    deadline.log = run.say  # a changed deadline, or a stack that could not be read again, in the progress lines
    fleets = CloudFleets(
        run,
        diagnose=lambda fleet: not_ready_evidence(session, m.campaign, fleet),
        concurrent=concurrent,
        systems_under_test=systems_under_test(
            m, stack_amis(session.client("cloudformation"), aws.stack_name(m), m), stand_in
        ),
    )
    run.predicted = predicted
    state = resume_run(session, run, predicted, stop_conductor=not in_conductor) if resume_id is not None else None
    stop = threading.Event()
    status = "failed"
    try:
        if state is None:
            run.upload_inputs()
        report = run_stages(
            m,
            fleets,
            run.run_dir,
            stop,
            duration_s=duration_s,
            capacity=capacity,
            final_report=final_report,
            predicted=predicted,
            planned_cost=planned_cost,
            before_stage=deadline.stage,
            resume=state,
            deadline=deadline.cuts,
        )
        status = "finished"
        run.exit_code = EXIT_BY_DECISION[report.decision.state] if report is not None else EXIT_OK
    except KeyboardInterrupt:
        stop.set()
        run.say("interrupted: stopping every task of this run (workers flush and upload what they recorded)")
        fleets.abort()
        run.wait_all_stopped()
        status = "interrupted"
        raise
    finally:
        run.deregister()
        if run.run_dir.is_dir():
            run.say(f"run {run_id}: {run.publish()} file(s) of the run directory uploaded to {run.uri}/")
        run.write_run_record(status)
    assert run.exit_code is not None  # set where the status became "finished"
    return CloudRunResult(run_id, run.uri, run.run_dir, run.exit_code, report)


def resume_run(
    session: Any, run: CloudRun, predicted: Mapping[str, float] | None, *, stop_conductor: bool = True
) -> RunState:
    """`run --resume`: stop and deregister what the run cut off left running (its conductor too,
    unless this is the conductor taking the run up, `stop_conductor` False), fetch its directory,
    refuse unless its manifest, schedule and plan are this one's (naming both values), and set
    aside, here and under its prefix, what its last stage had left half done; the state it
    resumes from (campaign.stages.resume), also in the run record (`resumed`)."""
    from campaign.stages import resume

    m = run.m
    run.fetch_progress()
    stopped = run.launcher.stop_run(run.run_id, f"campaign run --resume {run.run_id}", conductor=stop_conductor)
    run.say(
        f"run {run.run_id}: {len(stopped)} task(s) of it still running stopped; "
        f"{run.deregister_stale()} Cloud Map registration(s) of it removed"
    )
    recorded, inputs = _recorded_run(run)
    check_same_run(m, inputs, recorded, predicted)
    download_tree(session.client("s3"), run.uri, run.run_dir)
    run.mark_published()
    state = resume.read_run_state(run.run_dir, [f.name for f in m.fleets])
    state = resume.prepare(state, m.workload.capacity_sweep is not None, run.say, on_move=run.move)
    run.resumed = {
        "at": state.stage,
        "carried_over": state.carried_over(),
        "stopped_tasks": len(stopped),
        "first_started_at": recorded.get("resumed", {}).get("first_started_at", recorded.get("started_at")),
    }
    return state


def _recorded_run(run: CloudRun) -> tuple[dict[str, Any], cc.RunInputs]:
    """The run record (run.json) and inputs/schedule.json under the run's prefix."""
    bucket, prefix = cc.split_s3_uri(run.uri)
    s3 = run.s3
    try:
        record = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.RUN_RECORD}")["Body"].read())
        schedule = s3.get_object(Bucket=bucket, Key=f"{prefix}/{cc.INPUTS_DIR}/{cc.INPUT_SCHEDULE}")["Body"].read()
    except s3.exceptions.NoSuchKey:
        raise BadArgument(
            f"--resume {run.run_id}: no run record or inputs under {run.uri}/ (is the run id right? `campaign run` prints it)"
        ) from None
    try:
        return record, cc.RunInputs.from_json(schedule.decode())
    except ValueError as exc:
        raise BadArgument(f"--resume {run.run_id}: {run.uri}/{cc.INPUTS_DIR}/{exc}") from None


def check_same_run(
    m: Manifest, inputs: cc.RunInputs, record: Mapping[str, Any], predicted: Mapping[str, float] | None
) -> None:
    """Refuse to resume a run with another manifest, schedule or plan than it was started with:
    its finished steps were measured and searched under those, naming each difference with both values."""
    from core.schedule import build_schedule, schedule_digest

    problems = []
    if inputs.manifest_digest != m.digest:
        problems.append(f"manifest digest: the run's {inputs.manifest_digest}, this manifest's {m.digest}")
    digest = schedule_digest(build_schedule(m))
    if inputs.schedule_digest != digest:
        problems.append(f"schedule digest: the run's {inputs.schedule_digest}, this manifest's {digest}")
    before = record.get("predicted")
    now = dict(predicted) if predicted is not None else None
    if before != now:
        problems.append(f"plan (--from-plan's predicted boundaries): the run's {before}, now {now}")
    if problems:
        raise BadArgument("--resume: not the run's inputs: " + "; ".join(problems))


def stack_deadline(
    cfn: Any,
    stack: str,
    cfg: cc.RunConfig,
    stage_minutes: Callable[[], Mapping[str, float]] | None,
    clock: Callable[[], datetime],
) -> StackDeadline:
    """The stack's deadline (its run config's, `cfg` as first read), read again from the stack before
    each stage, step and segment: no check while it has none (a stack deployed before it existed),
    no stage check without a plan."""
    return StackDeadline(lambda: read_run_config(cfn, stack).deadline_at, stage_minutes, clock, last=cfg.deadline_at)


def fetch_run(session: Any, m: Manifest, source: str, dest: Path) -> Path:
    """One run's directory (records, capacity steps, quality, campaign.json) into `dest`:
    `source` is a run id (found through the stack's results prefix) or the run's s3:// URI as
    `run` printed it (works after teardown too)."""
    from campaign.stages.run import CAMPAIGN_FILE

    try:  # a malformed id or URI is refused before any AWS call
        if source.startswith("s3://"):
            cc.split_s3_uri(source)
        else:
            cc.check_run_id(source)
    except ValueError as exc:
        raise BadArgument(f"--run-id: {exc}") from None
    if source.startswith("s3://"):
        uri = source.rstrip("/")
    else:
        cfg = read_run_config(session.client("cloudformation"), aws.stack_name(m))
        uri = cc.run_uri(cfg.results_uri, source)
    dest.mkdir(parents=True, exist_ok=True)
    files = download_tree(session.client("s3"), uri, dest)
    if not any(p.name == CAMPAIGN_FILE for p in files):
        raise BadArgument(f"--run-id: no run directory under {uri}/ (is the run id right? `campaign run` prints it)")
    return dest
