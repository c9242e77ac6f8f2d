"""One root error class: every project error reaches `python -m campaign`'s main, which prints it
without a traceback and exits with the error's own code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis.errors import EmptyWindow
from campaign.backends.local.processes import ProcessFailed
from campaign.cli import main as cli
from core.errors import EXIT_BAD_INPUT, EXIT_FAILED_STEP, CampaignError
from tests.conftest import ROOT

_BUILTIN_ERRORS = {"Exception", "ValueError", "RuntimeError", "LookupError", "KeyError", "OSError"}
# Errors that never leave their module: caught where raised and turned into a record or a response.
_INTERNAL = {
    "loadgen/http1.py": "HTTPParseError",  # a malformed response becomes the request's error outcome
    "runtime/emulator/protocol.py": "ApiError",  # an HTTP error response of the emulator
    "stacks/settings.py": "SynthInputError",  # raised inside `cdk synth`, not through this CLI
    "campaign/stages/capacity.py": "Interrupted",  # raised in a search thread only once Ctrl-C is already stopping the run
}


def test_every_project_error_derives_from_the_root() -> None:
    stray = []
    for pkg in ("campaign", "analysis", "loadgen", "runtime", "stacks"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if (
                    bases & _BUILTIN_ERRORS
                    and "CampaignError" not in bases
                    and node.name != "CampaignError"
                    and _INTERNAL.get(rel) != node.name
                ):
                    stray.append(f"{rel}: {node.name}{sorted(bases)}")
    assert stray == []


@pytest.mark.parametrize(
    ("exc", "code"),
    [(EmptyWindow("no records under x"), EXIT_BAD_INPUT), (ProcessFailed("emulator-g6 exited 1"), EXIT_FAILED_STEP)],
)
def test_main_prints_a_project_error_and_exits_with_its_code(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: CampaignError,
    code: int,
) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise exc

    monkeypatch.setattr("campaign.backends.local.fleets.run_local", boom)
    # A real manifest: `local` reads it and checks its whole trace before it calls run_local.
    assert cli.main(["local", str(ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml")]) == code
    err = capsys.readouterr().err
    assert str(exc) in err and "Traceback" not in err


def test_report_on_an_empty_records_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rec").mkdir()
    manifest = ROOT / "manifests" / "llama3-8b-inf2-vs-g6.yaml"
    assert (
        cli.main(["report", str(manifest), "--records", str(tmp_path / "rec"), "--out", str(tmp_path / "out")])
        == EXIT_BAD_INPUT
    )
    assert "the campaign window is empty" in capsys.readouterr().err
    assert not (tmp_path / "out" / "report.json").exists()
