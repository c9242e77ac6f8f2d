"""A plan is the sum of its parts: its replay, capacity-search and settle minutes, and every USD
term, equal what its simulated run recorded (the records' times, each step's and segment's took_s,
the settle record's seconds) at the price snapshot's prices. One simulated campaign of the
example, shared by the module's tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.capacity.steps import REPLAY, read_search_path
from campaign.aws.compile_estimate import compile_phase, hourly_price
from campaign.plan.predict import (
    DEPLOY_MIN,
    QUALITY_GATE_MIN,
    REPORT_AND_TEARDOWN_MIN,
    CampaignPrediction,
    StepOverhead,
    predict,
)
from campaign.stages.resume import CAPACITY_DIR, RECORDS_DIR
from core import catalog, prices
from core.cloud_contract import (
    CONDUCTOR_TASK_MEMORY_GIB,
    CONDUCTOR_TASK_VCPU,
    HEALTH_GRACE_MIN,
    LOADGEN_TASK_MEMORY_GIB,
    LOADGEN_TASK_VCPU,
    PROMETHEUS_TASK_MEMORY_GIB,
    PROMETHEUS_TASK_VCPU,
)
from core.manifest import Manifest, load_manifest, weight_bytes
from tests.conftest import EXAMPLE_MANIFEST

OVERHEAD_S = 60.0  # each simulated step's and segment's load-generator start and stop


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, CampaignPrediction, Path]:
    m = load_manifest(EXAMPLE_MANIFEST)
    work = tmp_path_factory.mktemp("plan")
    return m, predict(m, work, StepOverhead(OVERHEAD_S, "test")), work


def _replayed_s(records: Path) -> float:
    """From a simulated run's first arrival to its last completion, as SimulatedRun.duration_s."""
    rows = [json.loads(line) for line in records.read_text(encoding="utf-8").splitlines()]
    return float(max(r["scheduled_s"] + (r["e2e_s"] or 0.0) for r in rows) - min(r["scheduled_s"] for r in rows))


def _stage_seconds(m: Manifest, pred: CampaignPrediction, work: Path) -> dict[str, float]:
    """The replay, capacity-search and settle seconds as the simulated run recorded them."""
    replay = max(_replayed_s(work / RECORDS_DIR / f"records-{f.name}-sim.jsonl") for f in m.fleets)
    searches = []
    for f in m.fleets:
        path = read_search_path(work / CAPACITY_DIR / f.name)
        assert path is not None
        searches.append(sum(s.took_s or 0.0 for s in path.steps if s.label != REPLAY))
    assert pred.settle is not None
    return {"replay": replay, "capacity_searches": max(searches), "settle_phase": pred.settle["seconds"]}


def test_each_step_and_segment_pays_its_overhead_once(planned: tuple[Manifest, CampaignPrediction, Path]) -> None:
    """Issue 46, finding 7: every simulated capacity step and settle segment reports its arrivals,
    drain and the load generator's start and stop (SimulatedSteps.run); the plan's minutes, which
    the deadline guard reads before each stage, take them as reported. Until 2026-12 the settle
    phase's minutes added the overhead a second time per round (3.2 min where the phase took 2.2)."""
    m, pred, work = planned
    capacity = work / CAPACITY_DIR
    settle = pred.settle
    assert settle is not None and settle["segments"], "the example's plan runs a settle round"
    for seg in settle["segments"]:
        records = capacity / seg["directory"] / f"records-{seg['fleet']}-sim.jsonl"
        assert seg["took_s"] == pytest.approx(_replayed_s(records) + OVERHEAD_S)
    assert pred.minutes["settle_phase"] == round(settle["seconds"] / 60, 1)
    for f in m.fleets:
        path = read_search_path(capacity / f.name)
        assert path is not None
        for s in path.steps:
            if (
                s.label != REPLAY and "stopped early" not in s.detail
            ):  # an early stop ends at the completion that decided it
                records = capacity / f.name / s.label / f"records-{f.name}-sim.jsonl"
                assert s.took_s == pytest.approx(_replayed_s(records) + OVERHEAD_S)


