"""Values changed in a YAML file's text in place: comments, order, quoting of the rest kept.

PyYAML's composer gives every node its start and end offsets in the text (`Node.start_mark.index`,
`end_mark.index`); a value is replaced by rewriting exactly that span, so nothing else of the
user's file moves. No round-trip YAML library is pinned in requirements, and none is needed for
values this small.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import yaml

from core.manifest import Issue

Path_ = tuple[str | int, ...]
# A plain scalar that YAML reads back as this same string (hashes, image references, file names).
_PLAIN = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./:@+-]*$")


@dataclass(frozen=True)
class SetValue:
    path: Path_  # to a scalar: ("model", "weight_files", "model-00001.safetensors")
    value: str


@dataclass(frozen=True)
class AddEntry:
    path: Path_  # to a block mapping; the entry goes after its last one, at the same indentation
    key: str
    value: str


Edit = SetValue | AddEntry


def apply_edits(text: str, edits: list[Edit]) -> str:
    """`text` with each edit made; a path that is not in it is a ValueError naming it."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    spans: list[tuple[int, int, str]] = []
    for e in edits:
        if isinstance(e, SetValue):
            node = _node_at(root, e.path)
            if not isinstance(node, yaml.ScalarNode):
                raise ValueError(f"{_dotted(e.path)}: not a single value")
            old = text[node.start_mark.index : node.end_mark.index]
            tail = old[len(old.rstrip()) :]  # a block scalar's span runs to the next line: keep its line breaks
            spans.append((node.start_mark.index, node.end_mark.index, _render(e.value) + tail))
        else:
            spans.append(_insertion(text, root, e))
    for start, end, new in sorted(spans, key=lambda s: s[0], reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _insertion(text: str, root: yaml.Node | None, e: AddEntry) -> tuple[int, int, str]:
    node = _node_at(root, e.path)
    if not isinstance(node, yaml.MappingNode) or node.flow_style or not node.value:
        raise ValueError(f"{_dotted(e.path)}: not a block mapping with entries to add {e.key} beside")
    last_key, last_value = node.value[-1]
    indent = " " * last_key.start_mark.column
    end = last_value.end_mark
    if end.column == 0:  # a block scalar: its span already ends at the start of the next line
        at = end.index
    else:
        newline = text.find("\n", end.index)
        at = len(text) if newline < 0 else newline + 1
    prefix = "" if at == 0 or text[at - 1] == "\n" else "\n"
    return at, at, f"{prefix}{indent}{_render(e.key)}: {_render(e.value)}\n"


def _node_at(root: yaml.Node | None, path: Path_) -> yaml.Node:
    node = root
    for i, part in enumerate(path):
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
        if node is None:
            raise ValueError(f"{_dotted(path[: i + 1])}: not in the file")
    assert node is not None
    return node


def _render(value: str) -> str:
    """A plain scalar where YAML reads it back unchanged, else a double-quoted one (JSON's string
    escapes are YAML's: YAML 1.2, 7.3.1 "Double-Quoted Style")."""
    plain = _PLAIN.match(value) is not None and yaml.safe_load(value) == value  # "1e5..." would read as a number
    return value if plain else json.dumps(value, ensure_ascii=False)


def _dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + part
    return out


def edit_issue(exc: ValueError) -> Issue:
    """A failed edit as the manifest field it could not write."""
    where, _, reason = str(exc).partition(": ")
    return Issue(where, f"cannot be written in place ({reason})")
