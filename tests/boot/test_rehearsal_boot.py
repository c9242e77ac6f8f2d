"""A rehearsal fleet's boot script (issue 51, stacks/rehearsal_boot.py), rendered as the launch
template's user data, checked and run to healthy in the sandbox of tests/boot/test_boot_script.py
(every host command a stub that logs its argv; /etc, /opt, /var/log moved under the sandbox), with
the Amazon Linux 2023 host's `dnf` stubbed beside the others. Then the emulator itself serves the
manifest the boot wrote, on a free port: /health and /tokenize answer."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from core.manifest import Manifest, load_manifest
from core.serving import definition_digest, definition_for, weights_dir_for
from stacks.rehearsal_boot import (
    CLOUDWATCH_AGENT_CTL,
    EMULATOR_MANIFEST,
    READY_GRACE_S,
    emulator_run,
    rehearsal_boot_script,
)
from tests.boot.test_boot_script import STUB, STUBBED, _docker_runs, _gated, _run
from tests.conftest import EXAMPLE_MANIFEST, ROOT
from tests.real_parts import program

pytestmark = pytest.mark.boot_script

REGION = "us-east-1"
REGISTRY = f"123456789012.dkr.ecr.{REGION}.amazonaws.com"
# The emulator image as CDK publishes an image asset (the bootstrap's container-assets repository).
IMAGE = f"{REGISTRY}/cdk-hnb659fds-container-assets-123456789012-{REGION}:{'be40ac27' * 8}"
S3_WEIGHTS = "s3://weights-bucket/llama"
# dnf on Amazon Linux 2023: installing the CloudWatch agent puts its ctl in place, installing docker
# puts docker on PATH (as the Ubuntu stub's apt-get does).
AL2023_STUB = STUB.replace(
    "  aws) ",
    '  dnf) case "$*" in\n'
    '    *amazon-cloudwatch-agent*) ctl="$SANDBOX/opt/aws/amazon-cloudwatch-agent/bin"; mkdir -p "$ctl"; '
    'cp "$0" "$ctl/amazon-cloudwatch-agent-ctl";;\n'
    '    *docker*) cp "$0" "$STUB_BIN/docker";;\n'
    "    esac;;\n"
    "  aws) ",
    1,
)
AL2023_STUBBED = (*STUBBED, "dnf")
EC2_USER_DATA_MAX = (
    16 * 1024
)  # "User data is limited to 16 KB, in raw form, before it is base64-encoded" (EC2 user guide)


@pytest.fixture(scope="module")
def example() -> Manifest:
    return load_manifest(EXAMPLE_MANIFEST, check_files=False)


def _script(manifest: Manifest, fleet: str, weights_s3_uri: str | None = None) -> str:
    """The user data stacks/fleet.py renders for a rehearsal fleet."""
    f = manifest.fleet(fleet)
    defn = definition_for(manifest, f, weights_s3_uri=weights_s3_uri)
    lines = rehearsal_boot_script(
        manifest,
        f,
        defn,
        image=IMAGE,
        serving_digest=definition_digest(defn),
        weights_s3_uri=weights_s3_uri,
        region=REGION,
        agent_param=f"/harness/{manifest.campaign}/{fleet}/cloudwatch-agent",
    )
    return "#!/bin/bash\n" + "\n".join(lines) + "\n"


def _boot(script: str, tmp_path: Path, **kw: object) -> tuple[int, list[list[str]], str]:
    return _run(script, tmp_path, stub=AL2023_STUB, stubbed=AL2023_STUBBED, **kw)  # type: ignore[arg-type]


def _tokenizer_files(directory: Path) -> dict[str, str]:
    """A small real tokenizer (word level) and its config, as `pin` would find them at the commit."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "rehearsal": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text('{"bos_token": "<|begin_of_text|>"}', encoding="utf-8")
    return {
        n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in ("tokenizer.json", "tokenizer_config.json")
    }


def _huggingface(manifest: Manifest, files: dict[str, str]) -> Manifest:
    """The manifest with a pinned huggingface tokenizer, as a cloud campaign's (its path the operator's checkout's)."""
    tok = manifest.tokenizer.model_copy(
        update={"kind": "huggingface", "path": "../.cache/tok/tokenizer.json", "files": files}
    )
    return manifest.model_copy(update={"tokenizer": tok})


