"""bench/ holds benchmarks that print figures and nothing else imports it: no test imports `bench`
(a test of a benchmark runs it as `python -m bench.x` and reads its output), and no module of the
repository edits sys.path (every package imports from the checkout or the installed copy, and
every bench runs as a module)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

SKIPPED = {".venv", ".venv-engine", ".venv-checkov", "node_modules", "cdk.out", ".cache", "runs", "build"}


def _python_files(under: Path) -> list[Path]:
    return [p for p in sorted(under.rglob("*.py")) if not SKIPPED & set(p.relative_to(ROOT).parts)]


def _imported_modules(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at any depth (functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _edits_sys_path(path: Path) -> list[int]:
    """Lines that change sys.path: sys.path.insert/append/extend/remove or sys.path = ..."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, ast.Assign | ast.AugAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if isinstance(target, ast.Attribute) and target.attr == "path" and ast.unparse(target.value) == "sys":
            lines.append(node.lineno)
    return sorted(lines)


def test_no_test_imports_bench() -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _imported_modules(p) if m.split(".")[0] == "bench")
        for p in _python_files(ROOT / "tests")
    }
    assert not {k: v for k, v in offenders.items() if v}, "tests run a bench as a subprocess instead"


def test_no_module_of_the_repository_edits_sys_path() -> None:
    edits = {str(p.relative_to(ROOT)): _edits_sys_path(p) for p in _python_files(ROOT)}
    assert not {k: v for k, v in edits.items() if v}


def test_the_sys_path_check_sees_an_edit(tmp_path: Path) -> None:
    """The check itself: it finds each way of editing sys.path, and leaves reading it alone."""
    p = tmp_path / "x.py"
    p.write_text(
        "import sys\nsys.path.insert(0, 'a')\nsys.path.append('b')\nsys.path = []\nsys.path += ['c']\nprint(sys.path)\n"
    )
    assert _edits_sys_path(p) == [2, 3, 4, 5]
