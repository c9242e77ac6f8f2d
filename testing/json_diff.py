"""Two JSON documents compared field by field: every path where they differ, with both values.

Used where a figure must survive something (a resume, a rebuild, a renaming): the invariants in
tests/invariants and the offline fault proofs compare whole report.json trees rather than the
decision alone, so a figure that changed beneath an unchanged verdict is caught and named."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    path: str  # dotted, list items by index: "fleets.g6.capacity.steps.0.instances"
    left: Any
    right: Any

    def __str__(self) -> str:
        return f"{self.path}: {self.left!r} != {self.right!r}"


_ABSENT = object()


def differences(left: Any, right: Any, path: str = "", rel: float = 0.0) -> list[Difference]:
    """Every leaf or shape where `left` and `right` differ. Numbers are equal within `rel` relative
    (0: exactly; an int and a float of the same value are equal); a key on one side only is a
    difference with the other side shown as <absent>."""
    if isinstance(left, dict) and isinstance(right, dict):
        out: list[Difference] = []
        for k in sorted(left.keys() | right.keys(), key=str):
            a, b = left.get(k, _ABSENT), right.get(k, _ABSENT)
            where = f"{path}.{k}" if path else str(k)
            if a is _ABSENT or b is _ABSENT:
                out.append(Difference(where, "<absent>" if a is _ABSENT else a, "<absent>" if b is _ABSENT else b))
            else:
                out += differences(a, b, where, rel)
        return out
    if isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            return [Difference(path, f"{len(left)} items", f"{len(right)} items")]
        out = []
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            out += differences(a, b, f"{path}.{i}" if path else str(i), rel)
        return out
    if _number(left) and _number(right):
        same = left == right or (rel > 0 and math.isclose(left, right, rel_tol=rel))
        return [] if same else [Difference(path, left, right)]
    return [] if left == right and type(left) is type(right) else [Difference(path, left, right)]


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
