"""Client CPU per streamed token, ours against `vllm bench serve`: the figures of
`bench/loadgen_ceiling.py --efficiency`, computed from its probes (no processes, no clock here).

Every probe of the efficiency mode becomes a `Sample`: one tool, one offered rate, one repeat.
Its client CPU-seconds are utime + stime of the tool's whole process tree over the steady
window (the requests sent at full concurrency), and its streamed tokens are the tokens the
reference server wrote in that same window. A probe in which the server did not keep its
schedule (testing/reference_server.py kept_schedule) counts for neither tool: the offered load
was not the one named, so its figures are left out of every median here and only counted as
excluded. What remains is summarised per tool and rate as median and range over the repeats
(`Figures`), and compared at the rates where both tools kept up.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# A tool keeps up while it achieves this share of the offered rate (issue 41; the ceiling
# mode's first criterion too).
MIN_ACHIEVED_SHARE = 0.98
TARGET_RATIO = 5.0  # ours' tokens per CPU-second against vLLM's, the issue's target
TARGET_TTFT_ERROR_P99_S = 0.010  # ours' TTFT error P99 at every rate, the issue's target


def keeps_up(achieved: float, offered: float) -> bool:
    return achieved >= MIN_ACHIEVED_SHARE * offered


@dataclass(frozen=True)
class Sample:
    """One efficiency probe: one tool at one offered rate in one repeat."""

    tool: str
    offered: float  # req/s
    repeat: int
    server_kept_schedule: bool
    achieved: float  # req/s
    cpu_s: float | None  # utime + stime of the tool's process tree over the steady window
    window_s: float | None  # that window's length (between two samples of the tree's CPU)
    tokens: int  # tokens the server wrote in the window
    lag_p99_s: float
    ttft_err_p50_s: float
    ttft_err_p99_s: float

    @property
    def achieved_share(self) -> float:
        return self.achieved / self.offered

    @property
    def tokens_per_cpu_s(self) -> float | None:
        if self.cpu_s is None or self.cpu_s <= 0:
            return None
        return self.tokens / self.cpu_s

    @property
    def cpu_share(self) -> float | None:
        """The share of one core the tool used in the window."""
        if self.cpu_s is None or not self.window_s:
            return None
        return self.cpu_s / self.window_s


@dataclass(frozen=True)
class Spread:
    """Median and range of one figure over the repeats."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread | None:
        """None where no value is there (a missing figure or NaN: a percentile over nothing)."""
        xs = [x for x in values if x is not None and not math.isnan(x)]
        if not xs:
            return None
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def text(self, fmt: str = ".1f", k: float = 1.0) -> str:
        """`median (lo-hi)` of the values times `k`; one value alone."""
        if self.n == 1:
            return format(self.median * k, fmt)
        return f"{self.median * k:{fmt}} ({self.lo * k:{fmt}}-{self.hi * k:{fmt}})"


@dataclass(frozen=True)
class Figures:
    """One tool at one offered rate, over the repeats whose server kept its schedule."""

    tool: str
    offered: float
    probes: int  # probes that count: the server kept its schedule
    excluded: int  # probes left out: the server fell behind
    cpu_s: Spread | None
    tokens_per_cpu_s: Spread | None
    cpu_share: Spread | None
    lag_p99_s: Spread | None
    ttft_err_p50_s: Spread | None
    ttft_err_p99_s: Spread | None
    achieved_share: Spread | None

    @property
    def kept_up(self) -> bool:
        """Achieved >= 98% of offered in the median probe that counts (none counted: no)."""
        return self.achieved_share is not None and self.achieved_share.median >= MIN_ACHIEVED_SHARE

    @property
    def projected_req_s_per_core(self) -> float | None:
        """A projection, not a measurement: the offered rate over the share of a core it took."""
        if self.cpu_share is None or self.cpu_share.median <= 0:
            return None
        return self.offered / self.cpu_share.median

    def as_dict(self) -> dict[str, Any]:
        def spread(s: Spread | None, k: float = 1.0) -> dict[str, float | int] | None:
            return None if s is None else {"median": s.median * k, "lo": s.lo * k, "hi": s.hi * k, "n": s.n}

        return {
            "tool": self.tool,
            "offered_req_s": self.offered,
            "probes": self.probes,
            "excluded_server_limited": self.excluded,
            "kept_up": self.kept_up,
            "cpu_s": spread(self.cpu_s),
            "tokens_per_cpu_s": spread(self.tokens_per_cpu_s),
            "cpu_share": spread(self.cpu_share),
            "lag_p99_ms": spread(self.lag_p99_s, 1000),
            "ttft_error_p50_ms": spread(self.ttft_err_p50_s, 1000),
            "ttft_error_p99_ms": spread(self.ttft_err_p99_s, 1000),
            "achieved_share": spread(self.achieved_share),
        }


