"""A campaign's stages, written once for `campaign local` and `campaign run`.

    quality gate (fixtures, task acceptance) -> trace replay -> distribution checks
    -> capacity search per fleet (or the fixed sweep) -> settle phase -> report

Where the fleets run is behind one seam, `Fleets`: local processes (campaign.backends.local.fleets.LocalFleets:
emulators or CPU engines, Locust on this machine) or the deployed stack (campaign.backends.fargate.fleets.
CloudFleets: Fargate tasks inside the VPC). A capacity step reaches a fleet through the same
`StepRunner` on both sides, so the search, the settle phase and the report cannot differ.

Everything a report is built from lands in one run directory, laid out the same on both sides
(and, for a cloud run, in S3 under the run's prefix):

    records/                         the trace replay's records and summaries
    quality.json                     the gate's layers per fleet
    capacity/<fleet>/search.json, capacity/<fleet>/x<k>/ (records; settle-<n>/ segments)
    capacity/settle.json             what the settle phase did
    metrics/<fleet>/<step>.json      the server's histograms and up checks per step, as Prometheus gave them
    pulled/<source>.json             every other answer the report pulled (CloudWatch, time to ready, bills,
                                     prices, the replay window's Prometheus queries), with when it was pulled
    campaign.json                    instances measured, what served the fleets, readiness
    interrupted/                     a resumed run's cut-off steps, set aside (campaign.stages.resume): no report reads them
    resumes.json                     each resume: where it was cut off, what it kept, what ran again (the report says so)
    report.json, report.md, report.html

`report_from_run_dir` rebuilds the report from such a directory (`campaign report --run-dir`, and
`--run-id` once it is downloaded), reading pulled/ in place of the network: the same report after teardown.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from analysis.capacity.settle_record import SettleOutcome
from analysis.errors import AnalysisError
from analysis.model import QualityLayer, QualityResult
from analysis.report.inputs import PlannedCost
from campaign.stages.deadline import GATE_STAGE, REPLAY_STAGE, StageGuard, StepDeadline
from campaign.stages.quality import (
    DISTRIBUTION,
    distribution_layer,
    fleet_quality,
    gate_layers,
    replay_figures,
)
from campaign.stages.resume import CAMPAIGN_FILE as CAMPAIGN_FILE
from campaign.stages.resume import CAPACITY_DIR as CAPACITY_DIR
from campaign.stages.resume import (
    GATE,
    REPLAY,
    REPORT,
    SEARCH,
    SETTLE,
    FleetSteps,
    RunState,
    read_resumes,
    record_resume,
)
from campaign.stages.resume import QUALITY_FILE as QUALITY_FILE
from campaign.stages.resume import RECORDS_DIR as RECORDS_DIR
from campaign.stages.resume import prepare as prepare_resume
from core.manifest import CapacitySearch, Manifest

if TYPE_CHECKING:
    from analysis.capacity.search import StepPlan
    from analysis.model import Report
    from campaign.stages.capacity import StepRunner
    from core.records import RunSummary
    from loadgen.fixtures import GateResult
    from loadgen.replay_options import ReplayOptions


@dataclass
class RunFacts:
    """What the report needs to know about where the fleets ran (campaign.json)."""

    instances_measured: dict[str, int]
    systems_under_test: str | None = None  # None: the manifest's own hardware (a cloud run)
    aws: bool = False  # pull prices, CloudWatch and billing from AWS
    prometheus_url: str | None = None
    ready_after_s: dict[str, float] = field(default_factory=dict)
    prometheus_sigv4_region: str | None = None  # sign for aps in it though not an AMP URL (a stand-in)
    planned_cost: PlannedCost | None = None  # the plan the run was given: its cost beside the computed and billed
    scrape_interval_s: float | None = None  # the Prometheus scrape interval the fleets were scraped at

    def write(self, run_dir: Path) -> None:
        body: dict[str, Any] = {
            "instances_measured": self.instances_measured,
            "systems_under_test": self.systems_under_test,
            "aws": self.aws,
            "ready_after_s": self.ready_after_s,
        }
        if self.planned_cost is not None:
            body["planned_cost"] = asdict(self.planned_cost)
        if self.scrape_interval_s is not None:  # `report --run-dir` widens the replay's queries by it
            body["scrape_interval_s"] = self.scrape_interval_s
        (run_dir / CAMPAIGN_FILE).write_text(json.dumps(body, indent=2), encoding="utf-8")

    @classmethod
    def read(cls, run_dir: Path) -> RunFacts | None:
        path = run_dir / CAMPAIGN_FILE
        if not path.is_file():
            return None
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise AnalysisError(f"{path}: not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise AnalysisError(f"{path}: expected an object with instances_measured, got {type(d).__name__}")
        sut = d.get("systems_under_test")
        if sut is not None and not isinstance(sut, str):
            raise AnalysisError(f"{path}: systems_under_test: expected text or null, got {sut!r}")
        return cls(
            _numbers(path, d, "instances_measured", int, required=True),
            sut,
            bool(d.get("aws")),
            None,
            _numbers(path, d, "ready_after_s", float, required=False),
            planned_cost=_planned_cost(path, d.get("planned_cost")),
            scrape_interval_s=_scrape_interval(path, d.get("scrape_interval_s")),
        )


def _scrape_interval(path: Path, value: object) -> float | None:
    """campaign.json's scrape_interval_s: a positive number of seconds, or absent (a file written
    before it was recorded: the replay's cross-check is then read over the window as measured)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise AnalysisError(f"{path}: scrape_interval_s: expected a positive number of seconds, got {value!r}")
    return float(value)


