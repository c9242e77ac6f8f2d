"""`python -m stacks.checkov_gate TEMPLATE...`: checkov on synthesized templates, every failure explained.

checkov runs from its own virtual environment (`make checkov` builds `.venv-checkov` at the pin
in stacks/requirements-checkov.txt): its dependency pins clash with the project's. Each failed
check must match an entry of stacks/checkov-accepted.yaml (check id + resource pattern, with a
reason); anything else fails the gate with the check, the resource and checkov's title.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.errors import EXIT_BAD_INPUT, CampaignError
from core.shipped import checkout_root

REPO_ROOT = Path(__file__).resolve().parent.parent
ACCEPTED_FILE = REPO_ROOT / "stacks" / "checkov-accepted.yaml"
CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"


class GateInputError(CampaignError, ValueError):
    """A malformed accepted-findings file or checkov report; the message names the entry."""

    exit_code = EXIT_BAD_INPUT


@dataclass(frozen=True)
class Accepted:
    check: str
    resource: str  # fnmatch pattern over checkov's "TYPE.LogicalId"
    reason: str


@dataclass(frozen=True)
class Finding:
    template: str
    check: str
    resource: str
    title: str


def load_accepted(path: Path = ACCEPTED_FILE) -> list[Accepted]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise GateInputError(f"{path}: expected a list of {{check, resource, reason}} entries")
    out = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or set(entry) != {"check", "resource", "reason"}:
            raise GateInputError(f"{path}: entry {i}: needs exactly the keys check, resource, reason; got {entry!r}")
        if len(str(entry["reason"]).strip()) < 30:
            raise GateInputError(
                f"{path}: entry {i} ({entry['check']}): the reason must say why, got {entry['reason']!r}"
            )
        out.append(Accepted(str(entry["check"]), str(entry["resource"]), str(entry["reason"])))
    return out


def failed_findings(report: Any, template: str) -> list[Finding]:
    """Failed checks of one checkov JSON report (one framework: a dict; several: a list of dicts)."""
    reports = report if isinstance(report, list) else [report]
    out = []
    for r in reports:
        if not isinstance(r, dict) or "results" not in r:
            raise GateInputError(f"{template}: not a checkov JSON report (no 'results')")
        if r.get("summary", {}).get("parsing_errors"):
            raise GateInputError(f"{template}: checkov could not parse the template")
        for f in r["results"].get("failed_checks", []):
            out.append(Finding(template, f["check_id"], f["resource"], f.get("check_name", "")))
    return out


def unexplained(findings: Sequence[Finding], accepted: Sequence[Accepted]) -> tuple[list[Finding], list[Accepted]]:
    """(failures no entry explains, entries that matched nothing)."""
    used: set[int] = set()
    left = []
    for f in findings:
        hits = [i for i, a in enumerate(accepted) if a.check == f.check and fnmatch.fnmatchcase(f.resource, a.resource)]
        used.update(hits)
        if not hits:
            left.append(f)
    return left, [a for i, a in enumerate(accepted) if i not in used]


def run_checkov(template: Path, checkov: Path = CHECKOV) -> Any:
    if not checkov.is_file():
        checkout_root("the checkov gate (`make checkov` builds its .venv-checkov)")  # an installed copy has no Makefile
        raise GateInputError(f"{checkov} is missing: run `make checkov` (it builds .venv-checkov)")
    proc = subprocess.run(
        [str(checkov), "-f", str(template), "--framework", "cloudformation", "-o", "json", "--quiet", "--compact"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise GateInputError(
            f"checkov on {template} printed no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}"
        ) from None


def synthesize(manifest: Path, outdir: Path, **context: str) -> Path:
    """The manifest's template, synthesized as `cdk synth` does (cdk-nag attached); `context`: more
    -c values."""
    from stacks.app_builder import build_app

    app, stack = build_app(context={"manifest": str(manifest.resolve()), **context}, outdir=str(outdir))
    app.synth()
    return outdir / f"{stack.artifact_id}.template.json"


def deploy_templates(manifest: Path, outdir: Path) -> list[Path]:
    """Every template `deploy` can create from the manifest: the plain one and, when a fleet is
    compiled first (campaign/aws/compile_phase.py), the compile phase's with every fleet that can
    be (a deploy that compiles fewer creates a subset of its resources)."""
    from core.compile_host import compile_hosts
    from core.manifest import load_manifest
    from stacks.compile_boot import COMPILE_FLEETS_CONTEXT

    templates = [synthesize(manifest, outdir / "deploy")]
    compiled = [h.fleet for h in compile_hosts(load_manifest(manifest, check_files=False)) if h.instance_type]
    if compiled:
        context = {COMPILE_FLEETS_CONTEXT: ",".join(compiled)}
        templates.append(synthesize(manifest, outdir / "compile-phase", **context))
    return templates


def rehearsal_template(manifest: Path, outdir: Path) -> Path:
    """The template `deploy --rehearsal` creates from the manifest (-c rehearsal=1, issue 51)."""
    from core.naming import REHEARSAL_CONTEXT

    return synthesize(manifest, outdir / "rehearsal", **{REHEARSAL_CONTEXT: "1"})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stacks.checkov_gate", description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "templates", nargs="*", type=Path, help="synthesized CloudFormation templates (cdk.out/*.template.json)"
    )
    p.add_argument(
        "--manifest",
        action="append",
        type=Path,
        default=[],
        help="synthesize every template deploy can create from this manifest first (repeatable)",
    )
    p.add_argument(
        "--rehearsal",
        action="append",
        type=Path,
        default=[],
        help="synthesize the rehearsal's template (deploy --rehearsal) from this manifest first (repeatable)",
    )
    p.add_argument(
        "--outdir",
        type=Path,
        default=REPO_ROOT / "cdk.out" / "checkov",
        help="where --manifest and --rehearsal templates are written",
    )
    args = p.parse_args(argv)
    templates = list(args.templates)
    for m in args.manifest:
        templates += deploy_templates(m, args.outdir / m.stem)
    for m in args.rehearsal:
        templates.append(rehearsal_template(m, args.outdir / m.stem))
    if not templates:
        p.error("give templates, --manifest or --rehearsal")
    args.templates = templates
    try:
        accepted = load_accepted()
        findings = [f for t in args.templates for f in failed_findings(run_checkov(t), str(t))]
    except CampaignError as exc:  # a bad accepted-findings file or report, or no checkout to run checkov from
        print(f"checkov gate: {exc}", file=sys.stderr)
        return 2
    left, stale = unexplained(findings, accepted)
    print(f"checkov: {len(findings)} failed check(s) over {len(args.templates)} template(s), {len(left)} unexplained")
    for a in stale:
        print(f"  stale entry (matches nothing now, remove it): {a.check} {a.resource}")
    for f in left:
        print(f"  UNEXPLAINED {f.check} {f.resource}: {f.title} ({f.template})", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
