"""The load-generator image's entry point runs Locust in its own process (loadgen/task_entry.py),
so gevent's monkey-patching there must still precede every socket and SSL import, as when
`python -m locust` imports Locust first."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_importing_the_entry_point_loads_no_ssl_before_locust_patches() -> None:
    """The entry's module-level imports run before its __main__ block imports Locust; were ssl among
    them, gevent would patch it late (its MonkeyPatchWarning) and boto3's connections could misbehave."""
    done = _python("import sys, loadgen.task_entry; print(sorted({'ssl', 'urllib3', 'botocore'} & set(sys.modules)))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_images_default_command_prints_locusts_help_and_exits_0() -> None:
    """The image's CMD (`--help`): Locust's own usage, from Locust's main in this process."""
    done = subprocess.run(
        [sys.executable, "-W", "error::Warning", "-m", "loadgen.task_entry", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: locust"), done.stdout[:500]
