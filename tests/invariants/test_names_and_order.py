"""Invariant: names and order do not matter (issue 47, 4).

The example's campaign, run in simulated time through the campaign's own stages (`campaign plan`'s
backend: campaign.stages.run.run_stages on SimulatedFleets), with its fleets renamed to any valid
names (one a prefix of another included: `g6` and `g6-big`, or the two names swapped) and listed in
either order, and with its fleets measured side by side or one at a time, leaves every file of the
run directory the same once each fleet's new name is read back as its old one: report.json's
figures, each fleet's capacity/<fleet>/search.json steps (labels, verdicts, multipliers), every
step's instance counts, the settle record, the records themselves.

Only what must differ is mapped: the manifest's digest (it hashes the names) and the run
directory's path; `VOLATILE` names the one field left out. The trace is the example's cut after
`TRACE_S` seconds, so that an example costs about 4 s of CPU instead of 11: the example's
campaign reads its seconds 600 to about 670, and every run compared here reads the same cut trace."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from campaign.backends.simulated.fleets import SimulatedFleets
from campaign.stages.run import run_stages
from core.manifest import manifest_from_data
from core.traces import read_trace
from tests.conftest import EXAMPLE_MANIFEST, ROOT
from tests.invariants import INVARIANT

# A whole campaign per example (about 4 s): few in `make test`, more under INVARIANTS_PROFILE=long.
EXAMPLES = {"ci": 2, "long": 40}[os.environ.get("INVARIANTS_PROFILE", "ci")]
CAMPAIGNS = settings(INVARIANT, max_examples=EXAMPLES)

TRACE_S = 1000.0  # the example's window starts at 600 s
VOLATILE = ("generated_at",)  # when the report was written
SLUG = re.compile(r"[a-z][a-z0-9-]{0,30}[a-z0-9]")  # core.manifest.Slug, a fleet's name


@dataclass(frozen=True)
class Variant:
    """The example's fleets renamed (old name -> new), listed in `order` (indices into the
    example's fleets[]), measured `concurrent` at a time."""

    names: Mapping[str, str]
    order: tuple[int, ...]
    concurrent: int


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example's manifest data on its trace cut after TRACE_S, with a savings plan on its
    baseline fleet so that the manifest's per-fleet field (costs.commitments[].fleet) is renamed too."""
    data: dict[str, Any] = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    src = ROOT / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
    fmt = data["workload"]["trace"]["format"]
    kept = {r.line for r in read_trace(src, fmt) if r.offset_s < TRACE_S}
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = tmp_path_factory.mktemp("trace") / src.name
    cut.write_text("".join(line for n, line in enumerate(lines, 1) if n == 1 or n in kept), encoding="utf-8")
    data["workload"]["trace"].update(path=str(cut), sha256=None)
    data["quality"]["task_acceptance"]["command"] = [
        sys.executable,
        str(ROOT / "manifests/scorers/answers_nonempty.py"),
    ]
    baseline = data["comparison"]["baseline"]
    data["costs"]["commitments"] = [
        {
            "fleet": baseline,
            "kind": "savings-plan",
            "covered_instances": 3,
            "effective_hourly_usd": 0.61,
            "term_months": 36,
        }
    ]
    return data


def renamed(data: Mapping[str, Any], v: Variant) -> dict[str, Any]:
    """The manifest data with every fleet name it holds replaced, and its fleets reordered."""
    out = copy.deepcopy(dict(data))
    out["fleets"] = [{**out["fleets"][i], "name": v.names[out["fleets"][i]["name"]]} for i in v.order]
    out["comparison"] = {role: v.names[name] for role, name in out["comparison"].items()}
    out["costs"]["commitments"] = [{**c, "fleet": v.names[c["fleet"]]} for c in out["costs"]["commitments"]]
    # A field naming a fleet that this function does not know of would keep an old name: none may
    # be left, as a value or a key, except where it is also a new name.
    stale = (set(v.names) - set(v.names.values())) & set(_leaves(out))
    assert not stale, f"the manifest names {stale} somewhere renamed() does not rename"
    return out


def _leaves(x: Any) -> list[str]:
    if isinstance(x, dict):
        return [str(k) for k in x] + [s for val in x.values() for s in _leaves(val)]
    if isinstance(x, list):
        return [s for val in x for s in _leaves(val)]
    return [x] if isinstance(x, str) else []


def run_campaign(data: Mapping[str, Any], run_dir: Path, concurrent: int) -> str:
    """The campaign in simulated time into `run_dir`, `concurrent` fleets at once; its manifest's digest."""
    m = manifest_from_data(dict(data))
    fleets = SimulatedFleets(m, overhead_s=60.0)
    fleets.concurrent = concurrent
    run_stages(m, fleets, run_dir, threading.Event(), full_report=False, log=lambda line: None)
    return m.digest


def name_pattern(names: Mapping[str, str]) -> re.Pattern[str]:
    """A fleet name where it stands as one: a key, a value, `g6/x0.5`, `capacity.g6`, `g6: ...`;
    not inside a longer name (`g6-big`), an instance type (`g6.xlarge`) or the campaign's name."""
    alts = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w-])({alts})(?![\w-]|\.\w)")


def records_file(name: str) -> re.Pattern[str]:
    return re.compile(rf"records-({re.escape(name)})-sim\.jsonl")


