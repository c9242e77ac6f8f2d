"""Each fleet's boot script, rendered exactly as the launch template's user data, checked and run.

`bash -n` and shellcheck first; then the script runs for real under bash in a sandbox: every
host command it calls (docker, aws, nvidia-smi, modinfo, mount, mkfs.ext4, curl, gpg, dpkg, ...)
is a stub on PATH that logs its argv, and the host paths it writes (/etc, /opt, /var/log) are
moved under the sandbox. The test then reads the log: the serving `docker run` line (devices,
capabilities, flags, image by digest), the cache mount, the hub token's path and the health wait.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from core.images import CachedPull
from core.manifest import Manifest, load_manifest
from core.serving import ServingDefinition, definition_digest, definition_for, render_docker_run
from stacks.fleet_boot import (
    APT_LOCK_WAIT_S,
    APT_RETRY_EVERY_S,
    CLOUDWATCH_AGENT_KEY_FINGERPRINT,
    CLOUDWATCH_AGENT_VERSION,
    CONTAINERD_VERSION,
    DOCKER_KEY_FINGERPRINT,
    DOCKER_PIN_UBUNTU,
    DOCKER_VERSION,
    boot_definition,
    boot_script,
)
from tests.conftest import EXAMPLE_MANIFEST, ROOT
from tests.real_parts import program

pytestmark = pytest.mark.boot_script

THREE_FLEETS = ROOT / "manifests" / "llama3-8b-three-fleets.yaml"
TOKEN_ARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:harness/hf-token-AbCdEf"
FAKE_TOKEN = "hf_sandboxtokenvalue"
S3_WEIGHTS = "s3://weights-bucket/llama"
COMPILED_URI = "s3://results-bucket/compiled"
CACHE_REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com"  # the stack's Docker Hub pull-through cache
HOST_PATH = re.compile(r"(^|[\s(>'\":=])/(etc|opt|var/log)/", re.MULTILINE)
SEP = "\x1f"

# One stub for every host command; behaviour by name. Each call appends NAME<US>arg<US>arg... to $STUB_LOG.
STUB = r"""#!/bin/bash
name="$(basename "$0")"
# One write per call: the stubs of a pipeline (aws ... | docker login) log side by side, and
# several printf calls each would interleave their lines (seen under load: a lost `docker login`).
line="$name"; for a in "$@"; do line+=$'\x1f'"$a"; done; printf '%s\n' "$line" >> "$STUB_LOG"
case "$name" in
  lsblk) case "$*" in *PKNAME*) echo nvme0n1;; *) printf '/dev/nvme0n1 Amazon Elastic Block Store\n/dev/nvme1n1 Amazon Elastic Block Store\n';; esac;;
  findmnt) echo /dev/nvme0n1p1;;
  blkid|mountpoint) exit 1;;
  modinfo) echo "$HOST_NEURON_DRIVER";;
  nvidia-smi) echo "$HOST_NVIDIA_DRIVER";;
  gpg) case "$*" in *--fingerprint*) echo "fpr:::::::::$CW_FPR:"; echo "fpr:::::::::$DOCKER_FPR:";; esac;;
  apt-get) case "$*" in
    *docker-ce=*) cp "$0" "$STUB_BIN/docker";;  # the install puts docker on PATH
    *agent.deb*) ctl="$SANDBOX/opt/aws/amazon-cloudwatch-agent/bin"; mkdir -p "$ctl"; cp "$0" "$ctl/amazon-cloudwatch-agent-ctl";;
    *update*)  # another apt (apt-daily) holds the lists lock for the first $APT_LISTS_LOCKED tries
      n=$(( $(cat "$SANDBOX/apt_updates" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$SANDBOX/apt_updates"
      if [ "$n" -le "${APT_LISTS_LOCKED:-0}" ]; then echo "E: Could not get lock /var/lib/apt/lists/lock" >&2; exit 100; fi;;
    esac;;
  aws) [ "${FAIL_S3_UPLOAD:-0}" = 1 ] && [ "$1 $2" = "s3 cp" ] && exit 1
    [ "${FAIL_TERMINATE:-0}" = 1 ] && [ "$2" = terminate-instance-in-auto-scaling-group ] && exit 254
    case " $* " in *" - "*) cat >/dev/null;; esac  # reads stdin as the CLI does: the writer gets no SIGPIPE
    case "$*" in *secretsmanager*) echo "$FAKE_TOKEN";; *ssm\ get-parameter*) echo '{}';; *get-login-password*) echo pw;;
    *list-objects-v2*) echo None;; esac;;  # an empty listing, as --output text prints it
  docker) echo "docker-env${STUB_SEP}HF_TOKEN=${HF_TOKEN:-<unset>}" >> "$STUB_LOG"; [ "$1" = login ] && cat >/dev/null
    # a pull of a reference containing $DOCKER_PULL_FAILS fails (the cache does not serve it)
    if [ "$1" = pull ] && [ -n "${DOCKER_PULL_FAILS:-}" ]; then case "$2" in *"$DOCKER_PULL_FAILS"*) exit 1;; esac; fi
    # a pull that hangs for $DOCKER_PULL_HANGS s (the real sleep: the `sleep` stub returns at once)
    if [ "$1" = pull ] && [ -n "${DOCKER_PULL_HANGS:-}" ]; then exec /bin/sleep "$DOCKER_PULL_HANGS"; fi; true;;
  sha256sum) cat >/dev/null;;
  curl)
    case "$*" in  # IMDSv2: a session token from a PUT, then the instance id with it
      *169.254.169.254/latest/api/token*) echo imds-session-token; exit 0;;
      *169.254.169.254/latest/meta-data/instance-id*) echo i-0c0a1e5ce0ffee123; exit 0;;
    esac
    out=""; prev=""
    for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
    if [ -n "$out" ] && [ "$out" != /dev/null ]; then echo stub > "$out"; exit 0; fi
    n=$(( $(cat "$SANDBOX/health_calls" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$SANDBOX/health_calls"
    [ "$n" -ge 3 ];;  # the server answers on the third probe
esac
"""
STUBBED = (
    "docker",
    "aws",
    "nvidia-smi",
    "neuron-ls",
    "modinfo",
    "mount",
    "mountpoint",
    "mkfs.ext4",
    "blkid",
    "lsblk",
    "findmnt",
    "curl",
    "gpg",
    "dpkg",
    "systemctl",
    "sha256sum",
    "sleep",
    "apt-get",
)
OS_RELEASE = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\nID=ubuntu\n'


def _boot_definition(
    manifest: Manifest, fleet: str, weights_s3_uri: str | None = None
) -> tuple[ServingDefinition, CachedPull | None]:
    """What stacks/fleet.py renders for the fleet, the Docker Hub cache at CACHE_REGISTRY."""
    return boot_definition(
        manifest,
        manifest.fleet(fleet),
        weights_s3_uri=weights_s3_uri,
        cache_registry=CACHE_REGISTRY,
        region=manifest.costs.region,
    )


def _fleet_scripts(manifest: Manifest, weights_s3_uri: str | None = None) -> dict[str, str]:
    """user data of every fleet, with the arguments stacks/fleet.py passes."""
    from stacks.accelerator_telemetry import neuron_namespace

    out = {}
    for f in manifest.fleets:
        defn, cached = _boot_definition(manifest, f.name, weights_s3_uri)
        neuron = defn.host.vendor == "aws-neuron"
        lines = boot_script(
            defn,
            campaign=manifest.campaign,
            serving_digest=definition_digest(definition_for(manifest, f, weights_s3_uri=weights_s3_uri)),
            cached=cached,
            weights_s3_uri=weights_s3_uri,
            driver_version=f.serving.driver_version,
            region=manifest.costs.region,
            agent_param=f"/harness/{manifest.campaign}/{f.name}/cloudwatch-agent",
            neuron_monitor_param=f"/harness/{manifest.campaign}/{f.name}/neuron-monitor" if neuron else None,
            neuron_namespace=neuron_namespace(manifest.campaign, f.name),
            compiled_uri=COMPILED_URI,  # as stacks/fleet.py passes it: the results bucket's compiled/
        )
        out[f.name] = "#!/bin/bash\n" + "\n".join(lines) + "\n"  # ec2.UserData.for_linux() adds the same shebang
    return out


def _gated(manifest: Manifest) -> Manifest:
    return manifest.model_copy(update={"model": manifest.model.model_copy(update={"hub_token_secret_arn": TOKEN_ARN})})


@pytest.fixture(scope="module")
def example() -> Manifest:
    return load_manifest(EXAMPLE_MANIFEST, check_files=False)


def _all_scripts(example: Manifest) -> dict[str, str]:
    scripts = {f"example/{k}": v for k, v in _fleet_scripts(example).items()}
    scripts |= {f"three/{k}": v for k, v in _fleet_scripts(load_manifest(THREE_FLEETS, check_files=False)).items()}
    scripts |= {f"gated/{k}": v for k, v in _fleet_scripts(_gated(example)).items()}
    scripts |= {f"s3/{k}": v for k, v in _fleet_scripts(example, S3_WEIGHTS).items()}
    return scripts


@pytest.mark.shellcheck
def test_every_boot_script_parses_and_passes_shellcheck(example: Manifest, tmp_path: Path) -> None:
    shellcheck = program("shellcheck")
    for name, text in _all_scripts(example).items():
        path = tmp_path / (name.replace("/", "-") + ".sh")
        path.write_text(text, encoding="utf-8")
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{name}: {syntax.stderr}"
        lint = subprocess.run(
            [shellcheck, "--shell=bash", "--severity=style", str(path)], capture_output=True, text=True
        )
        assert lint.returncode == 0, f"{name}:\n{lint.stdout}"


@pytest.mark.shellcheck
def test_shellcheck_gate_is_live(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\nrm -rf $DIR/cache\n", encoding="utf-8")  # unquoted expansion: SC2086
    assert subprocess.run([program("shellcheck"), "--shell=bash", str(bad)], capture_output=True).returncode != 0


def _run(
    script: str,
    tmp_path: Path,
    *,
    neuron_driver: str = "2.26.5.0",
    nvidia_driver: str = "595.71.05",
    docker_on_host: bool = True,
    apt_lists_locked: int = 0,
    docker_pull_fails: str = "",
    env_extra: dict[str, str] | None = None,
    stub: str = STUB,
    stubbed: tuple[str, ...] = STUBBED,
) -> tuple[int, list[list[str]], str]:
    """`stub` and `stubbed`: the host commands of another host (tests/boot/test_rehearsal_boot.py)."""
    sandbox = tmp_path / "root"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for d in ("etc/systemd/system", "etc/apt/sources.list.d", "opt", "var/log"):
        (sandbox / d).mkdir(parents=True, exist_ok=True)
    (sandbox / "etc" / "fstab").write_text("", encoding="utf-8")
    (sandbox / "etc" / "os-release").write_text(OS_RELEASE, encoding="utf-8")
    for name in stubbed:
        if name == "docker" and not docker_on_host:
            continue
        (bin_dir / name).write_text(stub, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    # Host files the script writes land in the sandbox: every absolute /etc, /opt, /var/log path is
    # prefixed (the stubs' log is un-prefixed again, so assertions read the real paths).
    script = HOST_PATH.sub(lambda mt: f"{mt.group(1)}{sandbox}/{mt.group(2)}/", script)
    path = tmp_path / "boot.sh"
    path.write_text(script, encoding="utf-8")
    log = tmp_path / "stub.log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STUB_LOG": str(log),
        "STUB_SEP": SEP,
        "SANDBOX": str(sandbox),
        "HOST_NEURON_DRIVER": neuron_driver,
        "HOST_NVIDIA_DRIVER": nvidia_driver,
        "FAKE_TOKEN": FAKE_TOKEN,
        "CW_FPR": CLOUDWATCH_AGENT_KEY_FINGERPRINT,
        "DOCKER_FPR": DOCKER_KEY_FINGERPRINT,
        "HOME": str(tmp_path),
        "STUB_BIN": str(bin_dir),
        "APT_LISTS_LOCKED": str(apt_lists_locked),
        "DOCKER_PULL_FAILS": docker_pull_fails,
        **(env_extra or {}),
    }
    proc = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    calls = (
        [line.replace(str(sandbox), "").split(SEP) for line in log.read_text(encoding="utf-8").splitlines()]
        if log.exists()
        else []
    )
    return proc.returncode, calls, proc.stdout + proc.stderr


def _docker_runs(calls: list[list[str]]) -> list[list[str]]:
    return [c[1:] for c in calls if c[0] == "docker" and c[1] == "run"]


@pytest.mark.parametrize("fleet", ["inf2", "g6"])
def test_boot_script_runs_end_to_end_in_a_sandbox(example: Manifest, fleet: str, tmp_path: Path) -> None:
    rc, calls, output = _run(_fleet_scripts(example)[fleet], tmp_path)
    assert rc == 0, output
    names = [c[0] for c in calls]
    f = example.fleet(fleet)
    defn, _ = _boot_definition(example, fleet)
    # Cache volume: the non-root EBS disk is formatted once and mounted at /opt/cache, before any docker call.
    assert ["mkfs.ext4", "-q", "-L", "harness-cache", "/dev/nvme1n1"] in calls
    assert ["mount", "/opt/cache"] in calls
    assert names.index("mount") < names.index("docker")
    # CloudWatch agent: the pinned release, its signature verified before it is installed.
    downloads = [c for c in calls if c[0] == "curl" and "-o" in c]
    assert any(
        c[-1].endswith(f"/ubuntu/amd64/{CLOUDWATCH_AGENT_VERSION}/amazon-cloudwatch-agent.deb") for c in downloads
    )
    assert not any("/latest/" in arg for c in downloads for arg in c)
    verify = next(i for i, c in enumerate(calls) if c[0] == "gpg" and "--verify" in c)
    install = next(i for i, c in enumerate(calls) if c[0] == "apt-get" and c[-1].endswith("/agent.deb"))
    assert verify < install
    deb_download = next(c for c in downloads if c[-1].endswith(".deb"))
    workdir = Path(deb_download[deb_download.index("-o") + 1]).parent
    assert workdir.name.startswith("tmp")
    assert not workdir.exists()  # the download directory (package, signature, keyring) is removed after the install
    # Driver check before the server starts.
    probe = "modinfo" if fleet == "inf2" else "nvidia-smi"
    assert names.index(probe) < names.index("docker")
    # The serving container: exactly the line core.serving renders, image by digest.
    serving = _docker_runs(calls)[-1]
    assert serving == shlex.split(render_docker_run(defn))[1:]
    # The manifest's image by its digest (through the Docker Hub cache for g6).
    assert defn.image in serving and defn.image.endswith("@" + f.serving.image.rsplit("@", 1)[1])
    assert "/opt/cache:/opt/cache" in serving
    if fleet == "inf2":
        assert "--device=/dev/neuron0" in serving
        assert serving[serving.index("--cap-add") + 1] == "SYS_ADMIN" and "IPC_LOCK" in serving
        assert serving[serving.index("--num-gpu-blocks-override") + 1] == str(f.max_concurrency)
    else:
        assert serving[serving.index("--gpus") + 1] == "all" and "--cap-add" not in serving
    # Health wait: probes the server's health path until it answers, then logs the time to ready.
    health = [c for c in calls if c[0] == "curl" and c[-1] == f"http://127.0.0.1:{defn.port}{defn.health_path}"]
    assert len(health) == 3
    assert "server healthy after" in output
    assert not [c for c in calls if c[0] == "aws" and "secretsmanager" in c]  # no token named, none read
    # Every aws call names its region: the stack's, or for ECR the registry's.
    for c in (c for c in calls if c[0] == "aws"):
        assert "--region" in c, c
        assert c[1] == "ecr" or c[c.index("--region") + 1] == example.costs.region, c
    # Compiled artifacts (tests/boot/test_compiled_share.py runs the logic): Neuron only. The stub
    # bucket lists no published set, so this instance compiles, and publishes once it serves.
    uploads = [i for i, c in enumerate(calls) if c[:3] == ["aws", "s3", "cp"] and c[-1].startswith("s3://")]
    if fleet == "inf2":
        assert "no complete set in s3://results-bucket/compiled/" in output and "compiled artifacts published" in output
        assert uploads and min(uploads) > calls.index(["docker", *serving])  # after the server started
        assert min(uploads) > max(i for i, c in enumerate(calls) if c[0] == "curl" and c[-1] == health[0][-1])
    else:
        assert not uploads and "compiled artifacts" not in output


def test_hub_token_is_read_at_boot_passed_by_name_and_unset(example: Manifest, tmp_path: Path) -> None:
    rc, calls, output = _run(_fleet_scripts(_gated(example))["g6"], tmp_path)
    assert rc == 0, output
    read = [c for c in calls if c[0] == "aws" and "secretsmanager" in c]
    assert read == [
        [
            "aws",
            "secretsmanager",
            "get-secret-value",
            "--region",
            "us-west-2",
            "--secret-id",
            TOKEN_ARN,
            "--query",
            "SecretString",
            "--output",
            "text",
        ]
    ]
    envs = [c[1] for c in calls if c[0] == "docker-env"]
    runs = [c for c in calls if c[0] == "docker" and c[1] in ("run", "pull")]
    download = next(i for i, c in enumerate(runs) if "--rm" in c)
    # Only the download container gets the token, by name (-e HF_TOKEN), never as a value on a command line.
    assert "HF_TOKEN" in runs[download] and not any(
        FAKE_TOKEN in arg for c in calls if c[0] != "docker-env" for arg in c
    )
    docker_calls = [i for i, c in enumerate(calls) if c[0] == "docker"]
    env_after = {i: envs[n] for n, i in enumerate(docker_calls)}
    download_idx = next(i for i in docker_calls if calls[i][1] == "run" and "--rm" in calls[i])
    assert env_after[download_idx] == f"HF_TOKEN={FAKE_TOKEN}"
    serving_idx = max(i for i in docker_calls if calls[i][1] == "run")
    assert env_after[serving_idx] == "HF_TOKEN=<unset>"  # unset before the long-running server starts
    assert FAKE_TOKEN not in json.dumps(calls[serving_idx])


@pytest.mark.parametrize(
    ("fleet", "kw"), [("inf2", {"neuron_driver": "2.30.2.0"}), ("g6", {"nvidia_driver": "595.58.03"})]
)
def test_boot_refuses_a_host_driver_other_than_the_pinned_one(
    example: Manifest, fleet: str, kw: dict[str, str], tmp_path: Path
) -> None:
    rc, calls, output = _run(_fleet_scripts(example)[fleet], tmp_path, **kw)
    assert rc == 1
    host, pinned = next(iter(kw.values())), example.fleet(fleet).serving.driver_version
    assert f"host driver {host} is not the pinned {pinned} " in output  # both versions, named
    assert _docker_runs(calls) == []  # the server never starts on the wrong driver


def test_boot_fails_when_the_server_never_gets_healthy(
    example: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stacks.fleet_boot

    monkeypatch.setattr(stacks.fleet_boot, "health_grace_s", lambda vendor: 0)
    rc, _, output = _run(_fleet_scripts(example)["g6"], tmp_path)
    assert rc == 1 and re.search(r"server not healthy \d+ s into the boot \(the health-check grace is 0 s", output)


@pytest.mark.parametrize("fleet", ["inf2", "g6"])
def test_the_boot_waits_for_the_server_as_long_as_the_asg_health_grace(
    example: Manifest, fleet: str, tmp_path: Path
) -> None:
    # One source (core.cloud_contract.HEALTH_GRACE_MIN): the ASG replaces an instance that is not
    # healthy once its grace is over (stacks/fleet.py), so the script gives up then, counted from its
    # own start, not after a fixed 7200 s. $SECONDS set at the top stands for a boot that got that far.
    from core.cloud_contract import HEALTH_GRACE_MIN

    grace = HEALTH_GRACE_MIN[definition_for(example, example.fleet(fleet)).host.vendor] * 60
    script = _fleet_scripts(example)[fleet]
    late = script.replace("#!/bin/bash\n", f"#!/bin/bash\nSECONDS={grace}\n", 1)
    rc, calls, output = _run(late, tmp_path / "late")
    assert rc == 1 and f"the health-check grace is {grace} s" in output and "server healthy" not in output
    assert _docker_runs(calls)  # the server was started; it just did not answer in time
    early = script.replace("#!/bin/bash\n", f"#!/bin/bash\nSECONDS={grace - 30}\n", 1)
    rc, _, output = _run(early, tmp_path / "early")
    assert rc == 0 and "server healthy after" in output  # within the grace: it keeps probing until the server answers


def test_sandbox_rewrite_leaves_no_host_path(example: Manifest, tmp_path: Path) -> None:
    # Guard for the harness itself: running as root must never touch the real /etc or /opt.
    before = {p: os.stat(p).st_mtime for p in ("/etc/fstab",) if os.path.exists(p)}
    _run(_fleet_scripts(example)["inf2"], tmp_path)
    assert {p: os.stat(p).st_mtime for p in before} == before


# --- Docker on the host (issue 25, item 5): installed, pinned, when the AMI has none -------------


def _docker_apt_calls(calls: list[list[str]]) -> list[list[str]]:
    """apt-get calls of the Docker install (the CloudWatch agent's own install is not one)."""
    return [c for c in calls if c[0] == "apt-get" and not c[-1].endswith("/agent.deb")]


def test_boot_installs_the_pinned_docker_when_the_host_has_none(example: Manifest, tmp_path: Path) -> None:
    if shutil.which("docker", path="/usr/bin:/bin"):
        pytest.skip("this machine has docker in /usr/bin or /bin, which the sandbox's PATH keeps")
    rc, calls, output = _run(_fleet_scripts(example)["inf2"], tmp_path, docker_on_host=False)
    assert rc == 0, output
    names = [c[0] for c in calls]
    pkg = f"5:{DOCKER_VERSION}-1~ubuntu.24.04~noble"  # from the sandbox's /etc/os-release
    install = next(c for c in calls if c[0] == "apt-get" and "install" in c and c[-3].startswith("docker-ce="))
    assert install[-3:] == [
        f"docker-ce={pkg}",
        f"docker-ce-cli={pkg}",
        f"containerd.io={CONTAINERD_VERSION}-1~ubuntu.24.04~noble",
    ]
    # Docker's repository key is fetched and its fingerprint checked before apt reads the repository.
    key = next(
        i for i, c in enumerate(calls) if c[0] == "curl" and c[-1] == "https://download.docker.com/linux/ubuntu/gpg"
    )
    check = next(i for i, c in enumerate(calls) if c[0] == "gpg" and "--show-keys" in c)
    update = next(i for i, c in enumerate(calls) if c[0] == "apt-get" and "update" in c)
    assert key < check < update < calls.index(install)
    sources = (tmp_path / "root" / "etc" / "apt" / "sources.list.d" / "docker.list").read_text(encoding="utf-8")
    assert (
        sources.strip()
        == "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu noble stable".replace(
            "/etc/", f"{tmp_path / 'root'}/etc/"
        )
    )
    assert ["systemctl", "enable", "--now", "docker"] in calls
    # ... and then the installed docker pulls and runs the server.
    assert calls.index(install) < names.index("docker")
    assert _docker_runs(calls)[-1] == shlex.split(render_docker_run(_boot_definition(example, "inf2")[0]))[1:]


def test_every_dlami_and_the_docker_pin_name_one_ubuntu_release() -> None:
    """The Docker pin comes from one DLAMI's release notes and installs on the other fleet's host:
    every AMI name filter must select that Ubuntu release (the NVIDIA one selected 22.04 while the
    pin cited a 24.04 DLAMI, and the sandbox runs the boot as on 24.04)."""
    from core.catalog import HOST_STACKS

    releases = {
        row.ami_name_filter: re.search(r"\(Ubuntu (\d+\.\d+)\)", row.ami_name_filter) for row in HOST_STACKS.values()
    }
    assert all(releases.values()), releases
    assert {name: m.group(1) for name, m in releases.items() if m} == dict.fromkeys(releases, DOCKER_PIN_UBUNTU)
    assert f'VERSION_ID="{DOCKER_PIN_UBUNTU}"' in OS_RELEASE


def test_boot_refuses_a_docker_repository_key_with_another_fingerprint(
    example: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("docker", path="/usr/bin:/bin"):
        pytest.skip("this machine has docker in /usr/bin or /bin, which the sandbox's PATH keeps")
    import stacks.fleet_boot

    monkeypatch.setattr(stacks.fleet_boot, "DOCKER_KEY_FINGERPRINT", "0" * 40)
    rc, calls, output = _run(_fleet_scripts(example)["inf2"], tmp_path, docker_on_host=False)
    assert rc == 1 and "Docker apt key fingerprint mismatch" in output
    assert not _docker_apt_calls(calls)


@pytest.mark.parametrize("fleet", ["inf2", "g6"])
def test_boot_leaves_a_hosts_own_docker_alone(example: Manifest, fleet: str, tmp_path: Path) -> None:
    rc, calls, output = _run(_fleet_scripts(example)[fleet], tmp_path)
    assert rc == 0, output
    assert not _docker_apt_calls(calls)
    assert not [c for c in calls if c[0] == "curl" and "download.docker.com" in c[-1]]
    assert not (tmp_path / "root" / "etc" / "apt" / "sources.list.d" / "docker.list").exists()
    assert "docker present:" in output


# --- Weight download (issue 25, item 5): only the pinned files, never original/*.pth -----------

# The files of meta-llama/Meta-Llama-3-8B-Instruct at the example's commit (the Hub's file list).
LLAMA3_8B_INSTRUCT_FILES = (
    ".gitattributes",
    "LICENSE",
    "README.md",
    "USE_POLICY.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00004.safetensors",
    "model-00002-of-00004.safetensors",
    "model-00003-of-00004.safetensors",
    "model-00004-of-00004.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "original/tokenizer.model",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _hub_download_kwargs(calls: list[list[str]]) -> dict[str, object]:
    """Run the download container's python with a stand-in huggingface_hub; what it was asked for."""
    import sys
    import types

    download = next(c for c in calls if c[0] == "docker" and c[1] == "run" and "--rm" in c)
    code = download[download.index("-c") + 1]
    seen: dict[str, object] = {}
    fake = types.ModuleType("huggingface_hub")
    fake.snapshot_download = lambda **kw: seen.update(kw)  # type: ignore[attr-defined]
    saved = sys.modules.get("huggingface_hub")
    sys.modules["huggingface_hub"] = fake
    try:
        exec(code, {})  # the script's own one-liner, run against the stand-in
    finally:
        if saved is not None:
            sys.modules["huggingface_hub"] = saved
        else:
            del sys.modules["huggingface_hub"]
    return seen


@pytest.mark.parametrize("fleet", ["inf2", "g6"])
def test_hub_download_fetches_only_the_pinned_weight_files(example: Manifest, fleet: str, tmp_path: Path) -> None:
    from huggingface_hub.utils import filter_repo_objects

    rc, calls, output = _run(_fleet_scripts(example)[fleet], tmp_path)
    assert rc == 0, output
    kw = _hub_download_kwargs(calls)
    assert kw["repo_id"] == example.model.repo and kw["revision"] == example.model.commit
    # What snapshot_download would fetch of the real repository, by the Hub client's own filter.
    fetched = set(filter_repo_objects(LLAMA3_8B_INSTRUCT_FILES, allow_patterns=kw["allow_patterns"]))  # type: ignore[arg-type]
    weights = {f for f in fetched if f.endswith((".safetensors", ".pth", ".bin", ".pt", ".gguf"))}
    assert weights == set(example.model.weight_files)
    assert not any(f.startswith("original/") for f in fetched)
    assert {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= fetched  # what the server reads


def test_s3_staging_syncs_only_the_pinned_weight_files(example: Manifest, tmp_path: Path) -> None:
    rc, calls, output = _run(_fleet_scripts(example, S3_WEIGHTS)["g6"], tmp_path)
    assert rc == 0, output
    sync = next(c for c in calls if c[:3] == ["aws", "s3", "sync"])
    assert sync[3:6] == ["--region", example.costs.region, f"{S3_WEIGHTS}/{example.model.commit}/"]
    # `aws s3 sync --exclude '*' --include A --include B`: later filters win, so only A and B are copied.
    assert sync[sync.index("--exclude") + 1] == "*" and sync.index("--exclude") < sync.index("--include")
    includes = {sync[i + 1] for i, a in enumerate(sync) if a == "--include"}
    assert set(example.model.weight_files) <= includes
    assert not any(i.startswith("original/") or "*" in i for i in includes)
    assert not [c for c in calls if c[0] == "docker" and "--rm" in c]  # no Hub download at all


# --- Package installs wait for the dpkg lock (issue 37) ----------------------------------------


def _apt_and_dpkg_calls(calls: list[list[str]]) -> list[list[str]]:
    return [c for c in calls if c[0] in ("apt-get", "apt", "dpkg")]


@pytest.mark.parametrize(("fleet", "docker_on_host"), [("inf2", False), ("g6", True)])
def test_every_apt_and_dpkg_call_waits_for_the_lock(
    example: Manifest, fleet: str, docker_on_host: bool, tmp_path: Path
) -> None:
    """unattended-upgrades may hold the dpkg lock at first boot: no install may fail on it."""
    if not docker_on_host and shutil.which("docker", path="/usr/bin:/bin"):
        pytest.skip("this machine has docker in /usr/bin or /bin, which the sandbox's PATH keeps")
    rc, calls, output = _run(_fleet_scripts(example)[fleet], tmp_path, docker_on_host=docker_on_host)
    assert rc == 0, output
    package_calls = _apt_and_dpkg_calls(calls)
    assert package_calls, "the CloudWatch agent install is always there"
    assert [c for c in package_calls if c[0] != "apt-get"] == []  # no bare dpkg -i: it never waits
    for c in package_calls:
        assert f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}" in c and c[c.index("-o") + 1].startswith("DPkg::Lock"), c
    assert APT_LOCK_WAIT_S > 0
    # The agent's verified .deb goes through apt-get, by path (apt installs a local package so).
    assert any(c[-1].endswith("/agent.deb") and "install" in c for c in package_calls)


def test_apt_update_is_retried_while_another_apt_holds_the_lists_lock(example: Manifest, tmp_path: Path) -> None:
    # DPkg::Lock::Timeout does not cover the lists lock `apt-get update` takes: the script retries.
    if shutil.which("docker", path="/usr/bin:/bin"):
        pytest.skip("this machine has docker in /usr/bin or /bin, which the sandbox's PATH keeps")
    rc, calls, output = _run(_fleet_scripts(example)["inf2"], tmp_path, docker_on_host=False, apt_lists_locked=2)
    assert rc == 0, output
    updates = [i for i, c in enumerate(calls) if c[0] == "apt-get" and "update" in c]
    assert len(updates) == 3  # two refused, the third ran
    assert all(["sleep", str(APT_RETRY_EVERY_S)] in calls[a:b] for a, b in itertools.pairwise(updates))
    install = next(
        i for i, c in enumerate(calls) if c[0] == "apt-get" and "install" in c and c[-3].startswith("docker-ce=")
    )
    assert updates[-1] < install


def test_apt_update_gives_up_after_the_lock_wait(
    example: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("docker", path="/usr/bin:/bin"):
        pytest.skip("this machine has docker in /usr/bin or /bin, which the sandbox's PATH keeps")
    import stacks.fleet_boot

    monkeypatch.setattr(stacks.fleet_boot, "APT_LOCK_WAIT_S", 3 * APT_RETRY_EVERY_S)
    rc, calls, output = _run(_fleet_scripts(example)["inf2"], tmp_path, docker_on_host=False, apt_lists_locked=99)
    assert rc == 1 and "apt-get update failed 3 times" in output
    assert len([c for c in calls if c[0] == "apt-get" and "update" in c]) == 3
    assert _docker_runs(calls) == []


# --- Images: no Docker Hub pull without credentials (issue 37) ----------------------------------

VLLM_TAG = "v0.13.0"


def _tagged_g6(manifest: Manifest) -> Manifest:
    """The example with its g6 image carrying a tag beside the digest, as a cloud deploy requires."""
    g6 = manifest.fleet("g6")
    name, digest = g6.serving.image.split("@")
    tagged = g6.model_copy(update={"serving": g6.serving.model_copy(update={"image": f"{name}:{VLLM_TAG}@{digest}"})})
    return manifest.model_copy(update={"fleets": tuple(tagged if f is g6 else f for f in manifest.fleets)})


def test_a_docker_hub_image_is_pulled_through_the_ecr_cache_tag_first_then_by_its_digest(
    example: Manifest, tmp_path: Path
) -> None:
    m = _tagged_g6(example)
    rc, calls, output = _run(_fleet_scripts(m)["g6"], tmp_path)
    assert rc == 0, output
    cache = f"{CACHE_REGISTRY}/docker-hub/vllm/vllm-openai"
    digest = m.fleet("g6").serving.image.rsplit("@", 1)[1]
    pulls = [c[2] for c in calls if c[:2] == ["docker", "pull"]]
    # The cache fills on a pull by tag only (aws/containers-roadmap#2837): the tag, then the pinned digest.
    assert pulls == [f"{cache}:{VLLM_TAG}", f"{cache}@{digest}"]
    login = next(i for i, c in enumerate(calls) if c[:2] == ["docker", "login"])
    assert calls[login][-1] == CACHE_REGISTRY
    assert login < next(i for i, c in enumerate(calls) if c[:2] == ["docker", "pull"])
    assert ["aws", "ecr", "get-login-password", "--region", m.costs.region] in calls
    # Both containers (the Hub download and the server) run the pinned cache reference; nothing names Docker Hub.
    runs = _docker_runs(calls)
    assert all(f"{cache}@{digest}" in r for r in runs) and len(runs) == 2
    assert not [a for c in calls if c[0] == "docker" for a in c if a.startswith(("vllm/", "docker.io/"))]


def test_a_tag_that_moved_off_the_pinned_digest_stops_the_boot(example: Manifest, tmp_path: Path) -> None:
    m = _tagged_g6(example)
    digest = m.fleet("g6").serving.image.rsplit("@", 1)[1]
    rc, calls, output = _run(_fleet_scripts(m)["g6"], tmp_path, docker_pull_fails=f"@{digest}")
    assert rc == 1 and "the tag no longer points at the pinned digest" in output
    assert _docker_runs(calls) == []


def test_an_ecr_public_image_comes_through_the_pull_through_cache(example: Manifest, tmp_path: Path) -> None:
    """Issue 50, item 3: the Neuron image was pulled from public.ecr.aws at every boot, through the NAT
    gateway; now through the stack's ECR Public rule (core/images.py), tag first, then the pin."""
    rc, calls, output = _run(_fleet_scripts(example)["inf2"], tmp_path)
    assert rc == 0, output
    image = example.fleet("inf2").serving.image
    tag = image.split("@")[0].rsplit(":", 1)[1]
    digest = image.rsplit("@", 1)[1]
    base = f"{CACHE_REGISTRY}/ecr-public/neuron/pytorch-inference-vllm-neuronx"
    assert [c[2] for c in calls if c[:2] == ["docker", "pull"]] == [f"{base}:{tag}", f"{base}@{digest}"]
    assert [c[-1] for c in calls if c[:2] == ["docker", "login"]] == [CACHE_REGISTRY]
    assert f"{base}@{digest}" in _docker_runs(calls)[-1]  # the server runs the pinned digest
