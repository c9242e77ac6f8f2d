"""The campaign's deadline, held before each stage: `campaign run` refuses to start a stage that the
plan says cannot finish before every fleet's group is set to 0 (the stack's scheduled actions,
stacks/fleet.py), instead of measuring fleets that vanish halfway.

The stage names are the keys of the plan's `minutes` breakdown (campaign.plan.predict), so the
guard reads a stage's planned minutes from a saved plan or an in-process one alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.cloud_contract import format_deadline
from core.errors import EXIT_FAILED_STEP, CampaignError

# The stages run_stages guards, by the plan's names for their minutes.
GATE_STAGE = "quality_gate"
REPLAY_STAGE = "replay"
CAPACITY_STAGE = "capacity_searches"
SETTLE_STAGE = "settle_phase"

StageGuard = Callable[[str], None]


class PastDeadline(CampaignError, RuntimeError):
    """A stage would end after the deadline: not started (what ran before it is kept)."""

    exit_code = EXIT_FAILED_STEP


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class DeadlineGuard:
    """Called with a stage's name before it starts; raises PastDeadline when now + the plan's minutes
    for it ends after `deadline`. A stage the plan gives no minutes is not held."""

    deadline: datetime
    stage_minutes: Mapping[str, float]
    clock: Callable[[], datetime] = utc_now

    def __call__(self, stage: str) -> None:
        minutes = self.stage_minutes.get(stage)
        if minutes is None:
            return
        now = self.clock()
        ends = now + timedelta(minutes=minutes)
        if ends > self.deadline:
            raise PastDeadline(
                f"{stage} not started: the plan gives it {minutes:g} min, so from now ({format_deadline(now)}) it "
                f"would end at {format_deadline(ends)}, after the deadline {format_deadline(self.deadline)}, when "
                "every fleet's Auto Scaling group is set to 0; `campaign deploy MANIFEST --extend-hours N` moves the "
                "deadline, then `run` again"
            )
