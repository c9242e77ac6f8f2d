"""`campaign local/run --from-plan FILE`: a saved plan read back, every bad input named by file and field."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from analysis.capacity.steps import StopRule
from campaign.backends.simulated.fleets import SimulatedSteps
from campaign.plan.plan_file import plan_document, predicted_boundaries
from campaign.stages.capacity import search_fleet
from core.errors import BadArgument
from core.manifest import CapacitySearch, Manifest, load_manifest
from tests.conftest import write_manifest


@pytest.fixture
def m(tmp_path: Path, manifest_data: dict[str, Any]) -> Manifest:
    return load_manifest(write_manifest(tmp_path, manifest_data))


def _plan(m: Manifest, brackets: dict[str, list[Any]]) -> dict[str, Any]:
    prediction = {
        "campaign_minutes": 1.0,
        "campaign_usd": 1.0,
        "predicted_decision": "defer",
        "fleets": {name: {"search_bracket": b} for name, b in brackets.items()},
    }
    return plan_document(m, [], prediction)


def _write(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def test_each_fleets_highest_predicted_hold_is_read_and_a_fleet_with_none_is_left_out(
    tmp_path: Path, m: Manifest
) -> None:
    p = _write(tmp_path, _plan(m, {"inf2": [0.7071, 0.8485], "g6": [None, 0.125]}))
    assert predicted_boundaries(p, m) == {"inf2": 0.7071}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("{not json", "plan.json: line 1: not JSON"),
        ([1, 2], "expected the JSON object `campaign plan --save` writes"),
        ({"manifest_digest": "0" * 64}, "manifest_digest '000"),
        ("no-prediction", "prediction.fleets: missing (a plan saved with --no-simulate predicts none)"),
        ("no-g6", "prediction.fleets.g6: missing"),
        ("bad-bracket", "prediction.fleets.g6.search_bracket: expected [held, missed]"),
        ("bad-held", "prediction.fleets.g6.search_bracket[0]: expected a positive multiplier, got 'x0.5'"),
    ],
)
def test_a_bad_plan_file_is_refused_naming_the_field(tmp_path: Path, m: Manifest, doc: object, says: str) -> None:
    good = {"inf2": [0.7, 0.84], "g6": [0.6, 0.72]}
    if doc == "no-prediction":
        doc = plan_document(m, [], None)
    elif doc == "no-g6":
        doc = _plan(m, {"inf2": good["inf2"]})
    elif doc == "bad-bracket":
        doc = _plan(m, {**good, "g6": [0.6]})
    elif doc == "bad-held":
        doc = _plan(m, {**good, "g6": ["x0.5", 0.72]})
    p = tmp_path / "plan.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    with pytest.raises(BadArgument) as err:
        predicted_boundaries(p, m)
    assert str(err.value).startswith(f"--from-plan {p}") and says in str(err.value)


def test_a_missing_file_is_a_bad_argument(tmp_path: Path, m: Manifest) -> None:
    with pytest.raises(BadArgument, match="cannot read it"):
        predicted_boundaries(tmp_path / "absent.json", m)


def test_a_search_given_its_own_predicted_boundary_starts_there_and_converges(tmp_path: Path, m: Manifest) -> None:
    """The emulator in simulated time, searched once without a prediction, then again given the
    boundary that search held at: the second starts there, confirms just above, and needs no more
    steps than the first."""
    cfg = CapacitySearch()
    blind = search_fleet(m, "inf2", tmp_path / "blind", cfg, 20.0, SimulatedSteps(m), threading.Event(), lambda _: None)
    assert blind.stop_rule is StopRule.CONVERGED and blind.held_multiplier is not None
    lines: list[str] = []
    told = search_fleet(
        m,
        "inf2",
        tmp_path / "told",
        cfg,
        20.0,
        SimulatedSteps(m),
        threading.Event(),
        lines.append,
        predicted=blind.held_multiplier,
    )
    assert told.steps[0].multiplier == pytest.approx(blind.held_multiplier)
    assert told.steps[0].why == "the plan's predicted boundary (campaign plan, simulated)"
    assert told.stop_rule is StopRule.CONVERGED, lines
    assert len(told.steps) <= len(blind.steps)
    # outside the search's range: said, and not used (only its first step is asserted on: one step is run)
    one_step = cfg.model_copy(update={"max_steps": 1})
    out = search_fleet(
        m, "inf2", tmp_path / "out", one_step, 20.0, SimulatedSteps(m), threading.Event(), lines.append, predicted=1e-6
    )
    assert any("outside the search's range" in line and "not used" in line for line in lines)
    assert out.steps[0].why == "start"


def test_planned_cost_is_the_plans_campaign_usd_dated_by_generated_at_or_the_files_mtime(
    tmp_path: Path, m: Manifest
) -> None:
    import os

    from campaign.plan.plan_file import planned_cost

    doc = plan_document(
        m,
        [],
        {"campaign_minutes": 206.0, "campaign_usd": 31.4, "predicted_decision": "defer"},
        generated_at="2026-12-05T20:00:00Z",
    )
    got = planned_cost(_write(tmp_path, doc), m)
    assert (got.usd, got.minutes, got.date) == (31.4, 206.0, "2026-12-05T20:00:00Z")
    assert got.source == "predicted (campaign plan, 2026-12-05T20:00:00Z; plan.json, dated by generated_at)"
    del doc["generated_at"]  # a plan saved before the field existed
    path = _write(tmp_path, doc)
    os.utime(path, (1_764_964_800, 1_764_964_800))  # 2025-12-05T20:00:00Z
    got = planned_cost(path, m)
    assert got.date == "2025-12-05T20:00:00Z" and "dated by the file's modification time" in got.source
    with pytest.raises(BadArgument, match="campaign_usd / campaign_minutes: missing"):
        planned_cost(_write(tmp_path, plan_document(m, [], None)), m)
    with pytest.raises(BadArgument, match="campaign_usd: expected USD or null"):
        planned_cost(_write(tmp_path, {**doc, "campaign_usd": "lots"}), m)