def test_the_plans_minutes_are_its_simulated_runs_stage_times(
    planned: tuple[Manifest, CampaignPrediction, Path],
) -> None:
    m, pred, work = planned
    for stage, seconds in _stage_seconds(m, pred, work).items():
        assert pred.minutes[stage] == round(seconds / 60, 1), stage
    for f in m.fleets:
        path = read_search_path(work / CAPACITY_DIR / f.name)
        assert path is not None
        took = sum(s.took_s or 0.0 for s in path.steps if s.label != REPLAY)
        assert pred.fleets[f.name].search_minutes == pytest.approx(took / 60)
    assert pred.campaign_minutes == pytest.approx(sum(pred.minutes.values()), abs=1e-9)


def test_the_plans_usd_is_its_stage_times_at_the_snapshots_prices(
    planned: tuple[Manifest, CampaignPrediction, Path],
) -> None:
    m, pred, work = planned
    region = m.costs.region
    stages = _stage_seconds(m, pred, work)
    load_min = sum(stages.values()) / 60
    compiles = [c for c in (compile_phase(m, f) for f in m.fleets) if c is not None]
    compile_min = max((c.minutes for c in compiles), default=0.0)
    # then one instance of each compiled fleet's own type, for at most its grace (side by side)
    check_min = max((c.check_minutes for c in compiles), default=0.0)
    ready_min = max(HEALTH_GRACE_MIN[catalog.instance(f.instance_type).accelerator.vendor] for f in m.fleets)
    total_min = DEPLOY_MIN + compile_min + check_min + ready_min + QUALITY_GATE_MIN + load_min + REPORT_AND_TEARDOWN_MIN
    fleets_at_zero_min = compile_min + check_min  # every group is at 0 until the check passed
    vcpu = prices.lookup("fargate", "vcpu-hour", region).usd
    gib = prices.lookup("fargate", "gb-hour", region).usd
    want = {}
    for f in m.fleets:
        hourly, _ = hourly_price(f.instance_type, region)
        assert hourly is not None
        want[f"instances.{f.name}"] = hourly * f.instances_deployed * (total_min - fleets_at_zero_min) / 60
    for c in compiles:
        assert c.usd is not None
        want[f"compile.{c.fleet}"] = c.usd
        check_hourly, _ = hourly_price(m.fleet(c.fleet).instance_type, region)
        assert check_hourly is not None
        want[f"one_instance_check.{c.fleet}"] = check_hourly * c.check_minutes / 60
    # the weights cross the NAT once per boot from the Hub: every instance deployed and every compile instance
    boots = sum(f.instances_deployed for f in m.fleets) + len(compiles)
    want["nat_weights"] = weight_bytes(m) / 1e9 * boots * prices.lookup("network", "nat-gb", region).usd
    tasks = len(m.fleets) * (1 + m.loadgen.workers)
    want["loadgen_tasks"] = tasks * (LOADGEN_TASK_VCPU * vcpu + LOADGEN_TASK_MEMORY_GIB * gib) * load_min / 60
    want["conductor"] = (
        (CONDUCTOR_TASK_VCPU * vcpu + CONDUCTOR_TASK_MEMORY_GIB * gib) * (total_min - fleets_at_zero_min) / 60
    )
    want["prometheus_task"] = (PROMETHEUS_TASK_VCPU * vcpu + PROMETHEUS_TASK_MEMORY_GIB * gib) * total_min / 60
    want["nlb"] = prices.lookup("nlb", "hour", region).usd * total_min / 60
    assert pred.usd.keys() == want.keys()
    for term, usd in want.items():  # each rounded to the cent
        assert pred.usd[term] == pytest.approx(usd, abs=0.005 + 1e-9), term
    assert pred.campaign_usd == pytest.approx(sum(pred.usd.values()), abs=1e-9)
