"""Invariant: a refusal writes nothing (issue 47; guards issue 46's finding 9).

`pin` against the stub Hub and registry of tests/campaign/test_pin.py, with any combination of
what makes it refuse (a checkpoint without a chat template, a chat_template.jinja left in the
tokenizer directory that the commit does not have, an image tag the registry does not know, a
gated repository and no token, a weight file the commit lacks) and whatever an older download
left in the tokenizer directory: pin either succeeds (no fault drawn) or exits non-zero with the
manifest and every file beside it byte for byte as they were. On 17e73d2 a refusal at the
tokenizer checks had already written the Hub's tokenizer files and the manifest."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from campaign.cli.main import main
from core.errors import EXIT_OK
from tests.campaign.test_pin import (
    ILLUSTRATIVE,
    TOKENIZER_FILES,
    WEIGHTS,
    Stubs,
    _manifest,
    _serve_images,
    stubs,  # noqa: F401  (the fixture, used by name below)
)
from tests.invariants import INVARIANT

FAULTS = ("no-chat-template", "stray-template-file", "unknown-image-tag", "gated-without-token", "weight-missing")


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _arrange(hub_and_registry: Stubs, faults: frozenset[str]) -> None:
    """The stubs as a fresh Hub and registry would be, then each fault drawn."""
    hub_and_registry.hub.files = dict(TOKENIZER_FILES)
    hub_and_registry.hub.lfs = dict(WEIGHTS)
    hub_and_registry.hub.gated_token = None
    hub_and_registry.registry.digests.clear()
    _serve_images(hub_and_registry)
    if "no-chat-template" in faults or "stray-template-file" in faults:
        del hub_and_registry.hub.files["chat_template.jinja"]
    if "no-chat-template" in faults:
        hub_and_registry.hub.files["tokenizer_config.json"] = json.dumps({"model_max_length": 4096}).encode()
    if "unknown-image-tag" in faults:
        hub_and_registry.registry.digests.pop(next(iter(hub_and_registry.registry.digests)))
    if "gated-without-token" in faults:
        hub_and_registry.hub.gated_token = "a token nobody gave"
    if "weight-missing" in faults:
        hub_and_registry.hub.lfs.pop(next(iter(hub_and_registry.hub.lfs)))


@INVARIANT
@given(
    faults=st.frozensets(st.sampled_from(FAULTS)),
    left=st.dictionaries(st.sampled_from(sorted(TOKENIZER_FILES)), st.binary(max_size=40), max_size=3),
)
def test_pin_either_succeeds_or_leaves_every_file_as_it_was(
    stubs: Stubs,  # noqa: F811
    manifest_data: dict[str, Any],
    faults: frozenset[str],
    left: dict[str, bytes],
) -> None:
    _arrange(stubs, faults)
    root = Path(tempfile.mkdtemp(prefix="pin-refusal-"))
    try:
        digests = (f"sha256:{ILLUSTRATIVE[3]}", f"sha256:{ILLUSTRATIVE[4]}")
        path = _manifest(root, json.loads(json.dumps(manifest_data)), stubs.host, digests=digests)
        tok = root / "tok"
        tok.mkdir()
        for name, data in left.items():  # an older download, or a template from another checkpoint
            (tok / name).write_bytes(data)
        if "stray-template-file" in faults:
            (tok / "chat_template.jinja").write_text("a template left from another checkpoint")
        before = _tree(root)

        code = main(["pin", str(path)])

        if not faults:
            assert code == EXIT_OK
        else:
            assert code != EXIT_OK, faults
            after = _tree(root)
            changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
            assert changed == [], (sorted(faults), changed)
    finally:
        shutil.rmtree(root, ignore_errors=True)
