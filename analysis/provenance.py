"""Every number in a report says where it came from: measured, pulled, snapshot, manifest or assumption."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SourceKind = Literal["measured", "pulled", "snapshot", "manifest", "assumption", "computed"]


@dataclass(frozen=True)
class Sourced:
    value: float
    source: SourceKind
    detail: str

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class Gap:
    """Evidence the report needed but did not get. `blocks_go` gaps turn a Go into a Defer."""

    what: str
    reason: str
    blocks_go: bool = True

    def as_dict(self) -> dict[str, object]:
        return {"what": self.what, "reason": self.reason, "blocks_go": self.blocks_go}
