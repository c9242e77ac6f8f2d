"""Two report.json trees (or any JSON) compared field by field: every path where they differ, with both values.

Where a figure must survive something (a resume, a rebuild, a renaming), the offline fault proof
(testing.cloud_offline_resume) and the invariants (tests/invariants) compare whole trees rather
than the decision alone, so a figure that changed beneath an unchanged verdict is caught and named."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def report_differences(ran: Any, again: Any, skip: Collection[str] = ()) -> tuple[int, list[str]]:
    """Walk two report.json trees (`ran`: the run's, `again`: `report --run-dir`'s) field by field:
    how many leaf fields were compared, and each difference as "<path>: <ran> vs <again>" (a path
    such as `fleets.g6.capacity.search.steps[2].goodput_tok_s`; "absent" where one tree lacks it).
    A path in `skip` is not compared (nor anything under it)."""
    differences: list[str] = []
    compared = 0

    def walk(a: Any, b: Any, path: str) -> None:
        nonlocal compared
        if path in skip:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in list(a) + [k for k in b if k not in a]:
                sub = f"{path}.{key}" if path else str(key)
                if key not in a or key not in b:
                    if sub not in skip:
                        differences.append(f"{sub}: {a.get(key, 'absent')!r} vs {b.get(key, 'absent')!r}")
                    continue
                walk(a[key], b[key], sub)
            return
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                differences.append(f"{path}: {len(a)} item(s) vs {len(b)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{path}[{i}]")
            return
        compared += 1
        # bool is an int in Python: True == 1 would pass; a figure must keep its type too
        if a != b or type(a) is not type(b):
            differences.append(f"{path}: {a!r} vs {b!r}")

    walk(ran, again, "")
    return compared, differences
