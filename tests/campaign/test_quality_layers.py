"""The quality gate's layers without sockets: hand-made fixture answers and records."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.report.build import ReportInputs, build_report
from campaign.stages.quality import (
    ReplayFigures,
    distribution_layer,
    equivalence_layer,
    fleet_quality,
    gate_layers,
    replay_figures,
    task_acceptance_layer,
)
from core.manifest import Manifest, load_manifest
from loadgen.fixtures import FixtureResult, GateResult
from tests.analysis.synth import rec, steady, write_jsonl
from tests.conftest import ROOT, write_manifest

SCORER = ROOT / "manifests" / "scorers" / "answers_nonempty.py"


def _gate(fleet: str, *fixtures: FixtureResult) -> GateResult:
    rate = sum(f.passed for f in fixtures) / len(fixtures)
    return GateResult(fleet, rate >= 1.0, rate, 1.0, list(fixtures))


def _fx(
    id_: str, tokens: int, finish: str = "length", schema: bool | None = None, output: str = "a b c"
) -> FixtureResult:
    return FixtureResult(id_, True, [], finish, tokens, output, schema)


def _m(tmp_path: Path, manifest_data: dict[str, Any], **ta: Any) -> Manifest:
    if ta:
        manifest_data["quality"]["task_acceptance"].update(ta)
    return load_manifest(write_manifest(tmp_path, manifest_data))


def test_equivalence_compares_tokens_stop_behaviour_and_schema_with_the_baseline() -> None:
    base = _gate("g6", _fx("a", 32), _fx("b", 8, "stop", True), _fx("c", 5))
    same = _gate("inf2", _fx("a", 32, output="other words"), _fx("b", 8, "stop", True), _fx("c", 5))
    assert equivalence_layer(same, base).passed is True  # the text may differ; counts, stops and schema may not
    diff = _gate("inf2", _fx("a", 31), _fx("b", 8, "length", False), _fx("c", 5))
    res = equivalence_layer(diff, base)
    assert res.passed is False
    assert res.reasons == [
        "equivalence: a: 31 completion tokens on inf2, 32 on g6",
        "equivalence: b: finish_reason 'length' on inf2, 'stop' on g6",
        "equivalence: b: schema invalid on inf2, valid on g6",
    ]


def test_the_example_scorer_prints_a_pass_rate_and_refuses_what_it_cannot_read() -> None:
    lines = (
        '{"id": "a", "output": "yes", "finish_reason": "stop"}\n{"id": "b", "output": "  ", "finish_reason": "stop"}\n'
        '{"id": "c", "output": "x", "finish_reason": "length"}\n{"id": "d", "output": "x", "finish_reason": null}\n'
    )
    r = subprocess.run([sys.executable, str(SCORER)], input=lines, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "0.500000"  # a and c pass; b is blank, d did not finish
    r = subprocess.run(
        [sys.executable, str(SCORER)],
        input='{"id": "a", "output": "x", "finish_reason": "stop"}\nnot json\n',
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "stdin line 2: not JSON" in r.stderr
    r = subprocess.run([sys.executable, str(SCORER)], input="", capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no answers" in r.stderr


def test_task_acceptance_runs_the_buyers_scorer_against_its_threshold(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(tmp_path, manifest_data, threshold=0.5)
    good = _gate("inf2", _fx("length-exact", 32), _fx("answers-nonempty", 24, output="yes"))
    res = task_acceptance_layer(m, good)
    assert res.passed is True and res.figures["pass_rate"] == 1.0
    half = _gate("inf2", _fx("length-exact", 32), _fx("answers-nonempty", 24, output=" "))
    assert task_acceptance_layer(m, half).passed is True  # 0.5 >= 0.5
    m = _m(tmp_path, manifest_data, threshold=0.75)
    res = task_acceptance_layer(m, half)
    assert res.passed is False and res.reasons == [
        f"task_acceptance: pass rate 0.500 < threshold 0.75 (scorer `{sys.executable} {SCORER}`)"
    ]


@pytest.mark.parametrize(
    ("script", "needle"),
    [
        ("import sys; sys.exit(3)", "exited 3"),
        ("print('great')", "printed 'great' as its last line, not a pass rate in [0, 1]"),
        ("print(1.5)", "not a pass rate"),
    ],
)
def test_a_scorer_that_cannot_score_leaves_the_layer_not_evaluated(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    script: str,
    needle: str,
) -> None:
    m = _m(tmp_path, manifest_data, command=[sys.executable, "-c", script])
    res = task_acceptance_layer(m, _gate("inf2", _fx("length-exact", 32)))
    assert res.passed is None and needle in res.reasons[0]


def _figs(tokens: list[int], sent: int | None = None, invalid: int = 0, retried: int = 0) -> ReplayFigures:
    return ReplayFigures(tokens, len(tokens) if sent is None else sent, invalid, retried)


def test_distribution_layer_two_sample_test_invalid_and_retry_rates(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(tmp_path, manifest_data)  # min_p_value 0.01, min_samples 20, max_invalid_rate 0.01, slo.max_retry_rate 0.02
    base = _figs(list(range(20)))
    same = distribution_layer(m, "inf2", {"g6": base, "inf2": _figs(list(range(20)))})
    assert same.passed is True and same.figures["output_length_ks"]["p_value"] == 1.0
    # 0..19 against 10..29: D = 0.5, p = 0.00816 (tests/analysis/test_two_sample.py) < 0.01
    shifted = distribution_layer(m, "inf2", {"g6": base, "inf2": _figs(list(range(10, 30)))})
    assert shifted.passed is False
    assert shifted.reasons == [
        "distribution: output lengths differ from g6's: KS D = 0.500, p = 0.0082 < 0.01 (n = 20, 20)"
    ]
    # 1 of 50 retried = 0.02: at the ceiling, holds; 2 of 50 = 0.04 fails. 1 of 50 invalid = 0.02 > 0.01 fails.
    assert distribution_layer(m, "g6", {"g6": _figs(list(range(20)), sent=50, retried=1)}).passed is True
    res = distribution_layer(m, "g6", {"g6": _figs(list(range(20)), sent=50, retried=2, invalid=1)})
    assert res.passed is False and res.reasons == [
        "distribution: invalid-response rate 0.0200 (1 of 50) > 0.01",
        "distribution: retry rate 0.0400 (2 of 50) > slo.max_retry_rate 0.02",
    ]
    few = distribution_layer(m, "inf2", {"g6": base, "inf2": _figs(list(range(19)))})
    assert few.passed is None and "needs 20 completed requests per fleet; inf2 has 19, g6 20" in few.reasons[0]


def test_replay_figures_read_retries_and_invalid_responses_from_records(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(tmp_path, manifest_data)
    recs = steady(m, "g6", 10, 100)
    recs[0] = replace(recs[0], retries=2)
    recs[1] = replace(rec(m, "g6", 1, outcome="truncated"))
    recs[2] = replace(rec(m, "g6", 2, outcome="not_sent"))
    recs.append(replace(rec(m, "g6", 10, tokens=7), warmup=True))  # warmup: left out
    write_jsonl(tmp_path / "r" / "records-g6-w0.jsonl", recs)
    figs = replay_figures(tmp_path / "r", m)["g6"]
    assert (figs.sent, figs.invalid, figs.retried) == (9, 1, 1)
    assert figs.output_tokens == [100] * 8


def test_a_failed_layer_names_itself_in_the_decision(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(tmp_path, manifest_data)
    base = _gate("g6", _fx("length-exact", 32), _fx("answers-nonempty", 24, "stop", True))
    cand = _gate("inf2", _fx("length-exact", 31), _fx("answers-nonempty", 24, "stop", True))
    layers = gate_layers(m, {"g6": base, "inf2": cand})
    assert [x.layer for x in layers["inf2"]] == ["fixtures", "equivalence", "task_acceptance"]
    assert [x.layer for x in layers["g6"]] == ["fixtures", "task_acceptance"]  # the baseline is the reference
    quality = {k: fleet_quality(g, layers[k]) for k, g in {"g6": base, "inf2": cand}.items()}
    assert quality["inf2"].passed is False and quality["inf2"].failed_layer == "equivalence"
    assert quality["g6"].passed is True and quality["g6"].failed_layer is None
    d = tmp_path / "rec"
    for f in ("g6", "inf2"):
        write_jsonl(d / f"records-{f}-w0.jsonl", steady(m, f, 30, 100))
    rep = build_report(
        ReportInputs(m, d, quality=quality, out_dir=tmp_path / "o", with_sensitivity=False, with_pages=False)
    ).model_dump(mode="json")
    assert rep["decision"]["state"] == "reject"
    assert (
        "inf2: quality gate failed: layer equivalence: length-exact: 31 completion tokens on inf2, 32 on g6"
        in rep["decision"]["reasons"]
    )
    # a layer that could not be evaluated is missing evidence: Defer, naming it
    quality["inf2"] = quality["inf2"].model_copy(
        update={
            "passed": None,
            "failed_layer": "task_acceptance",
            "failures": ["task_acceptance: scorer `x` exited 3: boom"],
        }
    )
    rep = build_report(
        ReportInputs(m, d, quality=quality, out_dir=tmp_path / "o", with_sensitivity=False, with_pages=False)
    ).model_dump(mode="json")
    assert rep["decision"]["state"] == "defer"
    assert (
        "evidence incomplete: no quality-gate result for inf2: layer task_acceptance: scorer `x` exited 3: boom"
        in rep["decision"]["reasons"]
    )
