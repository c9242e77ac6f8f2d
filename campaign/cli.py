"""`python -m campaign` (installed: `inf2-vs-g6`): one entry point for every step of a campaign.

Each subcommand registers itself here; bad input exits 2 with `field.path: reason` lines,
never a traceback. Every project error derives from `core.errors.CampaignError` and is
caught once, in `main`, which prints it and exits with the error's own exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from campaign.plan_file import FROM_PLAN_HELP
from core.errors import EXIT_FAILED_STEP, EXIT_INTERRUPTED, EXIT_OK, CampaignError, exit_code_table
from core.manifest import Manifest, ManifestError, load_manifest
from core.traces import TraceError

Handler = Callable[[argparse.Namespace], int]


def _load(path: str) -> Manifest:
    return load_manifest(path)


def cmd_validate(args: argparse.Namespace) -> int:
    from core.schedule import check_workload

    m = _load(args.manifest)
    if args.target == "cloud":
        from campaign.cloud_checks import cloud_issues

        issues = cloud_issues(
            m, weights_from_s3=bool(args.weights_s3_uri), docker_hub_credential_arn=args.docker_hub_credential_arn
        )
        if issues:
            raise ManifestError(issues, args.manifest)
    scheduled = len(check_workload(m))  # the whole trace: every bad row listed (TraceError), exit 2
    print(
        f"ok: {args.manifest} campaign={m.campaign} digest={m.digest} (checked for a {args.target} campaign); "
        f"trace {m.trace_path.name}: {scheduled} requests scheduled"
    )
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    from campaign.plan import plan, render_text
    from campaign.plan_file import plan_document

    m = _load(args.manifest)
    plans = plan(m)
    fits = all(p.fits for p in plans)
    prediction = None
    if fits and not args.no_simulate:
        from campaign.plan_campaign import StepOverhead, predict, render

        overhead = StepOverhead.measured_in(Path(args.overhead_from)) if args.overhead_from else StepOverhead()
        prediction = predict(m, overhead=overhead)
    out = plan_document(m, [p.as_dict() for p in plans], prediction.as_dict() if prediction is not None else None)
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render_text(m, plans))
        if prediction is not None:
            print(render(prediction))
    if args.save:
        # stderr: --json's stdout stays one JSON document
        print(
            f"plan saved to {args.save} (`local/run --from-plan {args.save}` starts each search there)", file=sys.stderr
        )
    return EXIT_OK if fits else EXIT_FAILED_STEP


def cmd_local(args: argparse.Namespace) -> int:
    from campaign.local import run_local
    from core.schedule import check_workload

    m = _load(args.manifest)
    check_workload(m)  # a bad trace row stops it here, before any fleet starts
    predicted = None
    if args.from_plan:
        from campaign.plan_file import predicted_boundaries

        predicted = predicted_boundaries(Path(args.from_plan), m)  # a bad or stale plan stops it here too
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
    ).exit_code


# validate --for cloud and deploy take the same flag (campaign.cloud_checks, stacks/image_cache.py).
DOCKER_HUB_CREDENTIAL_HELP = (
    "with --for cloud / deploy: ARN of the Secrets Manager secret (named ecr-pullthroughcache/..., in the manifest's "
    "region) holding Docker Hub credentials; the stack's ECR pull-through cache pulls every Docker Hub image "
    "(vLLM, Prometheus) with them instead of anonymously (docs/cloud.md)"
)

# The positional every campaign command takes (report_cli and aws_cli register theirs with it too).
MANIFEST_HELP = "the campaign's manifest (YAML: model, fleets, workload trace, SLOs, prices; e.g. manifests/llama3-8b-inf2-vs-g6.yaml)"

CONSOLE_SCRIPT = "inf2-vs-g6"  # pyproject's [project.scripts] entry: the same main as `python -m campaign`


def _prog() -> str:
    """The name the user called: the console script's, else `python -m campaign`."""
    return CONSOLE_SCRIPT if Path(sys.argv[0]).name == CONSOLE_SCRIPT else "python -m campaign"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=_prog(),
        description="Decide, with evidence, whether an LLM endpoint should run on Inf2 or G6.",
        epilog=exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's table keeps its lines
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    from campaign import aws_cli, report_cli

    report_cli.register(sub)
    aws_cli.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except ManifestError as exc:
        print(f"invalid manifest {exc.source or args.manifest}:", file=sys.stderr)
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        return exc.exit_code
    except TraceError as exc:
        lines = len({p.line for p in exc.problems})
        print(f"invalid trace {exc.path}: {len(exc.problems)} problem(s) on {lines} line(s):", file=sys.stderr)
        for problem in exc.problems:
            print(problem, file=sys.stderr)  # path:line: field: reason
        return exc.exit_code
    except CampaignError as exc:
        print(f"{args.command}: {exc}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # added on the way up, e.g. teardown's "nothing was destroyed"
            print(f"{args.command}: {note}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
