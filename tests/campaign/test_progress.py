"""Live progress follows the record files as they grow: a half-written line waits for the next
poll, and the P95 is the report's (nearest rank)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from campaign.stages.progress import RecordTail
from core.manifest import Manifest
from tests.analysis.synth import manifest, rec


def _line(m: Manifest, i: int, ttft: float) -> bytes:
    return (json.dumps(asdict(rec(m, "g6", i, ttft=ttft))) + "\n").encode()


def test_tail_waits_for_the_rest_of_a_half_written_line(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = manifest(manifest_data)
    f = tmp_path / "records-g6-w0.jsonl"
    lines = [_line(m, i, ttft=0.01 * (i + 1)) for i in range(20)]  # TTFTs 10..200 ms
    f.write_bytes(b"".join(lines[:19]) + lines[19][:30])
    tail = RecordTail(tmp_path, "g6", scheduled=20)
    assert tail.poll().done == 19
    with f.open("ab") as fh:
        fh.write(lines[19][30:])
    p = tail.poll()
    assert p.done == 20 and p.failed == 0
    assert p.ttft_p95_s == 0.19  # the 19th of 20 (nearest rank), not interpolated (0.1905)
