"""capacity_search.settle_min_segments: the settle phase runs that many segments per fleet even
when the decision is already settled (a rehearsal's one, issue 51), in simulated time through the
campaign's own stages; 0, the default, runs none on a settled decision, as before."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.capacity.settle_record import SettleOutcome
from analysis.model import Report
from campaign.backends.simulated.fleets import SimulatedFleets
from campaign.stages import run as run_stage
from campaign.stages.rehearsal import rehearsal_data
from core import rehearsal
from core.manifest import Manifest, ManifestError, manifest_from_data
from tests.conftest import EXAMPLE_MANIFEST


def _rehearsal(**search: Any) -> Manifest:
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str((EXAMPLE_MANIFEST.parent / data["workload"]["trace"]["path"]).resolve())
    data = rehearsal_data(data)
    data["workload"]["capacity_search"].update(search)
    if data["workload"]["capacity_search"].get("settle_min_segments", 0) is None:  # as a manifest without it
        del data["workload"]["capacity_search"]["settle_min_segments"]
    return manifest_from_data(data)


def _run_settled(
    m: Manifest, run_dir: Path, monkeypatch: pytest.MonkeyPatch, replay_sized: str | None = None
) -> SettleOutcome:
    """The campaign's stages in simulated time (the plan's step runner, its assumed 60 s overhead per
    step and segment), with every interim report the settle phase reads showing the decision
    settled: no decision.to_settle (the example's rehearsal is otherwise undecided)."""
    real = run_stage.run_report

    def settled(*args: Any, **kwargs: Any) -> Report:
        rep = real(*args, **kwargs)
        if Path(args[2]).name != "settle-interim":
            return rep
        rep = rep.model_copy(update={"decision": rep.decision.model_copy(update={"to_settle": None})})
        if replay_sized is not None:  # that fleet sized from the replay, as one whose steps all missed
            row = rep.fleets[replay_sized]
            assert row.intervals is not None
            fleets = {
                **rep.fleets,
                replay_sized: row.model_copy(
                    update={"intervals": row.intervals.model_copy(update={"basis": "replay"})}
                ),
            }
            rep = rep.model_copy(update={"fleets": fleets})
        return rep

    monkeypatch.setattr(run_stage, "run_report", settled)
    run_stage.run_stages(
        m, SimulatedFleets(m, overhead_s=60.0), run_dir, threading.Event(), full_report=False, log=lambda _: None
    )
    out = SettleOutcome.read(run_dir / "capacity")
    assert out is not None
    return out


def test_the_rehearsal_runs_its_settle_segment_per_fleet_on_a_settled_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offline the rehearsal's decision was settled and its settle phase ran 0 segments per fleet:
    # the phase only ran while the decision was unsettled. Its manifest now asks them regardless,
    # and its budget holds one with its drain and the load generator's start and stop.
    m = _rehearsal()
    out = _run_settled(m, tmp_path / "run", monkeypatch)
    per_fleet = {f.name: [s for s in out.segments if s.fleet == f.name] for f in m.fleets}
    assert {n: len(s) for n, s in per_fleet.items()} == {f.name: rehearsal.SETTLE_SEGMENTS for f in m.fleets}, (
        out.stopped,
        out.detail,
    )
    assert out.stopped == "settled" and "settle_min_segments" in out.detail
    for name, (seg,) in per_fleet.items():
        seg_dir = tmp_path / "run" / "capacity" / seg.directory
        assert seg.step.startswith(f"{name}/") and seg_dir.name == "settle-1"
        assert any(seg_dir.glob(f"records-{name}-*.jsonl"))  # its requests ran, pooled with its step
        assert seg.planned_requests == m.workload.capacity_search.min_requests  # type: ignore[union-attr]
    report = json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    assert len(report["provenance"]["settle"]["value"]["segments"]) == len(m.fleets)


def test_without_a_minimum_a_settled_decision_runs_no_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run_settled(_rehearsal(settle_min_segments=0), tmp_path / "run", monkeypatch)
    assert out.stopped == "nothing to settle" and out.segments == []
    assert not [p for p in (tmp_path / "run" / "capacity").rglob("settle-*") if p.is_dir()]


def test_a_minimum_the_phase_cannot_run_is_refused() -> None:
    with pytest.raises(ManifestError, match="settle_min_segments"):
        _rehearsal(settle_min_segments=5)  # more than the phase's rounds: one segment per fleet a round


def test_the_default_leaves_the_digest_as_before() -> None:
    # a field added later: at its default it is left out of the digest, so every campaign's results
    # prefix stays where it was (Manifest.digest)
    assert _rehearsal(settle_min_segments=0).digest == _rehearsal(settle_min_segments=None).digest
    assert _rehearsal().digest != _rehearsal(settle_min_segments=0).digest


def test_a_fleet_sized_from_the_replay_still_runs_its_owed_segment_at_a_search_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offline (tests/cloud/test_cloud_path.py) inf2 was sized from the replay: the phase had no
    # step of its own to extend, ran 0 segments for it and stopped "trace exhausted", so the
    # rehearsal failed at its tasks seam. The owed segment now runs at the search's held step.
    m = _rehearsal()
    name = m.fleets[0].name
    out = _run_settled(m, tmp_path / "run", monkeypatch, replay_sized=name)
    mine = [s for s in out.segments if s.fleet == name]
    assert len(mine) == rehearsal.SETTLE_SEGMENTS, (out.stopped, out.detail)
    assert mine[0].step.startswith(f"{name}/x")


def test_the_owed_segments_are_priced_at_their_fleets_hourly_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A segment decision.to_settle did not list (owed on a settled decision: a rehearsal's) was
    # priced 0 USD until 2026-12-07, and a listed one for its arrivals only: the settle budget's
    # USD and report.json's provenance.settle.value.usd undercounted what the cloud bills. Each
    # segment holds its fleet's instances and load-generator tasks for its whole took_s.
    from campaign.aws.compile_estimate import hourly_price
    from core import prices
    from core.cloud_contract import LOADGEN_TASK_MEMORY_GIB, LOADGEN_TASK_VCPU

    m = _rehearsal()
    out = _run_settled(m, tmp_path / "run", monkeypatch)
    report = json.loads((tmp_path / "run" / "report.json").read_text(encoding="utf-8"))
    region = m.costs.region
    task = LOADGEN_TASK_VCPU * prices.lookup("fargate", "vcpu-hour", region).usd
    task += LOADGEN_TASK_MEMORY_GIB * prices.lookup("fargate", "gb-hour", region).usd
    want = 0.0
    for seg in out.segments:
        f = m.fleet(seg.fleet)
        instance, _ = hourly_price(f.instance_type, region)
        assert instance is not None
        instances = report["provenance"][f"instances_measured.{f.name}"]["value"]
        assert instances >= 1
        want += (instances * instance + (m.loadgen.workers + 1) * task) * seg.took_s / 3600
    assert out.segments and want > 0
    assert out.usd == pytest.approx(want, rel=1e-9)
    assert report["provenance"]["settle"]["value"]["usd"] == pytest.approx(want, rel=1e-9)
