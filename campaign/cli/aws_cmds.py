"""CLI subcommands of the AWS path: deploy, run, teardown."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from campaign.aws import cdk_assets
from campaign.aws import stack as aws
from campaign.aws.run_config import read_run_config
from campaign.aws.session import aws_session
from campaign.cli.help import DOCKER_HUB_CREDENTIAL_HELP, FROM_PLAN_HELP, MANIFEST_HELP, prog
from core import cloud_contract as cc
from core.errors import EXIT_FAILED_STEP, EXIT_OK, BadArgument, CampaignError
from core.manifest import Manifest, load_manifest
from core.naming import DOCKER_HUB_CREDENTIAL_PARAMETER, REHEARSAL_CONTEXT
from core.schedule import check_workload


def cmd_deploy(args: argparse.Namespace) -> int:
    from campaign.aws import compile_phase
    from campaign.aws.cloud_checks import cloud_issues
    from campaign.aws.dlami import cdk_parameter_args, parse_ami_overrides, resolve_amis
    from core.manifest import ManifestError
    from stacks.compile_boot import COMPILE_FLEETS_CONTEXT

    rehearsal = bool(getattr(args, "rehearsal", False))  # (a Namespace built without the option: none)
    # With --rehearsal, the rehearsal's manifest (campaign.stages.rehearsal), written only once checked.
    path = Path(args.manifest)
    m = _rehearsal_manifest(args) if rehearsal else load_manifest(path)  # refuses an invalid one (exit 2)
    # Illustrative hashes/digests, a gated model without a token: refused before any spend.
    issues = cloud_issues(
        m, weights_from_s3=bool(args.weights_s3_uri), docker_hub_credential_arn=args.docker_hub_credential_arn
    )
    if issues:
        raise ManifestError(issues, str(path))
    check_workload(m)  # every bad trace row, before any AWS call
    if rehearsal and args.ami:
        raise BadArgument("--ami: a rehearsal's fleets boot the stack's own Amazon Linux 2023 AMI; drop --ami")
    overrides = parse_ami_overrides(args.ami, [f.name for f in m.fleets])
    session = aws_session(m.costs.region)
    stack = aws.stack_name(m)
    if rehearsal:
        _rehearsal_preflight(session, m)  # every image and the host type's quota, before anything starts
    else:
        _suggest_rehearsal(session, m, stack)
    deadline = _deadline(args, m, session, stack)
    # Fleets whose own host cannot hold the model compile once on a larger one first (or refuse);
    # a rehearsal's emulators compile nothing.
    targets = [] if rehearsal else compile_phase.needed(session, m, stack, enabled=not args.no_compile_phase)
    # A rehearsal's fleets boot Amazon Linux 2023, which its stack resolves itself (stacks/rehearsal_fleet.py).
    amis = [] if rehearsal else resolve_amis(m, session.client("ec2"), overrides)
    for a in amis:
        print(f"{a.fleet}: AMI {a.image_id} {a.name!r} ({a.how})")
    context = ["-c", f"weights_s3_uri={args.weights_s3_uri}"] if args.weights_s3_uri else []
    if rehearsal:
        context += ["-c", f"{REHEARSAL_CONTEXT}=1"]
    # cloud_issues refused a deploy without it: every stack pulls Prometheus from Docker Hub.
    credential = ["--parameters", f"{DOCKER_HUB_CREDENTIAL_PARAMETER}={args.docker_hub_credential_arn}"]
    extra = [*context, *credential, *aws.deadline_parameter_args(deadline), *cdk_parameter_args(amis)]
    hosts = [t.host for t in targets]
    if targets:
        fleets = ", ".join(f"{t.fleet} on one {t.host.instance_type}" for t in targets)
        print(f"compile phase: {fleets} (every fleet at 0 meanwhile); deploying {stack} to {m.costs.region}")
        phase = ["-c", f"{COMPILE_FLEETS_CONTEXT}={','.join(t.fleet for t in targets)}"]
        _cdk_deploy(args, path, extra=[*extra, *phase], session=session, compiling=hosts)
        compile_phase.run(session, m, stack, targets)
        compile_phase.prove_on_fleet_type(session, m, stack, targets)  # one on the fleet's own type, first
    what = "a rehearsal (every fleet its emulator on a cheap host type)" if rehearsal else f"manifest {m.short_digest}"
    print(f"deploying {stack} ({what}) to {m.costs.region}")
    if rehearsal:  # the file cdk synthesizes from; checked above, in memory
        from campaign.stages.rehearsal import write_rehearsal_manifest

        path = write_rehearsal_manifest(path)
    # A rehearsal's quotas are the host type's, checked in _rehearsal_preflight
    _cdk_deploy(args, path, extra=extra, session=session, compiling=hosts, check_quota=not targets and not rehearsal)
    if args.extend_hours:  # the deadline may have fired: its groups at 0 until set back
        _restore_fleets(session, stack)
    print(f"deadline: every fleet's Auto Scaling group is set to 0 at {deadline.parameter}")
    _cost_allocation_tags(session)
    if rehearsal:
        print(f"next: {prog()} run {args.manifest} --rehearsal   (then `teardown {args.manifest}`)")
    return EXIT_OK


def _rehearsal_manifest(args: argparse.Namespace) -> Manifest:
    """The rehearsal's manifest, built from the campaign's in memory (campaign.stages.rehearsal):
    the campaign's is checked first (exit 2 naming its fields), nothing is written."""
    from campaign.stages.rehearsal import load_rehearsal

    load_manifest(args.manifest)
    try:
        return load_rehearsal(Path(args.manifest))
    except ValueError as exc:
        raise BadArgument(f"--rehearsal: {exc}") from None