@pytest.mark.shellcheck
def test_every_rehearsal_boot_script_parses_passes_shellcheck_and_fits_in_user_data(
    example: Manifest, tmp_path: Path
) -> None:
    hf = _huggingface(_gated(example), {"tokenizer.json": "a" * 64, "tokenizer_config.json": "b" * 64})
    three = load_manifest(ROOT / "manifests" / "llama3-8b-three-fleets.yaml", check_files=False)
    cases = {
        f"{label}-{f.name}-{'s3' if s3 else 'hub'}": (m, f.name, s3)
        for label, m in (("example", example), ("huggingface", hf), ("three", three))
        for f in m.fleets
        for s3 in (None, S3_WEIGHTS)
    }
    for name, (m, fleet, s3) in cases.items():
        text = _script(m, fleet, s3)
        assert len(text.encode()) < EC2_USER_DATA_MAX, (name, len(text.encode()))
        path = tmp_path / f"{name}.sh"
        path.write_text(text, encoding="utf-8")
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, name
        lint = subprocess.run(
            [program("shellcheck"), "--shell=bash", "--severity=style", str(path)], capture_output=True, text=True
        )
        assert lint.returncode == 0, f"{name}:\n{lint.stdout}"


@pytest.mark.parametrize("fleet", ["inf2", "g6"])
def test_the_rehearsal_boot_runs_the_emulator_to_healthy_in_the_sandbox(
    example: Manifest, fleet: str, tmp_path: Path
) -> None:
    rc, calls, output = _boot(_script(example, fleet), tmp_path)
    assert rc == 0, output
    names = [c[0] for c in calls]
    # No accelerator host: no driver probe, no cache volume, no neuron-monitor, no compile share, no weights.
    assert not {"nvidia-smi", "modinfo", "neuron-ls", "mkfs.ext4", "mount", "lsblk"} & set(names)
    assert not [c for c in calls if c[0] == "aws" and c[1] == "s3"]
    assert not [c for c in calls if c[0] == "systemctl" and any("neuron" in a for a in c)]
    # The fleet's CloudWatch agent, from its own configuration parameter, before Docker.
    assert ["dnf", "install", "-y", "-q", "amazon-cloudwatch-agent"] in calls
    fetch = calls.index(
        [
            CLOUDWATCH_AGENT_CTL.rsplit("/", 1)[1],
            "-a",
            "fetch-config",
            "-m",
            "ec2",
            "-s",
            "-c",
            f"ssm:/harness/{example.campaign}/{fleet}/cloudwatch-agent",
        ]
    )
    # ECR login to the image's registry in the stack's region, then the pull, then the run.
    login = next(i for i, c in enumerate(calls) if c[:2] == ["docker", "login"])
    assert calls[login][-1] == REGISTRY and ["aws", "ecr", "get-login-password", "--region", REGION] in calls
    pull = calls.index(["docker", "pull", IMAGE])
    run = _docker_runs(calls)
    assert len(run) == 1 and fetch < login < pull < calls.index(["docker", *run[0]])
    defn = definition_for(example, example.fleet(fleet), weights_s3_uri=None)
    expected = shlex.split(emulator_run(example.fleet(fleet), defn).replace('"$EMULATOR_IMAGE"', IMAGE))[1:]
    assert run[0] == expected
    assert run[0][run[0].index("-p") + 1] == f"{defn.port}:{defn.port}"  # the port the NLB forwards and checks
    # Healthy: the fleet's health path (the NLB's check) probed until it answers.
    health = [c for c in calls if c[0] == "curl" and c[-1] == f"http://127.0.0.1:{defn.port}{defn.health_path}"]
    assert len(health) == 3 and "emulator healthy after" in output
    # The manifest the emulator reads is the campaign's, digest for digest.
    written = tmp_path / "root" / EMULATOR_MANIFEST.removeprefix("/")
    assert load_manifest(written, check_files=False).digest == example.digest


def test_the_rehearsal_boot_installs_docker_on_a_host_without_it(example: Manifest, tmp_path: Path) -> None:
    import shutil

    if shutil.which("docker", path="/usr/bin:/bin"):
        pytest.skip("this machine has docker in /usr/bin or /bin, which the sandbox's PATH keeps")
    rc, calls, output = _boot(_script(example, "g6"), tmp_path, docker_on_host=False)
    assert rc == 0, output
    install = calls.index(["dnf", "install", "-y", "-q", "docker"])
    assert (
        install
        < calls.index(["systemctl", "enable", "--now", "docker"])
        < next(i for i, c in enumerate(calls) if c[0] == "docker")
    )