def _planned_cost(path: Path, value: object) -> PlannedCost | None:
    """campaign.json's planned_cost ({usd, minutes, source, date}), or an error naming the field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise AnalysisError(f"{path}: planned_cost: expected {{usd, minutes, source, date}}, got {value!r}")
    usd, minutes, source, date = (value.get(k) for k in ("usd", "minutes", "source", "date"))
    for key, v, ok in (
        (
            "usd",
            usd,
            usd is None or (isinstance(usd, int | float) and not isinstance(usd, bool) and math.isfinite(usd)),
        ),
        ("minutes", minutes, isinstance(minutes, int | float) and not isinstance(minutes, bool) and minutes >= 0),
        ("source", source, isinstance(source, str) and bool(source)),
        ("date", date, isinstance(date, str) and bool(date)),
    ):
        if not ok:
            raise AnalysisError(f"{path}: planned_cost.{key}: not valid: {v!r}")
    return PlannedCost(None if usd is None else float(usd), float(minutes), str(source), str(date))  # type: ignore[arg-type]


def _numbers(
    path: Path, d: Mapping[str, Any], key: str, kind: type[int] | type[float], *, required: bool
) -> dict[str, Any]:
    """campaign.json's {fleet: number} field, or an error naming the field and the bad entry
    (the file may have been edited by hand before `report --run-dir`)."""
    value = d.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise AnalysisError(f"{path}: {key}: expected {{fleet: number}}, got {value!r}")
    out = {}
    for fleet, v in value.items():
        bad = isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0
        if bad or (kind is int and v != int(v)):
            raise AnalysisError(f"{path}: {key}.{fleet}: expected a non-negative {kind.__name__}, got {v!r}")
        out[str(fleet)] = kind(v)
    return out


class Fleets(Protocol):
    """Where the fleets serve and how load reaches them: the seam between the stages and a backend."""

    names: list[str]
    concurrent: int  # fleets measured at once by the search and the settle phase (1: one after another)

    def facts(self) -> RunFacts:
        """Instances measured, what served, where metrics come from (after `gate`: readiness too)."""
        ...

    def gate(self) -> dict[str, GateResult] | None:
        """Wait until every fleet serves, then run the quality gate's fixtures against each; None
        where no fleet can answer a fixture (the plan's simulated fleets): the gate is then assumed
        to pass, and said to be (ASSUMED_GATE)."""
        ...

    def replay(self, records_dir: Path, options: ReplayOptions) -> dict[str, RunSummary]:
        """The trace replay against every fleet at once; records into `records_dir`."""
        ...

    def steps(self) -> StepRunner:
        """How a capacity step or settle segment reaches one fleet."""
        ...

    def abort(self) -> None:
        """Stop everything in flight (Ctrl-C); records flushed so far stay."""
        ...

    def checkpoint(self, stage: str) -> None:
        """Keep the run directory as it stands where it outlives this process (on AWS: uploaded to
        the run's prefix, with the run record naming `stage`); run_stages calls it after each
        stage and before each capacity step or settle segment. Locally the disk already is."""
        ...


def say(line: str) -> None:
    print(line, flush=True)


def run_stages(
    m: Manifest,
    fleets: Fleets,
    run_dir: Path,
    stop: threading.Event,
    *,
    duration_s: float | None = None,
    capacity: bool = True,
    final_report: bool = True,
    full_report: bool = True,
    log: Callable[[str], None] = say,
    predicted: Mapping[str, float] | None = None,
    planned_cost: PlannedCost | None = None,
    before_stage: StageGuard = lambda stage: None,
    resume: RunState | None = None,
    deadline: StepDeadline | None = None,
) -> Report | None:
    """Every stage in order, into `run_dir`; returns the report (also written there), or None
    with `final_report=False` (`campaign run --no-report`: `campaign report --run-id` builds it later).
    `full_report=False`: the decision without the sensitivity grid and the pages (`campaign plan`).
    `predicted`: per fleet, the boundary `campaign plan` predicted, where each search looks first;
    `planned_cost`: that plan's campaign cost, kept in campaign.json for the report's billing.
    `before_stage`: called with the quality gate's and the replay's names before each starts (`campaign
    run`'s deadline, campaign.stages.deadline); it stops the campaign by raising. `deadline`: asked
    before each capacity step and settle segment (campaign.stages.deadline.StepDeadline); one it
    would cut is not started, the search or settle phase stops saying why, and the report follows.
    None (locally, in a plan): no stack, no deadline.
    `resume`: what a run cut off in `run_dir` had finished (campaign.stages.resume): the stages it
    finished are read from the directory, not run again; the one it was cut off in runs again
    from its start, its partial records set aside, but a search carries over its finished steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    records_dir = run_dir / RECORDS_DIR
    if resume is not None:
        resume = prepare_resume(resume, m.workload.capacity_sweep is not None, log)
        record_resume(resume)  # the report says so (provenance "resume"), `report --run-dir` too
        log(f"resuming at the {resume.stage}; carried over: {', '.join(resume.carried_over()) or 'no search step'}")
    records_dir.mkdir(exist_ok=True)
    if resume is None or resume.stage in (GATE, REPLAY):
        gated = gate_and_replay(m, fleets, run_dir, duration_s, log, before_stage)
        if isinstance(gated, tuple):
            quality, facts = gated
        else:
            return gated  # the gate failed: its report
    else:
        quality, facts = carried_gate_and_replay(fleets, run_dir, log)
    if planned_cost is not None:  # the plan the run was given (--from-plan): the report's planned campaign cost
        facts.planned_cost = planned_cost
        facts.write(run_dir)

    capacity_dirs: dict[str, Path] = {}
    settled: SettleOutcome | None = None
    carried = resume.stage if resume is not None else GATE
    if capacity and not all(q.passed is True for q in quality.values()):
        log("a quality layer failed: the comparison stops here; no capacity is measured")
    elif capacity:
        if carried in (SETTLE, REPORT):  # the search finished before the run was cut off
            from analysis.capacity.steps import discover_steps

            capacity_dirs = discover_steps(run_dir / CAPACITY_DIR)
        else:
            steps = resume.fleets if resume is not None else None
            capacity_dirs = measure_capacity(
                m, fleets, run_dir / CAPACITY_DIR, records_dir, stop, log, predicted, steps, deadline
            )
            fleets.checkpoint(SEARCH)
        if carried == REPORT:  # so did the settle phase
            settled = SettleOutcome.read(run_dir / CAPACITY_DIR)
        else:
            settled = settle_phase(m, fleets, run_dir, quality, facts, capacity_dirs, stop, log, deadline)
            fleets.checkpoint(SETTLE)
    save_server_series(m, run_dir, facts, capacity_dirs, log)  # before the report, and before any teardown
    fleets.checkpoint("server series")
    if not final_report:
        return None
    return run_report(m, run_dir, run_dir, quality, facts, capacity_dirs, settled, full=full_report)


def gate_and_replay(
    m: Manifest,
    fleets: Fleets,
    run_dir: Path,
    duration_s: float | None,
    log: Callable[[str], None],
    before_stage: StageGuard,
) -> tuple[dict[str, QualityResult], RunFacts] | Report:
    """The quality gate, then (if it passed) the trace replay and its distribution checks: the
    quality per fleet and the run's facts, or the gate's report when the gate failed."""
    from loadgen.replay_options import ReplayOptions

    records_dir = run_dir / RECORDS_DIR
    before_stage(GATE_STAGE)
    gates = fleets.gate()
    if gates is None:
        quality = write_quality(run_dir, {name: ASSUMED_GATE for name in fleets.names})
        layers: dict[str, list[QualityLayer]] = {}
        log(f"quality gate: not run ({ASSUMED_GATE_NOTE})")
    else:
        layers = gate_layers(m, gates)  # (a) fixtures + equivalence, (b) task acceptance
        quality = write_quality(run_dir, {k: fleet_quality(g, layers[k]) for k, g in gates.items()})
        print_gates(gates, quality, log)
    facts = fleets.facts()
    facts.write(run_dir)
    fleets.checkpoint(GATE)
    if not all(q.passed is True for q in quality.values()):
        from analysis.report.build import build_gate_report

        log("quality gate failed: no load is replayed; the report is decided on the gate alone")
        return build_gate_report(m, quality, out_dir=run_dir)

    before_stage(REPLAY_STAGE)
    summaries = fleets.replay(records_dir, ReplayOptions(duration_s=duration_s))
    for name, s in summaries.items():
        log(
            f"{name}: scheduled {s.scheduled} = completed {s.completed} + failed {s.failed} + not sent {s.not_sent}"
            f"; schedule lag p99 {s.schedule_lag_p99_s * 1000:.1f} ms{'' if s.valid else ' INVALID: ' + '; '.join(s.invalid_reasons)}"
        )
    if gates is not None:
        quality = distribution_checks(m, run_dir, gates, layers, log)
    fleets.checkpoint(REPLAY)
    return quality, facts


def carried_gate_and_replay(
    fleets: Fleets, run_dir: Path, log: Callable[[str], None]
) -> tuple[dict[str, QualityResult], RunFacts]:
    """A resumed run's gate and replay, as the run cut off recorded them: quality.json, and the
    facts of the fleets now with the readiness campaign.json recorded (the gate is not waited for again)."""
    quality = read_quality(run_dir / QUALITY_FILE)
    recorded = RunFacts.read(run_dir)
    if quality is None or recorded is None:  # RunState said the gate finished: both files were there
        raise AnalysisError(f"{run_dir}: no {QUALITY_FILE} or {CAMPAIGN_FILE} to resume from")
    facts = fleets.facts()
    facts.ready_after_s = recorded.ready_after_s or facts.ready_after_s
    facts.planned_cost = recorded.planned_cost
    log(f"quality gate and trace replay: carried over ({', '.join(f'{k} {q.passed}' for k, q in quality.items())})")
    return quality, facts


def step_windows(
    m: Manifest, records_dir: Path, capacity_dirs: Mapping[str, Path]
) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (fleet, step label), the step's window from its records (first send to last completion,
    analysis.measure.goodput.load_windows): the replay, every capacity step and every settle segment
    ("<label>+settle-<n>")."""
    from analysis.capacity.steps import REPLAY
    from analysis.measure.goodput import SETTLE_DIR, load_windows
    from analysis.sources.records import load_records

    out: dict[tuple[str, str], tuple[float, float]] = {}
    for label, d in {REPLAY: records_dir, **capacity_dirs}.items():
        for (fleet, segment), window in load_windows(load_records(d, m.digest)).items():
            out[(fleet, label if not segment else f"{label}+{SETTLE_DIR}{segment}")] = window
    return out


def save_server_series(
    m: Manifest,
    run_dir: Path,
    facts: RunFacts,
    capacity_dirs: Mapping[str, Path],
    log: Callable[[str], None] = say,
) -> int:
    """Pull the server's histograms and the targets' up checks over every step's window into
    metrics/<fleet>/<step>.json (analysis.sources.server_series), so the report's per-step server
    figures can be computed again from the run directory with no network. Returns the files
    written; a Prometheus that does not answer is logged (the report's prometheus gap says it)."""
    from analysis.errors import SourceUnavailable
    from analysis.sources.prometheus import HistogramNames, PrometheusSource
    from analysis.sources.server_series import METRICS_DIR, pull_step, write_series

    if not facts.prometheus_url or not facts.scrape_interval_s:
        return 0
    stacks = {f.name: f.serving.stack for f in m.fleets}
    written = 0
    try:
        src = PrometheusSource(facts.prometheus_url, sigv4_region=facts.prometheus_sigv4_region)
        for (fleet, label), window in sorted(step_windows(m, run_dir / RECORDS_DIR, capacity_dirs).items()):
            names = HistogramNames.for_stack(stacks[fleet])
            saved = pull_step(src, names, fleet, label, window, facts.scrape_interval_s)
            write_series(run_dir / METRICS_DIR, saved)
            written += 1
    except (SourceUnavailable, ValueError) as exc:
        log(f"server histograms per step not saved after {written} step(s): {exc}")
        return written
    log(f"server histograms per step: {written} step(s) saved in {METRICS_DIR}/")
    return written


# What the report holds for a fleet whose gate could not run (the plan's simulated fleets).
ASSUMED_GATE_NOTE = "campaign plan assumes the quality gate passes"
ASSUMED_GATE = QualityResult.model_validate(
    {"passed": True, "pass_rate": 1.0, "failures": [], "assumed": ASSUMED_GATE_NOTE}
)


def distribution_checks(
    m: Manifest,
    run_dir: Path,
    gates: dict[str, GateResult],
    layers: dict[str, list[QualityLayer]],
    log: Callable[[str], None],
) -> dict[str, QualityResult]:
    """Layer (c) over the replayed requests, added to each fleet's layers; quality.json again."""
    try:
        figs = replay_figures(run_dir / RECORDS_DIR, m)
    except AnalysisError as exc:  # nothing replayed: the layer says so (not evaluated)
        log(f"distribution checks: {exc}")
        figs = {}
    for name in layers:
        layers[name].append(distribution_layer(m, name, figs))
    quality = write_quality(run_dir, {k: fleet_quality(g, layers[k]) for k, g in gates.items()})
    print_layer(quality, DISTRIBUTION, log)
    return quality


class CheckpointedSteps:
    """A StepRunner that checkpoints the run before each step or segment it starts: what the steps
    before it left (their records, verdicts, the search's and settle phase's files) is kept before
    more load goes on a fleet, so a run killed mid-search loses at most the steps in flight."""

    def __init__(self, inner: StepRunner, fleets: Fleets, stage: str) -> None:
        self.inner, self.fleets, self.stage = inner, fleets, stage

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        self.fleets.checkpoint(f"{self.stage}: before {fleet}/{plan.label}")
        return self.inner.run(fleet, plan, step_dir, planned, stop)

    def abort(self) -> None:
        self.inner.abort()


def measure_capacity(
    m: Manifest,
    fleets: Fleets,
    root: Path,
    replay_dir: Path,
    stop: threading.Event,
    log: Callable[[str], None],
    predicted: Mapping[str, float] | None = None,
    resume: Mapping[str, FleetSteps] | None = None,
    deadline: StepDeadline | None = None,
) -> dict[str, Path]:
    """The fixed sweep when the manifest has workload.capacity_sweep, else the automatic search
    (`resume`: per fleet, the steps a run cut off had finished; `deadline`: asked before each step)."""
    from campaign.stages.capacity import run_search, run_sweep

    steps = CheckpointedSteps(fleets.steps(), fleets, SEARCH)
    if m.workload.capacity_sweep is not None:
        return run_sweep(m, fleets.names, steps, root, stop, log, fleets.concurrent, deadline)
    return run_search(
        m, fleets.names, steps, root, replay_dir, stop, log, fleets.concurrent, predicted, resume, deadline
    )


def settle_phase(
    m: Manifest,
    fleets: Fleets,
    run_dir: Path,
    quality: Mapping[str, QualityResult],
    facts: RunFacts,
    capacity_dirs: dict[str, Path],
    stop: threading.Event,
    log: Callable[[str], None],
    deadline: StepDeadline | None = None,
) -> SettleOutcome | None:
    """The settle phase after an automatic search (campaign.stages.settle), when its budget allows one."""
    from campaign.stages import settle

    # A manifest without capacity_search searches with its defaults (campaign.stages.capacity.run_search),
    # and settles with them too: until 2026-12-05 the live phase was skipped without the block while
    # `campaign plan` ran it, so the plan predicted a phase the campaign never ran.
    cfg = m.workload.capacity_search or CapacitySearch()
    if not capacity_dirs or m.workload.capacity_sweep is not None or cfg.settle_budget_s <= 0:
        return None

    def interim() -> Report:  # the decision as the records stand: what the next round must settle
        return run_report(m, run_dir, run_dir / "settle-interim", quality, facts, capacity_dirs, None, full=False)

    root = run_dir / CAPACITY_DIR

    def steps() -> StepRunner:
        return CheckpointedSteps(fleets.steps(), fleets, SETTLE)

    return settle.settle_phase(m, steps, root, capacity_dirs, interim, stop, log, fleets.concurrent, deadline)


def run_report(
    m: Manifest,
    run_dir: Path,
    out_dir: Path,
    quality: Mapping[str, QualityResult] | None,
    facts: RunFacts,
    capacity_dirs: Mapping[str, Path] | None,
    settled: SettleOutcome | None,
    *,
    full: bool = True,
    focus_csv: str | Path | None = None,
    records_dir: Path | str | None = None,
    saved: Collection[str] = (),
) -> Report:
    """The report from a run directory's records (or `records_dir`, `campaign report --records`)
    and what the stages found, into `out_dir`: the one place the campaign builds a report's inputs.
    `full=False`: the decision only (the settle phase's interim reports, `campaign plan`): no
    sensitivity grid, no pages, and no AWS or Prometheus pulls. Every answer pulled is kept in
    `run_dir`'s pulled/ (analysis.sources.pulled); `saved`: the sources read from there instead
    of pulled again (report_from_run_dir)."""
    from analysis.capacity.steps import SEARCH_FILE
    from analysis.report.build import ReportInputs, build_report
    from analysis.sources.pulled import PulledStore
    from analysis.sources.server_series import METRICS_DIR

    metrics_dir = run_dir / METRICS_DIR
    # The steps in the order their directory lists them (analysis.capacity.steps.discover_steps),
    # not the order the run measured them in: the report the run builds and the one rebuilt from
    # its directory list them alike.
    # A run whose searches all stopped before their first step has no step but has its searches.
    root = run_dir / CAPACITY_DIR
    searched = root.is_dir() and any(root.glob(f"*/{SEARCH_FILE}"))
    steps = (
        dict(sorted((capacity_dirs or {}).items(), key=lambda kv: kv[0].split("/")))
        if capacity_dirs or searched
        else None
    )
    return build_report(
        ReportInputs(
            m,
            records_dir if records_dir is not None else run_dir / RECORDS_DIR,
            metrics_dir=metrics_dir if metrics_dir.is_dir() else None,
            prometheus_url=facts.prometheus_url if full else None,
            prometheus_sigv4_region=facts.prometheus_sigv4_region,
            prometheus_scrape_interval_s=facts.scrape_interval_s,
            aws=facts.aws and full,
            quality=quality,
            out_dir=out_dir,
            instances_measured=facts.instances_measured,
            focus_csv=focus_csv,
            planned_cost=facts.planned_cost if full else None,
            capacity_dirs=steps,
            capacity_root=root if searched else None,
            systems_under_test=facts.systems_under_test,
            settle=settled,
            resumed=read_resumes(run_dir),
            with_sensitivity=full,
            with_pages=full,
            pulled=PulledStore.for_run(run_dir, saved) if full else None,
        )
    )


def report_from_run_dir(
    m: Manifest,
    run_dir: Path,
    out_dir: Path | None = None,
    *,
    prometheus_url: str | None = None,
    prometheus_sigv4_region: str | None = None,
    planned_cost: PlannedCost | None = None,
    focus_csv: str | Path | None = None,
    pull_again: Collection[str] = (),
) -> Report:
    """The report again from a run directory as `run_stages` left it (or as downloaded from S3);
    `planned_cost`: the plan's figure, over campaign.json's; `focus_csv`: a FOCUS export to bill from.
    Every answer the run pulled is read from its pulled/ (analysis.sources.pulled), not asked again,
    so the report after teardown is the run's; `pull_again`: sources asked again all the same (their
    new answers kept in the directory in place of the old), as `report --run-id` asks for the bill."""
    from analysis.capacity.steps import discover_steps
    from analysis.report.build import build_gate_report
    from analysis.sources.pulled import SOURCES

    facts = RunFacts.read(run_dir)
    if facts is None:
        raise AnalysisError(
            f"{run_dir}: no {CAMPAIGN_FILE} (not a run directory written by `campaign local` or `campaign run`)"
        )
    facts.prometheus_url, facts.prometheus_sigv4_region = prometheus_url, prometheus_sigv4_region
    facts.planned_cost = planned_cost or facts.planned_cost
    quality = read_quality(run_dir / QUALITY_FILE)
    out = out_dir or run_dir
    if quality is not None and not any(
        (run_dir / RECORDS_DIR).glob("records-*")
    ):  # the gate failed: nothing was replayed
        return build_gate_report(m, quality, out_dir=out)
    steps = discover_steps(run_dir / CAPACITY_DIR)
    settled = SettleOutcome.read(run_dir / CAPACITY_DIR)
    saved = SOURCES - set(pull_again)
    return run_report(m, run_dir, out, quality, facts, steps or None, settled, focus_csv=focus_csv, saved=saved)


def write_quality(run_dir: Path, quality: dict[str, QualityResult]) -> dict[str, QualityResult]:
    body = {k: q.model_dump(mode="json") for k, q in quality.items()}
    (run_dir / QUALITY_FILE).write_text(json.dumps(body, indent=2))
    return quality


def read_quality(path: Path) -> dict[str, QualityResult] | None:
    """quality.json (or `campaign report --quality FILE`): per fleet, the gate's verdict and its
    layers; None when there is no such file; an error naming the file and the field otherwise."""
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path}: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise AnalysisError(f"{path}: expected {{fleet: quality result}}, got {type(body).__name__}")
    out = {}
    for fleet, q in body.items():
        try:
            out[str(fleet)] = QualityResult.model_validate(q)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (fleet, *first["loc"]))
            raise AnalysisError(f"{path}: {where}: {first['msg']}") from None
    return out


def print_gates(
    gates: dict[str, GateResult], quality: Mapping[str, QualityResult], log: Callable[[str], None] = say
) -> None:
    for name, g in gates.items():
        q = quality[name]
        verdict = {True: "pass", False: "FAIL", None: "NOT EVALUATED"}[q.passed]
        layer = f", layer {q.failed_layer}" if q.failed_layer else ""
        log(f"quality gate {name}: {verdict} ({g.pass_rate:.0%} of {len(g.fixtures)} fixtures{layer})")
        for f in q.failures:
            log(f"  {f}")


def print_layer(quality: Mapping[str, QualityResult], layer: str, log: Callable[[str], None] = say) -> None:
    for name, q in quality.items():
        res = (q.layers or {}).get(layer)
        if res is None:
            continue
        verdict = {True: "pass", False: "FAIL", None: "NOT EVALUATED"}[res.passed]
        ks = res.figures.get("output_length_ks")
        test = (
            f", output lengths vs {ks['against']}: KS p = {ks['p_value']:.3g} (n = {ks['n']}, {ks['m']})" if ks else ""
        )
        log(
            f"quality {layer} {name}: {verdict} (invalid {res.figures.get('invalid_rate', 0):.3f}, "
            f"retried {res.figures.get('retry_rate', 0):.3f}{test})"
        )
        for r in res.reasons:
            log(f"  {r}")