def _preflight_seams(session: Any, m: Manifest) -> list[Any]:
    """The rehearsal's seams observed before anything starts: every image reference exists, the
    host type's vCPUs fit the account's quotas."""
    from campaign.aws.rehearsal_seams import quotas_seam
    from campaign.pin.image_check import check_images, image_references, images_seam, mirrors_from_env

    try:
        mirrors = mirrors_from_env()
    except ValueError as exc:
        raise BadArgument(str(exc)) from None
    checks = check_images(image_references(m), ecr=session.client("ecr"), mirrors=mirrors)
    return [images_seam(checks), quotas_seam(session, m)]


def _rehearsal_preflight(session: Any, m: Manifest) -> None:
    seams = _preflight_seams(session, m)
    for seam in seams:
        print(seam.line())
    bad = next((s for s in seams if s.passed is False), None)
    if bad is not None:
        raise aws.AwsStepFailed(f"{bad.name}: {bad.error}; {bad.fix}; nothing was deployed")


def _suggest_rehearsal(session: Any, m: Manifest, stack: str) -> None:
    """One line suggesting `deploy --rehearsal` where the campaign's results bucket records no
    passed rehearsal (or none can be read): never a refusal."""
    from campaign.aws.rehearsal_report import read_record

    why = "no stack deployed yet"
    try:
        cfg = read_run_config(session.client("cloudformation"), stack)
        record = read_record(session.client("s3"), cfg.results_uri, m.campaign)
        if record is not None and record.passed:
            return
        why = "its rehearsal did not pass" if record is not None else "no rehearsal recorded in its results bucket"
    except Exception:  # no stack (CloudRunError), AccessDenied: the suggestion stands
        pass
    print(
        f"note: {m.campaign} has no passed rehearsal ({why}): `deploy {m.source.name if m.source else 'MANIFEST'} "
        "--rehearsal` runs the whole AWS path on cheap instances first (`plan --rehearsal` prices it)"
    )


def _cost_allocation_tags(session: Any) -> None:
    """Whether the tags the report reads the bill by are activated cost allocation tags, and what to
    activate: until they are, Cost Explorer answers no rows for the campaign. A refusal (no
    ce:ListCostAllocationTags, an endpoint without the call) is a line, never a failed deploy."""
    from botocore.exceptions import BotoCoreError

    from analysis.errors import SourceUnavailable
    from analysis.sources.billing import CE_REQUEST_USD, COST_ALLOCATION_TAGS, activation_advice, tag_activation

    keys = ", ".join(COST_ALLOCATION_TAGS)
    try:
        # Cost Explorer's one endpoint is in us-east-1 (as analysis.report.inputs.AwsClients asks it)
        status, requests = tag_activation(session.client("ce", region_name="us-east-1"))
    except (SourceUnavailable, BotoCoreError) as exc:  # BotoCoreError: no client for Cost Explorer at all
        print(
            f"billing: the cost allocation tags {keys} could not be checked ({exc}); the report reads the bill by them: "
            f"{activation_advice()}"
        )
        return
    states = ", ".join(f"{k} {v}" for k, v in status.items())
    print(
        f"billing: cost allocation tags {states} (ListCostAllocationTags: {requests} request(s), "
        f"{requests * CE_REQUEST_USD:.2f} USD)"
    )
    inactive = [k for k, v in status.items() if v != "Active"]
    if inactive:
        print(
            f"billing: until {', '.join(inactive)} {'is' if len(inactive) == 1 else 'are'} active, Cost Explorer "
            f"answers no rows for this campaign and the report says the bill is not known: {activation_advice(inactive)}"
        )


