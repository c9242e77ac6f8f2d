"""The repository never tracks a virtual environment or node_modules, not even as a symlink:
checking out such a commit in a checkout whose .venv is a real directory replaces it."""

from __future__ import annotations

import subprocess

from tests.conftest import ROOT


def test_no_environment_is_tracked() -> None:
    out = subprocess.run(
        ["git", "ls-files", "--", ".venv", ".venv-*", "node_modules"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:  # not a git checkout (an exported tarball): nothing to check
        return
    assert out.stdout.split() == [], f"tracked environment paths: {out.stdout.split()}"
