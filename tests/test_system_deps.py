"""tools/system-deps.sh: what `make test` and `make demo` run to install the system programs no
pinned package ships. Run for real under bash, with `id`, `sudo` and `apt-get` stubbed on PATH."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.real_parts import program

SCRIPT = ROOT / "tools" / "system-deps.sh"
BASH = shutil.which("bash") or "/bin/bash"


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)


def _env(tmp_path: Path, bin_dir: Path) -> dict[str, str]:
    """PATH: the stubs, then only the few system programs the script uses, so that a real sudo or
    apt-get on this machine can never be reached."""
    system = tmp_path / "system"
    system.mkdir(exist_ok=True)
    for name in ("mktemp", "cat", "rm", "env", "chmod", "true"):
        found = shutil.which(name)
        assert found is not None, name
        if not (system / name).exists():
            (system / name).symlink_to(found)
    return {"PATH": f"{bin_dir}:{system}", "HOME": str(tmp_path)}


def _run(
    tmp_path: Path, *programs: str, uid: int, sudo_ok: bool | None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    _stub(bin_dir, "id", f"echo {uid}")
    # apt-get records its arguments; `install` puts each named program on PATH, as the package would.
    _stub(
        bin_dir,
        "apt-get",
        f'echo "apt-get $*" >> {calls}\n'
        'if [ "$1" = install ]; then for p in "$@"; do case "$p" in -*|install) ;; '
        f'*) printf "#!/bin/sh\\n" > {bin_dir}/"$p"; chmod +x {bin_dir}/"$p";; esac; done; fi',
    )
    if sudo_ok is not None:
        _stub(
            bin_dir,
            "sudo",
            f'echo "sudo $*" >> {calls}\n'
            + ('[ "$1" = -n ] && shift; exec "$@"' if sudo_ok else 'echo "a password is required" >&2; exit 1'),
        )
    proc = subprocess.run(
        [BASH, str(SCRIPT), *programs], capture_output=True, text=True, env=_env(tmp_path, bin_dir), timeout=30
    )
    return proc, calls


@pytest.mark.shellcheck
def test_the_script_passes_shellcheck() -> None:
    lint = subprocess.run(
        [program("shellcheck"), "--severity=style", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert lint.returncode == 0, lint.stdout


def test_nothing_missing_installs_nothing(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "cat", uid=1000, sudo_ok=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == "" and not calls.exists()


def test_as_root_it_installs_only_what_is_missing(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "cat", "harness-missing-a", "harness-missing-b", uid=0, sudo_ok=None)
    assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("apt-get update")
    assert lines[1].split() == [
        "apt-get", "install", "-y", "-qq", "harness-missing-a", "harness-missing-b"
    ]  # fmt: skip
    # idempotent: both are there now, so a second run asks apt-get nothing more
    proc, calls = _run(tmp_path, "cat", "harness-missing-a", "harness-missing-b", uid=0, sudo_ok=None)
    assert proc.returncode == 0 and len(calls.read_text().splitlines()) == 2


def test_a_user_with_passwordless_sudo_installs_through_it(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, "harness-missing-a", uid=1000, sudo_ok=True)
    assert proc.returncode == 0, proc.stderr
    installs = [line for line in calls.read_text().splitlines() if line.startswith("sudo -n env")]
    assert len(installs) == 2 and "apt-get install" in installs[1]


def test_without_root_or_sudo_it_stops_and_names_the_one_command(tmp_path: Path) -> None:
    for sudo_ok in (False, None):  # sudo asks for a password, or there is no sudo
        proc, calls = _run(tmp_path, "cat", "harness-missing-a", uid=1000, sudo_ok=sudo_ok)
        assert proc.returncode == 1
        assert "Run once: sudo apt-get update && sudo apt-get install -y -qq harness-missing-a" in proc.stderr
        assert not calls.exists() or "apt-get" not in calls.read_text()


def test_a_failed_install_shows_apt_gets_own_words(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "id", "echo 0")
    _stub(
        bin_dir,
        "apt-get",
        '[ "$1" = update ] || { echo "E: Unable to locate package harness-missing-a" >&2; exit 100; }',
    )
    proc = subprocess.run(
        [BASH, str(SCRIPT), "harness-missing-a"],
        capture_output=True,
        text=True,
        env=_env(tmp_path, bin_dir),
        timeout=30,
    )
    assert proc.returncode == 1
    assert "E: Unable to locate package harness-missing-a" in proc.stderr and "apt-get could not install" in proc.stderr
