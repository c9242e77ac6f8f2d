"""`validate --for cloud` / `deploy` refuse what a cloud deploy cannot use; the local campaign still accepts it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from campaign.aws.cloud_checks import ILLUSTRATIVE_VALUES, cloud_issues
from core.manifest import load_manifest, manifest_from_data
from runtime import tiny_model
from tests.conftest import ROOT, write_manifest

TOKEN_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:harness/hf-token-AbCdEf"
HUB_CREDENTIAL_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:ecr-pullthroughcache/docker-hub-AbCdEf"
REAL_LOOKING = "0" * 63 + "1"
TINY_MANIFEST = ROOT / "manifests" / "tiny-llama-real-engine.yaml"


def _filled(data: dict[str, Any]) -> dict[str, Any]:
    """The example with every illustrative value replaced, as an operator would fill it (a Docker
    Hub image gets its tag beside the digest)."""
    data["model"]["weight_files"] = {name: f"{i:064x}" for i, name in enumerate(data["model"]["weight_files"], start=1)}
    for f in data["fleets"]:
        name = f["serving"]["image"].split("@sha256:")[0]
        if name == "vllm/vllm-openai":
            name += ":v0.13.0"
        f["serving"]["image"] = name + "@sha256:" + REAL_LOOKING
    data["model"]["hub_token_secret_arn"] = TOKEN_ARN
    data["operator"]["cidr"] = "10.20.0.0/16"
    data["tokenizer"] = {
        "kind": "huggingface",
        "path": "tokenizer.json",
        "files": {"tokenizer.json": "a" * 64, "tokenizer_config.json": "b" * 64},
        "special_tokens": {},
        "max_length": 8192,
    }
    return data


def test_the_example_is_refused_for_cloud_naming_every_field(manifest_data: dict[str, Any]) -> None:
    paths = [i.path for i in cloud_issues(manifest_from_data(manifest_data))]
    assert paths == [
        "fleets[1].serving.image",  # a Docker Hub image without its tag
        "--docker-hub-credential-arn",
        *(f"model.weight_files.model-0000{n}-of-00004.safetensors" for n in range(1, 5)),
        "fleets[0].serving.image",
        "fleets[1].serving.image",
        "tokenizer",
        "model.hub_token_secret_arn",
        "operator.cidr",
    ]


def test_a_filled_manifest_passes_and_s3_weights_need_no_token(manifest_data: dict[str, Any]) -> None:
    filled = _filled(manifest_data)
    assert cloud_issues(manifest_from_data(filled), docker_hub_credential_arn=HUB_CREDENTIAL_ARN) == []
    filled["model"]["hub_token_secret_arn"] = None
    assert [i.path for i in cloud_issues(manifest_from_data(filled), docker_hub_credential_arn=HUB_CREDENTIAL_ARN)] == [
        "model.hub_token_secret_arn"
    ]
    assert (
        cloud_issues(manifest_from_data(filled), weights_from_s3=True, docker_hub_credential_arn=HUB_CREDENTIAL_ARN)
        == []
    )


def test_docker_hub_images_need_the_pull_through_credential_and_a_tag(manifest_data: dict[str, Any]) -> None:
    """Every stack pulls Prometheus (and here g6's vLLM) from Docker Hub through the ECR pull-through
    cache, never anonymously: without the operator's credential the deploy is refused, naming the flag."""
    m = manifest_from_data(_filled(manifest_data))
    (missing,) = cloud_issues(m)
    assert missing.path == "--docker-hub-credential-arn"
    assert "fleets[1].serving.image" in missing.reason and "prom/prometheus" in missing.reason
    assert "ecr-pullthroughcache/" in missing.reason and m.costs.region in missing.reason
    # A secret ECR cannot use: another name, another region.
    for arn, why in (
        (TOKEN_ARN, "ecr-pullthroughcache/"),
        (HUB_CREDENTIAL_ARN.replace("us-east-1", "eu-west-1"), "eu-west-1"),
    ):
        (bad,) = cloud_issues(m, docker_hub_credential_arn=arn)
        assert bad.path == "--docker-hub-credential-arn" and why in bad.reason
    # The cache fills on a pull by tag only: a Docker Hub fleet image needs its tag beside the digest.
    data = _filled(manifest_data)
    data["fleets"][1]["serving"]["image"] = "vllm/vllm-openai@sha256:" + REAL_LOOKING
    (untagged,) = cloud_issues(manifest_from_data(data), docker_hub_credential_arn=HUB_CREDENTIAL_ARN)
    assert untagged.path == "fleets[1].serving.image" and "tag" in untagged.reason


def test_the_served_models_own_tokenizer_with_pinned_files_is_required(manifest_data: dict[str, Any]) -> None:
    example_tokenizer = dict(manifest_data["tokenizer"])  # the emulator's word tokenizer
    filled = _filled(manifest_data)
    filled["tokenizer"]["files"] = {}
    filled["tokenizer"]["chat_template"] = "{{ messages }}"
    [issue] = cloud_issues(manifest_from_data(filled), docker_hub_credential_arn=HUB_CREDENTIAL_ARN)
    assert issue.path == "tokenizer.files" and "meta-llama/Meta-Llama-3-8B-Instruct at model.commit" in issue.reason
    filled["tokenizer"] = example_tokenizer
    [issue] = cloud_issues(manifest_from_data(filled), docker_hub_credential_arn=HUB_CREDENTIAL_ARN)
    assert issue.path == "tokenizer" and "kind emulator counts words" in issue.reason


def test_the_real_engine_manifest_passes_the_tokenizer_checks_and_a_foreign_template_does_not(
    tmp_path: Path,
) -> None:
    """Its pinned tokenizer files (generated here) pass `validate --for cloud`'s tokenizer checks; a
    chat template other than the checkpoint's is refused naming the field."""
    data = yaml.safe_load(TINY_MANIFEST.read_text(encoding="utf-8"))
    tiny_model.write_tokenizer(tmp_path / "tiny")
    data["tokenizer"]["path"] = str(tmp_path / "tiny" / "tokenizer.json")
    data["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")
    path = write_manifest(tmp_path, data)
    m = load_manifest(path)
    assert [i.path for i in cloud_issues(m) if i.path.startswith("tokenizer")] == []
    cloud = _validate(path, "--for", "cloud")
    assert cloud.returncode == 2 and "tokenizer" not in cloud.stderr  # only its illustrative images and CIDR
    data["tokenizer"]["chat_template"] = tiny_model.CHAT_TEMPLATE.replace("<|eot_id|>", "")
    cloud = _validate(write_manifest(tmp_path, data, "foreign.yaml"), "--for", "cloud")
    assert cloud.returncode == 2
    assert "tokenizer.chat_template: differs from the checkpoint's template in chat_template.jinja" in cloud.stderr


def _validate(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "campaign", "validate", str(path), *extra], capture_output=True, text=True, cwd=ROOT
    )


