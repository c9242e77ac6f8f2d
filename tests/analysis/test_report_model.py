"""report.json against the typed model: a generated report validates; a wrong version or bad field is refused by name."""

from __future__ import annotations

import ast
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from analysis.model import (
    REPORT_VERSION,
    Report,
    ReportInvalid,
    load_report,
    non_finite_to_null,
    parse_report,
)
from analysis.report.build import ReportInputs, build_gate_report, build_report
from tests.analysis.test_capacity import KW, _m, _three_steps, _write
from tests.conftest import example_data
from tests.quality import quality_results


@pytest.fixture(scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report with every section the replay gives: a capacity sweep, intervals, sensitivity,
    series; built once for the module (the tests only read it, or edit their own copy)."""
    tmp = tmp_path_factory.mktemp("report-model")
    m = _m(example_data())
    rep = _write(tmp / "replay", m, {"inf2": (1.0, 900, False), "g6": (1.0, 300, True)})
    build_report(ReportInputs(m, rep, out_dir=tmp / "out", capacity_dirs=_three_steps(tmp, m), **KW))
    return tmp / "out"


@pytest.fixture
def written(_built: Path, tmp_path: Path) -> Path:
    """The module's report directory, copied for this test: its report.json."""
    shutil.copytree(_built, tmp_path / "out")
    return tmp_path / "out" / "report.json"


def test_a_generated_report_validates_and_round_trips(written: Path) -> None:
    on_disk = json.loads(written.read_text())
    assert on_disk["report_version"] == REPORT_VERSION
    r = load_report(written)
    assert r.fleets["inf2"].capacity is not None and r.fleets["inf2"].capacity.steps
    assert r.sensitivity is not None and r.sensitivity.cells
    assert r.fleets["g6"].p95_ttft_ci_s is not None and r.fleets["g6"].measure is not None
    assert r.model_dump(mode="json") == on_disk  # nothing lost or added by reading it back


def test_a_gate_report_validates(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(manifest_data)
    quality = quality_results(
        {
            "inf2": {"passed": False, "pass_rate": 0.5, "failures": ["x"]},
            "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
        }
    )
    build_gate_report(m, quality, out_dir=tmp_path / "out", with_pages=False)
    r = load_report(tmp_path / "out" / "report.json")
    assert r.stopped_at == "quality_gate" and r.decision.state == "reject"
    assert r.fleets["inf2"].p95_ttft_s is None


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda d: d.pop("report_version"), "report_version: missing"),
        (lambda d: d.update(report_version="1.4"), "report_version"),
        (lambda d: d.update(report_version="9.0"), "report_version"),
        (lambda d: d.update(report_version=f"{REPORT_VERSION.split('.')[0]}.999"), "report_version"),
        (lambda d: d.update(report_version="two"), "report_version"),
        (lambda d: d["fleets"]["inf2"].update(p95_ttft_s="fast"), "fleets.inf2.p95_ttft_s"),
        (lambda d: d["fleets"]["g6"].pop("instance_type"), "fleets.g6.instance_type"),
        (lambda d: d["decision"].update(state="maybe"), "decision.state"),
        (lambda d: d["fleets"]["inf2"].update(p95_ttft_secs=1.0), "fleets.inf2.p95_ttft_secs"),
        (
            lambda d: d["sensitivity"]["cells"][0].update(monthly_delta_ci_usd=[1.0]),
            "sensitivity.cells.0.monthly_delta_ci_usd",
        ),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(written: Path, edit: Any, named: str) -> None:
    data = json.loads(written.read_text())
    edit(data)
    written.write_text(json.dumps(data))
    with pytest.raises(ReportInvalid, match=named.replace(".", r"\.")):
        load_report(written)


def test_not_json_is_refused_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "report.json"
    p.write_text("{not json")
    with pytest.raises(ReportInvalid, match=r"report\.json"):
        load_report(p)


def test_nan_and_inf_are_written_as_null(written: Path) -> None:
    r = load_report(written)
    r.fleets["inf2"].p95_ttft_s = math.nan
    r.monthly_delta_usd = math.inf
    again = json.loads(r.to_json())
    assert again["fleets"]["inf2"]["p95_ttft_s"] is None and again["monthly_delta_usd"] is None
    assert isinstance(parse_report(again), Report)


def test_render_rewrites_the_pages_from_report_json(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from campaign.cli.main import main
    from campaign.cli.report_cmds import EXIT_BY_STATE

    state = json.loads(written.read_text())["decision"]["state"]
    assert main(["render", str(written), "--out", str(tmp_path / "again")]) == EXIT_BY_STATE[state]
    assert (tmp_path / "again" / "report.md").read_text() == (written.parent / "report.md").read_text()
    assert (tmp_path / "again" / "report.html").read_text() == (written.parent / "report.html").read_text()


def test_render_refuses_a_bad_report_json_naming_the_field(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from campaign.cli.main import main
    from core.errors import EXIT_BAD_INPUT

    data = json.loads(written.read_text())
    data["fleets"]["g6"]["requests"] = "many"
    written.write_text(json.dumps(data))
    assert main(["render", str(written), "--out", str(tmp_path / "again")]) == EXIT_BAD_INPUT
    assert "fleets.g6.requests" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()


def test_non_finite_floats_become_null_in_the_model_the_pages_render(written: Path) -> None:
    r = load_report(written)
    r.fleets["inf2"].p95_ttft_s = math.nan
    r.monthly_delta_ci_usd = (math.inf, 1.0)
    assert r.cloudwatch is None
    r.cloudwatch = {"inf2": {"cpu": -math.inf, "nlb": 2.0}}
    clean = non_finite_to_null(r)
    assert clean.fleets["inf2"].p95_ttft_s is None and clean.monthly_delta_ci_usd == (None, 1.0)
    assert clean.cloudwatch == {"inf2": {"cpu": None, "nlb": 2.0}}
    assert r.fleets["inf2"].p95_ttft_s != r.fleets["inf2"].p95_ttft_s  # the original is left as it was
    # what holds no non-finite float is the same object: nothing else is copied
    assert clean.fleets["g6"] is r.fleets["g6"] and clean.decision is r.decision


def _method_calls(node: ast.AST) -> list[ast.Attribute]:
    return [n.func for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]


def test_the_report_is_assembled_as_a_model_not_round_tripped_through_a_dict() -> None:
    """report.json's content is built as analysis.model.Report from the typed stages: no
    stage's model or dataclass is turned into a dict for the report to validate it back (issue 38).
    (evaluation_findings echoes manifest sections as provenance values: dicts by design.)"""
    root = Path(__file__).resolve().parents[2] / "analysis"
    checked: list[ast.AST] = []
    for name in ("report/build.py", "report/evaluate.py", "measure/intervals.py", "economics/decision.py"):
        checked.append(ast.parse((root / name).read_text(encoding="utf-8")))
    assembly = ast.parse((root / "report" / "assembly.py").read_text(encoding="utf-8"))
    checked += [f for f in assembly.body if isinstance(f, ast.FunctionDef) and f.name != "evaluation_findings"]
    assert any(isinstance(f, ast.FunctionDef) and f.name == "assemble_report" for f in checked)
    for node in checked:
        calls = _method_calls(node)
        where = getattr(node, "name", "a module")
        assert not [c.attr for c in calls if c.attr in ("model_dump", "as_dict")], where
        validated = [c.value for c in calls if c.attr == "model_validate"]
        assert not [
            v.id for v in validated if isinstance(v, ast.Name) and v.id in ("Report", "Decision", "FleetIntervalsModel")
        ], where
