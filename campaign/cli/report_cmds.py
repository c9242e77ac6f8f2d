"""`python -m campaign report MANIFEST --records DIR [--prometheus URL [--prometheus-sigv4 REGION]] [--aws] --out DIR`, and
`python -m campaign render REPORT_JSON --out DIR` (the pages again from a report.json).

campaign/cli/main.py calls `register` to add the subcommands. Exit codes (core/errors.py's table):
0 Go, 10 Defer, 11 Reject (the report was written in all three), 2 bad input (nothing written),
1 a remote source failed. Every error is raised, never printed here: campaign/cli/main.py's `main`
prints it and exits with its code.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.errors import AnalysisError
from analysis.model import QualityResult
from campaign.cli.help import MANIFEST_HELP
from core.errors import EXIT_BAD_INPUT as EXIT_BAD_INPUT  # re-exported: tests and callers read the codes from here too
from core.errors import EXIT_BY_DECISION, BadArgument

if TYPE_CHECKING:
    from analysis.report.inputs import PlannedCost
    from core.manifest import Manifest

EXIT_BY_STATE = EXIT_BY_DECISION  # the decision's exit code (core/errors.py)


def _quality(path: str) -> dict[str, QualityResult]:
    from campaign.stages.run import read_quality

    try:
        quality = read_quality(Path(path))
    except AnalysisError as exc:
        raise BadArgument(f"--quality {exc}") from None
    if quality is None:
        raise BadArgument(f"--quality {path}: no such file")
    return quality


def _instances(pairs: list[str]) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (pair.split("=", 1) for pair in pairs)}
    except ValueError:
        raise BadArgument(f"--instances takes FLEET=N pairs, got {' '.join(pairs)}") from None


def _prometheus(url: str | None, sigv4_region: str | None) -> str | None:
    """--prometheus (and --prometheus-sigv4) checked before anything is read: a plain Prometheus,
    or an AMP workspace's URL (signed for its own region)."""
    from analysis.sources.prometheus import prometheus_endpoint

    if url is None:
        if sigv4_region is not None:
            raise BadArgument("--prometheus-sigv4 signs the queries to --prometheus URL: give --prometheus too")
        return None
    try:
        prometheus_endpoint(url, sigv4_region)
    except ValueError as exc:
        raise BadArgument(f"--prometheus: {exc}") from None
    return url


def stack_prometheus(session: Any, m: Manifest) -> str | None:
    """For `report --run-id` without --prometheus: the stack's Prometheus workspace, whose series
    outlive the run; None, saying why, when the stack (and with it the workspace) is gone."""
    from campaign.aws import stack as aws
    from campaign.aws.run_config import CloudRunError, read_run_config
    from core.cloud_contract import PROMETHEUS_QUERY_OUTPUT

    stack = aws.stack_name(m)
    try:
        url = read_run_config(session.client("cloudformation"), stack).prometheus_url
    except CloudRunError as exc:
        print(
            f"prometheus: none ({exc}); the histograms come from the run's pulled/ answers, else the records alone",
            flush=True,
        )
        return None
    if not url:
        print(
            f"prometheus: stack {stack} has no {PROMETHEUS_QUERY_OUTPUT} output; the histograms come from the run's "
            "pulled/ answers, else the records alone"
        )
        return None
    print(f"prometheus: {url} (stack {stack}'s workspace, queried with SigV4)", flush=True)
    return url


def _planned_cost(given: str | None, m: Manifest, run_dir: Path | None) -> PlannedCost | None:
    """--plan FILE's campaign cost, else the run directory's plan.json (`plan --save RUN_DIR/plan.json`)
    where there is one, else None (the run's campaign.json may still hold the plan it was given)."""
    from campaign.plan.plan_file import RUN_DIR_PLAN, planned_cost

    if given:
        return planned_cost(Path(given), m)
    if run_dir is not None and (run_dir / RUN_DIR_PLAN).is_file():
        return planned_cost(run_dir / RUN_DIR_PLAN, m, flag="the run directory's plan")
    return None


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.capacity.steps import discover_steps
    from campaign.stages.run import RunFacts, run_report
    from core.manifest import load_manifest

    m = load_manifest(args.manifest, check_files=False)
    prometheus = _prometheus(args.prometheus, args.prometheus_sigv4)
    sigv4: str | None = args.prometheus_sigv4
    quality = _quality(args.quality) if args.quality else None
    instances = _instances(args.instances) if args.instances else None
    capacity = None
    if args.capacity:
        capacity = discover_steps(Path(args.capacity))
        if not capacity:
            raise BadArgument(f"--capacity {args.capacity}: no step directories (x<k>/ or <fleet>/x<k>/) found")
    records = args.records
    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.run_id:  # the run's directory is downloaded from the results bucket first
        from campaign.aws.session import aws_session
        from campaign.backends.fargate.campaign import fetch_run

        session = aws_session(m.costs.region)
        run_dir = fetch_run(session, m, args.run_id, Path(args.out) / "run")
        if not prometheus:
            prometheus = stack_prometheus(session, m)
            # the stack's own workspace, signed for the stack's region as `run` signs it (CloudFleets.facts)
            sigv4 = sigv4 or (m.costs.region if prometheus else None)
    if run_dir is not None:  # the same report the run itself built, from the same files
        from analysis.sources.pulled import BILLING
        from campaign.stages.run import report_from_run_dir

        if records or capacity or quality or instances:
            raise BadArgument(
                "--run-id / --run-dir take the records, capacity, quality and instances from the run: drop "
                "--records, --capacity, --quality and --instances"
            )
        rep = report_from_run_dir(
            m,
            run_dir,
            Path(args.out),
            prometheus_url=prometheus,
            prometheus_sigv4_region=sigv4,
            planned_cost=_planned_cost(args.plan, m, run_dir),
            focus_csv=args.focus,
            # --run-id asks Cost Explorer again: the bill pulled minutes after the run may have been
            # refreshed since (up to 24 h, analysis.sources.billing.NO_ROWS); --run-dir reads the
            # run's own answer, dated when it was pulled. Every other answer is the run's either way.
            pull_again=(BILLING,) if args.run_id else (),
        )
        print(f"{rep.decision.state.upper()}: " + "; ".join(rep.decision.reasons))
        print(f"wrote {args.out}/report.json, report.md, report.html")
        return EXIT_BY_DECISION[rep.decision.state]
    if not records:
        raise BadArgument("give --records DIR, --run-dir DIR or --run-id RUN_ID")
    facts = RunFacts(
        instances or {},
        aws=args.aws,
        prometheus_url=prometheus,
        prometheus_sigv4_region=args.prometheus_sigv4,
        planned_cost=_planned_cost(args.plan, m, None),
    )
    rep = run_report(
        m, Path(args.out), Path(args.out), quality, facts, capacity, None, focus_csv=args.focus, records_dir=records
    )
    state = rep.decision.state
    print(f"{state.upper()}: " + "; ".join(rep.decision.reasons))
    print(f"wrote {args.out}/report.json, report.md, report.html")
    return EXIT_BY_DECISION[state]


