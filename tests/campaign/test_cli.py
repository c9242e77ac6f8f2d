"""The CLI's conventions (issue 27): one exit-code table, shown in `--help`; errors raised where
they happen and printed once, by `main`."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import SourceUnavailable
from campaign.cli import main as cli
from campaign.cli import report_cmds as report_cli
from campaign.cli.help import CONSOLE_SCRIPT
from core.errors import EXIT_BAD_INPUT, EXIT_CODES, EXIT_FAILED_STEP, CampaignError
from tests.conftest import EXAMPLE_MANIFEST, ROOT, write_manifest
from tests.loadgen.test_traces import BAD_ROWS, BAD_ROWS_FOUND


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        cli.main(["--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    epilog = out[out.index("exit codes:") :]
    flat = " ".join(epilog.split())
    for code, meaning in EXIT_CODES:
        assert f" {code} {' '.join(meaning.split())}" in flat, (code, epilog)


# The modules that decide a command's exit code. Every code comes from core/errors.py's table.
_EXIT_CODE_MODULES = [
    "campaign/cli/main.py",
    "campaign/cli/report_cmds.py",
    "campaign/cli/aws_cmds.py",
    "campaign/backends/fargate/fleets.py",
    "campaign/backends/local/fleets.py",
]


_CODE_NAMES = ("code", "rc", "exit_code")


def _literal_exit_codes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        value: ast.expr | None = None
        names = [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.Return | ast.Assign) and (
            isinstance(node, ast.Return) or set(names) & set(_CODE_NAMES)
        ):
            value = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.endswith("Result")
            and node.args
        ):
            value = node.args[0] if node.func.id == "LocalResult" else node.args[3] if len(node.args) > 3 else None
        elif isinstance(node, ast.Dict) and {getattr(k, "value", None) for k in node.keys} >= {"go", "defer", "reject"}:
            found += [f"{path.name}:{node.lineno}: decision table" for v in node.values if isinstance(v, ast.Constant)][
                :1
            ]
        if isinstance(value, ast.Constant) and type(value.value) is int:
            found.append(f"{path.name}:{node.lineno}: {value.value}")
    return found


def test_no_command_spells_an_exit_code_as_a_literal() -> None:
    assert [hit for rel in _EXIT_CODE_MODULES for hit in _literal_exit_codes(ROOT / rel)] == []


def test_a_failed_source_exits_as_a_failed_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """core/errors.py: a source that fails while running exits 1, not 2 (nothing about the input is wrong)."""

    def unreachable(*_a: object, **_k: object) -> None:
        raise SourceUnavailable("Prometheus at http://127.0.0.1:9 is unreachable: connection refused")

    monkeypatch.setattr("analysis.report.build.build_report", unreachable)
    (tmp_path / "rec").mkdir()
    rc = cli.main(
        [
            "report",
            str(EXAMPLE_MANIFEST),
            "--records",
            str(tmp_path / "rec"),
            "--prometheus",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == EXIT_FAILED_STEP == SourceUnavailable.exit_code
    assert "report: Prometheus at http://127.0.0.1:9 is unreachable" in capsys.readouterr().err


def _report_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    report_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", str(EXAMPLE_MANIFEST), *extra, "--out", str(tmp_path / "out")])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--records", "{tmp}", "--quality", "{tmp}/missing.json"], "--quality {tmp}/missing.json: "),
        (["--records", "{tmp}", "--instances", "inf2"], "--instances takes FLEET=N pairs"),
        (["--records", "{tmp}", "--capacity", "{tmp}"], "--capacity {tmp}: no step directories"),
        ([], "give --records DIR, --run-dir DIR or --run-id RUN_ID"),
        (["--run-id", "latest"], "--run-id: run id 'latest' is not of the form"),
    ],
)
def test_report_raises_bad_input_for_main_to_print(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """cmd_report raises; it neither prints nor returns 2 itself. main prints it once and exits 2."""
    argv = [a.format(tmp=tmp_path) for a in extra]
    with pytest.raises(CampaignError) as ei:
        report_cli.cmd_report(_report_args(tmp_path, *argv))
    assert ei.value.exit_code == EXIT_BAD_INPUT and str(ei.value).startswith(message.format(tmp=tmp_path))
    assert capsys.readouterr().err == ""
    assert cli.main(["report", str(EXAMPLE_MANIFEST), *argv, "--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("report: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "out" / "report.json").exists()


def _parsers(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """The parser and every subparser under it, each with its command path."""
    out = [(path or parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}".strip())
    return out


def test_every_argument_of_every_command_has_help() -> None:
    parser = cli.build_parser()
    parsers = _parsers(parser)
    assert {p for p, _ in parsers} >= {"validate", "plan", "local", "report", "render", "deploy", "run", "teardown"}
    missing = []
    for path, p in parsers:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [
                    f"{path} {c.dest}" for c in action._choices_actions if not (c.help or "").strip()
                ]  # each command's one-liner
            elif not (action.help or "").strip() or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


HEAVY = ("duckdb", "boto3", "locust", "aws_cdk")  # each takes a noticeable part of a second to import


@pytest.mark.parametrize("argv", [["--help"], ["report", "--help"], ["deploy", "--help"], ["local", "--help"]])
def test_help_imports_none_of_the_heavy_packages(argv: list[str]) -> None:
    """`python -m campaign --help` as the user runs it; -X importtime lists every module it loaded."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "campaign", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: "), r.stdout + r.stderr
    loaded = {
        line.rsplit("|", 1)[1].strip()
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "campaign.cli.main" in loaded  # the listing is there to be read
    assert sorted(m for m in loaded if m.split(".")[0] in HEAVY) == []


def _bad_trace_manifest(tmp_path: Path, manifest_data: dict[str, Any]) -> tuple[Path, Path]:
    """A valid manifest whose trace (beside it) has five bad rows, lines 3-7 (tests/loadgen/test_traces.py)."""
    trace = tmp_path / "bad.csv"
    trace.write_text(BAD_ROWS)
    manifest_data["workload"]["trace"]["path"] = "bad.csv"  # relative to the manifest
    del manifest_data["workload"]["trace"]["sha256"]
    return write_manifest(tmp_path, manifest_data), trace.resolve()


def _every_bad_row_listed(stderr: str, trace: Path) -> None:
    lines = stderr.splitlines()
    assert [f"{trace}:{line}: {field}: {reason}" for line, field, reason in BAD_ROWS_FOUND] == [
        ln for ln in lines if ln.startswith(f"{trace}:")
    ]


def test_validate_from_outside_the_repository_lists_every_bad_trace_row(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """The installed command (`make install` puts it in .venv), run from a directory that is not the checkout."""
    script = Path(sys.executable).parent / CONSOLE_SCRIPT
    assert script.is_file(), (
        f"no {script}: `make install` installs the project (editable) into .venv, its console script with it"
    )
    manifest, trace = _bad_trace_manifest(tmp_path, manifest_data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [str(script), "validate", str(manifest)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == EXIT_BAD_INPUT and r.stdout == "", r.stdout + r.stderr
    assert f"invalid trace {trace}: 5 problem(s) on 5 line(s):" in r.stderr and "Traceback" not in r.stderr
    _every_bad_row_listed(r.stderr, trace)


def test_local_stops_on_a_bad_trace_row_before_anything_starts(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def started(*_a: object, **_k: object) -> None:
        raise AssertionError("run_local started the campaign on a trace with bad rows")

    monkeypatch.setattr("campaign.backends.local.fleets.run_local", started)
    manifest, trace = _bad_trace_manifest(tmp_path, manifest_data)
    assert cli.main(["local", str(manifest), "--out", str(tmp_path / "run")]) == EXIT_BAD_INPUT
    _every_bad_row_listed(capsys.readouterr().err, trace)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["deploy", "run"])
def test_deploy_and_run_stop_on_a_bad_trace_row_before_any_aws_call(
    tmp_path: Path,
    manifest_data: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    def no_aws(*_a: object, **_k: object) -> None:
        raise AssertionError(f"{command} reached AWS with a trace with bad rows")

    monkeypatch.setattr("campaign.cli.aws_cmds.aws_session", no_aws)
    monkeypatch.setattr(
        "campaign.aws.cloud_checks.cloud_issues", lambda *_a, **_k: []
    )  # the example's illustrative hashes aside
    manifest, trace = _bad_trace_manifest(tmp_path, manifest_data)
    assert cli.main([command, str(manifest)]) == EXIT_BAD_INPUT
    _every_bad_row_listed(capsys.readouterr().err, trace)


def test_run_resume_refuses_a_malformed_run_id_before_any_aws_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], example_manifest_path: Path
) -> None:
    def no_aws(*_a: object, **_k: object) -> None:
        raise AssertionError("run --resume reached AWS with a malformed run id")

    monkeypatch.setattr("campaign.cli.aws_cmds.aws_session", no_aws)
    assert cli.main(["run", str(example_manifest_path), "--resume", "not-a-run"]) == EXIT_BAD_INPUT
    assert "--resume" in capsys.readouterr().err


def test_attach_is_refused_beside_detach_or_resume_and_a_bad_run_id_before_any_aws_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for extra in (["--detach"], ["--resume", "20261205T230000Z-abc123"]):
        rc = cli.main(["run", str(EXAMPLE_MANIFEST), "--attach", "20261205T230000Z-abc123", *extra])
        assert rc == EXIT_BAD_INPUT
        assert "--attach follows a run already started" in capsys.readouterr().err
    assert cli.main(["run", str(EXAMPLE_MANIFEST), "--attach", "yesterday"]) == EXIT_BAD_INPUT
    assert "--attach: run id 'yesterday' is not of the form" in capsys.readouterr().err


def test_conduct_outside_its_task_names_what_its_definition_sets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from core import cloud_contract as cc

    monkeypatch.delenv(cc.ENV_STACK_NAME, raising=False)
    assert cli.main(["conduct", "20261205T230000Z-abc123"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert cc.ENV_STACK_NAME in err and "run --detach" in err
