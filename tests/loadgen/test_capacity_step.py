"""A capacity step: the same requests at rate x k, each abandoned once it can no longer meet
the per-request SLO, so an overloaded step ends within the SLO's own bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from analysis.measure import goodput, intervals
from analysis.sources.records import load_records
from campaign.backends.local.fleets import start_emulator
from campaign.backends.local.processes import Supervisor
from core.manifest import load_manifest
from core.schedule import build_schedule
from loadgen.launch import start_fleet
from loadgen.recording import read_records
from loadgen.replay_options import ReplayOptions
from tests.loadgen.conftest import small_manifest_data, write


def test_rate_multiplier_compresses_offsets_and_deadline_bounds_each_request(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    data = small_manifest_data(manifest_data, time_scale=0.2)
    data["loadgen"]["request_timeout_s"] = 30.0
    data["slo"]["ttft_p95_s"] = 0.3  # g6 prefill alone exceeds this for longer prompts: some requests must be abandoned
    data["slo"]["itl_p95_s"] = 0.01
    path = write(tmp_path, data)
    m = load_manifest(path)
    base = {r.request_id: r.offset_s for r in build_schedule(m)}
    with Supervisor(tmp_path / "logs") as sup:
        url = start_emulator(sup, path, "g6", tmp_path, [])
        run = start_fleet(
            m,
            "g6",
            url,
            tmp_path / "step",
            ReplayOptions(rate_multiplier=4.0, slo_deadline=True, duration_s=3.0, warmup=False),
        )
        summary = run.wait(timeout=120)
    recs = list(read_records(sorted((tmp_path / "step").glob("records-g6-*.jsonl"))))
    assert summary.invariant_holds()
    sent = [r for r in recs if r.sent_s is not None]
    assert sent and all(r.scheduled_s == pytest.approx(base[r.request_id] / 4.0) for r in recs)
    assert max(r.scheduled_s for r in sent) <= 3.0
    assert not any(r.warmup for r in recs)  # the manifest's warmup does not apply to a step
    abandoned = [r for r in sent if r.outcome == "slo_abandoned"]
    assert abandoned, "with a 0.3 s TTFT SLO some g6 requests must pass their SLO bound"
    # an SLO miss, not an error: the request timeout (30 s) bound none of them
    assert not [r for r in sent if r.outcome == "timeout"]
    rs = load_records(tmp_path / "step", m.digest)
    fm = goodput.measure_fleets(rs, m.slo.ttft_p95_s, m.slo.itl_p95_s)["g6"]
    assert fm.errors == 0 and fm.successful_requests < len(sent)
    assert len(intervals.latency_sample(rs, "g6", "ttft_s")) == len(
        sent
    )  # every request has a TTFT, measured or bounded
    for r in sent:
        bound = m.slo.ttft_p95_s + r.max_tokens * m.slo.itl_p95_s
        assert r.e2e_s is not None and r.e2e_s <= bound + 0.25, (r.e2e_s, bound)