def test_the_rehearsal_boot_fails_when_the_emulator_never_answers(example: Manifest, tmp_path: Path) -> None:
    late = _script(example, "inf2").replace("#!/bin/bash\n", f"#!/bin/bash\nSECONDS={READY_GRACE_S}\n", 1)
    rc, calls, output = _boot(late, tmp_path)
    assert rc == 1 and f"the health-check grace is {READY_GRACE_S} s" in output
    assert _docker_runs(calls)  # started, never healthy in time


def test_tokenizer_files_come_from_the_hub_through_the_emulator_image_hashes_checked(
    example: Manifest, tmp_path: Path
) -> None:
    files = {"tokenizer.json": "a" * 64, "tokenizer_config.json": "b" * 64}
    m = _huggingface(_gated(example), files)
    rc, calls, output = _boot(_script(m, "inf2"), tmp_path)
    assert rc == 0, output
    assert [c for c in calls if c[0] == "aws" and "secretsmanager" in c]  # the gated repository's token
    download = next(c for c in calls if c[:2] == ["docker", "run"] and "--rm" in c)
    assert IMAGE in download and "-e" in download and "HF_TOKEN" in download
    code = download[download.index("-c") + 1]
    assert f"allow_patterns={json.dumps(sorted(files))}" in code  # the tokenizer files, no weight file
    assert f'local_dir="{weights_dir_for(m)}"' in code  # where a campaign's fleet stages them
    assert not any(w in code for w in m.model.weight_files)
    pull = calls.index(["docker", "pull", IMAGE])
    assert pull < calls.index(download) < calls.index(["docker", *_docker_runs(calls)[-1]])


def test_tokenizer_files_come_from_s3_when_the_weights_would(example: Manifest, tmp_path: Path) -> None:
    files = {"tokenizer.json": "a" * 64, "tokenizer_config.json": "b" * 64}
    rc, calls, output = _boot(_script(_huggingface(example, files), "g6", S3_WEIGHTS), tmp_path)
    assert rc == 0, output
    sync = next(c for c in calls if c[:3] == ["aws", "s3", "sync"])
    assert sync[3:6] == ["--region", example.costs.region, f"{S3_WEIGHTS}/{example.model.commit}/"]
    assert {sync[i + 1] for i, a in enumerate(sync) if a == "--include"} == set(files)
    assert not [c for c in calls if c[:2] == ["docker", "run"] and "--rm" in c]  # no Hub download


def _serve(manifest_path: Path, fleet: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "runtime.emulator", "--manifest", str(manifest_path), "--fleet", fleet),
            *("--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--no-check-files"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the emulator did not start: {proc.communicate()[1].decode()[-2000:]}")
        time.sleep(0.1)
    return proc, int(port_file.read_text())


def _post(port: int, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


@pytest.mark.parametrize("tokenizer", ["emulator", "huggingface"])
def test_the_emulator_serves_the_manifest_the_boot_wrote(example: Manifest, tokenizer: str, tmp_path: Path) -> None:
    """The boot's manifest, read by `python -m runtime.emulator` as the container does: its health
    path answers, and /tokenize counts with the manifest's tokenizer (for a huggingface one, the
    file the boot staged in the weights directory, not the operator's path)."""
    m = example
    if tokenizer == "huggingface":
        staged = tmp_path / "root" / weights_dir_for(example).removeprefix("/")
        m = _huggingface(example, _tokenizer_files(staged))
    rc, _, output = _boot(_script(m, "inf2"), tmp_path)
    assert rc == 0, output
    written = tmp_path / "root" / EMULATOR_MANIFEST.removeprefix("/")
    served = json.loads(written.read_text(encoding="utf-8"))
    proc, port = _serve(written, "inf2", tmp_path)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200
        counted = _post(port, "/tokenize", {"prompt": "hello rehearsal zebra", "return_token_strs": True})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert counted["count"] == 3
    if tokenizer == "huggingface":
        # The staged file (in the sandbox's weights directory): its vocabulary has no "zebra".
        assert served["tokenizer"]["path"] == f"{staged}/tokenizer.json"
        assert counted["token_strs"] == ["hello", "rehearsal", "[UNK]"]
    else:
        assert counted["token_strs"] == ["hello", "rehearsal", "zebra"]
