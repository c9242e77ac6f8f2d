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

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from analysis.errors import AnalysisError, BadCapacityStep
from analysis.measure import goodput
from analysis.model import CapacityModel, CapacityStep, Measure
from analysis.model import SearchPath as SearchPath  # the search's types, named here as before
from analysis.model import SearchStep as SearchStep
from analysis.model import StopRule as StopRule
from analysis.model import Verdict as Verdict
from analysis.sources.instances import CountedInstances, read_counted
from analysis.sources.records import RecordSet, load_records

REPLAY = "replay"
# A step measures steady state only if its arrivals span several request lifetimes: in a step
# barely longer than one request, a server past its capacity queues the burst into the drain
# and still meets the SLO, so the step would overstate what it sustains.
STEADY_STATE_LIFETIMES = 3.0
# "x0.5" (a step every fleet ran) or "g6/x1.41" (a step of one fleet's capacity search); a
# search that repeats a multiplier with a longer step labels the repeat "x1.41-r2".
_LABEL = re.compile(r"(?:([a-z][a-z0-9-]*[a-z0-9])/)?x([0-9.eE+-]+?)(?:-r([0-9]+))?")


def split_label(label: str) -> tuple[str | None, float]:
    """'x0.5' -> (None, 0.5); 'g6/x2' -> ('g6', 2.0); any other label is a BadCapacityStep naming it."""
    m = _LABEL.fullmatch(label)
    try:
        mult = float(m.group(2)) if m else math.nan
    except ValueError:
        mult = math.nan
    if m is None or not math.isfinite(mult) or mult <= 0:
        raise BadCapacityStep(
            f"capacity sweep step label {label!r} is not '[<fleet>/]x<positive multiplier>' (e.g. 'x0.5', 'g6/x2')"
        )
    return m.group(1), mult


def parse_label(label: str) -> float:
    """'x0.5' -> 0.5; any other label is a BadCapacityStep naming it."""
    return split_label(label)[1]


SEARCH_FILE = "search.json"  # capacity/<fleet>/search.json, next to the fleet's step directories


def write_search_path(path: SearchPath, fleet_dir: Path) -> Path:
    fleet_dir.mkdir(parents=True, exist_ok=True)
    out = fleet_dir / SEARCH_FILE
    out.write_text(json.dumps(path.model_dump(), indent=2), encoding="utf-8")
    return out


STEP_FILE = "step.json"  # capacity/<fleet>/x<k>/step.json: the step's verdict, written as it ends


def write_search_step(step: SearchStep, step_dir: Path) -> Path:
    """One step's verdict beside its records as soon as it is judged, before the search goes on:
    the search's state so far, which a run killed mid-search keeps (search.json comes at its end)."""
    step_dir.mkdir(parents=True, exist_ok=True)
    out = step_dir / STEP_FILE
    out.write_text(json.dumps(step.model_dump(), indent=2), encoding="utf-8")
    return out


def read_search_path(fleet_dir: Path) -> SearchPath | None:
    """The fleet's search path if its directory has one; a malformed file is an AnalysisError naming it."""
    f = fleet_dir / SEARCH_FILE
    if not f.is_file():
        return None
    try:
        d = json.loads(f.read_text(encoding="utf-8"))
        # a file written before a field existed: the defaults the search's dataclasses gave it
        steps = [{"detail": "", "sizing_lifetime_s": None, **st} for st in d["steps"]]
        return SearchPath.model_validate({"held_multiplier": None, "missed_multiplier": None, **d, "steps": steps})
    except (ValueError, KeyError, TypeError) as exc:
        raise AnalysisError(f"{f}: not a capacity search path ({exc})") from None


@dataclass(frozen=True)
class SweepStep:
    """One step's records, loaded and checked against the manifest digest."""

    label: str
    multiplier: float
    directory: Path
    records: RecordSet
    peaks: dict[str, int]  # peak in flight per fleet (whole fleet)
    median_e2e: dict[str, float]  # per fleet, completed non-warmup requests
    fleet: str | None = None  # a step of this fleet's capacity search; None: every fleet ran it
    invalid: frozenset[str] = frozenset()  # fleets whose run summary marks this step invalid (it measured the client)
    # per fleet, what its goodput is divided by: the instances its runner counted while the step
    # and its settle segments ran, time-weighted over their load windows (step_divisors)
    counted: Mapping[str, Divisor] = field(default_factory=dict)

    def covers(self, fleet: str) -> bool:
        return self.fleet is None or self.fleet == fleet


