"""The cells both report pages show: what a reader sees for a not-evaluated gate and a blocked grid."""

from __future__ import annotations

from analysis.model import CellSummary, QualityResult, Sensitivity, SensitivityCell
from analysis.report.render.cells import NOT_DECIDED, quality_row, sensitivity_rows


def test_a_gate_not_evaluated_is_not_shown_as_failed() -> None:
    # Seen in a 30 s local run: the distribution layer had too few requests, the decision said
    # "no quality-gate result", and the gate table said FAIL.
    assert quality_row("inf2", QualityResult(passed=None, pass_rate=1.0))[1] == "not evaluated (100% of fixtures)"
    assert quality_row("inf2", QualityResult(passed=False, pass_rate=0.5))[1] == "FAIL (50% of fixtures)"
    assert quality_row("g6", QualityResult(passed=True, pass_rate=1.0))[1] == "pass (100% of fixtures)"


def _cell(delta: float, reasons: list[str]) -> CellSummary:
    return CellSummary(
        decision="defer",
        reasons=reasons,
        monthly_delta_usd=delta,
        monthly_delta_ci_usd=None,
        migration_cost_usd=1000.0,
        payback_months=1000.0 / delta,
        payback_months_ci=None,
        fleets={},
    )


def _grid() -> Sensitivity:
    base = _cell(400.0, ["evidence incomplete: saturation.inf2", "payback 2.5 months is beyond the 1-month horizon"])
    demand = _cell(800.0, ["evidence incomplete: saturation.inf2", "payback 1.2 months is beyond the 1-month horizon"])
    same = _cell(400.0, list(base.reasons))
    other = _cell(400.0, ["no commitment in the manifest: inf2 has none"])
    scen = {
        "demand_scale": 1.0,
        "utilization_target": None,
        "rate_mode": "on_demand",
        "slo_scale": 1.0,
        "effort_scale": 1.0,
        "months_to_next_refresh": None,
    }
    cells = [
        SensitivityCell(**demand.model_dump(), dimension="demand", label="demand x2", scenario=scen),
        SensitivityCell(**same.model_dump(), dimension="utilization", label="utilization 0.6", scenario=scen),
        SensitivityCell(**other.model_dump(), dimension="rate", label="covered", scenario=scen),
    ]
    return Sensitivity(base=base, cells=cells, method="one at a time")


def test_a_blocked_grid_shows_no_figures_and_each_cell_says_only_what_differs_from_the_base() -> None:
    rows = sensitivity_rows(_grid(), decided=False)
    assert [r[0] for r in rows] == ["base (manifest)", "demand x2", "utilization 0.6", "covered"]
    # The figures rest on the same blocked evidence as the headline: not decided, as there.
    assert all(r[2] == NOT_DECIDED and r[3] == NOT_DECIDED for r in rows)
    assert rows[0][4] == "evidence incomplete: saturation.inf2; payback 2.5 months is beyond the 1-month horizon"
    assert (
        rows[1][4]
        == "as base, but: payback 1.2 months is beyond the 1-month horizon; not: payback 2.5 months is beyond the 1-month horizon"
    )
    assert rows[2][4] == "as base"
    assert rows[3][4] == "no commitment in the manifest: inf2 has none"  # nothing shared: its own reasons, whole


def test_a_decided_grid_shows_its_figures() -> None:
    rows = sensitivity_rows(_grid(), decided=True)
    assert rows[0][2] == "400.00" and rows[1][2] == "800.00" and rows[1][3] == "1.2"
