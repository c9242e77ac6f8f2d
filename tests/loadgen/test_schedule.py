from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.manifest import load_manifest
from core.schedule import ScheduleError, build_schedule, partition, transform
from core.traces import TraceRow
from tests.loadgen.conftest import small_manifest_data, write


def _m(tmp_path: Path, base: dict[str, Any], **w: Any) -> Any:
    return load_manifest(write(tmp_path, small_manifest_data(base, **w)))


def test_deterministic_and_ids_are_indices(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    m = _m(tmp_path, manifest_data)
    a, b = build_schedule(m), build_schedule(m)
    assert a == b and [r.request_id for r in a] == list(range(len(a)))
    offs = [r.offset_s for r in a]
    assert offs == sorted(offs) and offs[0] >= 0 and offs[-1] < 60 * 0.1


def test_window_and_time_scale(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    full = build_schedule(_m(tmp_path, manifest_data, time_scale=1.0, rate_scale=1.0))
    half = build_schedule(_m(tmp_path, manifest_data, time_scale=0.5, rate_scale=1.0))
    assert len(full) == len(half)
    assert all(h.offset_s == pytest.approx(f.offset_s * 0.5) for f, h in zip(full, half, strict=True))
    assert full[-1].offset_s < 60


def test_rate_scale_thins_and_replicates(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    base = build_schedule(_m(tmp_path, manifest_data, rate_scale=1.0))
    thin = build_schedule(_m(tmp_path, manifest_data, rate_scale=0.3))
    double = build_schedule(_m(tmp_path, manifest_data, rate_scale=2.0))
    assert len(double) == 2 * len(base)
    assert 0.15 * len(base) < len(thin) < 0.45 * len(base)
    # thinning keeps a subset of the original arrivals, with their original times
    assert {r.trace_line for r in thin} <= {r.trace_line for r in base}
    other_seed = build_schedule(_m(tmp_path, manifest_data, rate_scale=0.3, sample_seed=99))
    assert [r.trace_line for r in other_seed] != [r.trace_line for r in thin]


def test_request_class_clip_and_filter(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    clip = build_schedule(_m(tmp_path, manifest_data, rate_scale=1.0))
    filt = build_schedule(
        _m(
            tmp_path,
            manifest_data,
            rate_scale=1.0,
            request_class={"max_input_tokens": 1024, "max_output_tokens": 256, "mode": "filter"},
        )
    )
    assert max(r.input_tokens for r in clip) == 256 and max(r.output_tokens for r in clip) == 16
    assert 0 < len(filt) < len(clip)
    assert all(r.input_tokens <= 1024 and r.output_tokens <= 256 for r in filt)


def test_warmup_flag_in_replay_seconds(tmp_path: Path, manifest_data: dict[str, Any]) -> None:
    s = build_schedule(_m(tmp_path, manifest_data, warmup_s=2.0))
    assert any(r.warmup for r in s) and any(not r.warmup for r in s)
    assert all(r.warmup == (r.offset_s < 2.0) for r in s)


def test_partition_is_disjoint_cover() -> None:
    rows = [TraceRow(i + 2, i * 0.1, 10, 5) for i in range(50)]
    from core.manifest import Workload

    w = Workload.model_validate(
        {
            "trace": {"path": "x", "format": "plain-csv"},
            "window": {"duration_s": 100},
            "request_class": {"max_input_tokens": 99, "max_output_tokens": 9},
            "demand": {"peak_requests_per_s": 1},
        }
    )
    s = transform(rows, w)
    parts = [partition(s, 3, i) for i in range(3)]
    ids = sorted(r.request_id for p in parts for r in p)
    assert ids == list(range(50))
    with pytest.raises(ValueError):
        partition(s, 3, 3)


@pytest.mark.parametrize(
    ("workload", "needle"),
    [
        (
            {"window": {"start_s": 10_000_000, "duration_s": 60}},
            "workload.window: [10000000.0, 10000060.0) s selects no request; AzureLLMInferenceTrace_conv.csv spans 0 to 3501.7 s",
        ),
        ({"request_class": {"max_input_tokens": 1, "max_output_tokens": 1, "mode": "filter"}}, "none left after"),
    ],
)
def test_a_schedule_that_replays_nothing_is_an_error(
    tmp_path: Path, manifest_data: dict[str, Any], workload: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ScheduleError) as ei:
        build_schedule(_m(tmp_path, manifest_data, **workload))
    assert needle in str(ei.value)


def test_window_s_replays_more_of_the_trace_and_keeps_the_manifest_window_prefix(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    m = _m(tmp_path, manifest_data, time_scale=1.0, rate_scale=1.0)
    base = build_schedule(m)
    longer = build_schedule(m, window_s=m.workload.window.duration_s * 3)
    assert len(longer) > len(base)
    assert longer[: len(base)] == base  # the same requests, ids and offsets first
    assert longer[-1].offset_s < m.workload.window.duration_s * 3
    shorter = build_schedule(m, window_s=m.workload.window.duration_s / 2)
    assert shorter == [r for r in base if r.offset_s < m.workload.window.duration_s / 2]
    with pytest.raises(ScheduleError, match="window_s must be > 0"):
        build_schedule(m, window_s=0)


def test_skip_s_continues_the_trace_after_the_requests_already_replayed(
    tmp_path: Path, manifest_data: dict[str, Any]
) -> None:
    """A settle segment: the requests of [skip, skip + window) trace seconds, offsets counted from
    the skip, exactly those a longer window would have replayed after it."""
    m = _m(tmp_path, manifest_data, time_scale=2.0, rate_scale=1.0)
    w = m.workload.window.duration_s
    whole = build_schedule(m, window_s=2 * w)
    later = build_schedule(m, window_s=w, skip_s=w)
    after = [r for r in whole if r.offset_s >= w * 2.0]  # offsets are trace seconds x time_scale
    assert [(r.trace_line, r.input_tokens, r.output_tokens) for r in later] == [
        (r.trace_line, r.input_tokens, r.output_tokens) for r in after
    ]
    assert [r.offset_s for r in later] == pytest.approx([r.offset_s - w * 2.0 for r in after])
    with pytest.raises(ScheduleError, match="skip_s must be >= 0"):
        build_schedule(m, skip_s=-1)
