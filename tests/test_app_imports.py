"""app.py (the CDK entry point `cdk synth` runs) sits outside the import-linter contract, which
takes packages only: its imports are checked here. It may use the stacks, core, aws-cdk-lib and
constructs, never the load generator (gevent's monkey-patching deadlocks jsii), the emulator,
the analysis or the CLI."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

ALLOWED = {"stacks", "core", "aws_cdk", "constructs", "cdk_nag"}
FORBIDDEN = {"campaign", "loadgen", "runtime", "analysis", "bench", "gevent", "locust"}


def top_imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_cdk_app_imports_only_stacks_core_and_the_cdk() -> None:
    got = top_imports((ROOT / "app.py").read_text(encoding="utf-8"))
    assert not got & FORBIDDEN, got & FORBIDDEN
    import sys

    third_party = {n for n in got if n not in sys.stdlib_module_names}
    assert third_party <= ALLOWED, third_party - ALLOWED


def test_the_check_sees_a_forbidden_import() -> None:
    assert top_imports("from loadgen.launch import start_fleet\nimport gevent.monkey\n") == {"loadgen", "gevent"}
