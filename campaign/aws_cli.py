"""CLI subcommands of the AWS path: deploy, run, teardown."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from campaign import aws
from campaign.manifest import load_manifest


def _session(region: str) -> Any:
    import boto3

    return boto3.session.Session(region_name=region)


def cmd_deploy(args: argparse.Namespace) -> int:
    from campaign.cloud_checks import cloud_issues
    from campaign.dlami import cdk_parameter_args, parse_ami_overrides, resolve_amis
    from campaign.manifest import ManifestError

    m = load_manifest(args.manifest)  # refuses to deploy an invalid manifest (exit 2 via ManifestError)
    # Illustrative hashes/digests, a gated model without a token: refused before any spend.
    issues = cloud_issues(m, weights_from_s3=bool(args.weights_s3_uri))
    if issues:
        raise ManifestError(issues, args.manifest)
    overrides = parse_ami_overrides(args.ami, [f.name for f in m.fleets])
    amis = resolve_amis(m, _session(m.costs.region).client("ec2"), overrides)
    for a in amis:
        print(f"{a.fleet}: AMI {a.image_id} {a.name!r} ({a.how})")
    print(f"deploying {aws.stack_name(m)} (manifest {m.short_digest}) to {m.costs.region}")
    context = ["-c", f"weights_s3_uri={args.weights_s3_uri}"] if args.weights_s3_uri else []
    return aws.deploy(Path(args.manifest), approve=args.yes, extra=[*context, *cdk_parameter_args(amis)])


def cmd_run(args: argparse.Namespace) -> int:
    m = load_manifest(args.manifest)
    cfn = _session(m.costs.region).client("cloudformation")
    try:
        stack = cfn.describe_stacks(StackName=aws.stack_name(m))["Stacks"][0]
    except Exception as exc:  # botocore ClientError or no credentials: say which stack we looked for
        print(f"cannot read stack {aws.stack_name(m)}: {exc}", file=sys.stderr)
        return 1
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    ui = next((v for k, v in outputs.items() if "LocustUi" in k or "LocustUI" in k), None)
    if ui is None:
        print(f"stack {aws.stack_name(m)} has no Locust UI output; outputs: {sorted(outputs)}", file=sys.stderr)
        return 1
    print(f"Locust web UI (reachable from {m.operator.cidr} only): {ui}")
    print("Start the schedule from the UI, or headless: the Fargate master replays the manifest's trace once started.")
    return 0


def cmd_teardown(args: argparse.Namespace) -> int:
    m = load_manifest(args.manifest)
    if not args.check_only:
        if args.records:
            from analysis.report import build_report

            out = Path(args.out)
            build_report(m, Path(args.records), aws=True, out_dir=out)
            print(f"report written first: {out / 'report.html'}")
        else:
            print("no --records given: no report written before teardown", file=sys.stderr)
        rc = aws.destroy(Path(args.manifest))
        if rc != 0:
            print(f"cdk destroy failed with exit code {rc}; checking what is left anyway", file=sys.stderr)
    left, kept = aws.check_nothing_left(_session(m.costs.region), m.campaign)
    for x in kept:
        print(f"kept by design: {x.arn}")
    if left:
        print(f"{len(left)} resource(s) still tagged campaign={m.campaign}:", file=sys.stderr)
        for x in left:
            print(f"  LEFT RUNNING: {x.arn} {json.dumps(x.tags, sort_keys=True)}", file=sys.stderr)
        return 1
    print(f"nothing tagged campaign={m.campaign} is left running")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("deploy", help="npx cdk deploy the comparison environment (refuses an invalid manifest)")
    d.add_argument("manifest")
    d.add_argument("--yes", action="store_true", help="do not ask to approve IAM / security-group changes")
    d.add_argument("--ami", action="append", metavar="FLEET=AMI_ID",
                   help="the fleet's AMI id (repeatable); needed for NVIDIA fleets, whose DLAMI description names no driver")
    d.add_argument("--weights-s3-uri", metavar="S3_URI",
                   help="stage the checkpoint from s3://bucket/prefix/<commit>/ instead of the Hub (no hub token needed)")
    d.set_defaults(handler=cmd_deploy)

    r = sub.add_parser("run", help="print the Locust web UI URL of the deployed load generator")
    r.add_argument("manifest")
    r.set_defaults(handler=cmd_run)

    t = sub.add_parser("teardown", help="report first, then cdk destroy, then list anything still tagged with the campaign")
    t.add_argument("manifest")
    t.add_argument("--records", help="records directory (local copy of the S3 results) for the report written first")
    t.add_argument("--out", default="runs/aws-report", help="where the report goes")
    t.add_argument("--check-only", action="store_true", help="skip report and destroy; only list what is still tagged")
    t.set_defaults(handler=cmd_teardown)
