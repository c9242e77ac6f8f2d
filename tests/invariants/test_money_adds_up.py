"""Money adds up: a run's computed cost (report.json billing.computed) equals, term by term, each
fleet's instances deployed x the measured window's hours x its price, plus each load-generator
task's vCPU and memory hours x Fargate's prices, plus the NLB's hours x its price: over generated
fleets, workers, windows and prices."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis.provenance import Sourced
from analysis.report.evidence import MeasuredWindow, _computed_cost, _loadgen_task_price
from analysis.sources.pricing import PriceBook
from core.cloud_contract import LOADGEN_TASK_MEMORY_GIB, LOADGEN_TASK_VCPU
from core.manifest import manifest_from_data
from tests.invariants import INVARIANT

START = 1_700_000_000.0
PRICE = st.floats(min_value=0.001, max_value=50.0, allow_nan=False, allow_infinity=False)


@dataclass
class FixedPrices(PriceBook):
    """A price book answering from a given table, every price dated."""

    table: dict[tuple[str, str], float] | None = None

    def get(self, kind: str, key: str) -> Sourced:
        assert self.table is not None
        return Sourced(self.table[(kind, key)], "snapshot", f"generated, as of 2026-01-01: {kind} {key}")


@st.composite
def fleet_sizes(draw: st.DrawFn) -> dict[str, Any]:
    top = draw(st.integers(1, 12))
    desired = draw(st.integers(1, top))
    return {
        "asg": {"min": 1, "max": top, "desired": desired},
        "measure_instances": draw(st.one_of(st.none(), st.integers(1, top))),
    }


@INVARIANT
@given(
    sizes=st.tuples(fleet_sizes(), fleet_sizes()),
    workers=st.integers(1, 64),
    hours=st.floats(min_value=1 / 60, max_value=48.0),
    instance_prices=st.tuples(PRICE, PRICE),
    nlb=PRICE,
    vcpu=PRICE,
    gib=PRICE,
)
def test_the_computed_cost_is_deployed_instances_and_task_resources_times_hours_times_price(
    _example_data: dict[str, Any],
    sizes: tuple[dict[str, Any], dict[str, Any]],
    workers: int,
    hours: float,
    instance_prices: tuple[float, float],
    nlb: float,
    vcpu: float,
    gib: float,
) -> None:
    data = copy.deepcopy(_example_data)
    for f, size in zip(data["fleets"], sizes, strict=True):
        f.update(size)
    data["loadgen"]["workers"] = workers
    m = manifest_from_data(data)
    table = {("instance", f.instance_type): p for f, p in zip(m.fleets, instance_prices, strict=True)}
    table |= {("nlb", "hour"): nlb, ("fargate", "vcpu-hour"): vcpu, ("fargate", "gb-hour"): gib}
    book = FixedPrices(m.costs.region, table=table)
    task_hourly, _, _ = _loadgen_task_price(book)
    got = _computed_cost(m, book, task_hourly, MeasuredWindow(START, START + hours * 3600))

    tasks = len(m.fleets) * (workers + 1)
    terms = [f.instances_deployed * hours * table[("instance", f.instance_type)] for f in m.fleets]
    terms += [tasks * hours * (LOADGEN_TASK_VCPU * vcpu + LOADGEN_TASK_MEMORY_GIB * gib), hours * nlb]
    assert got["usd"] == pytest.approx(sum(terms), abs=5e-5, rel=1e-12)  # rounded to 4 decimals
    for f in m.fleets:  # each term named as counted: every instance deployed, healthy or not
        assert f.instances_deployed == max(f.asg.desired, f.instances_measured)
        price = table[("instance", f.instance_type)]
        assert f"{f.name}: {f.instances_deployed} x {f.instance_type} deployed at {price:g} USD/h" in got["covers"]
    assert f"{tasks} load-generator tasks at {task_hourly:.4g} USD/h" in got["covers"]
