"""Capacity sweep: per-instance SLO-compliant capacity measured at several offered rates.

The trace replay drives both fleets with one schedule, so one fleet is usually under-loaded
(its goodput is a lower bound) and the other overloaded (its SLO-compliant goodput has
collapsed). The sweep replays the same trace's requests against each fleet at several rate
multipliers of the manifest's rate ("x0.5", "x1", "x2", ...), each step's records in their
own directory. A fleet's per-instance capacity is the highest per-instance SLO-compliant
goodput among the steps whose fleet SLO held (P95 TTFT and P95 ITL under target, error
ceiling held); the replay itself is a candidate step ("replay", multiplier 1) when it held
the SLO. Every step is measured by the same rules as the replay (`goodput.measure_fleets`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from analysis import goodput
from analysis.errors import AnalysisError
from analysis.sources.records import RecordSet, load_records

REPLAY = "replay"
# A step measures steady state only if its arrivals span several request lifetimes: in a step
# barely longer than one request, a server past its capacity queues the burst into the drain
# and still meets the SLO, so the step would overstate what it sustains.
STEADY_STATE_LIFETIMES = 3.0
_LABEL = re.compile(r"x([0-9.eE+-]+)")


def parse_label(label: str) -> float:
    """'x0.5' -> 0.5; any other label is a ValueError naming it."""
    m = _LABEL.fullmatch(label)
    try:
        mult = float(m.group(1)) if m else math.nan
    except ValueError:
        mult = math.nan
    if not math.isfinite(mult) or mult <= 0:
        raise ValueError(f"capacity sweep step label {label!r} is not 'x<positive multiplier>' (e.g. 'x0.5', 'x2')")
    return mult


@dataclass(frozen=True)
class SweepStep:
    """One step's records, loaded and checked against the manifest digest."""

    label: str
    multiplier: float
    directory: Path
    records: RecordSet
    peaks: dict[str, int]  # peak in flight per fleet (whole fleet)
    median_e2e: dict[str, float]  # per fleet, completed non-warmup requests


def load_sweep(capacity_dirs: Mapping[str, str | Path], manifest_digest: str, fleets: set[str]) -> list[SweepStep]:
    """Load every step (sorted by multiplier); labels are parsed before any file is read."""
    parsed = sorted(((parse_label(k), k, Path(v)) for k, v in capacity_dirs.items()), key=lambda t: t[0])
    seen: dict[float, str] = {}
    for mult, label, _ in parsed:
        if mult in seen:
            raise ValueError(f"capacity sweep steps {seen[mult]!r} and {label!r} have the same multiplier")
        seen[mult] = label
    out = []
    for mult, label, d in parsed:
        rs = load_records(d, manifest_digest)
        unknown = sorted(set(rs.fleets()) - fleets)
        if unknown:
            raise AnalysisError(f"capacity sweep step {label} ({d}): records name fleet(s) {unknown} that the manifest does not define")
        out.append(SweepStep(label, mult, d, rs, goodput.peak_in_flight(rs), goodput.median_e2e(rs)))
    return out


@dataclass(frozen=True)
class StepResult:
    label: str
    multiplier: float
    requests: int
    successful_requests: int
    per_instance_goodput_tok_s: float | None
    p95_ttft_s: float | None
    p95_itl_s: float | None
    error_rate: float | None
    slo_pass: bool
    peak_in_flight_per_instance: float | None
    window_s: float | None = None
    median_e2e_s: float | None = None

    @property
    def steady_state(self) -> bool:
        if not self.window_s or not self.median_e2e_s:
            return False
        return self.window_s >= STEADY_STATE_LIFETIMES * self.median_e2e_s

    def as_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "multiplier": self.multiplier,
            "requests": self.requests,
            "successful_requests": self.successful_requests,
            "per_instance_goodput_tok_s": self.per_instance_goodput_tok_s,
            "p95_ttft_s": self.p95_ttft_s,
            "p95_itl_s": self.p95_itl_s,
            "error_rate": self.error_rate,
            "slo_pass": self.slo_pass,
            "peak_in_flight_per_instance": self.peak_in_flight_per_instance,
            "window_s": self.window_s,
            "median_e2e_s": self.median_e2e_s,
            "steady_state": self.steady_state,
        }


