"""What a campaign's settle phase did (campaign.stages.settle), as one typed record from the phase to the
report: written to capacity/settle.json, read back by `campaign report --run-dir`, and handed to
`build_report` (ReportInputs.settle), which states it in the report's provenance."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from analysis.errors import AnalysisError

SETTLE_FILE = "settle.json"


class SettleStop(StrEnum):
    """Why the phase stopped."""

    SETTLED = "settled"  # the decision settled after its segments
    NOTHING = "nothing to settle"  # it was settled before any segment
    BUDGET = "budget"  # every fleet's next segment is over the settle budget (seconds or USD)
    TRACE_EXHAUSTED = "trace exhausted"  # the trace has no requests left after the segments
    ROUNDS = "rounds"  # MAX_ROUNDS rounds without settling
    STALLED = "stalled"  # a round moved no end of any interval
    REOPENED = "reopened"  # a sizing step missed the SLO pooled with its segments: its search resumes below
    NO_STEP = "no search step to continue"  # no fleet had a sizing step to continue


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SettleSegment(_Record):
    """One fleet's segment of one round: the requests that follow its sizing step in the trace."""

    fleet: str
    step: str = Field(description='the capacity step it continues ("<fleet>/x<k>")')
    directory: str = Field(description="relative to the capacity root")
    multiplier: float
    skip_s: float = Field(description="replay seconds at x1 of the trace skipped (the step's and earlier segments')")
    span_s: float
    planned_requests: int
    took_s: float


class Reopened(_Record):
    step: str = Field(description='"<fleet>/x<k>"')
    why: str = Field(description="what it measured pooled")


class SettleOutcome(_Record):
    stopped: SettleStop
    detail: str
    delta_ci_before: list[float | None] | None
    delta_ci_after: list[float | None] | None
    decision_before: str
    decision_after: str
    seconds: float = 0.0
    usd: float = 0.0
    segments: list[SettleSegment] = Field(default_factory=list)
    over_budget: list[str] = Field(default_factory=list, description="fleets the last round left out, and why")
    # REOPENED: per fleet, the sizing step that held over its own requests but missed the SLO
    # pooled with its segments (its search resumes below it).
    reopened: dict[str, Reopened] = Field(default_factory=dict)

    def write(self, capacity_root: Path) -> None:
        (capacity_root / SETTLE_FILE).write_text(json.dumps(self.model_dump(mode="json"), indent=2), encoding="utf-8")

    @classmethod
    def read(cls, capacity_root: Path) -> SettleOutcome | None:
        """capacity_root/settle.json, None when the run had no settle phase; an error naming the
        file and the field when it does not hold a settle record (edited by hand, or truncated)."""
        path = capacity_root / SETTLE_FILE
        if not path.is_file():
            return None
        try:
            return cls.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise AnalysisError(f"{path}: {where}: {first['msg']}") from None
