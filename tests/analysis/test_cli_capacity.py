from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from campaign.cli.main import main
from core.manifest import load_manifest
from tests.analysis.synth import steady, write_jsonl
from tests.conftest import write_manifest


def test_report_cli_reads_capacity_step_directories(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    path = write_manifest(tmp_path, manifest_data)
    m = load_manifest(path)
    for fleet in ("inf2", "g6"):
        write_jsonl(tmp_path / "records" / f"records-{fleet}-w0.jsonl", steady(m, fleet, 30, 200))
        for k in ("x1", "x2"):
            write_jsonl(
                tmp_path / "capacity" / k / f"records-{fleet}-w0.jsonl", steady(m, fleet, 30, 200 if k == "x1" else 400)
            )
    rc = main(
        [
            "report",
            str(path),
            "--records",
            str(tmp_path / "records"),
            "--capacity",
            str(tmp_path / "capacity"),
            "--instances",
            "inf2=1",
            "g6=1",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc in (0, 10, 11)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["fleets"]["g6"]["capacity"]["step"] == "x2"
    assert report["fleets"]["g6"]["sized_from"] == "capacity sweep step x2"


def test_report_cli_rejects_an_empty_capacity_directory(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    path = write_manifest(tmp_path, manifest_data)
    (tmp_path / "capacity").mkdir()
    rc = main(
        [
            "report",
            str(path),
            "--records",
            str(tmp_path),
            "--capacity",
            str(tmp_path / "capacity"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 2
