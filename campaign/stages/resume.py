"""Where a run that was cut off stands, read from its run directory (`campaign run --resume`).

`run_stages` checkpoints the run directory after each stage and before each capacity step or
settle segment (campaign.stages.run), and a search step's verdict lands in its `step.json` as soon
as it is judged (analysis.capacity.steps.write_search_step). So a downloaded run directory says,
file by file, what finished:

    quality.json + campaign.json                     the quality gate
    records/records-<fleet>-* of every fleet and the
    distribution layer in quality.json               the trace replay (no layer where the gate was
                                                     assumed: `campaign plan`'s simulated fleets)
    capacity/<fleet>/x<k>/step.json                  a finished search step (its verdict)
    capacity/<fleet>/x<k>/ without step.json         a step cut off mid-way: interrupted
    capacity/<fleet>/search.json                     that fleet's search finished
    capacity/settle-progress.json                    the settle phase's finished rounds (and
                                                     the round in flight, whose segments run again)
    capacity/settle.json                             the settle phase finished
    inputs/schedule.json                             the run's inputs (manifest and schedule digests)
    resumes.json                                     the run's resumes so far (record_resume), which
                                                     the report states (provenance "resume")

An interrupted step's partial records are moved aside, under `interrupted/`, outside `capacity/`,
so no report pools them (analysis.capacity.steps.discover_steps reads every directory under
`capacity/<fleet>/`), and the step is run again from its start.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.errors import AnalysisError
from campaign.stages.quality import DISTRIBUTION
from core.cloud_contract import INPUT_SCHEDULE, INPUTS_DIR, RunInputs
from loadgen.recording import fleet_records

if TYPE_CHECKING:  # the analysis stack (duckdb) stays out of the CLI's `--help` (tests/campaign/test_cli.py)
    from analysis.capacity.steps import SearchStep
    from analysis.report.inputs import Resumption

# The run directory's layout (campaign.stages.run's docstring draws it).
CAMPAIGN_FILE = "campaign.json"
QUALITY_FILE = "quality.json"
RECORDS_DIR = "records"
CAPACITY_DIR = "capacity"
# Under the run directory, beside capacity/: what a cut-off step or replay had recorded.
INTERRUPTED_DIR = "interrupted"
# Under the run directory: one record per resume, in order (record_resume).
RESUMES_FILE = "resumes.json"

# The stages in order, as run_stages names them in its checkpoints.
GATE = "quality gate"
REPLAY = "trace replay"
SEARCH = "capacity search"
SETTLE = "settle phase"
REPORT = "report"


# What read_run_state takes as "finished", each vouching for the files beside or under it, in
# the order a copy elsewhere (the run's S3 prefix) must receive them, after everything else: a step's
# verdict after its files, a fleet's search after its verdicts, the settle phase after its segments
# and the steps it reopened, the gate's two files last (quality.json gains the replay's layer).
# (Names as analysis.capacity.steps and settle_record write them; not imported: duckdb stays out.)
FINISH_MARKERS = ("step.json", "search.json", "settle-progress.json", "settle.json", CAMPAIGN_FILE, QUALITY_FILE)


def publish_order(rel: str) -> tuple[int, str]:
    """The sort key of a run-relative path for uploading a run directory: FINISH_MARKERS last, in order."""
    name = rel.rsplit("/", 1)[-1]
    return (1 + FINISH_MARKERS.index(name), rel) if name in FINISH_MARKERS else (0, rel)


@dataclass(frozen=True)
class FleetSteps:
    """One fleet's capacity search as its directory stands."""

    finished: Mapping[str, SearchStep]  # label -> the verdict in its step.json
    interrupted: tuple[str, ...]  # labels of step directories without a step.json
    search_finished: bool  # search.json is there


@dataclass(frozen=True)
class RunState:
    """What a run directory says finished; `inputs`: the run's inputs/schedule.json, if downloaded."""

    run_dir: Path
    gate_finished: bool
    replay_finished: bool
    fleets: Mapping[str, FleetSteps]
    settle_finished: bool
    inputs: RunInputs | None = None
    # What `prepare` moved under interrupted/ (run-relative destinations): it runs again.
    set_aside: tuple[str, ...] = ()

    @property
    def search_finished(self) -> bool:
        return bool(self.fleets) and all(f.search_finished for f in self.fleets.values())

    @property
    def stage(self) -> str:
        """The first stage that did not finish (REPORT: every stage did)."""
        if not self.gate_finished:
            return GATE
        if not self.replay_finished:
            return REPLAY
        if not self.search_finished:
            return SEARCH
        if not self.settle_finished:
            return SETTLE
        return REPORT

    def carried_over(self) -> list[str]:
        """Every finished search step, "<fleet>/<label>", which a resumed run does not run again."""
        return [f"{fleet}/{label}" for fleet, st in sorted(self.fleets.items()) for label in sorted(st.finished)]

    def interrupted(self) -> list[str]:
        return [f"{fleet}/{label}" for fleet, st in sorted(self.fleets.items()) for label in st.interrupted]


