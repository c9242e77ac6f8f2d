"""Pinned requirement files read as {distribution: version}, and the installed closure of a set
of distributions: what the image and packaging tests compare imports against."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path


def norm(name: str) -> str:
    """A distribution name as PEP 503 normalizes it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """Every `name==version` line of a requirements file, following `-r other.txt`; any other
    line fails, naming the file and line."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(pins(path.parent / line[3:].strip()))
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        assert m, f"{path.name}:{n}: {line!r} is not pinned with =="
        out[norm(m.group(1).split("[")[0])] = m.group(2)
    return out


def closure(roots: set[str]) -> set[str]:
    """`roots` and everything they require (no extras), as installed here."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue  # a dependency under a platform marker false here (e.g. pywin32)
        seen.add(name)
        for req in reqs:
            if "extra ==" in req:
                continue
            dep = re.match(r"[A-Za-z0-9_.\-]+", req)
            assert dep
            todo.append(norm(dep.group(0)))
    return seen
