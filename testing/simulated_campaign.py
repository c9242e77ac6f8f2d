"""Whole campaigns in simulated time for the orchestration tests, as `campaign plan` runs them
(campaign.backends.simulated.fleets), and the other in-process orchestration tests, with the
trace read once per process instead of at every schedule.

A simulated campaign of the example builds its request schedule a dozen times (the replay, the
search's arrival offsets and fallback lifetime, every step and settle segment, every report's
prefix-cache figures; `campaign local`'s launcher more), and each build parsed the whole
19,366-row trace again: about 1.5 s a read on a busy 2-core machine, half of a simulated
campaign's time (profiled 2026-12-07). These tests' subject is the stages' decisions, not the
trace's parsing (tests/loadgen/test_traces.py has that), so they read each unchanged file once:
`traces_read_once` keys the rows on the file's path, size and modification time, so an edited or
rewritten trace is read again, and hands each caller its own list (the rows themselves are frozen).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import core.schedule
from core.traces import TraceRow, read_trace

_rows: dict[tuple[str, str, int, int], tuple[TraceRow, ...]] = {}
_lock = threading.Lock()  # the fleets' searches run side by side in threads


def read_trace_once(path: str | Path, fmt: str) -> list[TraceRow]:
    """core.traces.read_trace, each unchanged file parsed once per process (a bad trace raises
    every time: its error is not kept)."""
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError:  # read_trace says what is wrong with it
        return read_trace(path, fmt)
    key = (str(p), fmt, st.st_size, st.st_mtime_ns)
    with _lock:
        rows = _rows.get(key)
    if rows is None:
        rows = tuple(read_trace(path, fmt))
        with _lock:
            _rows[key] = rows
    return list(rows)


@contextmanager
def traces_read_once() -> Iterator[None]:
    """Within it, every schedule (core.schedule.build_schedule, the only reader of whole traces
    in the stages) reads its trace through `read_trace_once`."""
    with mock.patch.object(core.schedule, "read_trace", read_trace_once):
        yield