def read_run_state(run_dir: Path, fleets: list[str]) -> RunState:
    """The state of `run_dir` for the manifest's `fleets`; a step.json or inputs file that does not
    parse is an AnalysisError naming it."""
    read = _read_json(run_dir / QUALITY_FILE)
    quality: dict[str, Any] = read if isinstance(read, dict) else {}
    gate = bool(quality) and (run_dir / CAMPAIGN_FILE).is_file()
    records = run_dir / RECORDS_DIR
    replayed = all(fleet_records(records, f) for f in fleets)
    # quality.json gains the distribution layer once the replay's records are judged (run_stages),
    # unless the gate was assumed (campaign plan's simulated fleets): then there are no layers
    distribution = all(
        (q := quality.get(f) or {}).get("assumed") or DISTRIBUTION in (q.get("layers") or {}) for f in fleets
    )
    from analysis.capacity.settle_record import SETTLE_FILE

    capacity = run_dir / CAPACITY_DIR
    return RunState(
        run_dir,
        gate,
        gate and replayed and distribution,
        {f: _fleet_steps(capacity / f) for f in fleets},
        (capacity / SETTLE_FILE).is_file(),
        _read_inputs(run_dir / INPUTS_DIR / INPUT_SCHEDULE),
    )


def _fleet_steps(fleet_dir: Path) -> FleetSteps:
    from analysis.capacity.steps import SEARCH_FILE, STEP_FILE, SearchStep

    finished: dict[str, SearchStep] = {}
    interrupted: list[str] = []
    for d in sorted(p for p in fleet_dir.iterdir() if p.is_dir()) if fleet_dir.is_dir() else []:
        verdict = d / STEP_FILE
        if not verdict.is_file():
            interrupted.append(d.name)
            continue
        try:
            finished[d.name] = SearchStep.model_validate_json(verdict.read_bytes())
        except ValueError as exc:
            raise AnalysisError(f"{verdict}: not a search step's verdict ({exc})") from None
    return FleetSteps(finished, tuple(interrupted), (fleet_dir / SEARCH_FILE).is_file())


def _read_json(path: Path) -> object:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise AnalysisError(f"{path}: not JSON ({exc})") from None


def _read_inputs(path: Path) -> RunInputs | None:
    if not path.is_file():
        return None
    try:
        return RunInputs.from_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise AnalysisError(f"{path}: {exc}") from None


# Told of each move (the run-relative source and destination), so a copy elsewhere (the run's
# S3 prefix, campaign.backends.fargate.run.CloudRun.move) moves the same.
OnMove = Callable[[str, str], object]


def set_aside(run_dir: Path, relative: str, on_move: OnMove | None = None) -> Path:
    """Move `run_dir/relative` (a cut-off step's or replay's partial records) to
    `run_dir/interrupted/<relative>-<n>` (n: the first free), where no report reads it; the new path."""
    src = run_dir / relative
    n = 1
    while (dst := run_dir / INTERRUPTED_DIR / f"{relative}-{n}").exists():
        n += 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(src, dst)
    if on_move is not None:
        on_move(relative, dst.relative_to(run_dir).as_posix())
    return dst


def set_aside_interrupted(state: RunState, on_move: OnMove | None = None) -> list[Path]:
    """Every interrupted step of `state` moved aside (set_aside); the directories they went to."""
    return [
        set_aside(state.run_dir, f"{CAPACITY_DIR}/{fleet}/{label}", on_move)
        for fleet, st in sorted(state.fleets.items())
        for label in st.interrupted
    ]