@dataclass(frozen=True)
class Divisor:
    """The instances one step's goodput is divided by, and how they were counted."""

    instances: float
    detail: str


def step_divisors(step_dir: Path, rs: RecordSet) -> dict[str, Divisor]:
    """Per fleet with a count beside its records: the time-weighted mean of its healthy targets over
    the load windows (first send to last end, goodput.load_windows) of the step and of each settle
    segment pooled with it, each part by its own count (settle-<n>/instances.json; the step's
    where a segment has none). 0: no target was healthy while the step ran (it measured nothing)."""
    windows = goodput.load_windows(rs)
    counts = {seg: read_counted(step_dir / f"{goodput.SETTLE_DIR}{seg}" if seg else step_dir) for _, seg in windows}
    out: dict[str, Divisor] = {}
    for fleet in sorted({f for f, _ in windows}):
        parts = sorted((seg, w) for (f, seg), w in windows.items() if f == fleet)
        used: list[tuple[str, float, float, CountedInstances]] = []
        for seg, (a, b) in parts:
            c = counts.get(seg, {}).get(fleet) or counts.get("", {}).get(fleet)
            if c is not None:
                used.append((seg, a, b, c))
        if not used or len(used) < len(parts):
            continue  # not counted (locally, before the count existed): the run's instances_measured
        span = sum(b - a for _, a, b, _ in used)
        area = sum(c.mean_over(a, b) * (b - a) for _, a, b, c in used)
        mean = area / span if span > 0 else used[0][3].mean_over(used[0][1], used[0][1])
        out[fleet] = Divisor(mean, _divisor_detail(mean, span, used))
    return out


def _divisor_detail(mean: float, span: float, used: list[tuple[str, float, float, CountedInstances]]) -> str:
    polls = sum(len(c.polls) for *_, c in used)
    if not polls:  # a count written before the polls were kept: the count, as its file says
        return "; ".join(dict.fromkeys(c.detail for *_, c in used))
    parts = "; ".join(
        f"{'the step' if not seg else goodput.SETTLE_DIR + seg} {b - a:.0f} s: "
        + (_changes(c, a) if c.polls else f"{c.instances} counted ({c.detail})")
        for seg, a, b, c in used
    )
    how = used[0][3].detail
    return (
        f"time-weighted mean of the healthy targets over the load window (first send to last end, {span:.0f} s"
        f"{' over ' + str(len(used)) + ' parts' if len(used) > 1 else ''}): {mean:.4g}, from {polls} poll(s) ({parts})"
        + (f"; counted as: {how}" if how else "")
    )


def _changes(c: CountedInstances, start: float) -> str:
    """The poll series as its changes, in seconds from the window's start: '4 from -3 s, 3 from +120 s'."""
    out: list[str] = []
    last: int | None = None
    for t, n in c.polls:
        if n != last:
            out.append(f"{n} from {t - start:+.0f} s")
            last = n
    return ", ".join(out)


def load_sweep(capacity_dirs: Mapping[str, str | Path], manifest_digest: str, fleets: set[str]) -> list[SweepStep]:
    """Load every step (sorted by multiplier); labels are parsed before any file is read."""
    parsed = sorted(((split_label(k), k, Path(v)) for k, v in capacity_dirs.items()), key=lambda t: t[0][1])
    seen: dict[tuple[str | None, float], str] = {}
    for (scope, mult), label, _ in parsed:
        if scope is not None and scope not in fleets:
            raise BadCapacityStep(
                f"capacity sweep step {label!r} names fleet {scope!r}, which the manifest does not define"
            )
        if scope is None and (scope, mult) in seen:  # a search may repeat a multiplier (-r2); a shared sweep may not
            raise BadCapacityStep(
                f"capacity sweep steps {seen[(scope, mult)]!r} and {label!r} have the same multiplier"
            )
        seen[(scope, mult)] = label
    out = []
    for (scope, mult), label, d in parsed:
        rs = load_records(d, manifest_digest)
        allowed = fleets if scope is None else {scope}
        unknown = sorted(set(rs.fleets()) - allowed)
        if unknown:
            raise AnalysisError(
                f"capacity sweep step {label} ({d}): records name fleet(s) {unknown} that "
                + ("the manifest does not define" if scope is None else f"are not the step's fleet {scope}")
            )
        invalid = frozenset(sm.fleet for sm in rs.summaries.values() if not sm.valid)
        out.append(
            SweepStep(
                label,
                mult,
                d,
                rs,
                goodput.peak_in_flight(rs),
                goodput.median_e2e(rs),
                scope,
                invalid,
                step_divisors(d, rs),
            )
        )
    return out


