"""Every number in a report says where it came from: measured, pulled, snapshot, manifest or assumption."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from analysis.model import Gap as Gap  # the stages' gaps are report.json's, named here as before

if TYPE_CHECKING:
    from core.manifest import Manifest

SourceKind = Literal["measured", "pulled", "snapshot", "manifest", "assumption", "computed"]


@dataclass(frozen=True)
class Sourced:
    value: float
    source: SourceKind
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "source": self.source, "detail": self.detail}


def run_relative(path: str | Path, run_dir: str | Path) -> str:
    """`path` as a report prints it: relative to the run directory the report is written to (a
    directory outside it gets `../`), so a report names no directory of the machine that ran it
    and stays true when the run directory is copied or archived. An s3:// URI is printed whole."""
    if str(path).startswith("s3://"):
        return str(path)
    return Path(os.path.relpath(Path(path).resolve(), Path(run_dir).resolve())).as_posix()


def manifest_provenance(m: Manifest) -> dict[str, str]:
    """The manifest's provenance entry: its file name (a path relative to its own directory) and
    its canonical digest, which is what identifies it."""
    name = m.source.name if m.source is not None else "<in memory>"
    return {"source": "manifest", "detail": f"{name} digest {m.digest}"}


@dataclass
class Findings:
    """What one report stage learned besides its result: the gaps it met and where its inputs came
    from (provenance key -> {source, detail[, value]}). Each stage returns its own; the report
    concatenates them with `+` in a fixed order, so no stage writes into another's."""

    gaps: list[Gap] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)

    def __add__(self, other: Findings) -> Findings:
        return Findings([*self.gaps, *other.gaps], {**self.provenance, **other.provenance})
