"""The compile instance's user data (stacks/compile_boot.py), checked as the fleets' boot scripts are.

`bash -n` and shellcheck, then a run under bash in the same sandbox as tests/boot/test_boot_script.py
(every host command a stub that logs its argv, IMDS answered by the curl stub): it starts the
fleet's own server (which compiles), publishes the set under the FLEET's key with the marker last,
and terminates itself through its Auto Scaling group with the desired capacity decremented, on
success and on failure alike.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from core.compile_host import compile_hosts
from core.manifest import Manifest, load_manifest
from core.serving import definition_digest, definition_for, render_docker_run
from stacks.compile_boot import TERMINATE_TRIES, compile_script
from tests.boot.test_boot_script import COMPILED_URI, S3_WEIGHTS, _boot_definition, _docker_runs, _gated, _run
from tests.conftest import EXAMPLE_MANIFEST
from tests.real_parts import program

pytestmark = pytest.mark.boot_script

INSTANCE_ID = "i-0c0a1e5ce0ffee123"  # what the sandbox's IMDS (the curl stub) answers


@pytest.fixture(scope="module")
def example() -> Manifest:
    return load_manifest(EXAMPLE_MANIFEST, check_files=False)


def _compile_scripts(manifest: Manifest, weights_s3_uri: str | None = None) -> dict[str, str]:
    """user data of each at-risk fleet's compile instance, with the arguments stacks/compile_instance.py passes."""
    from stacks.accelerator_telemetry import neuron_namespace

    out = {}
    for host in compile_hosts(manifest):
        f = manifest.fleet(host.fleet)
        defn, cached = _boot_definition(manifest, f.name, weights_s3_uri)
        lines = compile_script(
            defn,
            campaign=manifest.campaign,
            serving_digest=definition_digest(definition_for(manifest, f, weights_s3_uri=weights_s3_uri)),
            cached=cached,
            weights_s3_uri=weights_s3_uri,
            driver_version=f.serving.driver_version,
            region=manifest.costs.region,
            agent_param=f"/harness/{manifest.campaign}/{f.name}/cloudwatch-agent",
            neuron_namespace=neuron_namespace(manifest.campaign, f.name),
            compiled_uri=COMPILED_URI,
        )
        out[f.name] = "#!/bin/bash\n" + "\n".join(lines) + "\n"
    return out


def _aws(calls: list[list[str]], *head: str) -> list[int]:
    return [i for i, c in enumerate(calls) if c[0] == "aws" and c[1 : 1 + len(head)] == list(head)]


def _terminations(calls: list[list[str]]) -> list[list[str]]:
    return [calls[i] for i in _aws(calls, "autoscaling", "terminate-instance-in-auto-scaling-group")]


@pytest.mark.shellcheck
def test_every_compile_script_parses_and_passes_shellcheck(example: Manifest, tmp_path: Path) -> None:
    shellcheck = program("shellcheck")
    scripts = {f"example/{k}": v for k, v in _compile_scripts(example).items()}
    scripts |= {f"s3/{k}": v for k, v in _compile_scripts(example, S3_WEIGHTS).items()}
    scripts |= {f"gated/{k}": v for k, v in _compile_scripts(_gated(example)).items()}
    assert set(scripts) == {"example/inf2", "s3/inf2", "gated/inf2"}  # the example's at-risk fleet
    for name, text in scripts.items():
        path = tmp_path / (name.replace("/", "-") + ".sh")
        path.write_text(text, encoding="utf-8")
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{name}: {syntax.stderr}"
        lint = subprocess.run(
            [shellcheck, "--shell=bash", "--severity=style", str(path)], capture_output=True, text=True
        )
        assert lint.returncode == 0, f"{name}:\n{lint.stdout}"


def test_the_compile_host_compiles_the_fleets_server_publishes_under_the_fleets_key_then_terminates(
    example: Manifest, tmp_path: Path
) -> None:
    rc, calls, output = _run(_compile_scripts(example)["inf2"], tmp_path)
    assert rc == 0, output
    fleet = definition_for(example, example.fleet("inf2"))
    assert fleet.compiled is not None
    # The fleet's own server, flag for flag: TP 2, its buckets, NEURON_COMPILED_ARTIFACTS named by its key,
    # its image pulled as the fleet pulls it (through the ECR Public cache).
    (serving,) = [r for r in _docker_runs(calls) if "--rm" not in r]
    assert serving == shlex.split(render_docker_run(_boot_definition(example, "inf2")[0]))[1:]
    assert f"NEURON_COMPILED_ARTIFACTS={fleet.compiled.directory}" in serving
    assert "no complete set in s3://results-bucket/compiled/" in output and "this instance compiles" in output
    assert not [c for c in calls if c[0] == "systemctl" and "neuron-monitor.service" in c]  # not the fleet's metrics
    # Published under the fleet's key (it names inf2.xlarge), never under this host's own type's key.
    bigger = definition_for(example, example.fleet("inf2").model_copy(update={"instance_type": "inf2.8xlarge"}))
    assert bigger.compiled is not None and bigger.compiled.key != fleet.compiled.key
    uploads = [calls[i] for i in _aws(calls, "s3", "cp") if calls[i][-1].startswith("s3://")]
    assert len(uploads) == 2
    files, marker = uploads
    prefix = f"{COMPILED_URI}/{fleet.compiled.key}/"
    assert files[-1].startswith(prefix) and "--recursive" in files and files[-2] == f"{fleet.compiled.directory}/"
    assert marker[-2:] == ["-", files[-1] + "COMPLETE"]  # the marker last, in the same publisher's prefix
    assert "compile host: the set under s3://results-bucket/compiled/" in output and "is complete" in output
    # ... and only then it terminates itself, the group's desired capacity going to 0 with it.
    (term,) = _terminations(calls)
    assert calls.index(term) > calls.index(marker)
    assert term[2:] == [
        "terminate-instance-in-auto-scaling-group",
        "--region",
        example.costs.region,
        "--instance-id",
        INSTANCE_ID,
        "--should-decrement-desired-capacity",
    ]
    assert "compile host: exit status 0; this instance terminates itself" in output


