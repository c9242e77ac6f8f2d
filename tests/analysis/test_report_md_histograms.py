from __future__ import annotations

from analysis.model import PrometheusSection
from analysis.report.render.markdown import _histogram_lines


def test_histogram_table_puts_merged_and_record_p95_side_by_side() -> None:
    prom = {
        "url": "http://127.0.0.1:9",
        "fleets": {
            "g6": {
                "window_unix": [0, 1],
                "client_ttft": {
                    "metric": "loadgen_ttft_seconds_bucket",
                    "p95_s_merged_histogram": 0.5625,
                    "p95_s_records": 0.5137,
                    "difference_s": 0.0488,
                },
            }
        },
    }
    lines = _histogram_lines(PrometheusSection.model_validate(prom))
    assert "| g6 | client_ttft | `loadgen_ttft_seconds_bucket` | 0.562 | 0.514 | 0.049 |" in lines
    assert not any("window_unix" in x for x in lines)


def test_without_prometheus_the_report_says_records_only() -> None:
    assert any("raw records" in x for x in _histogram_lines(None))


def test_a_difference_is_read_at_its_bucket_and_inside_it_says_so() -> None:
    """Issue 46, finding 11: the merged histogram's P95 lies somewhere in its bucket; the records'
    P95 inside that bucket shows as agreement within it, one outside as its figure and bucket."""
    entry = {"metric": "loadgen_ttft_seconds_bucket", "p95_s_merged_histogram": 0.23125}
    prom = {
        "url": "http://127.0.0.1:9",
        "fleets": {
            "g6": {
                "window_unix": [0, 1],
                "client_ttft": {**entry, "p95_s_records": 0.2, "bucket_s": [0.1, 0.25], "difference_s": None},
                "client_itl": {**entry, "p95_s_records": 0.4, "bucket_s": [0.1, 0.25], "difference_s": -0.16875},
            }
        },
    }
    lines = _histogram_lines(PrometheusSection.model_validate(prom))
    assert "| g6 | client_ttft | `loadgen_ttft_seconds_bucket` | 0.231 | 0.200 | within bucket 0.1-0.25 |" in lines
    assert "| g6 | client_itl | `loadgen_ttft_seconds_bucket` | 0.231 | 0.400 | -0.169 (bucket 0.1-0.25) |" in lines