def discover_steps(root: Path) -> dict[str, Path]:
    """A capacity directory's steps: `x<k>/` (a shared sweep) and `<fleet>/x<k>/` (a fleet's
    search, beside its search.json), as the report's label -> directory mapping."""
    out: dict[str, Path] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if d.name.startswith("x"):
            out[d.name] = d
        else:
            out.update({f"{d.name}/{s.name}": s for s in sorted(d.iterdir()) if s.is_dir()})
    return out


def median_overhead_s(steps: Iterable[SearchStep]) -> float:
    """The median seconds these search steps spent outside their requests (starting and stopping
    the load generator: SearchStep.overhead_s), 0 when none was measured: what one more step or
    settle segment costs on top of its arrivals and drain."""
    measured = sorted(s.overhead_s for s in steps if s.overhead_s is not None)
    if not measured:
        return 0.0
    mid = len(measured) // 2
    return measured[mid] if len(measured) % 2 else (measured[mid - 1] + measured[mid]) / 2


def search_paths(
    sweep: list[SweepStep], capacity_root: Path | None = None, fleets: Iterable[str] = ()
) -> dict[str, SearchPath]:
    """Each searched fleet's path, read from search.json beside its step directories and, given the
    run's capacity directory, from `<capacity_root>/<fleet>/` for each of `fleets`: a search that
    stopped before its first step (its time budget spent on the replay) has no step directory."""
    dirs = {s.fleet: s.directory.parent for s in sweep if s.fleet is not None}
    if capacity_root is not None:
        for f in fleets:
            dirs.setdefault(f, capacity_root / f)
    out: dict[str, SearchPath] = {}
    for fleet, d in dirs.items():
        path = read_search_path(d)
        if path is not None:
            out[fleet] = path
    return out


def step_result(
    label: str,
    multiplier: float,
    fm: Measure | None,
    peak: int | None,
    instances: float,
    ttft_slo_s: float,
    itl_slo_s: float,
    max_error_rate: float,
    median_e2e_s: float | None = None,
    valid: bool = True,
    instances_detail: str = "the run's instances_measured",
) -> CapacityStep:
    """One step's row of a fleet's capacity, as report.json shows it (its P95 intervals are added there)."""
    if fm is None:  # the step has no records for this fleet
        return CapacityStep(
            label=label,
            multiplier=multiplier,
            requests=0,
            successful_requests=0,
            per_instance_goodput_tok_s=None,
            p95_ttft_s=None,
            p95_itl_s=None,
            error_rate=None,
            slo_pass=False,
            peak_in_flight_per_instance=None,
            window_s=None,
            median_e2e_s=None,
            steady_state=False,
            valid=True,
            instances=instances,
            instances_detail=instances_detail,
        )
    per = fm.goodput_tok_s / instances if fm.goodput_tok_s is not None and instances > 0 else None
    window = fm.window_s or None
    if instances <= 0:  # no target was healthy while it ran: it measured no instance, not a miss
        valid = False
    return CapacityStep(
        label=label,
        multiplier=multiplier,
        requests=fm.requests,
        successful_requests=fm.successful_requests,
        per_instance_goodput_tok_s=per,
        p95_ttft_s=fm.p95_ttft_s,
        p95_itl_s=fm.p95_itl_s,
        error_rate=fm.error_rate,
        slo_pass=fm.slo_pass(ttft_slo_s, itl_slo_s, max_error_rate),
        peak_in_flight_per_instance=None if peak is None or instances <= 0 else peak / instances,
        window_s=window,
        median_e2e_s=median_e2e_s,
        steady_state=steady_state(window, median_e2e_s),
        valid=valid,
        instances=instances,
        instances_detail=instances_detail,
    )


