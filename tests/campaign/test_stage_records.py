"""The stages hand typed records to the report: the settle record and the quality results are
models from their producer to build_report, read back from a run directory with errors naming
the file and the field, and `campaign plan` runs the campaign's own stages (run_stages)."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from analysis.capacity.settle_record import SETTLE_FILE, SettleOutcome, SettleSegment, SettleStop
from analysis.errors import AnalysisError
from analysis.model import Report
from analysis.report.inputs import PlannedCost
from campaign.backends.simulated.fleets import SimulatedFleets
from campaign.stages.run import QUALITY_FILE, RunFacts, read_quality, run_stages
from core.manifest import Manifest, manifest_from_data


def _outcome() -> SettleOutcome:
    return SettleOutcome(
        stopped=SettleStop.BUDGET,
        detail="inf2: over",
        delta_ci_before=[-800.0, 3300.0],
        delta_ci_after=[-200.0, None],
        decision_before="defer",
        decision_after="defer",
        seconds=300.0,
        segments=[
            SettleSegment(
                fleet="inf2",
                step="inf2/x1.5",
                directory="inf2/x1.5/settle-1",
                multiplier=1.5,
                skip_s=145.0,
                span_s=56.0,
                planned_requests=56,
                took_s=144.0,
            )
        ],
    )


def test_the_settle_record_reads_back_as_written(tmp_path: Path) -> None:
    out = _outcome()
    out.write(tmp_path)
    body = json.loads((tmp_path / SETTLE_FILE).read_text())
    assert body["stopped"] == "budget" and body["segments"][0]["directory"] == "inf2/x1.5/settle-1"
    back = SettleOutcome.read(tmp_path)
    assert back == out and back is not None and back.stopped is SettleStop.BUDGET
    assert SettleOutcome.read(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda b: b.update(stopped="done"), "stopped"),  # not one of SettleStop's values
        (lambda b: b["segments"][0].pop("took_s"), "segments.0.took_s"),
        (lambda b: b.update(extra=1), "extra"),
    ],
)
def test_a_bad_settle_record_names_the_file_and_field(tmp_path: Path, edit: Any, where: str) -> None:
    _outcome().write(tmp_path)
    body = json.loads((tmp_path / SETTLE_FILE).read_text())
    edit(body)
    (tmp_path / SETTLE_FILE).write_text(json.dumps(body))
    with pytest.raises(AnalysisError, match=rf"settle\.json: {where}: "):
        SettleOutcome.read(tmp_path)


def test_quality_results_read_back_typed_and_bad_ones_are_named(tmp_path: Path) -> None:
    path = tmp_path / QUALITY_FILE
    assert read_quality(path) is None
    path.write_text(json.dumps({"inf2": {"passed": True, "pass_rate": 1.0, "failures": [], "fleet": "inf2"}}))
    got = read_quality(path)
    assert got is not None and got["inf2"].passed is True and got["inf2"].model_extra == {"fleet": "inf2"}
    path.write_text(json.dumps({"inf2": {"passed": "perhaps"}}))
    with pytest.raises(AnalysisError, match=r"quality\.json: inf2\.passed: "):
        read_quality(path)
    path.write_text("[1]")
    with pytest.raises(AnalysisError, match=r"quality\.json: expected \{fleet: quality result\}"):
        read_quality(path)


@pytest.fixture(scope="module")
def defaults_run(
    tmp_path_factory: pytest.TempPathFactory, _example_data: dict[str, Any]
) -> tuple[Manifest, SimulatedFleets, Report, Path, list[str], PlannedCost]:
    """One campaign on the plan's fleets, shared by the two tests below (each ran its own until
    2026-12-07): the example without its workload.capacity_search block, given a plan's cost."""
    from tests.conftest import ROOT

    data = copy.deepcopy(_example_data)
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    data["workload"].pop("capacity_search", None)
    m = manifest_from_data(data)
    run_dir = tmp_path_factory.mktemp("defaults")
    fleets = SimulatedFleets(m, overhead_s=60.0)
    planned = PlannedCost(123.45, 200.0, "predicted (campaign plan)", "2026-12-05T21:00:00Z")
    lines: list[str] = []
    rep = run_stages(m, fleets, run_dir, threading.Event(), planned_cost=planned, log=lines.append)
    assert rep is not None
    return m, fleets, rep, run_dir, lines, planned


def test_without_a_capacity_search_block_the_stages_settle_with_its_defaults(
    defaults_run: tuple[Manifest, SimulatedFleets, Report, Path, list[str], PlannedCost],
) -> None:
    """The live stages skipped the settle phase for a manifest without workload.capacity_search,
    while the search ran with its defaults and `campaign plan` settled with them: the plan then
    predicted a phase the campaign never ran (fixed 2026-12-05). The plan's fleets run the same
    stages here, in simulated time."""
    m, fleets, rep, run_dir, lines, _ = defaults_run
    assert m.workload.capacity_search is None and m.workload.capacity_sweep is None
    assert fleets.replay_s > 0
    settled = SettleOutcome.read(run_dir / "capacity")
    assert settled is not None, lines
    assert rep.model_dump(mode="json")["provenance"]["settle"]["value"]["stopped"] == settled.stopped.value
    # The plan's gate is assumed, and the report says so.
    quality = read_quality(run_dir / QUALITY_FILE)
    assert quality is not None and all(q.model_extra and "assumed" in q.model_extra for q in quality.values())


def test_the_plan_a_run_was_given_reaches_its_report_and_campaign_json(
    defaults_run: tuple[Manifest, SimulatedFleets, Report, Path, list[str], PlannedCost],
) -> None:
    """`local/run --from-plan FILE`: the plan's campaign cost is the report's planned figure, and
    campaign.json keeps it for `report --run-dir` (it was read only from RUN_DIR/plan.json or --plan)."""
    _, _, rep, run_dir, _, planned = defaults_run
    assert rep.billing is not None and rep.billing.plan is not None
    assert rep.billing.plan.usd == 123.45 and rep.billing.plan.source.startswith("predicted")
    facts = RunFacts.read(run_dir)
    assert facts is not None and facts.planned_cost == planned