def figures(samples: Sequence[Sample], tool: str, offered: float) -> Figures:
    mine = [s for s in samples if s.tool == tool and s.offered == offered]
    counted = [s for s in mine if s.server_kept_schedule]
    return Figures(
        tool,
        offered,
        len(counted),
        len(mine) - len(counted),
        Spread.of(s.cpu_s for s in counted),
        Spread.of(s.tokens_per_cpu_s for s in counted),
        Spread.of(s.cpu_share for s in counted),
        Spread.of(s.lag_p99_s for s in counted),
        Spread.of(s.ttft_err_p50_s for s in counted),
        Spread.of(s.ttft_err_p99_s for s in counted),
        Spread.of(s.achieved_share for s in counted),
    )


def table(samples: Sequence[Sample], tools: Sequence[str], rates: Sequence[float]) -> list[Figures]:
    return [figures(samples, tool, rate) for tool in tools for rate in rates]


def _of(rows: Sequence[Figures], tool: str, rate: float) -> Figures | None:
    return next((f for f in rows if f.tool == tool and f.offered == rate), None)


# -- the rates ---------------------------------------------------------------------------------------


def rate_ladder(top: float, count: int = 3, step: float = 2.0) -> list[float]:
    """`count` rates ending at `top`, each `step` times the one before (rounded to 0.1 req/s)."""
    rates = sorted({round(top / step**i, 1) for i in range(count)})
    if len(rates) < count or rates[0] <= 0:
        raise ValueError(f"{top:g} req/s is too low for {count} distinct rates {step:g}x apart (0.1 req/s steps)")
    return rates


