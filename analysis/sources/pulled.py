"""Every answer a report pulls from outside the run, kept with the run: `pulled/<source>.json`.

The report's evidence from AWS (CloudWatch; the Auto Scaling activities, target groups and NLB
health behind time to ready; Cost Explorer; the Price List API) and from Prometheus (the replay
window's cross-check and the prefix-cache hit rates) goes through one `PulledSource` per source.
Pulled live, each call's request and its answer (or its failure) is written to the source's file
as it comes, and the caller gets the answer back as the file holds it (its JSON form), so every
figure is computed from exactly what is saved. Rebuilt from a run directory (`report --run-dir`,
after teardown), the same calls are answered from the file with no network; a call the file does
not hold fails, naming the file. Each file keeps when it was pulled, and a source that asks for
"now" (time to ready's end, Cost Explorer's 14-day HOURLY reach, the prices' date) gets that
time back, so the rebuilt report asks the same questions the run asked.

The per-step server series are kept apart, in metrics/ (analysis.sources.server_series).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.errors import AnalysisError, SourceUnavailable
from analysis.sources.prometheus import PrometheusSource

PULLED_DIR = "pulled"  # in the run directory
CLOUDWATCH, TIME_TO_READY, BILLING, PRICES, PROMETHEUS = (
    "cloudwatch",
    "time_to_ready",
    "billing",
    "prices",
    "prometheus",
)
SOURCES = frozenset({CLOUDWATCH, TIME_TO_READY, BILLING, PRICES, PROMETHEUS})
_DATETIME = "$datetime"  # how a datetime of an AWS answer (StartTime, Timestamps) is kept in JSON


class NotPulled(SourceUnavailable):
    """A call the saved answers do not hold (rebuilt with no network): the source did not answer."""


class PulledFailure(SourceUnavailable):
    """A call that failed when it was pulled, failing again with the same type name and message
    (the AWS sources name the type in their gaps; a Prometheus failure is SourceUnavailable already)."""


_FAILURES: dict[str, type[PulledFailure]] = {}


def _failure(type_name: str, message: str) -> PulledFailure:
    """The failure as saved: a class of the original's name, as the sources name it in their gaps."""
    cls = _FAILURES.get(type_name)
    if cls is None:
        cls = _FAILURES[type_name] = type(type_name, (PulledFailure,), {})
    return cls(message)


def _encode(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return {_DATETIME: value.isoformat()}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items() if k != "ResponseMetadata"}  # request ids, not answers
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"cannot keep a {type(value).__name__} in a pulled answer")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_DATETIME}:
            return dt.datetime.fromisoformat(value[_DATETIME])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _key(service: str, operation: str, request: Any) -> str:
    return json.dumps([service, operation, _encode(request)], sort_keys=True)


