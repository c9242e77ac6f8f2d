"""Bad input fails synth with a message that names the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from core.manifest import load_manifest
from stacks.app_builder import pinned_context
from stacks.settings import REGION_AZS_CONTEXT_KEY, SynthInputError, settings_from_context
from tests.stacks.conftest import EXAMPLE_MANIFEST


def _variant(tmp_path: Path, edit: Any) -> Path:
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text(encoding="utf-8"))
    data["workload"]["trace"]["path"] = str(load_manifest(EXAMPLE_MANIFEST).trace_path)
    edit(data)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _settings(path: Path) -> Any:
    return settings_from_context(
        {"manifest": str(path), REGION_AZS_CONTEXT_KEY: pinned_context()[REGION_AZS_CONTEXT_KEY]}
    )


def test_example_manifest_is_accepted() -> None:
    s = _settings(EXAMPLE_MANIFEST)
    assert s.vpc_azs == ("us-east-1a", "us-east-1b")


def test_world_open_operator_cidr_is_refused_by_field(tmp_path: Path) -> None:
    path = _variant(tmp_path, lambda d: d["operator"].update(cidr="0.0.0.0/0"))
    with pytest.raises(SynthInputError, match=r"operator\.cidr: 0\.0\.0\.0/0 opens the Locust UI"):
        _settings(path)


def test_az_outside_the_region_is_refused_by_field(tmp_path: Path) -> None:
    # us-east-1g looks like an AZ of the region, but the pinned list has no such zone.
    path = _variant(tmp_path, lambda d: d["fleets"][1].update(availability_zones=["us-east-1a", "us-east-1g"]))
    with pytest.raises(
        SynthInputError,
        match=r"fleets\[1\]\.availability_zones\[1\]: 'us-east-1g' is not an availability zone of us-east-1",
    ):
        _settings(path)


def test_az_of_another_region_is_refused_by_field(tmp_path: Path) -> None:
    path = _variant(tmp_path, lambda d: d["fleets"][0].update(availability_zones=["us-east-1a", "us-west-2a"]))
    with pytest.raises(SynthInputError, match=r"fleets\[0\]\.availability_zones\[1\]"):
        _settings(path)


def test_unknown_instance_type_is_refused_by_field(tmp_path: Path) -> None:
    path = _variant(tmp_path, lambda d: d["fleets"][1].update(instance_type="p5.48xlarge"))
    with pytest.raises(SynthInputError, match=r"fleets\[1\]\.instance_type: unknown instance type 'p5.48xlarge'"):
        _settings(path)


def test_sdk_without_a_host_stack_row_is_refused_by_field(tmp_path: Path) -> None:
    # The AMI, driver and image of a fleet come from core.catalog.HOST_STACKS; an SDK release
    # with no row there has no pinned AMI and fails synth by name instead of booting a `latest` AMI.
    path = _variant(tmp_path, lambda d: d["fleets"][0]["serving"].update(sdk_version="2.31.0"))
    with pytest.raises(
        SynthInputError, match=r"fleets\[0\]\.serving\.sdk_version: no compatibility row for aws-neuron SDK '2.31.0'"
    ):
        _settings(path)


def test_bad_weights_uri_names_the_context_key() -> None:
    ctx = {
        "manifest": str(EXAMPLE_MANIFEST),
        REGION_AZS_CONTEXT_KEY: pinned_context()[REGION_AZS_CONTEXT_KEY],
        "weights_s3_uri": "bucket/x",
    }
    with pytest.raises(SynthInputError, match="weights_s3_uri"):
        settings_from_context(ctx)