def _restore_fleets(session: Any, stack: str) -> None:
    """After `--extend-hours`' stack update: every group the deadline left below its template's
    sizes set back (campaign.aws.fleet_sizes), each named."""
    from campaign.aws.fleet_sizes import restore_fleet_sizes

    try:
        restored, notes = restore_fleet_sizes(session, stack)
    except Exception as exc:  # botocore: AccessDenied on GetTemplate or UpdateAutoScalingGroup, throttling
        raise aws.AwsStepFailed(
            f"the stack is updated with the new deadline, but its Auto Scaling groups could not be checked or set back "
            f"to their template's sizes ({type(exc).__name__}: {exc}); a group the deadline set to 0 stays there: "
            "`aws autoscaling describe-auto-scaling-groups` shows them"
        ) from None
    for r in restored:
        print(r.line())
    for note in notes:
        print(f"fleet sizes: {note}")
    if not restored:
        print("fleet sizes: every Auto Scaling group is at its template's min, max and desired: none set back")


def _deadline(args: argparse.Namespace, m: Manifest, session: Any, stack: str) -> aws.Deadline:
    """One deadline for this deploy's every `cdk deploy` (the compile phase's included), printed with
    what still bills after it, before anything is deployed."""
    from campaign.plan.predict import billing_after_deadline

    assert m.max_campaign_hours is not None  # cloud_issues refused a manifest without it
    deployed = aws.deployed_deadline(session.client("cloudformation"), stack)
    deadline = aws.campaign_deadline(
        m.max_campaign_hours, now=aws.utc_now(), deployed=deployed, extend_hours=args.extend_hours
    )
    print(f"deadline {deadline.parameter}: {deadline.how}")
    print("warning: after the deadline the fleets are at 0, but these still bill until `teardown`:")
    for line in billing_after_deadline(m):
        print(f"  {line}")
    return deadline


def _cdk_deploy(args: argparse.Namespace, path: Path, *, extra: list[str], session: Any, **kw: Any) -> None:
    rc = aws.deploy(path, approve=args.yes, extra=extra, session=session, **kw)
    if rc != 0:
        raise aws.AwsStepFailed(f"cdk deploy exited {rc} (its output above says why)")


def cmd_run(args: argparse.Namespace) -> int:
    # Imported where used, as the other commands' are: they would add ~0.5 s to every CLI start.
    from campaign.backends.fargate.campaign import run_campaign
    from campaign.plan.plan_file import planned_cost, predicted_boundaries

    if args.attach is not None and (args.detach or args.resume is not None):
        raise BadArgument("--attach follows a run already started: give it without --detach or --resume")
    if getattr(args, "rehearsal", False):
        return _rehearse(args)
    m = load_manifest(args.manifest)
    if args.attach is not None:
        return _attach(m, _run_id("--attach", args.attach))
    check_workload(m)  # every bad trace row, before any task starts
    predicted = predicted_boundaries(Path(args.from_plan), m) if args.from_plan else None
    planned = planned_cost(Path(args.from_plan), m, "--from-plan") if args.from_plan else None
    resume_id = _run_id("--resume", args.resume) if args.resume is not None else None  # before any AWS call
    if args.detach:
        return _detach(args, m, predicted, planned, resume_id)
    result = run_campaign(
        aws_session(m.costs.region),
        m,
        Path(args.out),
        duration_s=args.duration,
        capacity=not args.no_capacity,
        final_report=not args.no_report,
        predicted=predicted,
        planned_cost=planned,
        stage_minutes=lambda: _stage_minutes(args, m),
        resume_id=resume_id,
    )  # CloudRunError: exit 1; PastDeadline: exit 1 before the gate or replay that would outlast the deadline
    if result.report is not None:
        rep = result.report
        print(f"decision: {rep.decision.state.upper()} — " + "; ".join(rep.decision.reasons))
        print(f"report: {result.run_dir / 'report.html'} (and under {result.uri}/)")
    else:
        print(f"next: python -m campaign report {args.manifest} --run-id {result.run_id} --aws --out {result.run_dir}")
    return result.exit_code


