"""Property tests: whatever a user writes, the loader answers with a manifest or field-named
errors, never an unexpected exception."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.manifest import ManifestError, load_manifest
from tests.conftest import EXAMPLE_MANIFEST, ROOT

BASE: dict[str, Any] = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
BASE["workload"]["trace"]["path"] = str(ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(BASE)
# The mutated manifest is written with LibYAML's emitter where PyYAML has it (the same YAML as
# safe_dump's, a third of each example's time in pure Python); the loader under test is unchanged.
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=scalars, delete=st.booleans())
def test_any_single_mutation_loads_or_names_the_field(
    tmp_path: Path, path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    data = copy.deepcopy(BASE)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    p = tmp_path / "m.yaml"
    p.write_text(yaml.dump(data, Dumper=DUMPER))
    try:
        m = load_manifest(p)
    except ManifestError as exc:
        assert exc.issues, "an error must carry at least one issue"
        for issue in exc.issues:
            assert issue.path and issue.reason
            top = issue.path.split(".")[0].split("[")[0]
            assert top in BASE or top in {"(root)", "(yaml)", "fleets", "comparison"}, issue
    else:
        assert len(m.digest) == 64
