"""The analysis reads each fleet's own server histograms (core.serving), never vLLM's for every fleet."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from analysis.report import evidence as report_evidence
from analysis.sources.prometheus import HistogramNames, PrometheusSource
from core.manifest import load_manifest
from core.serving import TGI_METRICS, TRTLLM_METRICS


def test_names_per_stack() -> None:
    assert HistogramNames.for_stack("vllm-neuron") == HistogramNames()
    trt = HistogramNames.for_stack("tensorrt-llm")
    assert (trt.server_ttft, trt.server_itl, trt.server_itl_fallback) == (
        TRTLLM_METRICS["ttft"],
        TRTLLM_METRICS["itl"],
        None,
    )
    tgi = HistogramNames.for_stack("tgi")
    assert tgi.server_ttft is None and tgi.server_itl == TGI_METRICS["itl"]
    with pytest.raises(ValueError, match="unknown serving stack 'sglang'"):
        HistogramNames.for_stack("sglang")


class _RecordingSource:
    """Stands in for PrometheusSource's answers (its methods replace the class's, so the report's
    source, which answers through the run's pulled answers, answers with them): records which
    series the report asks for."""

    queried: ClassVar[list[str]] = []

    def has_series(self, metric: str, *_: Any) -> bool:
        _RecordingSource.queried.append(metric)
        return True

    def merged_quantile(self, q: float, metric: str, *_: Any) -> float:
        _RecordingSource.queried.append(metric)
        return 0.5

    def merged_buckets(self, metric: str, *_: Any) -> dict[float, float]:
        return {0.5: 1.0, float("inf"): 1.0}

    def per_replica_quantiles(self, *_: Any) -> dict[str, float]:
        return {}


def test_report_queries_each_fleets_own_series(example_manifest_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = load_manifest(example_manifest_path, check_files=False)
    g6 = m.fleet("g6")
    fleets = [
        f if f.name != "g6" else g6.model_copy(update={"serving": g6.serving.model_copy(update={"stack": "tgi"})})
        for f in m.fleets
    ]
    m2 = m.model_copy(update={"fleets": tuple(fleets)})
    for name in ("has_series", "merged_quantile", "merged_buckets", "per_replica_quantiles"):
        monkeypatch.setattr(PrometheusSource, name, vars(_RecordingSource)[name])
    _RecordingSource.queried = []
    measure = SimpleNamespace(wall_start=1000.0, window_start_s=0.0, window_end_s=60.0, p95_ttft_s=0.4, p95_itl_s=0.05)
    out, _found = report_evidence._prometheus_section(m2, "http://prom", None, {"inf2": measure, "g6": measure})  # type: ignore[dict-item]
    assert out["fleets"]["inf2"]["server_ttft"]["metric"] == "vllm:time_to_first_token_seconds_bucket"
    assert out["fleets"]["g6"]["server_itl"]["metric"] == f"{TGI_METRICS['itl']}_bucket"
    assert (
        out["fleets"]["g6"]["server_ttft"]["metric"] is None
        and "tgi exports no such histogram" in out["fleets"]["g6"]["server_ttft"]["note"]
    )
    # vLLM's TTFT is asked for the vLLM fleet only; the TGI fleet's ITL comes from TGI's own series.
    assert _RecordingSource.queried.count("vllm:time_to_first_token_seconds") == 1
    assert TGI_METRICS["itl"] in _RecordingSource.queried
