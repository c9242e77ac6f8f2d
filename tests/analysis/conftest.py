from __future__ import annotations

from typing import Any

import pytest

from core.manifest import Manifest
from tests.analysis.synth import manifest


@pytest.fixture
def m(manifest_data: dict[str, Any]) -> Manifest:
    return manifest(manifest_data)