# The options a rehearsal's fixed shape leaves no room for (core.rehearsal): it detaches and attaches itself.
REHEARSAL_EXCLUDES = ("attach", "detach", "resume", "duration", "no_capacity", "from_plan", "no_report")


def _rehearse(args: argparse.Namespace) -> int:
    """`run MANIFEST --rehearsal`: the fixed rehearsal on the stack `deploy --rehearsal` left
    (campaign.backends.fargate.rehearsal); exit 0 when every seam passed, 1 naming the first that did not."""
    from campaign.aws.rehearsal_report import STACK, RehearsalReport, failed
    from campaign.backends.fargate.ecs_tasks import EcsTaskLauncher
    from campaign.backends.fargate.rehearsal import rehearse

    given = [f"--{k.replace('_', '-')}" for k in REHEARSAL_EXCLUDES if getattr(args, k, None) not in (None, False)]
    if given:
        raise BadArgument(f"--rehearsal runs a fixed shape and detaches and attaches itself: drop {', '.join(given)}")
    from campaign.stages.rehearsal import write_rehearsal_manifest

    campaign_m = load_manifest(args.manifest)
    m = _rehearsal_manifest(args)  # in memory: refused (and a stack not found) before anything is written
    check_workload(m)
    session = aws_session(m.costs.region)
    checked = _preflight_seams(session, m)
    stack = aws.stack_name(m)
    try:
        cfg = read_run_config(session.client("cloudformation"), stack)
    except Exception as exc:  # no stack (CloudRunError), AccessDenied
        report = RehearsalReport(m.campaign, campaign_m.digest, m.digest, seams=list(checked))
        report.add(
            failed(STACK, f"{stack}: its run config not readable", exc, f"`deploy {args.manifest} --rehearsal` first")
        )
        for line in report.lines():
            print(line)
        return report.exit_code
    m = load_manifest(write_rehearsal_manifest(Path(args.manifest)))  # the file the conductor uploads
    run_id = cc.new_run_id()
    report = rehearse(
        session,
        m,
        campaign_m.digest,
        cfg,
        EcsTaskLauncher(session.client("ecs"), cfg, run_id),
        Path(args.out),
        checked=checked,
        run_id=run_id,
    )
    if report.run_id:
        print(
            f"report: {prog()} report {m.source} --run-id {report.run_id} --aws --out {Path(args.out) / report.run_id}"
        )
    print(f"then:   {prog()} teardown {args.manifest}")
    return report.exit_code


def _run_id(option: str, value: str) -> str:
    """A run id given to `option`, checked before any AWS call."""
    try:
        return cc.check_run_id(value)
    except ValueError as exc:
        raise BadArgument(f"{option}: {exc}") from None


def _detach(
    args: argparse.Namespace,
    m: Manifest,
    predicted: dict[str, float] | None,
    planned: Any,
    resume_id: str | None,
) -> int:
    """`run --detach`: the conductor task runs the campaign (campaign.backends.fargate.conductor)."""
    from dataclasses import asdict

    from campaign.backends.fargate.conductor import ConductorRequest, detach
    from campaign.backends.fargate.ecs_tasks import EcsTaskLauncher

    session = aws_session(m.costs.region)
    cfg = read_run_config(session.client("cloudformation"), aws.stack_name(m))
    run_id = resume_id or cc.new_run_id()
    minutes = _stage_minutes(args, m) if cfg.deadline else None  # the conductor holds each stage to the deadline
    request = ConductorRequest(
        run_id,
        resume_id is not None,
        duration_s=args.duration,
        capacity=not args.no_capacity,
        final_report=not args.no_report,
        predicted=predicted,
        planned_cost=asdict(planned) if planned is not None else None,
        stage_minutes=dict(minutes) if minutes is not None else None,
        requested_at=time.time(),
    )
    task = detach(session, m, cfg, EcsTaskLauncher(session.client("ecs"), cfg, run_id), request)
    print(f"run {run_id}: the conductor {task} runs it in the stack; this terminal may close")
    print(f"follow it:  {prog()} run {args.manifest} --attach {run_id}")
    print(f"if it dies: {prog()} run {args.manifest} --resume {run_id} --detach")
    return EXIT_OK


