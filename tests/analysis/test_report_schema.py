"""report.json's contract: every field of analysis/model.py described, and the JSON Schema
generated from the model committed as schemas/report-v<major>.json."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analysis import model as report_model
from analysis.model import REPORT_VERSION, Report

ROOT = Path(__file__).resolve().parents[2]


def _models(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The top-level model and every nested one ($defs), by name."""
    yield "Report", schema
    yield from schema.get("$defs", {}).items()


def _fields(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property of every model, as 'Model.field' and its schema."""
    for name, model in _models(schema):
        for field, prop in model.get("properties", {}).items():
            yield f"{name}.{field}", prop


def test_every_field_of_every_model_says_what_it_is() -> None:
    schema = Report.model_json_schema()
    fields = dict(_fields(schema))
    assert len(fields) > 250  # every model reached, nested ones included
    missing = [name for name, prop in fields.items() if not str(prop.get("description", "")).strip()]
    assert not missing, f"{len(missing)} field(s) without a description: {missing[:20]}"
    undocumented = [name for name, model in _models(schema) if not str(model.get("description", "")).strip()]
    assert not undocumented, f"models without a description: {undocumented}"


def test_the_committed_schema_is_the_models() -> None:
    major = REPORT_VERSION.split(".")[0]
    path = ROOT / "schemas" / f"report-v{major}.json"
    assert report_model.schema_path() == path
    assert path.is_file(), f"{path} missing: run `python -m analysis.model --schema --write`"
    committed = json.loads(path.read_text(encoding="utf-8"))
    assert committed == report_model.json_schema(), f"{path} is stale: run `python -m analysis.model --schema --write`"
    assert path.read_text(encoding="utf-8") == report_model.schema_text()  # byte for byte, as the generator writes it
    assert committed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert REPORT_VERSION in committed["description"]


def test_the_generator_prints_the_schema() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "analysis.model", "--schema"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert json.loads(out) == report_model.json_schema()


def test_a_generated_report_is_valid_under_the_committed_schema(
    full_pages: tuple[dict[str, Any], Path], gate_reject_pages: tuple[dict[str, Any], Path]
) -> None:
    jsonschema = pytest.importorskip("jsonschema")

    schema = json.loads(report_model.schema_path().read_text(encoding="utf-8"))
    for data, out in (full_pages, gate_reject_pages):
        jsonschema.validate(json.loads((out / "report.json").read_text(encoding="utf-8")), schema)
        assert data["report_version"] == REPORT_VERSION


def test_every_field_added_since_a_version_was_recorded_bumped_it() -> None:
    """The compatibility rule (analysis/model.py): a field only added bumps MINOR, anything else
    MAJOR. 2.1's fields were recorded from its committed schema (ac93cec); issue 39 added the
    billing section and the per-step server figures without a bump, which this would have failed."""
    ledger = json.loads(report_model.FIELDS_LEDGER.read_text(encoding="utf-8"))
    fields = report_model.schema_fields(report_model.json_schema())
    recorded = ledger.get(REPORT_VERSION)
    assert recorded is not None, (
        f"report_version {REPORT_VERSION} not recorded: `python -m analysis.model --schema --write`"
    )
    added, gone = sorted(set(fields) - set(recorded)), sorted(set(recorded) - set(fields))
    assert not added and not gone, (
        f"fields changed since {REPORT_VERSION} was recorded (added {added}, removed {gone}): bump REPORT_VERSION "
        "(MINOR for additions only, MAJOR otherwise), then `python -m analysis.model --schema --write`"
    )
    versions = sorted(ledger, key=report_model._version)
    assert versions[-1] == REPORT_VERSION  # no newer version recorded than the code's
    for older, newer in itertools.pairwise(versions):
        if report_model._version(older)[0] == report_model._version(newer)[0]:  # a MINOR bump only adds
            removed = sorted(set(ledger[older]) - set(ledger[newer]))
            assert not removed, f"{newer} removes {removed} of {older}'s fields: that needs a MAJOR bump"


def test_recording_other_fields_under_a_recorded_version_is_refused(tmp_path: Path) -> None:
    ledger = tmp_path / "report-fields.json"
    ledger.write_text(json.dumps({REPORT_VERSION: ["Report.only_this"]}), encoding="utf-8")
    with pytest.raises(SystemExit, match=f"report_version {REPORT_VERSION} is recorded with other fields"):
        report_model.record_fields(ledger)
    ledger.write_text("{}", encoding="utf-8")
    report_model.record_fields(ledger)
    assert json.loads(ledger.read_text(encoding="utf-8"))[REPORT_VERSION] == report_model.schema_fields(
        report_model.json_schema()
    )
