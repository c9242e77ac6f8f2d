"""A report names no directory of the machine that ran it: paths in it are relative to the run
directory (where report.json is written) or, for the manifest, to the manifest's own directory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from analysis.report.build import ReportInputs, build_report
from core.manifest import load_manifest
from tests.analysis.synth import steady, write_jsonl
from tests.conftest import write_manifest
from tests.quality import quality_results

PASS = quality_results(
    {
        "inf2": {"passed": True, "pass_rate": 1.0, "failures": []},
        "g6": {"passed": True, "pass_rate": 1.0, "failures": []},
    }
)


def _strings(x: Any) -> Iterator[str]:
    if isinstance(x, dict):
        for k, v in x.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)
    elif isinstance(x, str):
        yield x


def test_report_json_holds_no_absolute_path(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    (tmp_path / "manifests").mkdir()
    m = load_manifest(write_manifest(tmp_path / "manifests", manifest_data))
    run = tmp_path / "run"
    records = run / "records"
    write_jsonl(records / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 600))
    torn = write_jsonl(records / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))
    torn.write_bytes(torn.read_bytes() + b'{"campaign": "cut mid-wri')  # a torn tail is named in a gap
    step = run / "capacity" / "x2"
    write_jsonl(step / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 600))
    write_jsonl(step / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))
    build_report(
        ReportInputs(
            m,
            records,
            quality=PASS,
            out_dir=run,
            instances_measured={"inf2": 1, "g6": 1},
            capacity_dirs={"x2": step},
            with_sensitivity=False,
            with_pages=False,
        )
    )
    report = json.loads((run / "report.json").read_text())
    leaked = [s for s in _strings(report) if str(tmp_path) in s or s.startswith("/")]
    assert not leaked, leaked
    prov = report["provenance"]
    assert prov["manifest"]["detail"].startswith(f"m.yaml digest {m.digest}")
    assert "under records" in prov["records"]["detail"] and "under capacity/x2" in prov["capacity_sweep"]["detail"]
    assert any(
        g["what"] == "records.torn_tail" and g["reason"].startswith("records-g6-w0.jsonl:") for g in report["gaps"]
    )


def test_records_outside_the_run_directory_are_named_relative_to_it(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = load_manifest(write_manifest(tmp_path, manifest_data))
    records = tmp_path / "elsewhere" / "records"
    write_jsonl(records / "records-inf2-w0.jsonl", steady(m, "inf2", 100, 600))
    write_jsonl(records / "records-g6-w0.jsonl", steady(m, "g6", 100, 450))
    r = build_report(
        ReportInputs(
            m,
            records,
            quality=PASS,
            out_dir=tmp_path / "out",
            instances_measured={"inf2": 1, "g6": 1},
            with_sensitivity=False,
            with_pages=False,
        )
    ).model_dump(mode="json")
    assert r["provenance"]["records"]["detail"].endswith("under ../elsewhere/records")
