"""A fleet's worker files are its own, whatever the other fleets are named: `records-g6-w*` also
matches `records-g6-west-w0.jsonl`, so a glob on it merged fleet g6-west's records and worker
summaries into g6's replay summary, where both fleets replay into one directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.manifest import Manifest, manifest_from_data
from core.schedule import build_schedule
from loadgen.launch import merge_worker_outputs
from loadgen.recording import records_name, summary_name
from loadgen.summary import SummaryInputs, summarize
from tests.analysis.synth import rec, write_jsonl


def _worker(m: Manifest, out: Path, fleet: str, outcome: str, cpu: float) -> None:
    """A worker's records of every scheduled request, all with `outcome`, and its summary."""
    ids = [r.request_id for r in build_schedule(m)]
    recs = [rec(m, fleet, i, outcome=outcome) for i in ids]
    write_jsonl(out / records_name(fleet, "w0"), recs)
    s = summarize(
        SummaryInputs(m.campaign, m.digest, fleet, m.loadgen.max_schedule_lag_p99_s),
        recs,
        ids,
        client_cpu_percent=cpu,
        started_at=1_700_000_000.0,
        ended_at=1_700_000_060.0,
    )
    (out / summary_name(fleet, "w0")).write_text(s.to_json(), encoding="utf-8")


def test_a_fleet_summary_merges_only_its_own_workers_beside_a_fleet_whose_name_continues_it(
    manifest_data: dict[str, Any], tmp_path: Path
) -> None:
    manifest_data["fleets"][0]["name"] = manifest_data["comparison"]["candidate"] = "g6-west"
    m = manifest_from_data(manifest_data)
    _worker(m, tmp_path, "g6", "ok", cpu=5.0)
    _worker(m, tmp_path, "g6-west", "error", cpu=95.0)
    merge_worker_outputs(m, "g6-west", tmp_path)  # its merged summary-g6-west.json is there too
    s = merge_worker_outputs(m, "g6", tmp_path)
    # on 9295f33: completed 0, failed 188 (g6-west's records, read after g6's, replaced them),
    # client CPU 95.0 (g6-west's worker) and invalid for duplicate records
    assert (s.completed, s.failed, s.client_cpu_percent) == (s.scheduled, 0, 5.0)
    assert s.valid, s.invalid_reasons