def parse_rates(text: str, *, at_least: int = 3) -> list[float]:
    """`--rates 2,4,8`: at least `at_least` distinct positive rates, ascending."""
    try:
        rates = sorted({float(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--rates: {text!r} is not a comma-separated list of numbers (req/s)") from None
    if any(not r > 0 or math.isinf(r) for r in rates):
        raise ValueError(f"--rates: every rate must be a positive number of req/s, got {text!r}")
    if len(rates) < at_least:
        raise ValueError(f"--rates: need at least {at_least} distinct rates, got {len(rates)} in {text!r}")
    return rates


def turns(tools: Sequence[str], rates: Sequence[float], repeats: int) -> list[tuple[int, float, str]]:
    """The run's order: every repeat goes through the rates from the lowest, the tools taking
    turns at each rate; who goes first rotates from one repeat to the next, so a drift of the
    shared machine's load does not always fall on the same tool."""
    out: list[tuple[int, float, str]] = []
    for repeat in range(repeats):
        k = repeat % len(tools)
        order = [*tools[k:], *tools[:k]]
        out.extend((repeat, rate, tool) for rate in sorted(rates) for tool in order)
    return out


@dataclass(frozen=True)
class KeepUpSearch:
    """How the default rates were found: `vllm bench serve`'s search for its highest rate that
    keeps up. A rate at which the server fell behind bounds the search (nothing above it can be
    measured here) but is no miss of vLLM's."""

    kept_up_req_s: float  # the highest rate at which it kept up: the set's top
    missed_req_s: float | None  # the lowest rate at which it did not (None: none seen)
    server_limited_req_s: float | None  # the lowest rate at which the server fell behind

    @classmethod
    def of(cls, probes: Iterable[tuple[float, bool, bool]]) -> KeepUpSearch | None:
        """From (offered, server kept its schedule, tool kept up) per probe; None where the tool
        kept up at no rate the server held."""
        probes = list(probes)
        kept = [r for r, held, up in probes if held and up]
        if not kept:
            return None
        missed = [r for r, held, up in probes if held and not up]
        limited = [r for r, held, _ in probes if not held]
        return cls(max(kept), min(missed, default=None), min(limited, default=None))

    @property
    def limit_found(self) -> bool:
        """Whether the search saw vLLM itself fall behind (else its top is a lower bound)."""
        return self.missed_req_s is not None

    def as_dict(self) -> dict[str, float | bool | None]:
        return {
            "kept_up_req_s": self.kept_up_req_s,
            "missed_req_s": self.missed_req_s,
            "server_limited_req_s": self.server_limited_req_s,
            "limit_found": self.limit_found,
        }

    def line(self, tool: str) -> str:
        bound = (
            f", missed at {self.missed_req_s:g}"
            if self.missed_req_s is not None
            else ": its limit is higher, not found within the search's probes"
        )
        if self.server_limited_req_s is not None:
            bound += f"; the server fell behind at {self.server_limited_req_s:g}"
        return f"(the rates come from {tool}'s search: kept up at {self.kept_up_req_s:g} req/s{bound})"


# -- the comparison ----------------------------------------------------------------------------------


def common_rates(rows: Sequence[Figures], ours: str, theirs: str, rates: Sequence[float]) -> list[float]:
    """The rates at which both tools kept up (probes the server held only)."""
    out = []
    for rate in rates:
        a, b = _of(rows, ours, rate), _of(rows, theirs, rate)
        if a is not None and b is not None and a.kept_up and b.kept_up:
            out.append(rate)
    return sorted(out)


def ratio(ours: Spread | None, theirs: Spread | None) -> float | None:
    """Of the medians."""
    if ours is None or theirs is None or theirs.median <= 0:
        return None
    return ours.median / theirs.median


def tokens_written_between(rows: Iterable[tuple[float, int]], itl_s: float, t0: float, t1: float) -> int:
    """Tokens written in [t0, t1) by streams given as (first token's write, tokens), token k at
    first write + k x ITL: the reference server's schedule, which a probe that counts kept to
    within 2 ms at P90."""
    total = 0
    for first, n in rows:
        k_lo = max(0, math.ceil((t0 - first) / itl_s))
        k_hi = min(n - 1, math.ceil((t1 - first) / itl_s) - 1)
        total += max(0, k_hi - k_lo + 1)
    return total


@dataclass(frozen=True)
class Comparison:
    """What the efficiency mode concludes; `result()` is its last JSON line."""

    ours: str
    theirs: str
    rates: list[float]
    repeats: int
    rows: list[Figures]
    baseline: str | None = None  # ours at another revision (--baseline REF)
    search: KeepUpSearch | None = None  # how the rates were found (None: given)

    def of(self, tool: str, rate: float) -> Figures | None:
        return _of(self.rows, tool, rate)

    @property
    def common(self) -> list[float]:
        return common_rates(self.rows, self.ours, self.theirs, self.rates)

    @property
    def highest_common_rate(self) -> float | None:
        return max(self.common, default=None)

    def ratio_at(self, rate: float, tool: str | None = None) -> float | None:
        """Ours to `tool` (vLLM's by default) in tokens per CPU-second at `rate`."""
        a, b = self.of(self.ours, rate), self.of(tool or self.theirs, rate)
        if a is None or b is None:
            return None
        return ratio(a.tokens_per_cpu_s, b.tokens_per_cpu_s)

    def tokens_per_cpu_s(self, tool: str, rate: float | None) -> float | None:
        f = self.of(tool, rate) if rate is not None else None
        return f.tokens_per_cpu_s.median if f and f.tokens_per_cpu_s else None

    @property
    def vllm_missed_req_s(self) -> list[float]:
        """The rates at which `vllm bench serve` was measured and did not keep up."""
        return [f.offered for f in self.rows if f.tool == self.theirs and f.probes and not f.kept_up]

    @property
    def highest_measured_ours(self) -> Figures | None:
        """Ours at the highest rate with a probe that counts."""
        measured = [f for f in self.rows if f.tool == self.ours and f.probes > 0]
        return max(measured, key=lambda f: f.offered, default=None)

    def ours_ttft_error_p99_ms_by_rate(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for rate in self.rates:
            f = self.of(self.ours, rate)
            out[f"{rate:g}"] = f.ttft_err_p99_s.median * 1000 if f and f.ttft_err_p99_s else None
        return out

    def result(self) -> dict[str, Any]:
        top = self.highest_common_rate
        ours_top = self.of(self.ours, top) if top is not None else None
        r = self.ratio_at(top) if top is not None else None
        by_rate = self.ours_ttft_error_p99_ms_by_rate()
        projected = self.highest_measured_ours
        out: dict[str, Any] = {
            "mode": "efficiency",
            "rates_req_s": self.rates,
            "repeats": self.repeats,
            "highest_common_req_s": top,
            "ours_tokens_per_cpu_s": self.tokens_per_cpu_s(self.ours, top),
            "vllm_tokens_per_cpu_s": self.tokens_per_cpu_s(self.theirs, top),
            "ratio": r,
            "ours_ttft_error_p99_ms": (
                ours_top.ttft_err_p99_s.median * 1000 if ours_top and ours_top.ttft_err_p99_s else None
            ),
            "ratios_by_rate": {f"{rate:g}": self.ratio_at(rate) for rate in self.common},
            "ours_ttft_error_p99_ms_by_rate": by_rate,
            "vllm_missed_req_s": self.vllm_missed_req_s,
            "vllm_search": self.search.as_dict() if self.search else None,
            # a projection, labelled as one: offered / CPU share at the highest rate measured
            "ours_projected_req_s_per_core": projected.projected_req_s_per_core if projected else None,
            "projected_from_req_s": projected.offered if projected else None,
            "target": {
                "min_ratio": TARGET_RATIO,
                "max_ttft_error_p99_ms": TARGET_TTFT_ERROR_P99_S * 1000,
                "ratio_met": r is not None and r >= TARGET_RATIO,
                # ours measured at every rate, each rate's median P99 under the bound
                "ttft_error_met": all(v is not None and v < TARGET_TTFT_ERROR_P99_S * 1000 for v in by_rate.values()),
            },
            "figures": [f.as_dict() for f in self.rows],
        }
        if self.baseline is not None:
            out["baseline"] = self.baseline
            out["baseline_tokens_per_cpu_s"] = self.tokens_per_cpu_s(self.baseline, top)
            out["ratio_to_baseline"] = self.ratio_at(top, self.baseline) if top is not None else None
        return out

    def lines(self, tokens_per_request: int) -> list[str]:
        """The closing text: the table, the ratios, the projection."""

        def cell(s: Spread | None, fmt: str, k: float = 1.0) -> str:
            return "n/a" if s is None else s.text(fmt, k)

        out = [
            "median (range) over the probes in which the server kept its schedule; CPU: the tool's process "
            "tree, utime + stime, over the steady window",
            f"{'tool':<16}{'req/s':>7}  {'probes':<8}{'CPU-s':<18}{'tokens/CPU-s':<24}{'CPU share':<20}"
            f"{'lag p99 ms':<20}{'TTFT err p50 ms':<20}{'p99 ms':<20}achieved/offered",
        ]
        for f in self.rows:
            left_out = f" -{f.excluded}" if f.excluded else ""
            out.append(
                f"{f.tool:<16}{f.offered:>7g}  {f'{f.probes}{left_out}':<8}{cell(f.cpu_s, '.2f'):<18}"
                f"{cell(f.tokens_per_cpu_s, ',.0f'):<24}{cell(f.cpu_share, '.0%'):<20}{cell(f.lag_p99_s, '.2f', 1000):<20}"
                f"{cell(f.ttft_err_p50_s, '.2f', 1000):<20}{cell(f.ttft_err_p99_s, '.2f', 1000):<20}"
                f"{cell(f.achieved_share, '.1%')}{'' if f.kept_up else '  (did not keep up)'}"
            )
        excluded = sum(f.excluded for f in self.rows)
        if excluded:
            out.append(f"({excluded} probes left out, '-N' above: the server fell behind its schedule in them)")
        result = self.result()
        top = result["highest_common_req_s"]
        if top is None:
            out.append(f"no rate at which both {self.ours} and {self.theirs} kept up: no ratio")
        else:
            by_rate = ", ".join(
                f"{r} req/s {v:.1f}" if v else f"{r} req/s n/a" for r, v in result["ratios_by_rate"].items()
            )
            out.append(f"ratio {self.ours} / {self.theirs}, tokens per client CPU-second: {by_rate}")
            out.append(
                f"at {top:g} req/s, the highest rate at which both kept up: ours {result['ours_tokens_per_cpu_s'] or 0:,.0f}, "
                f"vLLM's {result['vllm_tokens_per_cpu_s'] or 0:,.0f} tokens per CPU-second, ratio "
                f"{result['ratio'] or 0:.1f} (target >= {TARGET_RATIO:g}); ours' TTFT error p99 "
                f"{result['ours_ttft_error_p99_ms'] or math.nan:.2f} ms"
            )
        if self.vllm_missed_req_s:
            out.append(f"{self.theirs} did not keep up at {', '.join(f'{r:g}' for r in self.vllm_missed_req_s)} req/s")
        if self.search is not None:
            out.append(self.search.line(self.theirs))
        worst = {r: v for r, v in result["ours_ttft_error_p99_ms_by_rate"].items() if v is not None}
        out.append(
            f"ours' TTFT error p99 by rate (median, ms): {', '.join(f'{r}: {v:.2f}' for r, v in worst.items()) or 'n/a'} "
            f"(target < {TARGET_TTFT_ERROR_P99_S * 1000:g} ms at every rate: {'met' if result['target']['ttft_error_met'] else 'not met'})"
        )
        proj, at = result["ours_projected_req_s_per_core"], result["projected_from_req_s"]
        if proj is not None:
            out.append(
                f"PROJECTION, not a measurement: ours at {at:g} req/s (the highest rate measured) used "
                f"{at / proj:.0%} of a core, so one core would offer about {proj:.0f} req/s "
                f"({proj * tokens_per_request:,.0f} tokens/s) if its cost per token stayed the same"
            )
        if self.baseline is not None:
            rb = result["ratio_to_baseline"]
            out.append(
                f"ours / {self.baseline}, tokens per CPU-second at {top}: {'n/a' if rb is None else f'{rb:.2f}'}"
            )
        return out
