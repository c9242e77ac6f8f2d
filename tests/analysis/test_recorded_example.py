"""The example campaign's intervals, recorded, against the code that computes them now.

tests/analysis/data/example-run holds the records of a real `campaign local` run of the example
manifest (emulated fleets, the capacity search on both, 2026-12-04) and `expected.json`: the
intervals the analysis computed from them before issue 31 (commit d8a13d5: a pure-Python
bootstrap on every scenario). The order-statistic intervals must be unchanged exactly; the
capacity intervals and everything derived from them within the bootstrap's own noise (the
old and the new bootstrap draw different resamples).

The manifest is a copy with its trace path made relative to this folder; the records' digest is
rewritten to that copy's on the way in, since a digest names the manifest's canonical form,
which changes whenever the manifest schema gains a field.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.measure import intervals
from analysis.model import Report
from analysis.sources.records import load_records
from core import stats
from core.manifest import Manifest, load_manifest
from tests.analysis.conftest import EXAMPLE_RUN as FIXTURE
from tests.analysis.conftest import recorded_digest as _digest_of


def staged(tmp_path: Path) -> tuple[Manifest, Path]:
    """The recorded run under tmp_path, every record and summary carrying the copy's digest."""
    m = load_manifest(FIXTURE / "manifest.yaml", check_files=False)
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    for p in run.rglob("*"):
        if p.suffix == ".jsonl":
            lines = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]
            p.write_text(
                "".join(json.dumps({**r, "manifest_digest": m.digest}) + "\n" for r in lines), encoding="utf-8"
            )
        elif p.suffix == ".json" and p.name.startswith("summary"):
            data = json.loads(p.read_text(encoding="utf-8"))
            p.write_text(json.dumps({**data, "manifest_digest": m.digest}), encoding="utf-8")
    return m, run


def intervals_of(report: dict[str, Any]) -> dict[str, Any]:
    """The figures expected.json keeps: every interval of the report and the decision."""
    fleets = {}
    for name, f in report["fleets"].items():
        steps = {
            s["label"]: [s.get("p95_ttft_ci_s"), s.get("p95_itl_ci_s")]
            for s in (f.get("capacity") or {}).get("steps", [])
        }
        fleets[name] = {
            k: f.get(k)
            for k in (
                "p95_ttft_ci_s",
                "p95_itl_ci_s",
                "capacity_ci_tok_s",
                "instances_required_ci",
                "monthly_cost_ci_usd",
            )
        } | {"steps": steps}
    return {
        "fleets": fleets,
        "monthly_delta_ci_usd": report.get("monthly_delta_ci_usd"),
        "payback_months_ci": report.get("payback_months_ci"),
    }


@pytest.fixture(scope="module")
def recorded_report(_recorded_pages: tuple[Report, Path]) -> dict[str, Any]:
    """The recorded run's report (tests.analysis.report_pages.recorded_pages, built once a session
    in tests/analysis/conftest.py; its pages do not change report.json)."""
    return _recorded_pages[0].model_dump(mode="json")


def test_order_statistic_intervals_are_unchanged(recorded_report: dict[str, Any]) -> None:
    want = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
    got = intervals_of(recorded_report)
    for name, f in want["fleets"].items():
        assert got["fleets"][name]["p95_ttft_ci_s"] == f["p95_ttft_ci_s"]
        assert got["fleets"][name]["p95_itl_ci_s"] == f["p95_itl_ci_s"]
        assert got["fleets"][name]["steps"] == f["steps"]


def _close(got: float | None, want: float | None, tol: float) -> bool:
    return (got is None) == (want is None) and (got is None or want is None or abs(got - want) <= tol)


def test_capacity_intervals_are_unchanged_within_bootstrap_noise(recorded_report: dict[str, Any]) -> None:
    """Noise: the spread (4 sd) of the new bootstrap's ends over seeds on the same step's tokens,
    relative to the interval's width, applied to every interval derived from it."""
    want = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
    got = intervals_of(recorded_report)
    m = load_manifest(FIXTURE / "manifest.yaml", check_files=False)
    for name, f in want["fleets"].items():
        lo, hi = f["capacity_ci_tok_s"]
        g_lo, g_hi = got["fleets"][name]["capacity_ci_tok_s"]
        basis = recorded_report["fleets"][name]["intervals"]["basis"]
        tokens = _basis_tokens(name, basis, m)
        ends = np.array([stats.bootstrap_sum_ci(tokens, seed=s) for s in range(20)])
        rel_noise = 4 * float(ends.std(axis=0, ddof=1).max()) / float(tokens.sum())
        scale = (hi or 0.0) + (lo or 0.0)
        assert _close(g_lo, lo, rel_noise * scale) and _close(g_hi, hi, rel_noise * scale), (
            name,
            f,
            got["fleets"][name],
        )
        assert got["fleets"][name]["instances_required_ci"] == pytest.approx(f["instances_required_ci"], abs=1)
    for key in ("monthly_delta_ci_usd", "payback_months_ci"):
        w, g = want[key], got[key]
        assert (w is None) == (g is None), key
        for a, b in zip(w or [], g or [], strict=True):
            assert (a is None) == (b is None), key
            if a is not None and b is not None:  # an integer instance more or fewer moves these by a step
                assert b == pytest.approx(a, rel=0.25), (key, w, g)


def _basis_tokens(fleet: str, basis: str, m: Manifest) -> np.ndarray:
    run = FIXTURE / ("records" if basis == "replay" else f"capacity/{basis}")  # a search step's label is fleet/x<k>
    rs = load_records(run, _digest_of(run))
    return intervals.successful_tokens_per_request(rs, fleet, m.slo.ttft_p95_s, m.slo.itl_p95_s)
