"""Invariant: the instances a step is divided by are the time the fleet actually served it
(issue 47; guards issue 46's findings 3 and 4).

Two relations over generated health polls (every 10 s, as the AWS runner polls the target group):
- an instance gone for a while takes only that while from the divisor: with n healthy and k of
  them gone over an interval, the divisor is n - k x (the interval's overlap with the load
  window) / (the window). Dividing by the fewest seen makes a one-poll dip cost k whole instances.
- where the polls are kept does not matter: the same series written once in the step's
  instances.json, or split so that each part (the step, each settle segment) keeps the polls of its
  own run in its own file, gives the same divisor. Reading only the step's file holds its last
  poll through every segment."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from analysis.capacity.steps import step_divisors
from analysis.sources.records import load_records
from core.manifest import Manifest
from core.records import INSTANCES_FILE, RequestRecord
from tests.analysis.synth import rec, write_jsonl
from tests.invariants import INVARIANT

T0 = 1_700_000_000.0
POLL_S = 10.0


def _part(m: Manifest, start: float, offsets: list[float], lifetime: float, first_id: int) -> list[RequestRecord]:
    """Requests sent at start + offset, each lasting `lifetime`: the part's load window is
    [start + offsets[0], start + offsets[-1] + lifetime]."""
    return [
        replace(rec(m, "g6", first_id + i, e2e=lifetime), wall_start=start, scheduled_s=o, sent_s=o)
        for i, o in enumerate(offsets)
    ]


def _write_polls(directory: Path, polls: list[tuple[float, int]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    entry = {"instances": min(n for _, n in polls), "source": "measured", "detail": "target health polls"}
    (directory / INSTANCES_FILE).write_text(json.dumps({"g6": {**entry, "polls": [list(p) for p in polls]}}))


@st.composite
def dip(draw: st.DrawFn) -> tuple[int, int, float, float, list[float]]:
    """n healthy, k of them gone from a poll at `gone` until the poll `polls` x 10 s later; the
    step's arrivals (offsets from T0)."""
    n = draw(st.integers(1, 8))
    k = draw(st.integers(1, n))
    sends = sorted(draw(st.lists(st.floats(0.0, 600.0), min_size=2, max_size=40)))
    gone = POLL_S * draw(st.integers(-3, 63))
    return n, k, gone, POLL_S * draw(st.integers(1, 12)), sends


@INVARIANT
@given(dip())
def test_an_instance_gone_for_a_while_takes_only_that_while_from_the_divisor(
    m: Manifest, case: tuple[int, int, float, float, list[float]]
) -> None:
    n, k, gone, lasts, sends = case
    lifetime = 2.0
    root = Path(tempfile.mkdtemp(prefix="divisor-"))
    try:
        write_jsonl(root / "records-g6-w0.jsonl", _part(m, T0, sends, lifetime, 0))
        polls = [(T0 + t, n - k if gone <= t < gone + lasts else n) for t in range(-60, 720, int(POLL_S))]
        _write_polls(root, polls)
        got = step_divisors(root, load_records(root, m.digest))["g6"].instances
        a, b = T0 + sends[0], T0 + sends[-1] + lifetime
        overlap = max(0.0, min(b, T0 + gone + lasts) - max(a, T0 + gone))
        assert abs(got - (n - k * overlap / (b - a))) <= 1e-9 * n, (got, n, k, overlap, b - a)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@st.composite
def parted_series(draw: st.DrawFn) -> tuple[list[list[float]], list[float], list[int]]:
    """A step and 1-3 settle segments (each its arrivals' offsets from its own start), the gap
    before each segment, and a healthy count for every poll from before the step to after the
    last segment (a walk: targets come and go)."""
    parts = draw(st.lists(st.lists(st.floats(0.0, 120.0), min_size=1, max_size=12).map(sorted), min_size=2, max_size=4))
    gaps = draw(st.lists(st.floats(0.0, 90.0), min_size=len(parts) - 1, max_size=len(parts) - 1))
    steps = draw(st.lists(st.integers(-2, 2), min_size=80, max_size=80))
    level, counts = 4, []
    for s in steps:
        level = min(8, max(1, level + s))
        counts.append(level)
    return parts, gaps, counts


@INVARIANT
@given(parted_series())
def test_the_same_polls_in_the_steps_file_or_in_each_parts_own_give_one_divisor(
    m: Manifest, case: tuple[list[list[float]], list[float], list[int]]
) -> None:
    parts, gaps, counts = case
    lifetime = 3.0
    root = Path(tempfile.mkdtemp(prefix="divisor-parts-"))
    try:
        starts, t, windows = [], T0, []
        for i, offsets in enumerate(parts):
            t += gaps[i - 1] if i else 0.0
            starts.append(t)
            windows.append((t + offsets[0], t + offsets[-1] + lifetime))
            t = windows[-1][1]
        polls = [(T0 - 30.0 + POLL_S * j, c) for j, c in enumerate(counts)]
        assert polls[-1][0] > windows[-1][1]  # the series covers every part
        dirs = {}
        for layout in ("steps-file", "own-files"):
            d = root / layout
            first_id = 0
            for i, (offsets, start) in enumerate(zip(parts, starts, strict=True)):
                where = d if i == 0 else d / f"settle-{i}"
                write_jsonl(where / "records-g6-w0.jsonl", _part(m, start, offsets, lifetime, first_id))
                first_id += len(offsets)
                if i:
                    plan = {"span_s": offsets[-1] + lifetime, "skip_s": start - T0, "multiplier": 1.0}
                    (where / "segment.json").write_text(json.dumps(plan))
                if layout == "own-files":  # what each part's runner polled while it ran
                    a, b = windows[i]
                    _write_polls(where, [p for p in polls if a - POLL_S < p[0] < b + POLL_S])
            if layout == "steps-file":
                _write_polls(d, polls)
            dirs[layout] = step_divisors(d, load_records(d, m.digest))["g6"].instances
        assert abs(dirs["own-files"] - dirs["steps-file"]) <= 1e-9 * dirs["steps-file"], dirs
    finally:
        shutil.rmtree(root, ignore_errors=True)
