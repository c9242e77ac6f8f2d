"""The server's P95s over one step's window, from the series the run saved (analysis.sources.server_series).

Two rules decide whether a window's buckets are a figure at all:
- Too short: a window under MIN_SCRAPES scrape intervals. `increase` extrapolates the samples
  it has to the ends of the range, by up to half a scrape interval at each edge where a series
  starts or ends (Prometheus docs, "Query functions", increase: it "is extrapolated to cover the
  full time range as specified in the range vector selector"; the half-interval limit:
  prometheus/prometheus commit c77c3a8, "promql: Limit extrapolation of delta/rate/increase"), so
  over a few scrapes the edges are a large share of the count.
- A serving target down for part of the window: Prometheus stores `up` = 0 for each failed scrape
  (Prometheus docs, "Jobs and instances": "1 if the instance is healthy, i.e. reachable, or 0 if
  the scrape failed"), and no sample at all while a target is out of service discovery (an
  instance replaced). So both are checked per target: `min_over_time(up[w])` (0: a failed
  scrape) and `count_over_time(up[w])` against the window's scrapes (fewer: gone part of the
  time). Either makes the step a gap, never a smaller histogram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analysis.errors import AnalysisError
from analysis.measure.histogram import Bucket, quantile_in_bucket
from analysis.sources.prometheus import RawQuery
from analysis.sources.server_series import HISTOGRAMS, SavedSeries

MIN_SCRAPES = 6  # a window shorter than this many scrape intervals is too short for server truth
# A target may miss one scrape at each edge of the window without being down: the first and last
# scrapes fall wherever the scrape clock puts them.
EDGE_SCRAPES = 2
TOO_SHORT = "too short for server truth"

Status = Literal["ok", "too_short", "target_down", "no_series"]


@dataclass(frozen=True)
class ServerFigures:
    """What one saved step gives: the server's P95s, or why it gives none."""

    status: Status
    p95_ttft_s: float | None
    p95_itl_s: float | None
    note: str
    # The buckets each P95 was interpolated in: its resolution, and its gap's (gap_at_resolution).
    ttft_bucket: Bucket | None = None
    itl_bucket: Bucket | None = None


def _buckets(q: RawQuery, where: str) -> dict[float, float]:
    try:
        return {float(s["metric"]["le"]): float(s["value"][1]) for s in q.result}
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise AnalysisError(f"{where}: a bucket series without le or value ({exc!r})") from None


def _targets(q: RawQuery | None, where: str) -> dict[str, float]:
    try:
        return {} if q is None else {str(s["metric"].get("instance", "?")): float(s["value"][1]) for s in q.result}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise AnalysisError(f"{where}: an up series without metric or value ({exc!r})") from None


def down_targets(saved: SavedSeries, where: str = "") -> list[str]:
    """Serving targets down for part of the window: a failed scrape, or missing scrapes."""
    expected = saved.window_s / saved.scrape_interval_s
    low = _targets(saved.queries.get("up_min"), f"{where}: queries.up_min")
    samples = _targets(saved.queries.get("up_samples"), f"{where}: queries.up_samples")
    down = [f"{t}: a failed scrape (up = 0)" for t, v in sorted(low.items()) if v < 1]
    down += [
        f"{t}: {n:g} of ~{expected:.0f} scrapes" for t, n in sorted(samples.items()) if n < expected - EDGE_SCRAPES
    ]
    return down


def server_step(saved: SavedSeries, where: str = "") -> ServerFigures:
    """The step's server P95s from its saved series, or the reason it has none; `where` names the
    file in errors."""
    interval = saved.scrape_interval_s
    if saved.window_s < MIN_SCRAPES * interval:
        why = f"{TOO_SHORT}: a {saved.window_s:.1f} s window is under {MIN_SCRAPES} scrapes of {interval:g} s"
        return ServerFigures("too_short", None, None, why)
    if not _targets(saved.queries.get("up_samples"), f"{where}: queries.up_samples"):
        return ServerFigures("target_down", None, None, "no serving target was scraped over the window")
    down = down_targets(saved, where)
    if down:
        return ServerFigures("target_down", None, None, "a target was down for part of the window: " + "; ".join(down))
    p95: dict[str, tuple[float, Bucket] | None] = {}
    for key in HISTOGRAMS:
        q = saved.queries.get(key)
        p95[key] = None if q is None else quantile_in_bucket(0.95, _buckets(q, f"{where}: queries.{key}"))
    if all(v is None for v in p95.values()):
        return ServerFigures("no_series", None, None, "the server's histograms have no observations in the window")
    ttft, itl = p95["server_ttft"], p95["server_itl"]
    return ServerFigures(
        "ok",
        None if ttft is None else ttft[0],
        None if itl is None else itl[0],
        "",
        None if ttft is None else ttft[1],
        None if itl is None else itl[1],
    )
