from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from core.manifest import Manifest, load_manifest
from tests.conftest import ROOT, write_manifest

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def variant(data: dict[str, Any], fleet: str, **fleet_updates: Any) -> dict[str, Any]:
    """A copy of the manifest data with one fleet's fields replaced."""
    out = copy.deepcopy(data)
    for f in out["fleets"]:
        if f["name"] == fleet:
            f.update(fleet_updates)
    return out


def load(tmp_path: Path, data: dict[str, Any], name: str = "m.yaml") -> tuple[Path, Manifest]:
    path = write_manifest(tmp_path, data, name)
    return path, load_manifest(path, check_files=False)


@contextmanager
def emulator_process(manifest_path: Path, fleet: str, *args: str) -> Iterator[str]:
    """A real emulator process on loopback; yields its base URL and checks it exits cleanly."""
    cmd = [
        sys.executable,
        "-m",
        "runtime.emulator",
        "--manifest",
        str(manifest_path),
        "--fleet",
        fleet,
        "--no-check-files",
        "--port",
        "0",
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, proc.stderr.read() if proc.stderr else "")
        yield line.split()[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, proc.stderr.read() if proc.stderr else rc


@pytest.fixture
def example(manifest_data: dict[str, Any], tmp_path: Path) -> tuple[Path, Manifest]:
    return load(tmp_path, manifest_data)