def _attach(m: Manifest, run_id: str) -> int:
    from campaign.backends.fargate.conductor import attach
    from campaign.backends.fargate.ecs_tasks import EcsTaskLauncher

    session = aws_session(m.costs.region)
    cfg = read_run_config(session.client("cloudformation"), aws.stack_name(m))
    try:
        return attach(session, cfg, run_id, EcsTaskLauncher(session.client("ecs"), cfg, run_id))
    except KeyboardInterrupt:
        print(f"\ndetached from run {run_id}; it goes on (`run --attach {run_id}` follows it again)")
        return EXIT_OK


def cmd_conduct(args: argparse.Namespace, **offline: Any) -> int:
    """In the conductor task: the run's stages, as `run` runs them (campaign.backends.fargate.conductor).
    `offline`: conduct's launcher, concurrent, poll_s and stand_in, given by the offline cloud run
    (testing/offline_conductor.py) in place of ECS RunTask."""
    import os

    from campaign.backends.fargate.conductor import conduct

    stack = os.environ.get(cc.ENV_STACK_NAME, "")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
    if not stack or not region:
        raise BadArgument(
            f"conduct runs in the conductor task, whose definition sets {cc.ENV_STACK_NAME} and AWS_DEFAULT_REGION "
            "(start it with `run --detach`)"
        )
    work = Path(os.environ.get(cc.ENV_WORK_DIR) or "/data")
    return conduct(aws_session(region), stack, _run_id("conduct", args.run_id), work, resume=args.resume, **offline)


def _stage_minutes(args: argparse.Namespace, m: Manifest) -> dict[str, float]:
    """The plan's minutes per stage, which each stage must end within before the stack's deadline:
    the saved plan's with --from-plan, else the plan computed here (about 10 s of simulated time)."""
    if args.from_plan:
        from campaign.plan.plan_file import planned_stage_minutes

        return planned_stage_minutes(Path(args.from_plan), m)
    from campaign.plan.predict import predict

    print("deadline: planning each stage's minutes (campaign plan, in simulated time) ...")
    return predict(m).minutes


def cmd_teardown(args: argparse.Namespace) -> int:
    m = load_manifest(args.manifest)
    session = aws_session(m.costs.region)
    rehearsal_uri = _rehearsal_results_uri(session, aws.stack_name(m))
    if not args.check_only:
        out = Path(args.out)
        run_dir = Path(args.run_dir) if args.run_dir else None
        if args.run_id:
            from campaign.backends.fargate.campaign import fetch_run

            try:
                run_dir = fetch_run(session, m, args.run_id, out / "run")
            except CampaignError as exc:  # main prints it, and this note, and exits with its code
                exc.add_note("nothing was destroyed")
                raise
        if run_dir is not None:
            from campaign.stages.run import report_from_run_dir

            report_from_run_dir(m, run_dir, out)
            print(f"report written first: {out / 'report.html'}")
        else:
            print("no --run-id or --run-dir given: no report written before teardown", file=sys.stderr)
        _stop_left_tasks(session, m)
        try:  # read before the template goes; a report, never a reason not to tear down
            assets = cdk_assets.stack_assets(session, aws.stack_name(m))
        except Exception as exc:  # botocore: AccessDenied on GetTemplate, throttling, endpoint errors
            print(f"CDK assets not read ({type(exc).__name__}: {exc}); tearing down anyway", file=sys.stderr)
            assets = []
        rc = aws.destroy(session, aws.stack_name(m))
        if rc != 0:
            print(f"stack deletion failed (exit {rc}); checking what is left anyway", file=sys.stderr)
        _report_cdk_assets(session, assets)
    left, kept = aws.check_nothing_left(session, m.campaign)
    for x in kept:
        print(f"kept by design: {x.arn}")
    if rehearsal_uri:
        _record_teardown(session, rehearsal_uri, m.campaign, left)
    if left:
        print(f"{len(left)} resource(s) still tagged campaign={m.campaign}:", file=sys.stderr)
        for x in left:
            print(f"  LEFT RUNNING: {x.arn} {json.dumps(x.tags, sort_keys=True)}", file=sys.stderr)
        return EXIT_FAILED_STEP
    print(f"nothing tagged campaign={m.campaign} is left running")
    return EXIT_OK


