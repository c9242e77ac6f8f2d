"""The invariants' hypothesis profiles: `ci` (the default, derandomized: `make test` draws the same
examples every run) and `long` (HYPOTHESIS_PROFILE=long: many more, random; docs/testing.md says
how to run it and what it found)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from core.manifest import Manifest, manifest_from_data

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def m(manifest_data: dict[str, Any]) -> Manifest:
    """The example manifest, as plain data made a Manifest (tests/conftest.py's manifest_data)."""
    return manifest_from_data(manifest_data)