def prepare(state: RunState, sweep: bool, log: Callable[[str], None], on_move: OnMove | None = None) -> RunState:
    """Move aside what the stage the run resumes at had left half done, so it runs again from its
    start and nothing of it is pooled with the new records; the state again, as it now stands.
    Idempotent: a second call finds nothing left to move.

    At the gate or the replay: the replay's records. In the search: each interrupted step (a
    fixed sweep, which records no verdict per step, is run again whole: its steps). In the settle
    phase: the segments of the round it was cut off in (capacity/settle-progress.json names the
    finished ones) and the steps of a search it reopened, which search.json does not hold yet."""
    from analysis.capacity.steps import read_search_path
    from analysis.measure.goodput import SETTLE_DIR

    run_dir, stage = state.run_dir, state.stage
    moved: list[Path] = []
    if stage in (GATE, REPLAY) and any((run_dir / RECORDS_DIR).glob("*")):
        moved.append(set_aside(run_dir, RECORDS_DIR, on_move))
    if stage == SEARCH and sweep and (run_dir / CAPACITY_DIR).is_dir():
        moved.append(set_aside(run_dir, CAPACITY_DIR, on_move))
    elif stage == SEARCH:
        moved += set_aside_interrupted(state, on_move)
    if stage == SETTLE:
        from analysis.capacity.settle_record import SettleProgress

        # The segments of the rounds the phase finished are kept (its progress file names them);
        # the round in flight, and every segment of a run without that file, runs again.
        progress = SettleProgress.read(run_dir / CAPACITY_DIR)
        finished = {s.directory for s in progress.outcome.segments} if progress is not None else set()
        for fleet in sorted(state.fleets):
            path = read_search_path(run_dir / CAPACITY_DIR / fleet)
            searched = {s.label for s in path.steps} if path is not None else set()
            for label in sorted(state.fleets[fleet].finished.keys() | set(state.fleets[fleet].interrupted)):
                step = f"{CAPACITY_DIR}/{fleet}/{label}"
                if label not in searched:
                    moved.append(set_aside(run_dir, step, on_move))
                    continue
                for seg in sorted((run_dir / step).glob(f"{SETTLE_DIR}*")):
                    if f"{fleet}/{label}/{seg.name}" not in finished:
                        moved.append(set_aside(run_dir, f"{step}/{seg.name}", on_move))
    for d in moved:
        log(f"resume: set aside what was cut off: {d.relative_to(run_dir)}")
    if not moved:
        return state
    now = read_run_state(run_dir, list(state.fleets))
    return replace(now, set_aside=state.set_aside + tuple(d.relative_to(run_dir).as_posix() for d in moved))


def kept_segments(state: RunState) -> list[str]:
    """The settle segments under the finished search steps, "<fleet>/<label>/settle-<n>": after
    `prepare`, those the phase finished, which a resumed run does not run again."""
    from analysis.measure.goodput import SETTLE_DIR

    capacity = state.run_dir / CAPACITY_DIR
    return [
        f"{fleet}/{label}/{seg.name}"
        for fleet, st in sorted(state.fleets.items())
        for label in sorted(st.finished)
        for seg in sorted((capacity / fleet / label).glob(f"{SETTLE_DIR}*"))
        if seg.is_dir()
    ]


def record_resume(state: RunState) -> Resumption:
    """Add this resume of the run, from its state after `prepare`, to the run directory's
    RESUMES_FILE (which goes up with the run directory, so a later resume and `report --run-dir`
    read the same): where it was cut off, what it carries over, what was set aside to run again."""
    from analysis.report.inputs import Resumption

    done = read_resumes(state.run_dir)
    this = Resumption(
        at=state.stage,
        carried_over=tuple(state.carried_over() + kept_segments(state)),
        set_aside=state.set_aside,
    )
    path = state.run_dir / RESUMES_FILE
    tmp = path.with_name(path.name + ".tmp")  # a kill mid-write leaves the resumes recorded before
    tmp.write_text(json.dumps([r.model_dump(mode="json") for r in (*done, this)], indent=2), encoding="utf-8")
    tmp.replace(path)
    return this


def read_resumes(run_dir: Path) -> tuple[Resumption, ...]:
    """The run's resumes in order (RESUMES_FILE); none without the file; an AnalysisError naming
    the file and the field when it does not hold them."""
    from pydantic import ValidationError

    from analysis.report.inputs import Resumption

    path = run_dir / RESUMES_FILE
    body = _read_json(path)
    if body is None:
        return ()
    if not isinstance(body, list):
        raise AnalysisError(f"{path}: expected a list of resumes, got {type(body).__name__}")
    resumes = []
    for i, r in enumerate(body):
        try:
            resumes.append(Resumption.model_validate(r))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in (i, *first["loc"]))
            raise AnalysisError(f"{path}: {where}: {first['msg']}") from None
    return tuple(resumes)
