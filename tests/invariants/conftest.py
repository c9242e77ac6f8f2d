from __future__ import annotations

from typing import Any

import pytest

from core.manifest import Manifest, manifest_from_data


@pytest.fixture
def m(manifest_data: dict[str, Any]) -> Manifest:
    """The example manifest, as plain data made a Manifest (tests/conftest.py's manifest_data)."""
    return manifest_from_data(manifest_data)