def _rehearsal_results_uri(session: Any, stack: str) -> str:
    """The results URI of a stack deployed as a rehearsal ("" for a campaign's stack, or none):
    read before it goes, for teardown's line in the rehearsal record."""
    from campaign.aws.rehearsal_seams import is_rehearsal_stack

    try:
        (desc,) = session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
        return read_run_config(session.client("cloudformation"), stack).results_uri if is_rehearsal_stack(desc) else ""
    except Exception:  # no stack: nothing of a rehearsal to record
        return ""


def _record_teardown(session: Any, results_uri: str, campaign: str, left: list[aws.Leftover]) -> None:
    """The rehearsal record's teardown seam: what the leftover check found."""
    from campaign.aws.rehearsal_report import TEARDOWN, Seam, failed, put_record, read_record

    try:
        s3 = session.client("s3")
        record = read_record(s3, results_uri, campaign)
        if record is None:
            return
        record.add(
            failed(TEARDOWN, f"{len(left)} resource(s) left", f"left: {left[0].arn}", "delete them (listed below)")
            if left
            else Seam(TEARDOWN, True, f"the stack deleted; nothing tagged campaign={campaign} left running")
        )
        print(f"rehearsal record updated with teardown's check: {put_record(s3, results_uri, record)}")
    except Exception as exc:  # the leftover check stands; the record keeps its teardown pending
        print(f"rehearsal record not updated ({type(exc).__name__}: {exc})", file=sys.stderr)


