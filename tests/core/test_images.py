"""Which images come from Docker Hub, and the ECR pull-through cache references a host pulls them by."""

from __future__ import annotations

import pytest

from core.images import DockerHubImage, cached_pull, docker_hub_image, secret_arn_issue

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (f"vllm/vllm-openai@{DIGEST}", DockerHubImage("vllm/vllm-openai", None, DIGEST)),
        (f"prom/prometheus:v3.5.0@{DIGEST}", DockerHubImage("prom/prometheus", "v3.5.0", DIGEST)),
        # Official images live under library/ (the cache needs it: ECR user guide, pull-through cache).
        ("nginx:1.27", DockerHubImage("library/nginx", "1.27", None)),
        (f"docker.io/library/nginx@{DIGEST}", DockerHubImage("library/nginx", None, DIGEST)),
        ("registry-1.docker.io/vllm/vllm-openai:v0.13.0", DockerHubImage("vllm/vllm-openai", "v0.13.0", None)),
        (f"public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0@{DIGEST}", None),
        (f"nvcr.io/nvidia/tensorrt-llm/release@{DIGEST}", None),
        (f"123456789012.dkr.ecr.us-east-1.amazonaws.com/team/vllm:1@{DIGEST}", None),
        ("localhost:5000/vllm:1", None),
        ("localhost/vllm", None),
    ],
)
def test_docker_hub_images_are_recognised_by_the_reference_grammar(image: str, expected: DockerHubImage | None) -> None:
    assert docker_hub_image(image) == expected


def test_the_cache_pulls_by_tag_first_and_runs_the_pinned_digest() -> None:
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    pull = cached_pull(f"vllm/vllm-openai:v0.13.0@{DIGEST}", registry=registry, region="us-east-1")
    assert pull is not None
    assert pull.repository == "docker-hub/vllm/vllm-openai"
    assert pull.by_tag == f"{registry}/docker-hub/vllm/vllm-openai:v0.13.0"
    assert pull.pinned == f"{registry}/docker-hub/vllm/vllm-openai@{DIGEST}"
    untagged = cached_pull(f"vllm/vllm-openai@{DIGEST}", registry=registry, region="us-east-1")
    assert untagged is not None and untagged.by_tag is None
    assert cached_pull(f"public.ecr.aws/x/y@{DIGEST}", registry=registry, region="us-east-1") is None


def test_only_an_ecr_pullthroughcache_secret_of_the_region_is_a_credential() -> None:
    ok = "arn:aws:secretsmanager:us-east-1:123456789012:secret:ecr-pullthroughcache/docker-hub-AbCdEf"
    assert secret_arn_issue(ok, "us-east-1") is None
    assert "ecr-pullthroughcache/" in str(secret_arn_issue(ok.replace("ecr-pullthroughcache/", "hub/"), "us-east-1"))
    assert "us-west-2" in str(secret_arn_issue(ok, "us-west-2"))


def test_a_tagged_ecr_public_image_goes_through_its_own_cache_rule_an_untagged_one_as_it_is() -> None:
    """Issue 50, item 3: the ECR Public rule (prefix ecr-public, no credentials) fills on a pull by tag."""
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    image = f"public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04@{DIGEST}"
    pull = cached_pull(image, registry=registry, region="us-east-1")
    assert pull is not None
    assert pull.repository == "ecr-public/neuron/pytorch-inference-vllm-neuronx"
    assert (
        pull.by_tag
        == f"{registry}/ecr-public/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"
    )
    assert pull.pinned == f"{registry}/ecr-public/neuron/pytorch-inference-vllm-neuronx@{DIGEST}"
    assert cached_pull(f"public.ecr.aws/x/y@{DIGEST}", registry=registry, region="us-east-1") is None
