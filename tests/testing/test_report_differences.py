"""testing.json_diff.report_differences, as testing.cloud_offline_resume uses it: the offline fault proof compares the resumed
run's report.json with `report --run-dir`'s field by field (issue 46, finding 12). Until then it
compared decision.state alone, which two reports differing in every figure but the verdict pass."""

from __future__ import annotations

import copy
from typing import Any

from testing.cloud_offline_resume import VOLATILE
from testing.json_diff import report_differences as _differences


def report_differences(ran: Any, again: Any) -> tuple[int, list[str]]:
    return _differences(ran, again, VOLATILE)


RAN: dict[str, Any] = {
    "generated_at": "2026-12-06T22:00:00+00:00",
    "decision": {"state": "defer", "reasons": ["interval too wide"]},
    "fleets": {
        "g6": {"capacity": {"search": {"steps": [{"label": "x0.5", "goodput_tok_s": 200.0, "valid": True}]}}},
        "inf2": {"monthly_cost_usd": 1234.5, "instances_needed": 3},
    },
    "provenance": {"resume": {"source": "measured", "value": [{"at": "report"}]}},
}


def test_one_nested_figure_that_differs_is_named_by_its_path() -> None:
    again = copy.deepcopy(RAN)
    again["fleets"]["g6"]["capacity"]["search"]["steps"][0]["goodput_tok_s"] = 180.0
    assert again["decision"]["state"] == RAN["decision"]["state"]  # what the old check compared: it passed
    compared, differences = report_differences(RAN, again)
    assert differences == ["fleets.g6.capacity.search.steps[0].goodput_tok_s: 200.0 vs 180.0"]
    assert compared == 9  # every leaf but generated_at


def test_the_same_report_built_later_has_no_difference() -> None:
    again = copy.deepcopy(RAN)
    again["generated_at"] = "2026-12-06T22:05:00+00:00"  # VOLATILE: when it was built
    assert "generated_at" in VOLATILE
    assert report_differences(RAN, again) == (9, [])


def test_a_missing_field_a_shorter_list_and_a_changed_type_are_differences() -> None:
    again = copy.deepcopy(RAN)
    del again["provenance"]["resume"]
    again["fleets"]["inf2"]["extra"] = None
    again["decision"]["reasons"].append("another")
    again["fleets"]["g6"]["capacity"]["search"]["steps"][0]["valid"] = 1  # True == 1 in Python
    _, differences = report_differences(RAN, again)
    assert differences == [
        "decision.reasons: 1 item(s) vs 2",
        "fleets.g6.capacity.search.steps[0].valid: True vs 1",
        "fleets.inf2.extra: 'absent' vs None",
        "provenance.resume: {'source': 'measured', 'value': [{'at': 'report'}]} vs 'absent'",
    ]