@dataclass(frozen=True)
class Capacity:
    fleet: str
    steps: tuple[StepResult, ...]  # sorted by multiplier; the replay (multiplier 1) before a sweep step "x1"
    per_instance_tok_s: float | None  # None: no step held the SLO
    step: str | None  # the winning step's label

    @property
    def top_multiplier(self) -> float | None:
        return max((s.multiplier for s in self.steps), default=None)

    @property
    def winner(self) -> StepResult | None:
        return next((s for s in self.steps if s.label == self.step), None)

    def as_dict(self) -> dict[str, object]:
        return {"steps": [s.as_dict() for s in self.steps], "per_instance_tok_s": self.per_instance_tok_s, "step": self.step}


def step_result(
    label: str, multiplier: float, fm: goodput.FleetMeasure | None, peak: int | None, instances: int,
    ttft_slo_s: float, itl_slo_s: float, max_error_rate: float, median_e2e_s: float | None = None,
) -> StepResult:
    if fm is None:  # the step has no records for this fleet
        return StepResult(label, multiplier, 0, 0, None, None, None, None, False, None)
    per = fm.goodput_tok_s / instances if fm.goodput_tok_s is not None and instances > 0 else None
    return StepResult(
        label, multiplier, fm.requests, fm.successful_requests, per, fm.p95_ttft_s, fm.p95_itl_s, fm.error_rate,
        fm.slo_pass(ttft_slo_s, itl_slo_s, max_error_rate),
        None if peak is None or instances <= 0 else peak / instances,
        fm.window_s or None,
        median_e2e_s,
    )


def choose(fleet: str, steps: list[StepResult]) -> Capacity:
    """The highest per-instance goodput among the steady-state steps that held the fleet SLO
    (ties: the lower multiplier)."""
    ordered = tuple(sorted(steps, key=lambda s: (s.multiplier, s.label != REPLAY)))
    passing = [s for s in ordered if s.slo_pass and s.per_instance_goodput_tok_s and s.steady_state]
    if not passing:
        return Capacity(fleet, ordered, None, None)
    best = max(passing, key=lambda s: s.per_instance_goodput_tok_s or 0.0)  # max keeps the first of equals
    return Capacity(fleet, ordered, best.per_instance_goodput_tok_s, best.label)


def measure_capacity(
    sweep: list[SweepStep],
    fleets: list[str],
    instances: Mapping[str, int],
    ttft_slo_s: float,
    itl_slo_s: float,
    max_error_rate: float,
    *,
    replay: Mapping[str, goodput.FleetMeasure] | None = None,
    replay_peaks: Mapping[str, int] | None = None,
    replay_median_e2e: Mapping[str, float] | None = None,
    step_measures: Mapping[str, Mapping[str, goodput.FleetMeasure]] | None = None,
) -> dict[str, Capacity]:
    """Per fleet: every step's figures under this SLO and the capacity chosen from them.

    `step_measures` (label -> fleet -> measure) lets a caller pass measures it already holds
    (e.g. goodput recomputed under a scaled SLO with the P95s carried over); otherwise each
    step is measured here. `replay` adds the trace replay as the candidate step "replay"."""
    per_step = {
        s.label: step_measures[s.label] if step_measures is not None else goodput.measure_fleets(s.records, ttft_slo_s, itl_slo_s)
        for s in sweep
    }
    out: dict[str, Capacity] = {}
    for f in fleets:
        inst = instances.get(f, 0)
        rows = [
            step_result(s.label, s.multiplier, per_step[s.label].get(f), s.peaks.get(f), inst, ttft_slo_s, itl_slo_s, max_error_rate,
                        s.median_e2e.get(f))
            for s in sweep
        ]
        if replay is not None and f in replay and replay[f].requests > 0:
            rows.append(step_result(REPLAY, 1.0, replay[f], (replay_peaks or {}).get(f), inst, ttft_slo_s, itl_slo_s, max_error_rate,
                                    (replay_median_e2e or {}).get(f)))
        out[f] = choose(f, rows)
    return out
