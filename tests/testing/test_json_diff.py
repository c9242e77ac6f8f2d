from __future__ import annotations

from testing.json_diff import differences


def test_a_nested_figure_that_changed_is_named_with_both_values() -> None:
    a = {"decision": {"state": "defer"}, "fleets": {"g6": {"steps": [{"instances": 4}, {"instances": 4}]}}}
    b = {"decision": {"state": "defer"}, "fleets": {"g6": {"steps": [{"instances": 4}, {"instances": 3}]}}}
    assert [str(d) for d in differences(a, b)] == ["fleets.g6.steps.1.instances: 4 != 3"]


def test_shapes_absent_keys_and_types_differ_but_equal_numbers_do_not() -> None:
    assert [d.path for d in differences({"a": [1, 2], "b": 1}, {"a": [1], "c": 1})] == ["a", "b", "c"]
    assert differences({"n": 1}, {"n": 1.0}) == []  # one number, whatever its JSON spelling
    assert [d.path for d in differences({"n": True}, {"n": 1})] == ["n"]  # a flag is not a count
    assert differences({"x": 1.0}, {"x": 1.0 + 1e-12}, rel=1e-9) == []
    assert [d.path for d in differences({"x": 1.0}, {"x": 1.0 + 1e-12})] == ["x"]
