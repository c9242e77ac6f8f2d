"""The instances a replay or a capacity step ran on, as its runner counted them
(core.records.INSTANCES_FILE beside the records: on AWS, the fewest healthy targets of the fleet's
target group while it ran, campaign.backends.fargate.target_health)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import AnalysisError
from core.records import INSTANCES_FILE


@dataclass(frozen=True)
class CountedInstances:
    instances: int
    source: str  # provenance source: "measured"
    detail: str  # how it was counted


def read_counted(directory: Path) -> dict[str, CountedInstances]:
    """Per fleet, the instances counted beside the records in `directory`; {} without the file.
    A file edited by hand into something else is an error naming the file and the field."""
    path = Path(directory) / INSTANCES_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AnalysisError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AnalysisError(f"{path}: expected {{fleet: {{instances, source, detail}}}}, got {type(data).__name__}")
    out: dict[str, CountedInstances] = {}
    for fleet, entry in data.items():
        n = entry.get("instances") if isinstance(entry, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise AnalysisError(f"{path}: {fleet}.instances: expected a whole number >= 0, got {n!r}")
        out[str(fleet)] = CountedInstances(n, str(entry.get("source", "measured")), str(entry.get("detail", "")))
    return out
