"""What `pin` raises: the manifest's fields it cannot resolve (exit 2), or a remote that failed (exit 1)."""

from __future__ import annotations

from core.errors import EXIT_FAILED_STEP, CampaignError
from core.manifest import Issue, ManifestError


class PinError(ManifestError):
    """Fields `pin` cannot resolve as the manifest gives them, each as `field.path: reason` (exit 2)."""

    def __init__(self, issues: list[Issue], source: str | None = None):
        super().__init__(issues, source)


class PinFailed(CampaignError):
    """The Hub or a registry failed, or answered what cannot be right (exit 1)."""

    exit_code = EXIT_FAILED_STEP
