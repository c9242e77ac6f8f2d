"""The root of every error the project raises on bad input or a failed step.

The CLI (`python -m campaign ...`) catches `CampaignError` once, prints its message without a
traceback and exits with its `exit_code`; subclasses pick the code that fits.
"""

from __future__ import annotations

EXIT_FAILED_STEP = 1  # a process, an AWS step or a source failed while running
EXIT_BAD_INPUT = 2  # the input (manifest, records, trace, flags) is wrong; nothing was written


class CampaignError(Exception):
    exit_code: int = EXIT_BAD_INPUT