def utc(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PulledSource:
    """One source's calls as pulled: `live` pulls (and keeps each answer in `path`; None: a report
    with no run directory to keep them in), else the saved answers answer. `about`: what the source
    was (Prometheus's URL), kept beside them."""

    path: Path | None
    name: str
    live: bool
    pulled_at: float
    about: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def now(self) -> float:
        """When the answers were pulled: the time a live source opened, a saved one's as saved."""
        return self.pulled_at

    @property
    def where(self) -> str:
        """The file, as the report names it: pulled/<source>.json."""
        return f"{PULLED_DIR}/{self.name}.json" if self.path is not None else "not kept"

    @classmethod
    def unkept(cls, name: str) -> PulledSource:
        """Pulled live and kept nowhere (a report built without a run directory's store)."""
        return cls(None, name, True, time.time())

    def answer(self, service: str, operation: str, request: Any, fetch: Callable[[], Any] | None) -> Any:
        """The answer to one call: pulled with `fetch` and kept (live), else the saved one. A
        failure is kept too and raised again when rebuilt; a call with no saved answer raises NotPulled."""
        key = _key(service, operation, request)
        if not self.live:
            saved = self.calls.get(key)
            if saved is None:
                raise NotPulled(f"{self.where} holds no answer to {service} {operation} {json.dumps(_encode(request))}")
            if "failed" in saved:
                raise _failure(saved["failed"]["type"], saved["failed"]["message"])
            return _decode(saved["answer"])
        if fetch is None:
            raise NotPulled(f"{service} {operation}: no client to pull it with")
        entry: dict[str, Any] = {"service": service, "operation": operation, "request": _encode(request)}
        try:
            got = fetch()
        except Exception as exc:
            entry["failed"] = {"type": type(exc).__name__, "message": str(exc)}
            self._keep(key, entry)
            raise
        entry["answer"] = _encode(got)
        self._keep(key, entry)
        return _decode(entry["answer"])

    def _keep(self, key: str, entry: dict[str, Any]) -> None:
        self.calls[key] = entry
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        body = {
            "source": self.name,
            "pulled_at": self.pulled_at,
            "pulled_at_utc": utc(self.pulled_at),
            "about": self.about,
            "calls": list(self.calls.values()),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(body, indent=1), encoding="utf-8")

    @classmethod
    def read(cls, path: Path, name: str) -> PulledSource:
        """A saved source back; a file that is not one is an AnalysisError naming the file and field."""
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise AnalysisError(f"{path}: not a pulled source's answers ({exc})") from None
        what = "?"
        try:
            what = "pulled_at"
            pulled_at = float(d["pulled_at"])
            what = "about"
            about = dict(d.get("about") or {})
            calls: dict[str, dict[str, Any]] = {}
            for i, c in enumerate(d["calls"]):
                what = f"calls[{i}]"
                if ("answer" in c) == ("failed" in c):
                    raise ValueError("expected one of answer or failed")
                if "failed" in c and not {"type", "message"} <= set(c["failed"]):
                    raise ValueError("failed: expected its type and message")
                calls[_key(str(c["service"]), str(c["operation"]), _decode(c["request"]))] = c
        except (KeyError, TypeError, ValueError) as exc:
            raise AnalysisError(f"{path}: {what}: {exc!r}") from None
        return cls(path, name, False, pulled_at, about, calls)

    # --- what the report's sources call through ---------------------------------------------------

    def client(self, service: str, live: Any) -> Any:
        """A boto3 client's stand-in answering through this source (None: live, and no such client)."""
        if self.live and live is None:
            return None
        return _Client(self, service, live if self.live else None)

    def prometheus(self, url: str, sigv4_region: str | None = None) -> PrometheusSource:
        """A PrometheusSource answering through this source; live, it keeps `url` beside the answers."""
        if self.live:
            self.about = {"url": url, "sigv4_region": sigv4_region}
        return _Prometheus(self, url, sigv4_region)

    @property
    def prometheus_url(self) -> str | None:
        url = self.about.get("url")
        return str(url) if url else None


class _Client:
    """What the sources call on a boto3 client (an operation, or get_paginator(...).paginate)."""

    def __init__(self, source: PulledSource, service: str, live: Any) -> None:
        self._source, self._service, self._live = source, service, live

    def get_paginator(self, operation: str) -> _Paginator:
        return _Paginator(self, operation)

    def __getattr__(self, operation: str) -> Callable[..., Any]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        live = self._live

        def call(**request: Any) -> Any:
            fetch = None if live is None else lambda: getattr(live, operation)(**request)
            return self._source.answer(self._service, operation, request, fetch)

        return call


class _Paginator:
    def __init__(self, client: _Client, operation: str) -> None:
        self._client, self._operation = client, operation

    def paginate(self, **request: Any) -> list[Any]:
        """Every page, pulled at once (kept as one answer)."""
        live, op = self._client._live, self._operation
        fetch = None if live is None else lambda: {"pages": list(live.get_paginator(op).paginate(**request))}
        got = self._client._source.answer(self._client._service, f"paginate {op}", request, fetch)
        return list(got["pages"])


class _Prometheus(PrometheusSource):
    """PrometheusSource whose HTTP GETs answer through a PulledSource (the query text and time are the request)."""

    def __init__(self, source: PulledSource, url: str, sigv4_region: str | None) -> None:
        super().__init__(url, sigv4_region=sigv4_region)
        self._source = source

    def _get(self, path: str, params: dict[str, str]) -> Any:
        fetch = (lambda: super(_Prometheus, self)._get(path, params)) if self._source.live else None
        return self._source.answer("prometheus", path, params, fetch)


@dataclass(frozen=True)
class PulledStore:
    """Where a report's pulled answers are kept (the run directory's pulled/), and which sources
    read their saved answers in place of the network where the file is there (`saved`; a source
    not in it, or without a file, is pulled live and kept)."""

    directory: Path
    saved: frozenset[str] = frozenset()

    @classmethod
    def for_run(cls, run_dir: Path, saved: Collection[str] = ()) -> PulledStore:
        unknown = set(saved) - SOURCES
        if unknown:
            raise ValueError(f"unknown pulled source(s) {sorted(unknown)}; known: {sorted(SOURCES)}")
        return cls(run_dir / PULLED_DIR, frozenset(saved))

    def source(self, name: str) -> PulledSource:
        path = self.directory / f"{name}.json"
        if name in self.saved and path.is_file():
            return PulledSource.read(path, name)
        path.unlink(missing_ok=True)  # an earlier pull's answers are not this one's
        return PulledSource(path, name, True, time.time())
