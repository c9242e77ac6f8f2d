"""`plan --rehearsal` is the sum of its parts: the fixed rehearsal's stage lengths (core.rehearsal)
and the campaign plan's assumptions around them, priced at the snapshot's prices; on the example it
comes out under 45 minutes and 5 USD (issue 51)."""

from __future__ import annotations

import pytest

from campaign.plan.predict import DEPLOY_MIN, QUALITY_GATE_MIN, REPORT_AND_TEARDOWN_MIN, STEP_OVERHEAD_S, StepOverhead
from campaign.plan.rehearsal import predict_rehearsal
from core import prices, rehearsal
from core.cloud_contract import (
    CONDUCTOR_TASK_MEMORY_GIB,
    CONDUCTOR_TASK_VCPU,
    LOADGEN_TASK_MEMORY_GIB,
    LOADGEN_TASK_VCPU,
    PROMETHEUS_TASK_MEMORY_GIB,
    PROMETHEUS_TASK_VCPU,
)
from core.manifest import load_manifest
from tests.conftest import EXAMPLE_MANIFEST


@pytest.mark.parametrize("overhead_s", [STEP_OVERHEAD_S, 95.0])
def test_the_rehearsals_minutes_and_usd_are_their_parts_at_the_snapshots_prices(overhead_s: float) -> None:
    m = load_manifest(EXAMPLE_MANIFEST)
    region = m.costs.region
    r = predict_rehearsal(m, StepOverhead(overhead_s, "test"))
    step_min = (rehearsal.STEP_S + overhead_s) / 60  # arrivals and drain, then the load generator's start and stop
    want_min = {
        "deploy": DEPLOY_MIN,
        "ready_at_most": rehearsal.READY_MIN,
        "quality_gate": QUALITY_GATE_MIN,
        "replay": rehearsal.REPLAY_S / 60,
        "capacity_searches": rehearsal.CAPACITY_STEPS * step_min,
        "settle_phase": rehearsal.SETTLE_SEGMENTS * step_min,
        "report_and_teardown": REPORT_AND_TEARDOWN_MIN,
    }
    assert r.minutes.keys() == want_min.keys()  # no compile phase, no one-instance check
    for stage, minutes in want_min.items():
        assert r.minutes[stage] == pytest.approx(minutes, abs=0.05 + 1e-9), stage
    total_min = sum(want_min.values())
    load_min = want_min["replay"] + want_min["capacity_searches"] + want_min["settle_phase"]
    hourly = prices.instance_hourly("c6a.large", region).usd
    vcpu = prices.lookup("fargate", "vcpu-hour", region).usd
    gib = prices.lookup("fargate", "gb-hour", region).usd
    # measure_instances of the cheap type per fleet, from deploy to teardown; no weights through the NAT
    want_usd = {f"instances.{f.name}": hourly * f.instances_measured * total_min / 60 for f in m.fleets}
    tasks = len(m.fleets) * (1 + m.loadgen.workers)
    want_usd["loadgen_tasks"] = tasks * (LOADGEN_TASK_VCPU * vcpu + LOADGEN_TASK_MEMORY_GIB * gib) * load_min / 60
    want_usd["conductor"] = (CONDUCTOR_TASK_VCPU * vcpu + CONDUCTOR_TASK_MEMORY_GIB * gib) * total_min / 60
    want_usd["prometheus_task"] = (PROMETHEUS_TASK_VCPU * vcpu + PROMETHEUS_TASK_MEMORY_GIB * gib) * total_min / 60
    want_usd["nlb"] = prices.lookup("nlb", "hour", region).usd * total_min / 60
    assert r.usd.keys() == want_usd.keys()
    for term, usd in want_usd.items():  # each rounded to the cent
        assert r.usd[term] == pytest.approx(usd, abs=0.005 + 1e-9), term
    assert r.rehearsal_minutes == pytest.approx(sum(r.minutes.values()), abs=1e-9)
    assert r.rehearsal_usd == pytest.approx(sum(r.usd.values()), abs=1e-9)
    assert r.instance_type == "c6a.large" and r.hourly_usd == hourly
    if overhead_s == STEP_OVERHEAD_S:  # the plan's default: the bound on the example
        assert (r.rehearsal_minutes, r.rehearsal_usd) == (44.5, 0.59)
        assert r.rehearsal_minutes < 45 and r.rehearsal_usd is not None and r.rehearsal_usd < 5
