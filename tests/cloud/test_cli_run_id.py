"""`report` and `teardown` name the problem when the records of a cloud run cannot be found."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaign.cli import main as cli
from core.errors import EXIT_BAD_INPUT
from tests.conftest import EXAMPLE_MANIFEST


def test_report_needs_records_or_a_run_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(EXAMPLE_MANIFEST), "--out", str(tmp_path / "out")]) == 2
    assert "give --records DIR, --run-dir DIR or --run-id RUN_ID" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("run_id", ["latest", "2026-12-03", "../other-run"])
def test_a_malformed_run_id_is_refused_before_any_aws_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_id: str
) -> None:
    assert cli.main(["report", str(EXAMPLE_MANIFEST), "--run-id", run_id, "--out", str(tmp_path / "out")]) == 2
    assert f"run id {run_id!r} is not of the form" in capsys.readouterr().err
    # Bad input, as for `report` (it exited 1 here before the exit-code table of issue 27).
    assert (
        cli.main(["teardown", str(EXAMPLE_MANIFEST), "--run-id", run_id, "--out", str(tmp_path / "td")])
        == EXIT_BAD_INPUT
    )
    err = capsys.readouterr().err
    assert f"run id {run_id!r} is not of the form" in err and "nothing was destroyed" in err
