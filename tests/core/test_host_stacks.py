"""Driver / SDK / image compatibility (core.catalog.HOST_STACKS), checked by `validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core import catalog
from core.manifest import ManifestError, load_manifest
from tests.conftest import write_manifest


def _issues(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    with pytest.raises(ManifestError) as exc:
        load_manifest(write_manifest(tmp_path, data))
    return [str(i) for i in exc.value.issues]


def test_the_inf1_driver_line_is_refused_for_sdk_2_28(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["serving"]["driver_version"] = "2.24"
    issues = _issues(tmp_path, manifest_data)
    assert any(
        i.startswith("fleets[0].serving.driver_version: 2.24 is not the driver Neuron SDK 2.28.0 ships (2.26.5.0)")
        for i in issues
    ), issues


@pytest.mark.parametrize("driver", ["2.26", "2.26.5", "2.26.5.0"])
def test_a_prefix_of_the_shipped_driver_is_accepted(driver: str) -> None:
    image = (
        "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04@sha256:"
        + "a" * 64
    )
    assert catalog.host_stack_issues("aws-neuron", "2.28.0", driver, image) == []


def test_a_neuron_image_of_another_sdk_release_is_refused(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["serving"]["image"] = (
        "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.9.1-neuronx-py310-sdk2.25.1-ubuntu22.04@sha256:"
        + "b" * 64
    )
    issues = _issues(tmp_path, manifest_data)
    assert any(
        i.startswith(
            "fleets[0].serving.image: tag '0.9.1-neuronx-py310-sdk2.25.1-ubuntu22.04' is not an SDK 2.28.0 image"
        )
        for i in issues
    )


def test_an_sdk_without_a_row_is_refused_by_name(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    manifest_data["fleets"][0]["serving"]["sdk_version"] = "2.31.0"
    issues = _issues(tmp_path, manifest_data)
    assert any(
        i.startswith("fleets[0].serving.sdk_version: no compatibility row for aws-neuron SDK '2.31.0'") for i in issues
    ), issues


@pytest.mark.parametrize(
    ("driver", "ok"), [("570.26", True), ("570.172", True), ("575", True), ("565.57.01", False), ("570", False)]
)
def test_cuda_12_8_needs_driver_570_26_or_newer(driver: str, ok: bool) -> None:
    issues = catalog.host_stack_issues("nvidia", "12.8", driver, "vllm/vllm-openai@sha256:" + "c" * 64)
    assert (issues == []) is ok, issues


def test_every_row_names_its_sources() -> None:
    for row in catalog.HOST_STACKS.values():
        assert row.sources and all(("http" in s or "@" in s) for s in row.sources)


@pytest.mark.parametrize(
    "name", ["llama3-8b-inf2-vs-g6.yaml", "llama3-8b-three-fleets.yaml", "tiny-llama-real-engine.yaml"]
)
def test_the_examples_pin_the_nvidia_dlamis_own_driver(name: str) -> None:
    """Issue 50, item 5: the examples pinned 570.172 while the DLAMI they boot lists 595.71.05, and the
    boot script refuses a host driver other than the pinned one: every NVIDIA instance would refuse."""
    from tests.conftest import ROOT

    m = load_manifest(ROOT / "manifests" / name, check_files=False)
    nvidia = {
        f.name: f.serving.driver_version
        for f in m.fleets
        if catalog.instance(f.instance_type).accelerator.vendor == "nvidia"
    }
    assert nvidia and nvidia == dict.fromkeys(nvidia, catalog.NVIDIA_DLAMI_DRIVER)
    assert catalog.NVIDIA_DLAMI_DRIVER in catalog.NVIDIA_DLAMI_RELEASE_NOTES
