"""Errors the analysis raises on bad or missing evidence; each message names what to fix."""

from __future__ import annotations

from core.errors import EXIT_FAILED_STEP, CampaignError


class AnalysisError(CampaignError):
    """Base class: the report cannot honestly be produced from this input."""


class DigestMismatch(AnalysisError):
    def __init__(self, path: str, found: str, expected: str, count: int):
        self.path, self.found, self.expected, self.count = path, found, expected, count
        super().__init__(
            f"{path}: {count} record(s) carry manifest_digest {found}, but the manifest's digest is {expected}; "
            "these records come from a different manifest and cannot be mixed into this report"
        )


class EmptyWindow(AnalysisError):
    """No measurable records: reporting zeros would look like a result."""


class SourceUnavailable(AnalysisError):
    """A remote source (Prometheus, AWS API) could not be reached or answered with an error: a
    failed step (exit 1), not bad input."""

    exit_code = EXIT_FAILED_STEP


class BadCapacityStep(AnalysisError):
    """A capacity step directory whose label is not `[<fleet>/]x<multiplier>`, names an unknown
    fleet, or repeats a multiplier: bad input (exit 2), found before any record is read."""


class PriceMissing(AnalysisError):
    """Neither the live API nor the pinned snapshot has this price."""


class BadBillingData(AnalysisError):
    """A billing export is missing columns or holds values that are not numbers."""
