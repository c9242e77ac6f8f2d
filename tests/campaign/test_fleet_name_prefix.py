"""Where the replay's records of every fleet share one directory, a fleet's files are found by its
whole name: `records-g6-*` also matches `records-g6-big-sim.jsonl`, so a glob on it took fleet
g6-big's records for g6's (issue 47, invariant 4: names do not matter)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from campaign.stages import resume
from campaign.stages.capacity import replay_step, settings_from
from campaign.stages.progress import RecordTail
from campaign.stages.run import ASSUMED_GATE
from core.manifest import CapacitySearch, Manifest, manifest_from_data
from tests.analysis.synth import rec, write_jsonl

FLEETS = ["g6-big", "g6"]  # as listed: g6-big's replay is written first


def _manifest(data: dict[str, Any]) -> Manifest:
    data["fleets"][0]["name"] = data["comparison"]["candidate"] = "g6-big"
    return manifest_from_data(data)


def _replayed(m: Manifest, records: Path, fleet: str, n: int) -> None:
    write_jsonl(records / f"records-{fleet}-sim.jsonl", [rec(m, fleet, i) for i in range(n)])


def test_the_replay_seeds_no_search_for_a_fleet_without_records(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    m = _manifest(manifest_data)
    _replayed(m, tmp_path, "g6-big", 50)
    step = replay_step(m, "g6", tmp_path, settings_from(m.workload.capacity_search or CapacitySearch()))
    # on 9295f33: a replay step of 0 requests, verdict missed ("no records: nothing was measured"),
    # from which g6's search bracketed down
    assert step is None, step


def test_a_run_cut_off_between_two_fleets_replays_resumes_at_the_replay(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    m = _manifest(manifest_data)
    gate = {f: ASSUMED_GATE.model_dump(mode="json") for f in FLEETS}  # campaign plan's fleets: no layers to wait for
    (tmp_path / "quality.json").write_text(json.dumps(gate))
    (tmp_path / "campaign.json").write_text(json.dumps({"instances_measured": {f: 4 for f in FLEETS}}))
    _replayed(m, tmp_path / "records", "g6-big", 50)  # g6's replay was not written yet
    # on 9295f33: "capacity search" (the replay taken as finished, g6 searched with no replay)
    assert resume.read_run_state(tmp_path, FLEETS).stage == resume.REPLAY


def test_live_progress_counts_only_the_fleets_own_records(manifest_data: dict[str, Any], tmp_path: Path) -> None:
    m = _manifest(manifest_data)
    for fleet, n in (("g6", 20), ("g6-big", 7)):
        lines = "".join(json.dumps(asdict(rec(m, fleet, i))) + "\n" for i in range(n))
        (tmp_path / f"records-{fleet}-w0.jsonl").write_text(lines)
    # on 9295f33: 27 done of 20 scheduled (g6-big's 7 counted as g6's)
    assert RecordTail(tmp_path, "g6", scheduled=20).poll().done == 20
