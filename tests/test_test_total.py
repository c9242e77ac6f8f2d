"""tools/test-total.sh: `make test`'s closing line, the counts of its pytest processes added up."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.real_parts import program

SCRIPT = ROOT / "tools" / "test-total.sh"


def _total(tmp_path: Path, *summaries: str) -> subprocess.CompletedProcess[str]:
    logs = []
    for i, text in enumerate(summaries):
        log = tmp_path / f"log{i}"
        log.write_text(text, encoding="utf-8")
        logs.append(str(log))
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run([bash, str(SCRIPT), *logs], capture_output=True, text=True, timeout=30)


@pytest.mark.shellcheck
def test_the_script_passes_shellcheck() -> None:
    lint = subprocess.run([program("shellcheck"), "--severity=style", str(SCRIPT)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_the_counts_of_every_process_add_up_errors_counting_as_failures(tmp_path: Path) -> None:
    out = _total(
        tmp_path,
        "....\nreal parts: shellcheck 4 passed\n905 passed in 678.57s (0:11:18)\n",
        "..F.E\n1 failed, 136 passed, 1 error in 641.28s (0:10:41)\n",
        "13 passed, 2 skipped in 100.10s (0:01:40)\n",
    )
    assert out.returncode == 0 and out.stdout == "total: 1054 passed, 2 failed, 2 skipped\n"


def test_a_process_without_its_summary_counts_as_a_failure(tmp_path: Path) -> None:
    out = _total(tmp_path, "905 passed in 678.57s (0:11:18)\n", "Killed\n")
    assert out.stdout == "total: 905 passed, 1 failed\n" and "no pytest summary line" in out.stderr
