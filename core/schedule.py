"""The normalized open-loop schedule every fleet replays.

`build_schedule(manifest)` is deterministic: the same manifest gives the same list, so
request_id (the index) names the same request for every fleet and every worker layout.
Transform order: window (trace time) -> rate_scale (thin/replicate by sample_seed) ->
time_scale -> request class (clip or filter). warmup_s is in replay seconds (after
time_scale): warmup is about the system under test warming up in wall time.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import CampaignError
from core.manifest import Manifest, Workload
from core.traces import TraceRow, read_trace


@dataclass(frozen=True)
class ScheduledRequest:
    request_id: int
    offset_s: float  # replay seconds after the run's start
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None
    trace_line: int
    warmup: bool


def _unit(seed: int, line: int) -> float:
    """Uniform [0, 1) from (seed, trace line): keyed by the row, not its position, so a row's
    fate under thinning does not depend on which window was cut around it."""
    h = hashlib.blake2b(f"{seed}:{line}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def copies_of(rate_scale: float, seed: int, line: int) -> int:
    whole = math.floor(rate_scale)
    frac = rate_scale - whole
    return whole + (1 if frac > 0 and _unit(seed, line) < frac else 0)


def transform(
    rows: Sequence[TraceRow], w: Workload, window_s: float | None = None, skip_s: float = 0.0
) -> list[ScheduledRequest]:
    start = w.window.start_s + skip_s
    end = start + (w.window.duration_s if window_s is None else window_s)
    rc = w.request_class
    out: list[ScheduledRequest] = []
    for row in rows:
        if not start <= row.offset_s < end:
            continue
        n = copies_of(w.rate_scale, w.sample_seed, row.line)
        if n == 0:
            continue
        inp, outp = row.input_tokens, row.output_tokens
        if rc.mode == "filter":
            if inp > rc.max_input_tokens or outp > rc.max_output_tokens:
                continue
        else:
            inp, outp = min(inp, rc.max_input_tokens), min(outp, rc.max_output_tokens)
        # A zero-length prompt or answer cannot be requested; BurstGPT logs failures as 0.
        inp, outp = max(inp, 1), max(outp, 1)
        hashes = row.hash_ids
        if hashes is not None:
            hashes = hashes[: math.ceil(inp / 512)]
        offset = (row.offset_s - start) * w.time_scale
        for _ in range(n):
            out.append(ScheduledRequest(len(out), offset, inp, outp, hashes, row.line, offset < w.warmup_s))
    return out


class ScheduleError(CampaignError, ValueError):
    pass


def build_schedule(
    manifest: Manifest,
    trace_path: Path | None = None,
    *,
    window_s: float | None = None,
    skip_s: float = 0.0,
) -> list[ScheduledRequest]:
    """Raises ScheduleError, naming the manifest field, when nothing would be replayed: a run
    that measures nothing must not pass for a valid one. `window_s` (trace seconds from the
    window's start) replaces workload.window.duration_s: a capacity-search step replays as much
    of the trace as its length needs; `skip_s` (trace seconds) starts that much later, offsets
    counted from there: a settle segment continues its step with the requests that follow the
    ones already replayed. Everything else stays the manifest's."""
    w = manifest.workload
    path = trace_path or manifest.trace_path
    rows = read_trace(path, w.trace.format)
    if window_s is not None and window_s <= 0:
        raise ScheduleError(f"window_s must be > 0 trace seconds, got {window_s}")
    if skip_s < 0:
        raise ScheduleError(f"skip_s must be >= 0 trace seconds, got {skip_s}")
    out = transform(rows, w, window_s, skip_s)
    if not out:
        if not rows:
            raise ScheduleError(f"workload.trace: {path} has no requests")
        start = w.window.start_s + skip_s
        end = start + (w.window.duration_s if window_s is None else window_s)
        inside = sum(start <= r.offset_s < end for r in rows)
        if not inside:
            span = rows[-1].offset_s
            raise ScheduleError(
                f"workload.window: [{start:.1f}, {end:.1f}) s selects no request; {Path(path).name} spans 0 to {span:.1f} s"
            )
        raise ScheduleError(
            f"workload: {inside} requests in the window, none left after rate_scale {w.rate_scale:g} and request_class {w.request_class.mode}"
        )
    return out


def check_workload(manifest: Manifest) -> list[ScheduledRequest]:
    """The check `validate`, `local`, `deploy` and `run` make before anything starts: the whole
    trace read (a TraceError lists every bad row, `path:line: field: reason`) and the schedule
    built from it (a ScheduleError names the manifest field when nothing would be replayed)."""
    return build_schedule(manifest)


def partition(schedule: Sequence[ScheduledRequest], n_workers: int, index: int) -> list[ScheduledRequest]:
    """Worker `index` of `n_workers` replays request_id % n_workers == index: interleaved, so
    every worker sees the whole time span and the same burst shape."""
    if n_workers < 1 or not 0 <= index < n_workers:
        raise ValueError(f"worker index {index} out of range for {n_workers} workers")
    return [r for r in schedule if r.request_id % n_workers == index]


def span_s(schedule: Sequence[ScheduledRequest]) -> float:
    return schedule[-1].offset_s if schedule else 0.0


def schedule_digest(schedule: Sequence[ScheduledRequest]) -> str:
    """sha256 of what is replayed (id, offset, lengths, warmup): the operator's machine and each
    load-generator task compute it independently, and a task whose schedule differs refuses to run."""
    h = hashlib.sha256()
    for r in schedule:
        h.update(f"{r.request_id},{r.offset_s!r},{r.input_tokens},{r.output_tokens},{int(r.warmup)}\n".encode())
    return h.hexdigest()
