"""The server's own histograms per step, kept with the run: `metrics/<fleet>/<step>.json`.

At the end of a run the campaign pulls, per fleet and for the replay, every capacity step and
every settle segment, the serving stack's TTFT and ITL buckets over exactly that step's window
(`sum by (le)` of `increase`, analysis.sources.prometheus) and the serving targets' `up` checks,
and writes each raw query result with its query text and window (`pull_step` + `write_series`).
The report computes every per-step server figure from those files alone (analysis.measure.server_truth), so
`report --run-dir` gives the same figures with no network, and an edited file changes them.

What makes a window's buckets a figure, or a gap, is analysis.measure.server_truth's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from analysis.errors import AnalysisError
from analysis.sources.prometheus import (
    HistogramNames,
    PrometheusSource,
    RawQuery,
    merged_bucket_query,
    raw_query,
    scrape_widened,
    target_up_queries,
)

METRICS_DIR = "metrics"  # in the run directory
HISTOGRAMS = ("server_ttft", "server_itl")
UP_CHECKS = tuple(target_up_queries({}, 0, 1))


@dataclass(frozen=True)
class SavedSeries:
    """One fleet's step as pulled: the window, the scrape interval and each raw query result."""

    fleet: str
    step: str  # "replay", the capacity step's label ("x1.41", "g6/x2") or "<label>+settle-<n>"
    url: str
    window_unix: tuple[float, float]  # first send to last completion, Unix seconds
    scrape_interval_s: float
    queries: dict[str, RawQuery | None]  # HISTOGRAMS and up_min / up_samples; None: the stack has no such series

    @property
    def window_s(self) -> float:
        return self.window_unix[1] - self.window_unix[0]


def step_file_name(step: str) -> str:
    """'g6/x2' -> 'x2.json' (the fleet is the directory), 'x1.41+settle-1' -> 'x1.41+settle-1.json'."""
    return step.rsplit("/", 1)[-1] + ".json"


def series_path(metrics_dir: Path, fleet: str, step: str) -> Path:
    return metrics_dir / fleet / step_file_name(step)


def pull_step(
    src: PrometheusSource,
    names: HistogramNames,
    fleet: str,
    step: str,
    window: tuple[float, float],
    scrape_interval_s: float,
) -> SavedSeries:
    """The step's raw query results, over the window widened by one scrape interval each side and
    queried at its end (scrape_widened). Steps are apart by the load generator's start and stop,
    so the widening rarely reaches another step's requests. Raises SourceUnavailable when
    Prometheus does not answer."""
    start, end = window
    begin, at = scrape_widened(start, end, scrape_interval_s)
    labels = {names.fleet_label: fleet}
    queries: dict[str, RawQuery | None] = {}
    itl = names.server_itl
    if itl and names.server_itl_fallback and not src.has_series(itl, labels, begin, at):
        itl = names.server_itl_fallback  # older vLLM releases
    for key, metric in (("server_ttft", names.server_ttft), ("server_itl", itl)):
        queries[key] = None if metric is None else raw_query(src, merged_bucket_query(metric, labels, begin, at), at)
    for key, expr in target_up_queries(labels, begin, at).items():
        queries[key] = raw_query(src, expr, at)
    return SavedSeries(fleet, step, src.url, (start, end), scrape_interval_s, queries)


def write_series(metrics_dir: Path, saved: SavedSeries) -> Path:
    path = series_path(metrics_dir, saved.fleet, saved.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = asdict(saved)
    path.write_text(json.dumps(body, indent=2), encoding="utf-8")
    return path


def read_series(path: Path) -> SavedSeries:
    """A saved step back; a file that is not one is an AnalysisError naming the file and field."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path}: not a saved Prometheus series ({exc})") from None
    field = "?"
    try:
        field = "window_unix"
        start, end = (float(v) for v in d["window_unix"])
        field = "scrape_interval_s"
        interval = float(d["scrape_interval_s"])
        if not interval > 0:
            raise ValueError(f"expected a positive number of seconds, got {interval}")
        queries: dict[str, RawQuery | None] = {}
        for key in (*HISTOGRAMS, *UP_CHECKS):
            field = f"queries.{key}"
            q = d["queries"][key]
            queries[key] = None if q is None else RawQuery(str(q["query"]), float(q["at"]), list(q["result"]))
        field = "fleet"
        return SavedSeries(str(d["fleet"]), str(d["step"]), str(d["url"]), (start, end), interval, queries)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnalysisError(f"{path}: {field}: {exc!r}") from None


def read_fleet_series(metrics_dir: Path, fleet: str) -> list[SavedSeries]:
    """Every saved step of one fleet (none when the run saved none)."""
    d = metrics_dir / fleet
    return [read_series(p) for p in sorted(d.glob("*.json"))] if d.is_dir() else []
