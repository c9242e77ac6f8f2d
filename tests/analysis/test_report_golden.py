"""The example's report.json, built from the recorded run, against a golden copy.

tests/analysis/data/report_golden.json was written by the analysis as it stood before issue 28
split analysis/report/build.py and typed its evaluation (the analysis of commit 7a6709f): a refactor that
changes no behaviour leaves every field equal. Set REPORT_GOLDEN_WRITE=1 to write the file
again after a change that is meant to alter the report (and say so in the commit).

Left out of the comparison, because they vary from run to run and not with the code:
- `generated_at`: the clock;
- the manifest digest, wherever it stands (`manifest_digest`, provenance.manifest's detail):
  it names the manifest copy's canonical form, which changes whenever the manifest schema
  gains a field (tests/analysis/test_recorded_example.py rewrites the records' digest for it).
The report holds no absolute path: records and capacity steps are named relative to the output
directory (provenance.run_relative). Floats are compared to 1e-9 relative: duckdb's parallel
aggregates may sum in another order from one run to the next.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from analysis.model import Report

GOLDEN = Path(__file__).parent / "data" / "report_golden.json"
DIGEST = "<manifest digest>"


def normalized(x: Any, digest: str) -> Any:
    """The report with the fields that vary run to run set aside (see the module docstring)."""
    if isinstance(x, dict):
        return {k: normalized(v, digest) for k, v in x.items() if k != "generated_at"}
    if isinstance(x, list):
        return [normalized(v, digest) for v in x]
    if isinstance(x, str):
        return x.replace(digest, DIGEST)
    return x


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Every path at which the two differ (dicts by key, whatever their order; floats to 1e-9 relative)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want.keys() - got.keys()]
        out += [f"{where}.{k}: not in the golden" for k in got.keys() - want.keys()]
        for k in want.keys() & got.keys():
            out += differences(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, the golden has {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, float | int) and not isinstance(got, bool):
        return [] if math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12) else [f"{where}: {got!r} != {want!r}"]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]


def example_report(out: Path) -> dict[str, Any]:
    """The recorded example's report.json, as tests.analysis.report_pages.recorded_pages wrote it
    under `out`, normalized."""
    written = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return dict(normalized(written, written["manifest_digest"]))


def test_the_example_report_equals_the_golden(recorded_pages: tuple[Report, Path]) -> None:
    got = example_report(recorded_pages[1])
    if os.environ.get("REPORT_GOLDEN_WRITE"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip(f"wrote {GOLDEN}")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    diff = differences(got, want)
    assert not diff, f"{len(diff)} field(s) differ from {GOLDEN.name}:\n" + "\n".join(diff[:40])