def cmd_render(args: argparse.Namespace) -> int:
    """report.md and report.html again from a report.json, which must validate against the report model."""
    from analysis.model import load_report
    from analysis.report.build import write_pages

    rep = load_report(args.report_json)  # ReportInvalid: exit 2, printed by main
    write_pages(rep, args.out)
    print(f"{rep.decision.state.upper()}: " + "; ".join(rep.decision.reasons))
    print(f"wrote {args.out}/report.md, report.html")
    return EXIT_BY_DECISION[rep.decision.state]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "report", help="records + metrics + prices -> report.json/.md/.html and a Go/Defer/Reject"
    )
    p.add_argument("manifest", help=MANIFEST_HELP + "; the one the records were made with (their digest must match)")
    p.add_argument(
        "--records",
        help="directory holding records-*.jsonl / records-*.parquet, or an s3://BUCKET/PREFIX read in place",
    )
    p.add_argument(
        "--run-id",
        help="a cloud run (as `campaign run` printed it, or its s3:// URI): its directory is downloaded into "
        "--out DIR/run and reported as `campaign run` did",
    )
    p.add_argument(
        "--run-dir",
        help="a run's directory as `campaign local` or `campaign run` left it (records/, capacity/, metrics/, "
        "quality.json, campaign.json; plan.json when present): the report again from the same files, the per-step "
        "server figures from metrics/ with no Prometheus",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus for the merged-histogram percentiles: a base URL (http://127.0.0.1:9090), or an Amazon "
        "Managed Prometheus workspace's query URL (https://aps-workspaces.REGION.amazonaws.com/workspaces/ID"
        "[/api/v1/query]), queried signed with SigV4 (needs aps:QueryMetrics); with --run-id, the stack's "
        "workspace when not given",
    )
    p.add_argument(
        "--prometheus-sigv4",
        metavar="REGION",
        help="sign the queries to --prometheus with SigV4 for service aps in REGION though it is not an AMP "
        "workspace's URL (a stand-in such as testing/sigv4_proxy.py)",
    )
    p.add_argument("--aws", action="store_true", help="pull prices, CloudWatch and Cost Explorer from AWS")
    p.add_argument("--quality", help="JSON file: {fleet: {passed, pass_rate, failures}}")
    p.add_argument("--instances", nargs="*", metavar="FLEET=N", help="instances in service per fleet during the run")
    p.add_argument(
        "--focus",
        metavar="CSV",
        help="FOCUS billing export: a CSV file, s3://BUCKET/KEY read in place, or s3://BUCKET/PREFIX/ (every CSV part "
        "under it) (.gz: gzip-compressed, as AWS Data Exports writes it); its BilledCost over the run's window is the "
        "report's billed campaign cost",
    )
    p.add_argument(
        "--plan",
        metavar="FILE",
        help="a plan saved by `campaign plan MANIFEST --save FILE`: its campaign cost is set beside the computed "
        "and billed ones (with --run-dir / --run-id: RUN_DIR/plan.json when present)",
    )
    p.add_argument(
        "--capacity",
        help="capacity directory: x<k>/ steps of a fixed sweep, "
        "or <fleet>/x<k>/ steps and <fleet>/search.json of the automatic search",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory for report.json, report.md and report.html (created if missing)",
    )
    p.set_defaults(handler=cmd_report)
    r = subparsers.add_parser(
        "render", help="report.json -> report.md/.html again (the JSON must validate against the report model)"
    )
    r.add_argument("report_json", help="a report.json that `report` (or `local`) wrote")
    r.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory for the new report.md and report.html (created if missing)",
    )
    r.set_defaults(handler=cmd_render)
