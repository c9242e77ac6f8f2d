"""Every vLLM fleet of both example manifests boots with prefix caching set explicitly, as its
manifest says (vLLM V1 turns it on when no flag is given; on Neuron it also picks the KV layout,
SDK 2.28 vLLM user guide, Known Issues 2)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from core.manifest import load_manifest
from tests.stacks.conftest import Synth


def _serving_argv(s: Synth) -> dict[str, list[str]]:
    """fleet name -> the `docker run` line of the serving container in its launch template's user data."""
    out: dict[str, list[str]] = {}
    resources = s.template_json["Resources"]
    for asg in (r for r in resources.values() if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"):
        fleet = next((t["Value"] for t in asg["Properties"].get("Tags", []) if t["Key"] == "fleet"), None)
        ref = asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
        user_data: Any = resources[ref]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
        parts = user_data["Fn::Join"][1] if isinstance(user_data, dict) else [user_data]
        script = "".join(p if isinstance(p, str) else "" for p in parts)
        line = next(ln for ln in script.splitlines() if "docker run -d" in ln and "--entrypoint" in ln)
        out[str(fleet)] = shlex.split(line[line.index("docker run -d") :])
    return out


@pytest.mark.parametrize("which", ["example", "three_fleets"])
def test_every_vllm_fleet_sets_prefix_caching_explicitly(which: str, request: pytest.FixtureRequest) -> None:
    s: Synth = request.getfixturevalue(which)
    m = load_manifest(s.manifest_path, check_files=False)
    argv = _serving_argv(s)
    vllm = [f for f in m.fleets if f.serving.stack in ("vllm", "vllm-neuron")]
    assert vllm and set(argv) == {f.name for f in m.fleets}
    for f in vllm:
        flags = [a for a in argv[f.name] if a in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
        want = "--enable-prefix-caching" if f.serving.resolved_prefix_caching else "--no-enable-prefix-caching"
        assert flags == [want], f"{which}: fleet {f.name} ({f.serving.stack}) boots with {flags}"
        if f.serving.stack == "vllm-neuron" and not f.serving.resolved_prefix_caching:
            a = argv[f.name]  # contiguous layout: exactly max_num_seqs blocks, block_size left to the plugin
            assert a[a.index("--num-gpu-blocks-override") + 1] == str(f.max_concurrency) and "--block-size" not in a
