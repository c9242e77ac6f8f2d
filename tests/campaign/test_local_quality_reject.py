"""`campaign local` whose quality gate fails: a Reject report with the gate's results, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from campaign.cli.main import main
from campaign.cli.report_cmds import EXIT_BY_STATE
from tests.conftest import write_manifest

pytestmark = pytest.mark.slow


def test_failing_quality_gate_writes_a_reject_report(
    tmp_path: Path, manifest_data: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    # No emulated answer can match this: the gate fails on both fleets, so no load is replayed.
    manifest_data["quality"]["fixtures"][1]["expect_regex"] = "^never-said-by-anyone$"
    # The emulated model made 16x smaller, so the fixtures' answers stream about 10x sooner: the
    # gate's verdict and the report it decides are the subject, not the emulated hardware's pace.
    manifest_data["model"]["params_b"] = 0.5
    path = write_manifest(tmp_path, manifest_data)
    out = tmp_path / "run"
    # The CLI's own entry in this process (the emulators and Prometheus are still real processes),
    # so `python -m campaign` would add only the interpreter's start.
    code = main(["local", str(path), "--out", str(out)])
    said = capfd.readouterr()
    assert "Traceback" not in said.err, said.err[-3000:]
    assert code == EXIT_BY_STATE["reject"], said.out[-2000:] + said.err[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["decision"]["state"] == "reject"
    reasons = " ".join(report["decision"]["reasons"])
    assert "inf2: quality gate failed" in reasons and "answers-nonempty" in reasons
    # The gate's own results are in the report, per fleet, with the failing fixture.
    assert report["quality"]["inf2"]["passed"] is False
    assert any("answers-nonempty" in f for f in report["quality"]["g6"]["failures"])
    # Nothing after the gate was measured, and nothing pretends it was.
    assert report["monthly_delta_usd"] is None and report["payback_months"] is None
    assert all(f["instances_required"] is None for f in report["fleets"].values())
    assert not list((out / "records").glob("records-*"))
    md = (out / "report.md").read_text()
    assert md.startswith(f"# {report['campaign']}: REJECT") and "answers-nonempty" in md
    assert report["headline"]["decided"] is False and "**not decided**" in md
    assert "answers-nonempty" in (out / "report.html").read_text()
    assert "decision: REJECT" in said.out