def test_a_compile_host_whose_server_never_serves_publishes_nothing_and_terminates(
    example: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stacks.fleet_boot

    monkeypatch.setattr(stacks.fleet_boot, "health_grace_s", lambda vendor: 0)
    rc, calls, output = _run(_compile_scripts(example)["inf2"], tmp_path)
    assert rc == 1 and "server not healthy" in output
    assert not [c for c in calls if c[:3] == ["aws", "s3", "cp"]]  # nothing published
    (term,) = _terminations(calls)
    assert "--should-decrement-desired-capacity" in term and "compile host: exit status 1" in output


def test_a_compile_host_that_cannot_publish_fails_and_terminates(example: Manifest, tmp_path: Path) -> None:
    # A serving instance logs a failed upload and goes on serving; the compile host has no other job.
    rc, calls, output = _run(_compile_scripts(example)["inf2"], tmp_path, env_extra={"FAIL_S3_UPLOAD": "1"})
    assert rc == 1 and "compile host: no complete set under s3://results-bucket/compiled/" in output
    assert not any(c[-1].endswith("/COMPLETE") for c in calls if c[:3] == ["aws", "s3", "cp"])
    (term,) = _terminations(calls)
    assert "--should-decrement-desired-capacity" in term and "compile host: exit status 1" in output


def test_a_refused_termination_is_retried_then_logged(example: Manifest, tmp_path: Path) -> None:
    # The role's grant to terminate is created right after the group: an early failure retries.
    rc, calls, output = _run(_compile_scripts(example)["inf2"], tmp_path, env_extra={"FAIL_TERMINATE": "1"})
    assert rc == 0  # the compile's own outcome is kept
    assert len(_terminations(calls)) == TERMINATE_TRIES
    assert f"compile host: could not terminate {INSTANCE_ID}" in output


def test_only_a_fleet_that_shares_compiled_artifacts_gets_a_compile_script(example: Manifest) -> None:
    g6 = definition_for(example, example.fleet("g6"))
    with pytest.raises(ValueError, match="compiles nothing to share"):
        compile_script(
            g6,
            campaign=example.campaign,
            serving_digest=definition_digest(g6),
            cached=None,
            driver_version="570.172",
            region="us-east-1",
            agent_param="p",
            neuron_namespace="n",
            compiled_uri=COMPILED_URI,
        )


def test_a_compile_boot_that_hangs_before_the_health_wait_is_stopped_and_terminates(
    example: Manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `docker pull` that hangs comes before the health wait's own bound: only the whole-boot
    timeout (issue 48, item 3) stops it, and the instance still terminates itself. The limit is
    patched to 2 s (raising=False: the old script had no such bound and ran the pull out)."""
    import time

    import stacks.compile_boot

    monkeypatch.setattr(stacks.compile_boot, "compile_boot_limit_s", lambda vendor: 2, raising=False)
    start = time.monotonic()
    rc, calls, output = _run(_compile_scripts(example)["inf2"], tmp_path, env_extra={"DOCKER_PULL_HANGS": "20"})
    elapsed = time.monotonic() - start
    assert rc == 124, output  # timeout's status for the command it stopped
    assert elapsed < 15, elapsed  # stopped at the limit, not after the 20 s hang
    assert "the whole boot ran past 2 s" in output
    assert _docker_runs(calls) == [] and not [c for c in calls if c[:3] == ["aws", "s3", "cp"]]
    (term,) = _terminations(calls)
    assert "--should-decrement-desired-capacity" in term and "compile host: exit status 124" in output


def test_the_whole_boot_bound_is_the_grace_plus_a_margin_inside_the_plans_minutes(example: Manifest) -> None:
    from campaign.aws.compile_estimate import COMPILE_PHASE_OVERHEAD_MIN, compile_phase
    from core.cloud_contract import health_grace_s
    from stacks.compile_boot import COMPILE_BOOT_MARGIN_S, KILL_AFTER_S, compile_boot_limit_s

    limit = compile_boot_limit_s("aws-neuron")
    assert limit == health_grace_s("aws-neuron") + COMPILE_BOOT_MARGIN_S
    # deploy gives up at the plan's minutes; the instance's own bound (and KILL after it) ends first.
    phase = compile_phase(example, example.fleet("inf2"))
    assert phase is not None and limit + KILL_AFTER_S < phase.minutes * 60
    assert COMPILE_BOOT_MARGIN_S < COMPILE_PHASE_OVERHEAD_MIN * 60
    script = _compile_scripts(example)["inf2"]
    assert f'timeout --kill-after={KILL_AFTER_S} {limit} bash "$0"' in script


def test_the_compile_host_compiles_pre_sharded_weights(example: Manifest, tmp_path: Path) -> None:
    """Issue 50, item 1: the compile host's server writes each rank's weights into the set it publishes
    (tests/boot/test_compiled_share.py runs the publish and the fetch with a stand-in for NxD Inference)."""
    import json

    rc, calls, output = _run(_compile_scripts(example)["inf2"], tmp_path)
    assert rc == 0, output
    (serving,) = [r for r in _docker_runs(calls) if "--rm" not in r]
    cfg = json.loads(serving[serving.index("--additional-config") + 1])["override_neuron_config"]
    assert cfg.get("save_sharded_checkpoint") is True
