"""The checkov gate's logic on hand-made reports; `make checkov` (CI) runs it on the real templates."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stacks.checkov_gate import Accepted, Finding, GateInputError, failed_findings, load_accepted, main, unexplained


def _report(*failed: tuple[str, str]) -> dict[str, Any]:
    return {
        "summary": {"passed": 10, "failed": len(failed), "parsing_errors": 0},
        "results": {
            "failed_checks": [{"check_id": c, "resource": r, "check_name": f"title of {c}"} for c, r in failed]
        },
    }


def test_the_repository_accepted_file_is_valid_and_every_entry_has_a_reason() -> None:
    entries = load_accepted()
    assert entries and all(len(a.reason) >= 30 for a in entries)


def test_a_failure_without_an_entry_is_unexplained_and_a_matching_one_is_not() -> None:
    accepted = [
        Accepted("CKV_AWS_158", "AWS::Logs::LogGroup.*", "CloudWatch Logs encrypts at rest with AWS-owned keys anyway")
    ]
    findings = failed_findings(
        _report(("CKV_AWS_158", "AWS::Logs::LogGroup.FleetLogsABC"), ("CKV_AWS_20", "AWS::S3::Bucket.Results1")),
        "t.json",
    )
    left, stale = unexplained(findings, accepted)
    assert left == [Finding("t.json", "CKV_AWS_20", "AWS::S3::Bucket.Results1", "title of CKV_AWS_20")]
    assert stale == []


def test_the_check_id_must_match_not_only_the_resource() -> None:
    accepted = [
        Accepted("CKV_AWS_158", "AWS::Logs::LogGroup.*", "CloudWatch Logs encrypts at rest with AWS-owned keys anyway")
    ]
    left, stale = unexplained(failed_findings(_report(("CKV_AWS_66", "AWS::Logs::LogGroup.X")), "t"), accepted)
    assert [f.check for f in left] == ["CKV_AWS_66"] and stale == accepted


def test_parsing_errors_and_non_reports_are_refused() -> None:
    with pytest.raises(GateInputError, match="could not parse"):
        failed_findings({"summary": {"parsing_errors": 1}, "results": {}}, "t.json")
    with pytest.raises(GateInputError, match="not a checkov JSON report"):
        failed_findings({"oops": 1}, "t.json")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{}", "expected a list"),
        ("- {check: X, resource: Y}", "needs exactly the keys"),
        ("- {check: X, resource: Y, reason: because}", "must say why"),
    ],
)
def test_a_malformed_accepted_file_names_the_entry(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "accepted.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(GateInputError, match=match):
        load_accepted(path)


def test_gate_fails_on_an_unexplained_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import stacks.checkov_gate as gate

    monkeypatch.setattr(
        gate, "run_checkov", lambda t: _report(("CKV_AWS_2", "AWS::ElasticLoadBalancingV2::Listener.Other1"))
    )
    assert main([str(tmp_path / "t.json")]) == 1
    assert "UNEXPLAINED CKV_AWS_2 AWS::ElasticLoadBalancingV2::Listener.Other1" in capsys.readouterr().err
    monkeypatch.setattr(gate, "run_checkov", lambda t: _report(("CKV_AWS_158", "AWS::Logs::LogGroup.FleetLogs1")))
    assert main([str(tmp_path / "t.json")]) == 0


def test_the_gate_checks_every_template_deploy_can_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50, item 5: `make checkov` synthesized only the plain template; the example's inf2 is
    compiled first, so deploy also creates the compile phase's (stacks/compile_instance.py)."""
    import stacks.checkov_gate as gate
    from stacks.compile_boot import COMPILE_FLEETS_CONTEXT
    from tests.stacks.conftest import EXAMPLE_MANIFEST, THREE_FLEET_MANIFEST

    synthesized: list[tuple[str, dict[str, str]]] = []

    def fake_synth(manifest: Path, outdir: Path, **context: str) -> Path:
        synthesized.append((manifest.name, context))
        return outdir / "t.json"

    checked: list[Path] = []
    monkeypatch.setattr(gate, "synthesize", fake_synth)
    monkeypatch.setattr(gate, "run_checkov", lambda t: checked.append(t) or _report())
    args = ["--manifest", str(EXAMPLE_MANIFEST), "--manifest", str(THREE_FLEET_MANIFEST), "--outdir", str(tmp_path)]
    assert main(args) == 0
    assert synthesized == [
        (EXAMPLE_MANIFEST.name, {}),
        (EXAMPLE_MANIFEST.name, {COMPILE_FLEETS_CONTEXT: "inf2"}),
        (THREE_FLEET_MANIFEST.name, {}),
        (THREE_FLEET_MANIFEST.name, {COMPILE_FLEETS_CONTEXT: "inf2"}),
    ]
    assert len(set(checked)) == 4  # each in its own directory, each checked
    assert "over 4 template(s)" in capsys.readouterr().out


def _make_checkov_args() -> list[str]:
    """The arguments `make checkov` passes the gate (the Makefile's recipe, continuation lines joined)."""
    import shlex

    from tests.stacks.conftest import REPO_ROOT

    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    recipe = re.search(r"^checkov:.*\n\t(.*)$", text, re.MULTILINE)
    assert recipe, "no checkov: target in the Makefile"
    words = shlex.split(recipe.group(1))
    return words[words.index("stacks.checkov_gate") + 1 :]


def test_make_checkov_checks_the_examples_rehearsal_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 51: `deploy --rehearsal` creates its own template (-c rehearsal=1); the gate checks it."""
    import stacks.checkov_gate as gate
    from core.naming import REHEARSAL_CONTEXT

    synthesized: list[tuple[str, dict[str, str]]] = []

    def fake_synth(manifest: Path, outdir: Path, **context: str) -> Path:
        synthesized.append((manifest.name, context))
        return outdir / "t.json"

    monkeypatch.setattr(gate, "synthesize", fake_synth)
    monkeypatch.setattr(gate, "run_checkov", lambda t: _report())
    assert main([*_make_checkov_args(), "--outdir", str(tmp_path)]) == 0
    assert ("llama3-8b-inf2-vs-g6.yaml", {REHEARSAL_CONTEXT: "1"}) in synthesized
    assert len(synthesized) == 5 and "over 5 template(s)" in capsys.readouterr().out
