"""run_stages(resume=...): a run killed mid-search or mid-settle, resumed from its run directory,
takes the steps the uninterrupted run took, in the same order, and runs no finished step twice.
The campaign's own stages run on `campaign plan`'s simulated fleets (seconds, deterministic)."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from analysis.capacity.search import StepPlan
from analysis.capacity.settle_record import SettleProgress
from analysis.capacity.steps import write_search_step
from analysis.errors import AnalysisError
from campaign.backends.simulated.fleets import SimulatedFleets, SimulatedSteps
from campaign.stages import resume
from campaign.stages.capacity import ResumeMismatch
from campaign.stages.run import report_from_run_dir, run_stages
from core.manifest import Manifest, load_manifest


class Killed(Exception):
    """The orchestrator died here."""


class KillingSteps:
    """A StepRunner that runs steps in simulated time, noting each one it starts, and after `after`
    of them dies in the next one once its records are written, before its verdict (a SIGKILL mid-step)."""

    def __init__(self, inner: SimulatedSteps, run_dir: Path, started: list[str], after: int | None) -> None:
        self.inner, self.run_dir, self.started, self.after = inner, run_dir, started, after

    def run(
        self, fleet: str, plan: StepPlan, step_dir: Path, planned: int, stop: threading.Event
    ) -> tuple[float, str | None]:
        self.started.append(step_dir.relative_to(self.run_dir / "capacity").as_posix())
        out = self.inner.run(fleet, plan, step_dir, planned, stop)
        if self.after is not None and len(self.started) > self.after:
            raise Killed(step_dir)
        return out

    def abort(self) -> None:
        self.inner.abort()


class Fleets(SimulatedFleets):
    def __init__(self, m: Manifest, run_dir: Path, after: int | None = None) -> None:
        super().__init__(m, overhead_s=60.0)
        self.concurrent = 1  # one fleet after the other: the order of the steps is the run's own
        self.run_dir, self.after = run_dir, after
        self.started: list[str] = []

    def steps(self) -> KillingSteps:  # type: ignore[override]
        return KillingSteps(super().steps(), self.run_dir, self.started, self.after)


def _run(m: Manifest, run_dir: Path, after: int | None = None, state: resume.RunState | None = None) -> Fleets:
    fleets = Fleets(m, run_dir, after)
    run_stages(m, fleets, run_dir, threading.Event(), full_report=False, log=lambda line: None, resume=state)
    return fleets


def _searches(run_dir: Path, m: Manifest) -> dict[str, Any]:
    return {f.name: json.loads((run_dir / "capacity" / f.name / "search.json").read_text()) for f in m.fleets}


def _decision(run_dir: Path) -> Any:
    return json.loads((run_dir / "report.json").read_text())["decision"]


def _provenance(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "report.json").read_text())["provenance"])


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, example_manifest_path: Path) -> tuple[Manifest, Path, list[str]]:
    """The example's campaign run through, uninterrupted: its manifest, run directory and steps in order."""
    m = load_manifest(example_manifest_path)
    run_dir = tmp_path_factory.mktemp("whole")
    return m, run_dir, _run(m, run_dir).started


def _kill_and_resume(m: Manifest, tmp_path: Path, after: int) -> tuple[list[str], list[str], resume.RunState]:
    with pytest.raises(Killed):
        _run(m, tmp_path, after)
    state = resume.read_run_state(tmp_path, [f.name for f in m.fleets])
    resumed = _run(m, tmp_path, state=state)
    return resumed.started, state.carried_over(), state


def test_a_run_killed_mid_search_resumes_on_the_same_path(
    example: tuple[Manifest, Path, list[str]], tmp_path: Path
) -> None:
    m, whole_dir, whole = example
    searched = [s for s in whole if "settle-" not in s]
    after = len(searched) // 2  # mid-search (the first fleet's, or the second's)
    assert 0 < after < len(searched) - 1, whole
    resumed, carried, state = _kill_and_resume(m, tmp_path, after)
    assert state.stage == resume.SEARCH
    cut = whole[after]
    assert state.interrupted() == [cut]
    assert sorted(carried) == sorted(whole[:after])
    assert resumed == whole[after:]  # the cut step again from its start, then what the whole run did next
    assert not set(resumed) & set(carried)  # no finished step ran twice
    assert (tmp_path / "interrupted" / "capacity" / f"{cut}-1").is_dir()  # its partial records, kept apart
    assert _searches(tmp_path, m) == _searches(whole_dir, m)
    assert (tmp_path / "capacity" / "settle.json").read_text() == (whole_dir / "capacity" / "settle.json").read_text()
    assert _decision(tmp_path) == _decision(whole_dir)
    # `report --run-dir` over the resumed directory (interrupted/ beside it) decides as the resumed run did
    again = report_from_run_dir(m, tmp_path, tmp_path / "again")
    assert again.decision.model_dump(mode="json") == _decision(tmp_path)
    # the report says it was resumed: where it was cut off, what it carried over, what ran again
    # (issue 46, finding 12: on 35fb9c4 only run.json said so, the report had no "resume" entry)
    said = _provenance(tmp_path).get("resume")
    assert said is not None, sorted(_provenance(tmp_path))
    assert said["value"] == [
        {"at": resume.SEARCH, "carried_over": sorted(carried), "set_aside": [f"interrupted/capacity/{cut}-1"]}
    ]
    assert said["source"] == "measured" and f"set aside and run again: interrupted/capacity/{cut}-1" in said["detail"]
    assert again.provenance["resume"].model_dump(mode="json") == said  # `report --run-dir` says the same
    assert "resume" not in _provenance(whole_dir)  # a run that ran through says nothing of it