def test_every_made_up_value_in_the_example_manifests_is_registered() -> None:
    # Image digests: no manifest in the repository pins a real one, so each must be registered and a
    # new example cannot ship a placeholder that `validate --for cloud` would let through. Weight
    # hashes: the Llama 3 8B examples' are made up; tiny-llama-real-engine.yaml pins the real
    # sha256 of its generated checkpoint (runtime/tiny_model.py), which must not be registered.
    for path in sorted((ROOT / "manifests").glob("*.yaml")):
        m = load_manifest(path, check_files=False)
        digests = {f.serving.image.rsplit("@sha256:", 1)[1] for f in m.fleets}
        assert digests <= ILLUSTRATIVE_VALUES, (
            f"{path.name}: unregistered image digest {sorted(digests - ILLUSTRATIVE_VALUES)}"
        )
        hashes = set(m.model.weight_files.values())
        if path.name.startswith("llama3-8b-"):
            assert hashes <= ILLUSTRATIVE_VALUES, (
                f"{path.name}: unregistered weight hash {sorted(hashes - ILLUSTRATIVE_VALUES)}"
            )
        else:
            assert not hashes & ILLUSTRATIVE_VALUES, f"{path.name}: a real checkpoint hash is listed as illustrative"


def test_cli_validate_local_accepts_the_example_and_cloud_refuses_it(example_manifest_path: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "campaign", "validate", str(example_manifest_path), *extra],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )

    local = run()
    assert local.returncode == 0 and "checked for a local campaign" in local.stdout
    cloud = run("--for", "cloud")
    assert cloud.returncode == 2
    assert "fleets[0].serving.image: illustrative digest from the example" in cloud.stderr
    assert "model.hub_token_secret_arn: meta-llama/Meta-Llama-3-8B-Instruct is gated" in cloud.stderr
    assert "tokenizer: kind emulator counts words, not the served model's tokens" in cloud.stderr


def test_deploy_refuses_the_example_before_touching_aws(example_manifest_path: Path) -> None:
    # No credentials, no npx needed: the refusal comes first, with the same field lines.
    out = subprocess.run(
        [sys.executable, "-m", "campaign", "deploy", str(example_manifest_path), "--yes"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2, out.stderr
    assert "model.weight_files.model-00001-of-00004.safetensors: illustrative hash" in out.stderr


def test_cli_cloud_validation_with_weights_from_s3_drops_only_the_token_issue(example_manifest_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "campaign",
            "validate",
            str(example_manifest_path),
            "--for",
            "cloud",
            "--weights-s3-uri",
            "s3://bucket/llama",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "hub_token_secret_arn" not in out.stderr and "model.weight_files" in out.stderr
