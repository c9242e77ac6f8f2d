"""The instances a replay, a capacity step or a settle segment ran on, as its runner counted them
(core.records.INSTANCES_FILE beside the records: on AWS, every poll of the healthy targets of the
fleet's NLB target group while it ran, campaign.backends.fargate.target_health).

A step's goodput is divided by the time-weighted mean of the healthy targets over its own load
window (its first request sent to its last request's end): a target gone for one 10 s poll of a
five-minute step takes 10 s of one instance from the divisor, not a whole instance (dividing by
the fewest seen overstated per-instance capacity by up to a third, and the search then chose
that step). The mean may be fractional. Polls are held until the next one (the count is a step
function); the window's start takes the last poll before it, or the first poll when none was."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from analysis.errors import AnalysisError
from core.records import INSTANCES_FILE

Poll = tuple[float, int]  # (Unix seconds, UTC; healthy targets)


@dataclass(frozen=True)
class CountedInstances:
    instances: int  # the fewest seen (files written before the polls were kept: the only figure)
    source: str  # provenance source: "measured"
    detail: str  # how it was counted
    polls: tuple[Poll, ...] = ()  # every poll, in time order; () in a file from before the field

    def mean_over(self, start: float, end: float) -> float:
        """Healthy targets, time-weighted over [start, end] (without polls: the count itself)."""
        return time_weighted(self.polls, start, end) if self.polls else float(self.instances)


def time_weighted(polls: Sequence[Poll], start: float, end: float) -> float:
    """The mean of the step function the polls draw over [start, end]; at a point, its value there."""
    if not polls:
        raise ValueError("no polls")
    ordered = sorted(polls)
    if end <= start:
        return float(_value_at(ordered, start))
    area, t, level = 0.0, start, _value_at(ordered, start)
    for at, n in ordered:
        if at <= start:
            continue
        if at >= end:
            break
        area += level * (at - t)
        t, level = at, n
    area += level * (end - t)
    return area / (end - start)


def _value_at(ordered: Sequence[Poll], at: float) -> int:
    before = [n for t, n in ordered if t <= at]
    return before[-1] if before else ordered[0][1]


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
        raise AnalysisError(
            f"{path}: expected {{fleet: {{instances, source, detail, polls}}}}, got {type(data).__name__}"
        )
    out: dict[str, CountedInstances] = {}
    for fleet, entry in data.items():
        n = entry.get("instances") if isinstance(entry, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise AnalysisError(f"{path}: {fleet}.instances: expected a whole number >= 0, got {n!r}")
        polls = _polls(path, str(fleet), entry.get("polls", []))
        out[str(fleet)] = CountedInstances(n, str(entry.get("source", "measured")), str(entry.get("detail", "")), polls)
    return out


def _polls(path: Path, fleet: str, raw: object) -> tuple[Poll, ...]:
    if not isinstance(raw, list):
        raise AnalysisError(f"{path}: {fleet}.polls: expected a list of [unix seconds, healthy], got {raw!r}")
    out: list[Poll] = []
    for i, p in enumerate(raw):
        ok = (
            isinstance(p, list)
            and len(p) == 2
            and isinstance(p[0], int | float)
            and not isinstance(p[0], bool)
            and isinstance(p[1], int)
            and not isinstance(p[1], bool)
            and p[1] >= 0
        )
        if not ok:
            raise AnalysisError(f"{path}: {fleet}.polls[{i}]: expected [unix seconds, healthy >= 0], got {p!r}")
        out.append((float(p[0]), int(p[1])))
    return tuple(sorted(out))
