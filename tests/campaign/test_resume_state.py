"""campaign.stages.resume: what a cut-off run directory says finished, over hand-made directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.capacity.steps import SEARCH_FILE, SearchStep, Verdict, discover_steps, write_search_step
from analysis.errors import AnalysisError
from campaign.stages import resume
from core.cloud_contract import INPUT_SCHEDULE, INPUTS_DIR, RunInputs

FLEETS = ["g6", "inf2"]


def _step(label: str, k: float, verdict: Verdict = Verdict.HELD) -> SearchStep:
    return SearchStep(label, k, "start", 10.0, verdict, 80, 10.0, 8.0, 1.0, 0.5, 0.05, 0.0, "ok", took_s=12.0)


def _gate(run_dir: Path, *, distribution: bool) -> None:
    layers = {"fixtures": {}} | ({"distribution": {}} if distribution else {})
    (run_dir / "quality.json").write_text(json.dumps({f: {"passed": True, "layers": layers} for f in FLEETS}))
    (run_dir / "campaign.json").write_text(json.dumps({"instances_measured": {f: 1 for f in FLEETS}}))


def _replay(run_dir: Path) -> None:
    (run_dir / "records").mkdir(exist_ok=True)
    for f in FLEETS:
        (run_dir / "records" / f"records-{f}-w0.jsonl").write_text("{}\n")
        (run_dir / "records" / f"summary-{f}.json").write_text("{}")


def test_an_empty_directory_resumes_at_the_gate(tmp_path: Path) -> None:
    st = resume.read_run_state(tmp_path, FLEETS)
    assert (st.stage, st.carried_over(), st.interrupted(), st.inputs) == (resume.GATE, [], [], None)


def test_the_gate_alone_resumes_at_the_replay(tmp_path: Path) -> None:
    _gate(tmp_path, distribution=False)
    assert resume.read_run_state(tmp_path, FLEETS).stage == resume.REPLAY
    _replay(tmp_path)  # records, but the distribution layer was never written: the replay was cut off
    assert resume.read_run_state(tmp_path, FLEETS).stage == resume.REPLAY


def test_finished_and_interrupted_steps_per_fleet(tmp_path: Path) -> None:
    _gate(tmp_path, distribution=True)
    _replay(tmp_path)
    write_search_step(_step("x1", 1.0), tmp_path / "capacity" / "g6" / "x1")
    write_search_step(_step("x2", 2.0, Verdict.MISSED), tmp_path / "capacity" / "g6" / "x2")
    cut = tmp_path / "capacity" / "g6" / "x1.414"
    cut.mkdir()
    (cut / "records-g6-w0-p0.jsonl").write_text("{}\n")
    st = resume.read_run_state(tmp_path, FLEETS)
    assert st.stage == resume.SEARCH
    assert st.carried_over() == ["g6/x1", "g6/x2"]
    assert st.fleets["g6"].finished["x2"].verdict is Verdict.MISSED
    assert st.interrupted() == ["g6/x1.414"]
    assert st.fleets["inf2"].finished == {} and not st.search_finished


def test_search_and_settle_files_finish_their_stages(tmp_path: Path) -> None:
    _gate(tmp_path, distribution=True)
    _replay(tmp_path)
    for f in FLEETS:
        (tmp_path / "capacity" / f).mkdir(parents=True)
        (tmp_path / "capacity" / f / SEARCH_FILE).write_text("{}")
    assert resume.read_run_state(tmp_path, FLEETS).stage == resume.SETTLE
    (tmp_path / "capacity" / "settle.json").write_text("{}")
    assert resume.read_run_state(tmp_path, FLEETS).stage == resume.REPORT


def test_the_inputs_digests_are_read(tmp_path: Path) -> None:
    inputs = RunInputs("m" * 64, "trace.jsonl", "trace.jsonl", "s" * 64, 32)
    (tmp_path / INPUTS_DIR).mkdir()
    (tmp_path / INPUTS_DIR / INPUT_SCHEDULE).write_text(inputs.to_json())
    assert resume.read_run_state(tmp_path, FLEETS).inputs == inputs


def test_a_broken_step_file_is_named(tmp_path: Path) -> None:
    d = tmp_path / "capacity" / "g6" / "x1"
    d.mkdir(parents=True)
    (d / "step.json").write_text("{not json")
    with pytest.raises(AnalysisError, match=r"x1/step\.json"):
        resume.read_run_state(tmp_path, FLEETS)


def test_set_aside_moves_interrupted_steps_out_of_the_reports_reach(tmp_path: Path) -> None:
    write_search_step(_step("x1", 1.0), tmp_path / "capacity" / "g6" / "x1")
    for n in (1, 2):  # cut off twice at the same step: both partial records kept, apart
        cut = tmp_path / "capacity" / "g6" / "x2"
        cut.mkdir()
        (cut / "records-g6-w0-p0.jsonl").write_text(f"{n}\n")
        moved = resume.set_aside_interrupted(resume.read_run_state(tmp_path, FLEETS))
        assert moved == [tmp_path / "interrupted" / "capacity" / "g6" / f"x2-{n}"]
        assert (moved[0] / "records-g6-w0-p0.jsonl").read_text() == f"{n}\n"
    assert discover_steps(tmp_path / "capacity") == {"g6/x1": tmp_path / "capacity" / "g6" / "x1"}
