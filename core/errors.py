"""The root of every error the project raises on bad input or a failed step, and the one table
of exit codes every command uses.

The CLI (`python -m campaign ...`) catches `CampaignError` once, prints its message without a
traceback and exits with its `exit_code`; subclasses pick the code that fits. No module spells
an exit code as a literal: each comes from this table, which `--help` prints in its epilog.
"""

from __future__ import annotations

import textwrap

EXIT_OK = 0  # Go (the report was written), or the command did what it was asked
EXIT_FAILED_STEP = 1  # a process, an AWS step or a remote source failed while running
EXIT_BAD_INPUT = 2  # the input (manifest, trace, records, flags) is wrong; nothing was started or written
EXIT_SETUP_FAILED = 3  # a load generator refused its inputs and sent nothing (`run`; the locustfile's own exit status)
EXIT_DEFER = 10  # the report was written; the evidence does not settle Go or Reject yet
EXIT_REJECT = 11  # the report was written; the migration does not pay (or the candidate failed its quality gate)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: every process stopped, records flushed so far are kept (128 + SIGINT)

# (code, meaning) in the order `--help` lists them; README's exit-code table is this one.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "Go; or the command succeeded"),
    (
        EXIT_FAILED_STEP,
        "a step failed while running: a process, an AWS call or a remote source (Prometheus, CloudWatch, "
        "Price List); `plan`: a fleet cannot hold the model; `teardown`: something is still left running",
    ),
    (EXIT_BAD_INPUT, "bad input (manifest, trace, records, flags): every problem is listed; nothing was started"),
    (EXIT_SETUP_FAILED, "`run`: a load-generator task refused its inputs and sent nothing (its log names the cause)"),
    (
        EXIT_DEFER,
        "Defer: the report was written; more evidence is needed (report.json decision.to_settle says how much)",
    ),
    (
        EXIT_REJECT,
        "Reject: the report was written; the migration does not pay, or the candidate failed its quality gate",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C / SIGTERM): every process was stopped; records flushed so far are kept"),
)

# A report's decision -> the exit code of `report`, `render` and `local`.
EXIT_BY_DECISION: dict[str, int] = {"go": EXIT_OK, "defer": EXIT_DEFER, "reject": EXIT_REJECT}


def exit_code_table(width: int = 100) -> str:
    """The table as `--help` prints it: `  CODE  meaning` per code, wrapped to `width`."""
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(meaning, width, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
    return "\n".join(lines)


class CampaignError(Exception):
    exit_code: int = EXIT_BAD_INPUT


class BadArgument(CampaignError, ValueError):
    """A flag's value cannot be used (a file that does not read, a malformed pair): exit 2."""

    exit_code = EXIT_BAD_INPUT
