"""The rehearsal's plan (issue 51): the campaign's own stages, driven with the fixed shape of
core.rehearsal, through a manifest derived from the campaign's.

`deploy --rehearsal` and `run --rehearsal` both write it beside the campaign's manifest
(`<stem>.rehearsal.yaml`, so its relative paths, the trace's, the tokenizer's and the scorers',
resolve as the campaign's do) and use it in place of the campaign's: the stack is deployed for it,
its tasks check its digest, its runs sit under its own results prefix. The file is rewritten from
the campaign's manifest every time, byte for byte the same for the same manifest, so the deploy and
the run agree on its digest. What it changes, and nothing else:
- the window, cut to `REPLAY_S` seconds: the trace replay of the rehearsal;
- the capacity search: `CAPACITY_STEPS` steps (max_steps counts the replay when it is long
  enough to count as a step; the rehearsal report counts the steps that ran), a tolerance no
  two steps can meet, so the search does not end on convergence before them, and the settle
  phase's budget at `SETTLE_SEGMENTS` segments, each with a step's room, run settled or not
  (`settle_min_segments`);
- no fixed sweep (a sweep has no settle phase).
The fleets, their serving stacks and images, the gate's fixtures, the SLO and the costs are the
campaign's: the stacks (`-c rehearsal=1`) put each fleet's emulator on the rehearsal's host type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from core import rehearsal
from core.manifest import Manifest, ManifestError, manifest_from_data, parse_yaml, semantic_issues

SUFFIX = ".rehearsal.yaml"
# The smallest tolerance the manifest allows is > 0: at this one, no bracket of two steps (at the
# search's growth of 2 at least) converges, so the search runs to max_steps.
TOLERANCE = 0.01


def rehearsal_path(manifest: Path) -> Path:
    return manifest.with_name(f"{manifest.stem}{SUFFIX}")


def is_rehearsal(manifest: Path) -> bool:
    return manifest.name.endswith(SUFFIX)


def rehearsal_data(data: dict[str, Any]) -> dict[str, Any]:
    """The campaign manifest's `data` with the rehearsal's fixed shape (see the module's docstring)."""
    out = dict(data)
    workload = dict(out.get("workload") or {})
    window = dict(workload.get("window") or {})
    if "duration_s" in window:
        window["duration_s"] = min(float(window["duration_s"]), rehearsal.REPLAY_S)
    workload["window"] = window
    search = dict(workload.get("capacity_search") or {})
    search.update(
        start_multiplier=1.0,
        tolerance=TOLERANCE,
        max_steps=rehearsal.CAPACITY_STEPS + 1,
        # room for the steps at their span and drain, and the load generator's start and stop
        time_budget_s=(rehearsal.CAPACITY_STEPS + 1) * 4 * rehearsal.STEP_S,
        # The same room per segment: the settle phase counts a segment's arrivals, its drain and
        # the load generator's start and stop (campaign.stages.settle._over_budget), and one that
        # does not fit is skipped, which the rehearsal's tasks seam fails on.
        settle_budget_s=rehearsal.SETTLE_SEGMENTS * 4 * rehearsal.STEP_S,
        settle_budget_usd=None,
        # run whether or not the decision is settled: the phase's tasks are part of what it proves
        settle_min_segments=rehearsal.SETTLE_SEGMENTS,
    )
    workload.pop("capacity_sweep", None)
    workload["capacity_search"] = search
    out["workload"] = workload
    return out


def _data(manifest: Path) -> dict[str, Any]:
    if is_rehearsal(manifest):
        raise ValueError(f"{manifest}: already a rehearsal's manifest; give the campaign's")
    return rehearsal_data(parse_yaml(manifest.read_text(encoding="utf-8"), str(manifest)))


def load_rehearsal(manifest: Path) -> Manifest:
    """The rehearsal's manifest built from the campaign's in memory, as if read from its path
    (rehearsal_path): nothing is written, so a refusal on it leaves no file. ManifestError as
    load_manifest raises it; ValueError for a manifest that is itself a rehearsal's."""
    path = rehearsal_path(manifest)
    m = manifest_from_data(_data(manifest), source=path)
    issues = semantic_issues(m, check_files=True)
    if issues:
        raise ManifestError(issues, str(path))
    return m


def write_rehearsal_manifest(manifest: Path) -> Path:
    """The rehearsal's manifest beside `manifest` (rehearsal_path), written from it now; its path.
    Refused (ValueError) for a manifest that is itself a rehearsal's."""
    data = _data(manifest)
    path = rehearsal_path(manifest)
    header = (
        f"# The rehearsal's manifest, written by `deploy --rehearsal` / `run --rehearsal` from {manifest.name}\n"
        "# (campaign/stages/rehearsal.py); edits here are overwritten: edit the campaign's manifest.\n"
    )
    text = header + yaml.safe_dump(data, sort_keys=False)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path
