"""The import graph of the project's own packages, function-level imports included (grimp reads
every import statement, as import-linter does): no circle anywhere, and the two largest
packages keep their roots small (docs/layout.md). import-linter's contracts (make lint) hold the
layers; a circle inside one layer is what they cannot see, which this test does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

from tests.conftest import ROOT

FIRST_PARTY = ("bench", "testing", "campaign", "loadgen", "runtime", "analysis", "stacks", "core")


def circles(imports: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(imports.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_circle_finder_finds_circles_and_only_circles() -> None:
    # The circle issue 38 found: cli -> aws_cli / report_cli -> cli (for MANIFEST_HELP).
    old = {
        "campaign.cli.main": ["campaign.cli.aws_cmds", "campaign.cli.report_cmds", "core.manifest"],
        "campaign.cli.aws_cmds": ["campaign.cli.main", "campaign.stages.run"],
        "campaign.cli.report_cmds": ["campaign.cli.main", "campaign.cli.aws_cmds"],
        "campaign.stages.run": ["core.manifest"],
    }
    assert circles(old) == [["campaign.cli.aws_cmds", "campaign.cli.main", "campaign.cli.report_cmds"]]
    assert circles({"a": ["b"], "b": ["c"], "c": []}) == []
    assert circles({"a": ["a"]}) == []  # a module naming itself is no circle between modules


def test_no_import_circle_between_first_party_modules() -> None:
    packages = [p for p in FIRST_PARTY if (ROOT / p / "__init__.py").is_file()]
    graph = grimp.build_graph(*packages, include_external_packages=False)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert circles(imports) == []


def _root_modules(package: Path) -> list[str]:
    return sorted(p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def test_campaign_and_analysis_keep_small_roots() -> None:
    """Their modules live in sub-packages by role (docs/layout.md): at most 8 at each root."""
    for name in ("campaign", "analysis"):
        assert len(_root_modules(ROOT / name)) <= 8, (name, _root_modules(ROOT / name))
