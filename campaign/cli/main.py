"""`python -m campaign` (installed: `inf2-vs-g6`): one entry point for every step of a campaign.

Each subcommand registers itself here; bad input exits 2 with `field.path: reason` lines,
never a traceback. Every project error derives from `core.errors.CampaignError` and is
caught once, in `main`, which prints it and exits with the error's own exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from campaign.cli import aws_cmds, local_cmds, pin_cmds, report_cmds
from campaign.cli.help import prog
from core.errors import EXIT_INTERRUPTED, CampaignError, exit_code_table
from core.manifest import ManifestError
from core.traces import TraceError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Decide, with evidence, whether an LLM endpoint should run on Inf2 or G6.",
        epilog=exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's table keeps its lines
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    local_cmds.register(sub)
    report_cmds.register(sub)
    aws_cmds.register(sub)
    pin_cmds.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except ManifestError as exc:
        print(f"invalid manifest {exc.source or getattr(args, 'manifest', '')}:", file=sys.stderr)
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
