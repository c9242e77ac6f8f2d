"""Invariant: a resume changes nothing (issue 47, 2).

A campaign on `campaign plan`'s simulated fleets is cut off in-process at a generated checkpoint
(run_stages checkpoints after each stage and before each capacity step, settle segment and
reopened search's step), then resumed from its run directory. Its report.json equals the
uninterrupted run's field by field, but for the settle phase's seconds and USD, which are the
uninterrupted run's plus what the round it was cut off in had reserved (a cut-off round's tasks
may already bill: it counts as spent, campaign.stages.settle).

The fixture is the example with a settle budget of 900 s, so the phase runs several segments and
reopens a search: every kind of checkpoint is reached (the test fails, never skips, if not)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from campaign.backends.simulated.fleets import SimulatedFleets
from campaign.stages import resume
from campaign.stages.run import run_stages
from core.manifest import Manifest, manifest_from_data
from testing.json_diff import report_differences
from tests.invariants import INVARIANT

SETTLE_BUDGET_S = 900.0
# What a resume may change: when the report was written, the resume record itself (when it was
# cut, what carried over), and the settle record's seconds and USD (compared apart, below), which
# its detail line also states.
VOLATILE = {
    "provenance.resume",
    "generated_at",
    "provenance.settle.value.seconds",
    "provenance.settle.value.usd",
    "provenance.settle.detail",
}
VOLATILE |= {f"provenance.settle.value.interrupted_{k}" for k in ("seconds", "usd")}
# Each example is a campaign cut off and resumed (about 30 s on 2 cores): `make test` cuts the
# run at its last settle checkpoint only (inside the search the phase reopened, where 17e73d2's
# settle.json, written as the phase stopped to reopen, sent the resume straight to its report);
# INVARIANTS_PROFILE=long draws from every checkpoint.
LONG = os.environ.get("INVARIANTS_PROFILE") == "long"


class Killed(Exception):
    """The orchestrator died at a checkpoint."""


class Fleets(SimulatedFleets):
    """Simulated fleets that note every checkpoint and die at the `kill_at`-th."""

    def __init__(self, m: Manifest, kill_at: int | None = None) -> None:
        super().__init__(m, overhead_s=60.0)
        self.kill_at, self.seen = kill_at, []  # type: int | None, list[str]

    def checkpoint(self, stage: str) -> None:
        self.seen.append(stage)
        if self.kill_at is not None and len(self.seen) > self.kill_at:
            raise Killed(stage)


def _run(m: Manifest, run_dir: Path, kill_at: int | None = None, state: resume.RunState | None = None) -> Fleets:
    fleets = Fleets(m, kill_at)
    run_stages(m, fleets, run_dir, threading.Event(), full_report=False, log=lambda line: None, resume=state)
    return fleets


@pytest.fixture(scope="module")
def campaign(
    tmp_path_factory: pytest.TempPathFactory, _example_data: dict[str, Any]
) -> tuple[Manifest, Path, list[str]]:
    """The fixture campaign run through: its manifest, run directory and checkpoints in order."""
    import copy

    from tests.conftest import ROOT

    data = copy.deepcopy(_example_data)
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    data["workload"]["capacity_search"]["settle_budget_s"] = SETTLE_BUDGET_S
    m = manifest_from_data(data)
    run_dir = tmp_path_factory.mktemp("whole")
    seen = _run(m, run_dir).seen
    settled = json.loads((run_dir / "capacity" / "settle.json").read_text())
    kinds = {s.split(":")[0] for s in seen}
    assert settled["reopens"] >= 1 and len(settled["segments"]) >= 1, settled  # never a skip
    assert {"capacity search", "settle phase"} <= kinds, seen
    return m, run_dir, seen


def _report(run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    return out


@(settings(INVARIANT, max_examples=48) if LONG else settings(INVARIANT, max_examples=1))
@given(st.data())
def test_a_run_cut_off_at_any_checkpoint_resumes_to_the_same_report(
    campaign: tuple[Manifest, Path, list[str]], data: st.DataObject
) -> None:
    m, whole_dir, seen = campaign
    last_settle = max(i for i, s in enumerate(seen) if s.startswith("settle phase: before"))
    kill_at = data.draw(
        st.sampled_from(range(len(seen)) if LONG else [last_settle]), label=f"checkpoint of {len(seen)}"
    )
    run_dir = Path(tempfile.mkdtemp(prefix="resume-anywhere-"))
    try:
        with pytest.raises(Killed):
            _run(m, run_dir, kill_at)
        state = resume.read_run_state(run_dir, [f.name for f in m.fleets])
        _run(m, run_dir, state=state)
        whole, resumed = _report(whole_dir), _report(run_dir)
        compared, diff = report_differences(whole, resumed, VOLATILE)
        assert compared > 100 and not diff, f"cut at {seen[kill_at]!r}: " + "; ".join(diff[:10])
        a = json.loads((whole_dir / "capacity" / "settle.json").read_text())
        b = json.loads((run_dir / "capacity" / "settle.json").read_text())
        assert b["seconds"] == pytest.approx(a["seconds"] + b["interrupted_seconds"], rel=1e-9)
        assert b["usd"] == pytest.approx(a["usd"] + b["interrupted_usd"], rel=1e-9, abs=1e-12)
        assert b["segments"] == a["segments"] and b["reopens"] == a["reopens"]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_rebuilt_report_is_the_runs(campaign: tuple[Manifest, Path, list[str]], tmp_path: Path) -> None:
    """Invariant: a rebuild changes nothing (issue 47, 3), over this module's simulated campaign:
    `report --run-dir` (report_from_run_dir) gives the run's report.json field by field."""
    from campaign.stages.run import report_from_run_dir

    m, whole_dir, _ = campaign
    copy = tmp_path / "run"  # rebuilt in place, in a copy: the paths it states are the run's own
    shutil.copytree(whole_dir, copy)
    again = report_from_run_dir(m, copy, copy).model_dump(mode="json")
    # sensitivity: the fixture's run wrote the decision-only report (full_report=False, as the
    # settle phase's interim ones), without the grid that `report --run-dir` always adds
    compared, diff = report_differences(_report(whole_dir), again, {"generated_at", "sensitivity"})
    assert compared > 100 and not diff, "; ".join(diff[:10])
