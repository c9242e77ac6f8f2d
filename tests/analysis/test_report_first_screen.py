"""The report's first screen answers (verdict and why, the delta and the payback with their intervals,
what would change the verdict); the Fleets table shows the capacity each fleet is sized from with
its interval and the replay has a table of its own; goodput over time is a rate per step; every
figure links to its provenance. On the recorded example run (tests/analysis/data/example-run)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from analysis.model import Report
from analysis.report.render import plots
from analysis.report.render.cells import CHANGE_LABEL, ci_text, first_screen, fmt, payback_ci_text
from analysis.report.render.html import goodput_bins_per_step


@pytest.fixture
def recorded(recorded_pages: tuple[Report, Path]) -> tuple[Report, Path]:
    """The recorded example run's report and its pages (tests/analysis/conftest.py: built once)."""
    return recorded_pages


def first_screen_strings(r: Report) -> list[str]:
    """What the first screen must say for this report: the verdict, why, the delta and the payback with
    their intervals, and decision.to_settle's requests per fleet, minutes, USD and threshold."""
    ts = r.decision.to_settle
    assert (
        r.headline.decided and ts is not None and ts.threshold == "go"
    )  # the recorded run: Defer, evidence insufficient at Go
    out = [
        r.decision.state.upper(),
        "straddles the Go threshold",
        f"{fmt(r.monthly_delta_usd, 2)} USD/month, 95% CI {ci_text(r.monthly_delta_ci_usd, 2)}",
        f"{fmt(r.payback_months, 1)} months, 95% CI {payback_ci_text(r.payback_months_ci, r.monthly_delta_ci_usd)}",
        f"{fmt(ts.minutes, 1)} min and {fmt(ts.usd, 2)} USD",
        f"the Go threshold, {fmt(ts.threshold_usd_per_month, 2)} USD/month",
    ]
    out += [f"{name} {fmt(n)} (now {fmt(ts.by_fleet[name].requests_now)})" for name, n in ts.requests.items()]
    return out


def _section(md: str, heading: str) -> str:
    """A Markdown section's text, from its heading to the next heading of the same level."""
    level = heading.split(" ")[0]
    start = md.index(heading + "\n")
    nxt = md.find(f"\n{level} ", start + len(heading))
    return md[start : nxt if nxt >= 0 else None]


def test_report_md_opens_with_the_verdict_the_delta_the_payback_and_what_would_change_it(
    recorded: tuple[Report, Path],
) -> None:
    r, out = recorded
    md = (out / "report.md").read_text(encoding="utf-8")
    top = md.split("\n## ", 1)[0]  # before the first section
    for text in first_screen_strings(r):
        assert text in top, text
    assert f"**{CHANGE_LABEL}**: Measure " in top
    others = [x for x in r.decision.reasons if not x.startswith("evidence insufficient")]
    assert others and all(x in top for x in others)  # what else holds the verdict where it is


def test_report_html_opens_with_the_same(recorded: tuple[Report, Path]) -> None:
    r, out = recorded
    page = (out / "report.html").read_text(encoding="utf-8")
    top = page[page.index("<h1>") : page.index("<h2>")]
    assert '<section id="verdict"' in top
    text = " ".join(re.sub(r"<[^>]+>", " ", top).split())
    for want in first_screen_strings(r):
        assert " ".join(want.split()) in text, want


def test_a_report_that_is_not_decided_says_so_and_what_blocks_it(
    gate_reject_pages: tuple[dict[str, Any], Path],
) -> None:
    data, out = gate_reject_pages
    md = (out / "report.md").read_text(encoding="utf-8")
    top = md.split("\n## ", 1)[0]
    assert (
        top.startswith("# ")
        and "**Verdict: REJECT.** inf2: quality gate failed: fixture json-answer: schema invalid." in top
    )
    assert "**Payback**: not decided" in top and ": not decided\n" in top
    for blocked in data["headline"]["blocked_by"]:
        assert f"**Not decided: blocked by**: {blocked}" in top
    fs = first_screen(Report.model_validate(data))
    assert [label for label, _ in fs.lines][-1] == "Not decided: blocked by"


