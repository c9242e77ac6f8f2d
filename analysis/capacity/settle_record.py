"""What a campaign's settle phase did (campaign.stages.settle), as one typed record from the phase to the
report: written to capacity/settle.json, read back by `campaign report --run-dir`, and handed to
`build_report` (ReportInputs.settle), which states it in the report's provenance."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from analysis.errors import AnalysisError

SETTLE_FILE = "settle.json"
# The phase's state while it runs, rewritten before and after each round and after each reopened
# search (campaign.stages.settle): what a run cut off mid-phase resumes from.
SETTLE_PROGRESS_FILE = "settle-progress.json"


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
    DEADLINE = "deadline"  # the campaign's deadline would cut every fleet's next segment: none started


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


_R = TypeVar("_R", bound=_Record)


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
    reopens: int = Field(default=0, description="searches the phase has reopened and finished so far")
    # A resumed phase: what the rounds cut off had reserved and spent (their segments set aside).
    interrupted_seconds: float = 0.0
    interrupted_usd: float = 0.0

    def write(self, capacity_root: Path) -> None:
        (capacity_root / SETTLE_FILE).write_text(json.dumps(self.model_dump(mode="json"), indent=2), encoding="utf-8")

    @classmethod
    def read(cls, capacity_root: Path) -> SettleOutcome | None:
        """capacity_root/settle.json, None when the run had no settle phase; an error naming the
        file and the field when it does not hold a settle record (edited by hand, or truncated)."""
        return _read(cls, capacity_root / SETTLE_FILE)


class SettleProgress(_Record):
    """The settle phase so far: its outcome after the last round it finished, and the round in
    flight (its segments' directories and what it reserved of the budget), if any. A resumed run
    keeps the finished segments, sets the round in flight aside and counts what it reserved as
    spent: the phase never spends past its budget however often the run is cut off."""

    outcome: SettleOutcome
    pending: list[str] = Field(default_factory=list, description="the round in flight's segment directories")
    pending_seconds: float = 0.0
    pending_usd: float = 0.0

    def write(self, capacity_root: Path) -> None:
        path = capacity_root / SETTLE_PROGRESS_FILE
        tmp = path.with_name(path.name + ".tmp")  # a kill mid-write leaves the last whole state
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=2), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def read(cls, capacity_root: Path) -> SettleProgress | None:
        return _read(cls, capacity_root / SETTLE_PROGRESS_FILE)

    def carried_over(self) -> SettleOutcome:
        """The outcome a resumed phase goes on from: the round in flight's reservation spent."""
        return self.outcome.model_copy(
            update={
                "seconds": self.outcome.seconds + self.pending_seconds,
                "usd": self.outcome.usd + self.pending_usd,
                "interrupted_seconds": self.outcome.interrupted_seconds + self.pending_seconds,
                "interrupted_usd": self.outcome.interrupted_usd + self.pending_usd,
            },
            deep=True,
        )


def _read(cls: type[_R], path: Path) -> _R | None:
    """The record in `path`, None without the file; an error naming the file and the field when
    it does not hold one (edited by hand, or truncated)."""
    if not path.is_file():
        return None
    try:
        return cls.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise AnalysisError(f"{path}: {where}: {first['msg']}") from None