def steady_state(window_s: float | None, median_e2e_s: float | None) -> bool:
    """The step's arrivals spanned STEADY_STATE_LIFETIMES median request lifetimes: a capacity candidate."""
    if not window_s or not median_e2e_s:
        return False
    return window_s >= STEADY_STATE_LIFETIMES * median_e2e_s


def choose(steps: list[CapacityStep], search: SearchPath | None = None) -> CapacityModel:
    """The highest per-instance goodput among the valid steady-state steps that held the fleet SLO
    (ties: the lower multiplier), leaving out any step the fleet's search judged and did not call
    held (e.g. a replay with fewer than min_requests requests, which the search ran again)."""
    ordered = tuple(sorted(steps, key=lambda s: (s.multiplier, s.label != REPLAY)))
    judged = {st.label: st.verdict for st in search.steps} if search is not None else {}

    def search_allows(
        s: CapacityStep,
    ) -> bool:  # search labels are the step's own ("x0.5"), rows carry the fleet ("g6/x0.5")
        return judged.get(s.label.rsplit("/", 1)[-1], Verdict.HELD) is Verdict.HELD

    passing = [
        s
        for s in ordered
        if s.slo_pass and s.per_instance_goodput_tok_s and s.steady_state and s.valid and search_allows(s)
    ]
    if not passing:
        return CapacityModel(steps=list(ordered), per_instance_tok_s=None, step=None, search=search)
    best = max(passing, key=lambda s: s.per_instance_goodput_tok_s or 0.0)  # max keeps the first of equals
    return CapacityModel(
        steps=list(ordered), per_instance_tok_s=best.per_instance_goodput_tok_s, step=best.label, search=search
    )


def measure_capacity(
    sweep: list[SweepStep],
    fleets: list[str],
    instances: Mapping[str, int],
    ttft_slo_s: float,
    itl_slo_s: float,
    max_error_rate: float,
    *,
    replay: Mapping[str, Measure] | None = None,
    replay_peaks: Mapping[str, int] | None = None,
    replay_median_e2e: Mapping[str, float] | None = None,
    step_measures: Mapping[str, Mapping[str, Measure]] | None = None,
    searches: Mapping[str, SearchPath] | None = None,
) -> dict[str, CapacityModel]:
    """Per fleet: every step's figures under this SLO and the capacity chosen from them.

    `step_measures` (label -> fleet -> measure) lets a caller pass measures it already holds
    (e.g. goodput recomputed under a scaled SLO with the P95s carried over); otherwise each
    step is measured here. `replay` adds the trace replay as the candidate step "replay".
    A step of one fleet's search (label "<fleet>/x<k>") is a row of that fleet only; `searches`
    (fleet -> its search path) rides along so the report can show how the steps were chosen."""
    per_step = {
        s.label: step_measures[s.label]
        if step_measures is not None
        else goodput.measure_fleets(s.records, ttft_slo_s, itl_slo_s)
        for s in sweep
    }
    out: dict[str, CapacityModel] = {}
    for f in fleets:
        inst = instances.get(f, 0)
        rows = [
            step_result(
                s.label,
                s.multiplier,
                per_step[s.label].get(f),
                s.peaks.get(f),
                s.counted[f].instances if f in s.counted else inst,
                ttft_slo_s,
                itl_slo_s,
                max_error_rate,
                s.median_e2e.get(f),
                f not in s.invalid,
                f"counted while it ran: {s.counted[f].detail}" if f in s.counted else "the run's instances_measured",
            )
            for s in sweep
            if s.covers(f)
        ]
        if replay is not None and f in replay and replay[f].requests > 0:
            rows.append(
                step_result(
                    REPLAY,
                    1.0,
                    replay[f],
                    (replay_peaks or {}).get(f),
                    inst,
                    ttft_slo_s,
                    itl_slo_s,
                    max_error_rate,
                    (replay_median_e2e or {}).get(f),
                )
            )
        out[f] = choose(rows, (searches or {}).get(f))
    return out
