"""One-at-a-time sensitivity grid: each cell changes one input and recomputes the whole decision.

Dimensions: demand, utilization target, rate (On-Demand / covered / renewal), SLO (tighter /
looser: goodput is recomputed from the per-request records), port effort (low / high labor
hours) and refresh timing. Values are multiples of the manifest's, so the grid scales with
any manifest; the base cell is the manifest itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from analysis.economics.cost import RateMode
from analysis.model import CellSummary, ScenarioModel, Sensitivity, SensitivityCell
from core.manifest import Manifest


@dataclass(frozen=True)
class Scenario:
    demand_scale: float = 1.0
    utilization_target: float | None = None  # None: the manifest's
    rate_mode: RateMode = "manifest"
    slo_scale: float = 1.0  # multiplies both P95 TTFT and ITL targets
    effort_scale: float = 1.0  # multiplies every migration activity's hours
    months_to_next_refresh: float | None = None  # None: the manifest's (or a full cadence)


BASE = Scenario()


@dataclass(frozen=True)
class Cell:
    dimension: str
    label: str
    scenario: Scenario


def grid(m: Manifest) -> list[Cell]:
    util = m.costs.utilization_target
    cadence = m.migration.refresh_cadence_months
    cells = [
        Cell("demand", "demand x0.5", replace(BASE, demand_scale=0.5)),
        Cell("demand", "demand x1.5", replace(BASE, demand_scale=1.5)),
        Cell("demand", "demand x2", replace(BASE, demand_scale=2.0)),
        Cell(
            "utilization",
            f"utilization {max(util - 0.2, 0.1):.2f}",
            replace(BASE, utilization_target=max(util - 0.2, 0.1)),
        ),
        Cell(
            "utilization",
            f"utilization {min(util + 0.1, 1.0):.2f}",
            replace(BASE, utilization_target=min(util + 0.1, 1.0)),
        ),
        Cell("rate", "On-Demand", replace(BASE, rate_mode="on-demand")),
        Cell("rate", "covered", replace(BASE, rate_mode="covered")),
        Cell("rate", "renewal", replace(BASE, rate_mode="renewal")),
        Cell("slo", "SLO tighter (x0.75)", replace(BASE, slo_scale=0.75)),
        Cell("slo", "SLO looser (x1.5)", replace(BASE, slo_scale=1.5)),
        Cell("port_effort", "port effort low (x0.5)", replace(BASE, effort_scale=0.5)),
        Cell("port_effort", "port effort high (x2)", replace(BASE, effort_scale=2.0)),
        Cell("refresh", "refresh in 3 months", replace(BASE, months_to_next_refresh=3.0)),
        Cell("refresh", f"refresh in {cadence:g} months", replace(BASE, months_to_next_refresh=cadence)),
    ]
    return cells


def slo_scales(m: Manifest) -> list[float]:
    """The SLO scales the grid's cells judge the records by, the base's 1.0 first."""
    return list(dict.fromkeys([BASE.slo_scale, *(c.scenario.slo_scale for c in grid(m))]))


def run_grid(m: Manifest, evaluate: Callable[[Scenario], CellSummary]) -> Sensitivity:
    """Evaluate the base and every cell; `evaluate` returns the summary of one scenario."""
    base = evaluate(BASE)
    cells = [
        SensitivityCell(
            dimension=c.dimension,
            label=c.label,
            scenario=ScenarioModel(**asdict(c.scenario)),
            **dict(evaluate(c.scenario)),
        )
        for c in grid(m)
    ]
    return Sensitivity(
        base=base,
        cells=cells,
        method="one input at a time; every cell recomputes sizing, cost, payback and the decision",
    )
