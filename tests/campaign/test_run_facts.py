"""campaign.json (RunFacts): written by a run, read back by `report --run-dir`; a hand-edited
file gets an error naming the field, not a KeyError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.errors import AnalysisError
from campaign.stages.run import CAMPAIGN_FILE, RunFacts
from core.errors import EXIT_BAD_INPUT


def test_round_trip(tmp_path: Path) -> None:
    facts = RunFacts({"inf2": 4, "g6": 2}, "emulated", False, None, {"inf2": 12.5})
    facts.write(tmp_path)
    assert RunFacts.read(tmp_path) == facts
    assert RunFacts.read(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected an object"),
        ("{}", "instances_measured: expected {fleet: number}, got None"),
        (
            '{"instances_measured": {"inf2": "four"}}',
            "instances_measured.inf2: expected a non-negative int, got 'four'",
        ),
        ('{"instances_measured": {"inf2": 2.5}}', "instances_measured.inf2"),
        ('{"instances_measured": {"inf2": true}}', "instances_measured.inf2"),
        ('{"instances_measured": {"g6": 2}, "ready_after_s": {"g6": -1}}', "ready_after_s.g6"),
        ('{"instances_measured": {"g6": 2}, "ready_after_s": {"g6": NaN}}', "ready_after_s.g6"),
        ('{"instances_measured": {"g6": Infinity}}', "instances_measured.g6"),
        ('{"instances_measured": {"g6": 2}, "ready_after_s": 5}', "ready_after_s: expected {fleet: number}"),
        ('{"instances_measured": {"g6": 2}, "systems_under_test": 3}', "systems_under_test"),
    ],
)
def test_a_malformed_file_names_the_field(tmp_path: Path, body: str, names: str) -> None:
    (tmp_path / CAMPAIGN_FILE).write_text(body, encoding="utf-8")
    with pytest.raises(AnalysisError) as err:
        RunFacts.read(tmp_path)
    assert names in str(err.value) and str(tmp_path / CAMPAIGN_FILE) in str(err.value)
    assert err.value.exit_code == EXIT_BAD_INPUT


def test_optional_fields_may_be_absent(tmp_path: Path) -> None:
    (tmp_path / CAMPAIGN_FILE).write_text(json.dumps({"instances_measured": {"g6": 3.0}}), encoding="utf-8")
    facts = RunFacts.read(tmp_path)
    assert facts is not None and facts.instances_measured == {"g6": 3} and facts.ready_after_s == {}


def test_the_plan_a_run_was_given_round_trips_and_a_bad_field_is_named(tmp_path: Path) -> None:
    from analysis.report.inputs import PlannedCost

    planned = PlannedCost(12.5, 240.0, "predicted (campaign plan, 2026-12-05T20:00:00Z)", "2026-12-05T20:00:00Z")
    RunFacts({"g6": 1}, planned_cost=planned).write(tmp_path)
    got = RunFacts.read(tmp_path)
    assert got is not None and got.planned_cost == planned
    for bad, field in (
        ({"usd": "12"}, "planned_cost.usd"),
        ({"minutes": -1}, "planned_cost.minutes"),
        ({"source": ""}, "planned_cost.source"),
    ):
        body = {"instances_measured": {"g6": 1}, "planned_cost": {**planned.__dict__, **bad}}
        (tmp_path / CAMPAIGN_FILE).write_text(json.dumps(body), encoding="utf-8")
        with pytest.raises(AnalysisError, match=field):
            RunFacts.read(tmp_path)


def test_the_scrape_interval_is_kept_for_report_run_dir(tmp_path: Path) -> None:
    """Issue 46, finding 12: the run's report widens the replay window's Prometheus queries by the
    scrape interval (analysis.sources.prometheus.scrape_widened); campaign.json did not keep it,
    so `report --run-dir` queried the window unwidened (read back None on 35fb9c4)."""
    RunFacts({"g6": 1}, aws=True, scrape_interval_s=5.0).write(tmp_path)
    facts = RunFacts.read(tmp_path)
    assert facts is not None and facts.scrape_interval_s == 5.0
    for bad in ("0", "-5", '"5"', "true"):
        body = json.dumps({"instances_measured": {"g6": 1}})[:-1] + f', "scrape_interval_s": {bad}}}'
        (tmp_path / CAMPAIGN_FILE).write_text(body, encoding="utf-8")
        with pytest.raises(AnalysisError, match="scrape_interval_s: expected a positive number"):
            RunFacts.read(tmp_path)