def run_tree(run_dir: Path, text: Callable[[str], str], names: Mapping[str, str]) -> dict[str, Any]:
    """Every JSON and JSONL file of a run directory, parsed, under its path with fleet names mapped."""
    out: dict[str, Any] = {}
    for p in sorted(run_dir.rglob("*")):
        if p.suffix not in (".json", ".jsonl"):
            continue
        parts = []
        for part in p.relative_to(run_dir).parts:
            rec = next((mt for n in names if (mt := records_file(n).fullmatch(part))), None)
            parts.append(names.get(part, part) if rec is None else f"records-{names[rec.group(1)]}-sim.jsonl")
        body = p.read_text(encoding="utf-8")
        parsed = [json.loads(line) for line in body.splitlines()] if p.suffix == ".jsonl" else json.loads(body)
        out["/".join(parts)] = _mapped(parsed, text)
    return out


def _mapped(x: Any, text: Callable[[str], str]) -> Any:
    if isinstance(x, dict):
        return {text(str(k)): _mapped(v, text) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_mapped(v, text) for v in x]
    return text(x) if isinstance(x, str) else x


def differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Where `a` and `b` differ, each as its JSON path and the two values (floats within 1e-9 relative)."""
    if isinstance(a, dict) and isinstance(b, dict):

        def key(k: str) -> str:
            return f"{at}.{k}" if at else f"{k}: $"  # the top level: the run's files

        out = [f"{key(k)}: only in the example's run" for k in sorted(a.keys() - b.keys())]
        out += [f"{key(k)}: only in the variant's run" for k in sorted(b.keys() - a.keys())]
        return out + [d for k in sorted(a.keys() & b.keys()) for d in differences(a[k], b[k], key(k))]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{at}: {len(a)} items, {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{at}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0):
        return []
    return [] if a == b and type(a) is type(b) else [f"{at}: {a!r} != {b!r}"]


def _mapper(names: Mapping[str, str], digest: tuple[str, str], run_dir: tuple[Path, Path]) -> Callable[[str], str]:
    """Text of the variant's run read as the example's: its fleet names, digest and directory mapped."""
    pattern = name_pattern(names)

    def text(s: str) -> str:
        s = s.replace(str(run_dir[0]), str(run_dir[1])).replace(digest[0], digest[1])
        s = s.replace(digest[0][:12], digest[1][:12])
        return pattern.sub(lambda mt: names[mt.group(1)], s)

    return text


@dataclass
class Example:
    tree: dict[str, Any]
    digest: str
    run_dir: Path
    words: str  # every string of the run: where a new name must not occur but as a fleet


@pytest.fixture(scope="module")
def example_run(base: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Example:
    """The example's campaign as listed, fleets side by side."""
    run_dir = tmp_path_factory.mktemp("example")
    digest = run_campaign(base, run_dir, concurrent=len(base["fleets"]))
    tree = run_tree(run_dir, lambda s: s, {})
    return Example(tree, digest, run_dir, "\n".join(_leaves(tree)))


@st.composite
def variants(draw: st.DrawFn) -> Variant:
    """New names for the example's two fleets: free, one a prefix of the other (with or without a
    hyphen), or the example's own two swapped; either listing; side by side or one at a time."""
    old = ("inf2", "g6")
    slug = st.from_regex(SLUG, fullmatch=True)
    kind = draw(st.sampled_from(["free", "prefix", "swap"]))
    if kind == "swap":
        new = ["g6", "inf2"]
    else:
        a = draw(slug)
        b = draw(slug) if kind == "free" else a + draw(st.sampled_from(["-", ""])) + draw(slug)
        assume(a != b and SLUG.fullmatch(b))
        new = draw(st.permutations([a, b]))
    return Variant(
        dict(zip(old, new, strict=True)), tuple(draw(st.permutations([0, 1]))), draw(st.sampled_from([1, 2]))
    )


@pytest.mark.timeout(max(300, 20 * (EXAMPLES + 3)))  # pyproject's 300 s holds the ci profile, not the long one
@CAMPAIGNS
@given(variants())
@example(Variant({"inf2": "inf2", "g6": "g6"}, (0, 1), 1))  # one fleet at a time against side by side
# one name a prefix of the other, the longer listed first (a prefix match for g6 finds g6-big)
@example(Variant({"inf2": "g6-big", "g6": "g6"}, (0, 1), 2))
@example(Variant({"inf2": "g6", "g6": "inf2"}, (1, 0), 1))  # the two names swapped, listed the other way
def test_names_and_order_change_no_figure(
    base: dict[str, Any], example_run: Example, tmp_path_factory: pytest.TempPathFactory, v: Variant
) -> None:
    fresh = set(v.names.values()) - set(v.names)
    assume(not fresh or not name_pattern({n: n for n in fresh}).search(example_run.words))
    run_dir = tmp_path_factory.mktemp("variant")
    digest = run_campaign(renamed(base, v), run_dir, v.concurrent)
    back = {new: old for old, new in v.names.items()}
    got = run_tree(run_dir, _mapper(back, (digest, example_run.digest), (run_dir, example_run.run_dir)), back)
    diffs = differences(example_run.tree, got)
    if diffs:
        pytest.fail(f"{v}: {len(diffs)} differences from the example's run, first:\n  " + "\n  ".join(diffs[:12]))
