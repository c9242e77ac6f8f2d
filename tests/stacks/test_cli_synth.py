"""`npx cdk synth` through the pinned CLI works offline, without credentials."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.stacks.conftest import REPO_ROOT


@pytest.mark.timeout(900)  # the synth's own limit below, and the test's set-up
def test_npx_cdk_synth_offline(tmp_path: Path) -> None:
    cdk = REPO_ROOT / "node_modules" / ".bin" / "cdk"
    if not cdk.exists():
        pytest.fail(
            "node_modules/.bin/cdk missing: run `npm ci` in the repository root (aws-cdk is pinned in package.json)"
        )
    assert (REPO_ROOT / "Dockerfile").is_file(), "the load-generator Dockerfile at the repository root is missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # No credentials and no network: point every AWS lookup at nothing.
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
    )
    out = tmp_path / "cdk.out"
    proc = subprocess.run(
        [
            str(cdk),
            "synth",
            "--no-notices",
            "--no-version-reporting",
            "-o",
            str(out),
            "-q",
            "-c",
            "manifest=manifests/llama3-8b-inf2-vs-g6.yaml",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        # About 20 s alone; at nice 10 beside make test's other processes and a 100 M-record bench
        # (load 10-22, 2026-12-07) it passed 240 s: a limit for a hang, not a speed check.
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert "missing" not in manifest  # no context lookup left to do
    stacks = [a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]
    assert [s["properties"].get("stackName") for s in stacks] == ["llama3-8b-inf2-vs-g6-comparison"]
    assert shutil.which("node")
