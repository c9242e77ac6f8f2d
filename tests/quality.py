"""Quality-gate results for report tests, as the campaign's stages hand them to the report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis.model import QualityResult


def quality_results(given: Mapping[str, Mapping[str, Any] | QualityResult]) -> dict[str, QualityResult]:
    """Per fleet, a QualityResult from its JSON form (or as it is)."""
    return {name: QualityResult.model_validate(q) for name, q in given.items()}