def _report_cdk_assets(session: Any, assets: list[cdk_assets.CdkAsset]) -> None:
    """The stack's CDK assets still stored: the bootstrap's, shared, so reported, not deleted."""
    try:
        stored = cdk_assets.still_stored(session, assets)
    except Exception as exc:  # the leftover check that follows must still run
        print(f"CDK assets not checked ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    for asset, mb in stored:
        size = f", {mb:,.0f} MB" if mb is not None else ""
        print(f"kept by the CDK bootstrap (shared by every CDK app in this account and region{size}): {asset}")
    if stored:
        print(f"  `{cdk_assets.gc_command(session)}` deletes the bootstrap's assets no stack uses any more")


def _stop_left_tasks(session: Any, m: Manifest) -> None:
    """Tasks a run started are no stack resources: stop them, or the cluster cannot be deleted."""
    from campaign.backends.fargate.ecs_tasks import stop_run_tasks

    try:
        cfg = read_run_config(session.client("cloudformation"), aws.stack_name(m))
        stopped = stop_run_tasks(session.client("ecs"), cfg.cluster)
    except Exception as exc:  # no stack, no cluster: nothing of a run can be left running in it
        print(f"no load-generator tasks to stop ({type(exc).__name__}: {exc})")
        return
    for arn in stopped:
        print(f"stopped load-generator task {arn}")


def _positive_hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        hours = float("nan")
    if not hours > 0 or hours == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of hours, got {text!r}")
    return hours


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]

    d = sub.add_parser(
        "deploy",
        help="npx cdk deploy the comparison environment (refuses an invalid manifest); a Neuron fleet whose host memory "
        "is at risk is compiled once on a larger host first, every fleet at 0 until its set is published",
    )
    d.add_argument("manifest", help=MANIFEST_HELP)
    d.add_argument("--yes", action="store_true", help="do not ask to approve IAM / security-group changes")
    d.add_argument(
        "--ami",
        action="append",
        metavar="FLEET=AMI_ID",
        help="the fleet's AMI id (repeatable); needed for NVIDIA fleets, whose DLAMI description names no driver",
    )
    d.add_argument(
        "--weights-s3-uri",
        metavar="S3_URI",
        help="stage the checkpoint from s3://bucket/prefix/<commit>/ instead of the Hub (no hub token needed)",
    )
    d.add_argument("--docker-hub-credential-arn", metavar="SECRET_ARN", help=DOCKER_HUB_CREDENTIAL_HELP)
    d.add_argument(
        "--no-compile-phase",
        action="store_true",
        help="never compile a fleet once on a larger host first (the compile phase `plan` shows for a Neuron fleet "
        "whose host memory is at risk): refuse such a fleet unless its compiled set is already published",
    )
    d.add_argument(
        "--extend-hours",
        type=_positive_hours,
        metavar="N",
        help="move the deployed stack's deadline (when every fleet's group is set to 0) N hours later; without it a "
        "deployed stack keeps its deadline and a new one gets deploy time + max_campaign_hours",
    )
    d.add_argument(
        "--rehearsal",
        action="store_true",
        help="deploy the same stacks with every accelerator fleet its emulator on the cheapest fit host type (`plan "
        "--rehearsal` names it and prices the rehearsal), no compile phase, no weights; every image reference and the "
        "quotas are checked first; then `run --rehearsal` and `teardown`",
    )
    d.set_defaults(handler=cmd_deploy)

    r = sub.add_parser(
        "run",
        help="the whole campaign on the deployed fleets: readiness and quality gate, trace replay, capacity search and settle "
        "phase per fleet (fresh Fargate master + workers per step), then the report",
    )
    r.add_argument("manifest", help=MANIFEST_HELP + "; the one its stack was deployed from")
    r.add_argument(
        "--duration", type=float, help="replay only the first S seconds of the schedule (default: the whole window)"
    )
    r.add_argument(
        "--out", default=f"runs/aws-{time.strftime('%Y%m%d')}", help="where the run's local copy goes (under <run id>/)"
    )
    r.add_argument(
        "--no-capacity", action="store_true", help="stop after the trace replay: no capacity search, no settle phase"
    )
    r.add_argument("--from-plan", metavar="FILE", help=FROM_PLAN_HELP)
    r.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue a run that was cut off, under its own id and prefix: stop its leftover tasks, skip what "
        "finished (its search steps included), run the step it was cut off in again from its start (its partial "
        "records kept apart, under interrupted/); refused unless the manifest, schedule and --from-plan are the run's",
    )
    r.add_argument(
        "--no-report",
        action="store_true",
        help="do not build the report at the end (`campaign report --run-id` builds it)",
    )
    r.add_argument(
        "--detach",
        action="store_true",
        help="run the campaign in the stack's conductor task, not in this terminal (which may then close): prints the "
        "run id; with --resume, a new conductor picks the run up (any of it still running is stopped first)",
    )
    r.add_argument(
        "--attach",
        metavar="RUN_ID",
        help="follow a run's progress lines (detached or in another terminal; the Locust web UI port-forward commands among them) until it "
        "ends; exits with its decision's code; Ctrl-C detaches, the run goes on",
    )
    r.add_argument(
        "--rehearsal",
        action="store_true",
        help="the fixed rehearsal on a stack `deploy --rehearsal` left: the gate, a 2-minute replay, 2 capacity steps "
        "and a settle segment per fleet, through one --detach / --attach it performs itself; prints one line per AWS "
        "seam with what was observed; exits 0 when every seam passed, 1 naming the first that did not",
    )
    r.set_defaults(handler=cmd_run)

    c = sub.add_parser(
        "conduct",
        help="(in the conductor task, started by `run --detach`) run RUN_ID's campaign from the inputs under its prefix",
    )
    c.add_argument(
        "run_id", metavar="RUN_ID", help="the run `run --detach` started (its inputs and request are under its prefix)"
    )
    c.add_argument(cc.RESUME_FLAG, action="store_true", help="continue the run from what its prefix holds")
    c.set_defaults(handler=cmd_conduct)

    t = sub.add_parser(
        "teardown",
        help="report first, then stop a run's tasks and delete the stack, then list anything still tagged with the campaign",
    )
    t.add_argument("manifest", help=MANIFEST_HELP + "; the one its stack was deployed from")
    t.add_argument(
        "--run-id",
        help="the run to report on (as `run` printed it), or its s3:// URI; its records are downloaded first",
    )
    t.add_argument("--run-dir", help="a run's local directory (as `run` left it under --out) instead of --run-id")
    t.add_argument("--out", default="runs/aws-report", help="where the report goes")
    t.add_argument("--check-only", action="store_true", help="skip report and destroy; only list what is still tagged")
    t.set_defaults(handler=cmd_teardown)