def test_fleets_show_the_capacity_each_is_sized_from_inside_its_interval_and_the_replay_has_its_own_table(
    recorded: tuple[Report, Path],
) -> None:
    r, out = recorded
    md = (out / "report.md").read_text(encoding="utf-8")
    fleets, replay = _section(md, "## Fleets"), _section(md, "## Trace replay")
    for name, f in r.fleets.items():
        assert (
            f.capacity is not None
            and f.capacity.step is not None
            and f.capacity_ci_tok_s is not None
            and f.size is not None
        )
        cap, (low, high) = f.capacity.per_instance_tok_s, f.capacity_ci_tok_s
        assert (
            cap is not None and low is not None and high is not None and low <= cap <= high
        )  # the point shown is inside its interval
        assert f.size.per_instance_tok_s == cap  # and is what the fleet is sized from
        row = f"| {name} ({f.instance_type}) | step {f.capacity.step} | {fmt(cap, 1)} | {ci_text(f.capacity_ci_tok_s, 1)} |"
        assert row in fleets, row
        # the x1 replay's own figures are in the replay's table, not beside the capacity
        replay_goodput = fmt(f.per_instance_goodput_tok_s, 1)
        assert replay_goodput != fmt(cap, 1) and f"| {replay_goodput} |" not in fleets
        assert f"| {name} ({f.instance_type}) | {fmt(f.requests)} | {fmt(f.successful_requests)} |" in replay
        assert f"| {replay_goodput} |" in replay and ("| FAIL |" if not f.slo_pass else "| pass |") in replay
    assert "| SLO |" not in fleets.split("\n- ")[0]  # no replay SLO verdict beside the sizing capacity


def test_every_figure_links_to_provenance_entries_that_exist(recorded: tuple[Report, Path]) -> None:
    r, out = recorded
    page = (out / "report.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    figures = re.findall(r"<figure>(.*?)</figure>", page, flags=re.S)
    assert len(figures) >= 6
    for fig in figures:
        links = re.findall(r"<figcaption>.*?</figcaption>", fig, flags=re.S)[0]
        targets = re.findall(r'href="#([^"]+)"', links)
        assert targets and all(t.startswith("prov-") and t in ids for t in targets), (fig[:80], targets)
    for key in r.provenance:  # every entry is an anchor
        assert f'<li id="prov-{key}">' in page, key


def test_goodput_steps_hold_several_arrivals_and_keep_the_tokens() -> None:
    assert goodput_bins_per_step(32, 60) == 15  # 8 arrivals of 32 span 15 of 60 bins
    assert goodput_bins_per_step(33, 60) == 15 and goodput_bins_per_step(20, 60) == 30  # rounded up to a divisor of 60
    assert (
        goodput_bins_per_step(10_000, 60) == 1
        and goodput_bins_per_step(1, 60) == 60
        and goodput_bins_per_step(5, 0) == 1
    )
    pts = [(10.0 + i, float(y)) for i, y in enumerate([0, 100, 0, 0, 300, 0, 50])]
    steps = plots.rate_steps(pts, 1.0, 3)
    assert steps == [
        (10.0, 3.0, 100 / 3),
        (13.0, 3.0, 100.0),
        (16.0, 3.0, 50 / 3),
    ]  # the last step padded, not shortened
    assert sum(w * y for _, w, y in steps) == pytest.approx(sum(y for _, y in pts))


def test_the_recorded_goodput_figure_is_a_rate_per_step(recorded: tuple[Report, Path]) -> None:
    r, out = recorded
    page = (out / "report.html").read_text(encoding="utf-8")
    fig = next(
        f for f in re.findall(r"<figure>(.*?)</figure>", page, flags=re.S) if 'aria-label="Goodput over time"' in f
    )
    step = re.search(r"completed in a ([\d.]+) s step", fig)
    assert step, fig[-600:]
    g = r.series.fleets["inf2"].goodput
    assert g is not None and len(g) > 60
    bin_s = g[1][0] - g[0][0]
    assert float(step.group(1)) == pytest.approx(
        15 * bin_s, abs=0.05
    )  # 32 requests: 15 of the window's 60 bins per step
    ranked = sorted(y for _, _, y in plots.rate_steps(g, bin_s, 15))
    assert ranked[-1] < max(y for _, y in g) / 2  # the steps do not spike like the bins