def test_a_run_killed_mid_settle_carries_the_search_and_what_it_spent_over(
    example: tuple[Manifest, Path, list[str]], tmp_path: Path
) -> None:
    """Issue 46, finding 2: the resumed phase restarted its seconds, USD and reopen count at 0, so a
    run cut off in a segment ran the phase again from its start and could spend its budget twice.
    Now the round in flight counts at what it reserved, and only what fits after it runs."""
    m, whole_dir, whole = example
    segments = [i for i, s in enumerate(whole) if "settle-" in s]
    assert segments, f"the example's simulated campaign ran no settle segment: {whole}"  # never a skip
    after = segments[-1]  # killed in the phase's last segment
    with pytest.raises(Killed):
        _run(m, tmp_path, after)
    progress = SettleProgress.read(tmp_path / "capacity")
    assert progress is not None and progress.pending_usd > 0  # what the round in flight reserved
    state = resume.read_run_state(tmp_path, [f.name for f in m.fleets])
    resumed, carried = _run(m, tmp_path, state=state).started, state.carried_over()
    assert state.stage == resume.SETTLE
    assert not set(resumed) & set(carried)  # no search step ran again
    assert not set(resumed) & set(whole[segments[0] : after])  # no finished segment ran again
    # The cut segment's reservation leaves less than it needs again: the phase stops at its budget
    # instead of running it a second time (on 17e73d2 it ran again: the budget spent twice).
    assert resumed == [], resumed
    cfg = m.workload.capacity_search
    assert cfg is not None
    whole_settle = json.loads((whole_dir / "capacity" / "settle.json").read_text())
    settled = json.loads((tmp_path / "capacity" / "settle.json").read_text())
    cut = settled["interrupted_seconds"]
    # the one round's USD as it reserved it (its segments' estimated wall time; the whole run's
    # settle.json has what they took: on the whole run, `usd` is measured)
    assert cut > 0 and settled["interrupted_usd"] == pytest.approx(progress.pending_usd)
    assert whole_settle["usd"] > 0
    assert settled["stopped"] == "budget" and settled["seconds"] == pytest.approx(cut)
    assert settled["seconds"] <= cfg.settle_budget_s
    assert cfg.settle_budget_usd is None or settled["usd"] <= cfg.settle_budget_usd
    assert _decision(tmp_path)["state"] == _decision(whole_dir)["state"]
    # the report says the run was cut off in the settle phase, kept every search step, and set the
    # segment it was cut off in aside to run again
    assert _provenance(tmp_path).get("resume", {}).get("value") == [
        {"at": resume.SETTLE, "carried_over": sorted(carried), "set_aside": [f"interrupted/capacity/{whole[after]}-1"]}
    ]


def test_a_resume_records_the_settle_segments_it_keeps(
    example: tuple[Manifest, Path, list[str]], tmp_path: Path
) -> None:
    """Cut off after the phase's last round, before settle.json: its segments are kept, and the
    resume's record (resumes.json, the report's provenance "resume") names them as carried over."""
    m, whole_dir, whole = example
    run_dir = tmp_path / "run"
    shutil.copytree(whole_dir, run_dir)
    (run_dir / "capacity" / "settle.json").unlink()
    state = resume.read_run_state(run_dir, [f.name for f in m.fleets])
    assert state.stage == resume.SETTLE
    segments = sorted(s for s in whole if "/settle-" in s)
    assert segments
    resumed = _run(m, run_dir, state=state)
    # the phase goes on from its finished round: none of its segments runs again, none is lost
    assert not set(resumed.started) & set(segments), resumed.started
    settled = json.loads((run_dir / "capacity" / "settle.json").read_text())
    assert [s["directory"] for s in settled["segments"]] == segments
    (recorded,) = resume.read_resumes(run_dir)
    assert recorded.at == resume.SETTLE and recorded.set_aside == ()
    assert list(recorded.carried_over) == state.carried_over() + segments  # the kept segments named
    assert _provenance(run_dir)["resume"]["value"] == [recorded.model_dump(mode="json")]
    again = resume.record_resume(resume.read_run_state(run_dir, [f.name for f in m.fleets]))  # a later resume
    assert resume.read_resumes(run_dir) == (recorded, again) and again.at == resume.REPORT


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ("{}", "expected a list of resumes, got dict"),
        ('[{"at": "report", "carried_over": [], "set_aside": []}, {"at": "report"}]', "1.carried_over: Field required"),
        ('[{"at": "report", "carried_over": [], "set_aside": [], "when": 1}]', "0.when: Extra inputs"),
    ],
)
def test_a_malformed_resumes_file_names_the_entry_and_field(tmp_path: Path, body: str, names: str) -> None:
    (tmp_path / resume.RESUMES_FILE).write_text(body, encoding="utf-8")
    with pytest.raises(AnalysisError, match=names):
        resume.read_resumes(tmp_path)


def test_a_recorded_step_off_the_search_path_is_refused(
    example: tuple[Manifest, Path, list[str]], tmp_path: Path
) -> None:
    m, _, whole = example
    with pytest.raises(Killed):
        _run(m, tmp_path, 1)
    state = resume.read_run_state(tmp_path, [f.name for f in m.fleets])
    fleet = whole[0].split("/")[0]
    carried = state.fleets[fleet].finished[whole[0].split("/")[1]]
    stray = carried.model_copy(update={"label": "x7.77", "multiplier": 7.77})
    write_search_step(stray, tmp_path / "capacity" / fleet / "x7.77")
    with pytest.raises(ResumeMismatch, match=r"x7\.77"):
        _run(m, tmp_path, state=resume.read_run_state(tmp_path, [f.name for f in m.fleets]))
