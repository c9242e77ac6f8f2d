"""Replay a load through the emulator's engines in simulated time: no sockets, no sleeping.

The clock jumps from event to event (an arrival, the end of a replica's step) and every step
is planned and completed by the same Engine the live server runs, so the figures here are the
live emulator's figures minus the event loop's jitter. Replicas sit behind one endpoint that
hands requests out round-robin (the nginx default in the published data-parallel setups).
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from runtime.emulator.engine import Engine, EngineSeq, Step
from runtime.emulator.timing import TimingModel

LoadKind = Literal["synchronous", "concurrency", "rate"]


@dataclass(frozen=True)
class Load:
    kind: LoadKind
    value: float  # users (concurrency), requests/s (rate); 1 for synchronous
    # Closed loops only: seconds a user waits after a response before sending its next request
    # (a load generator that held fewer requests in flight than its users: runtime/emulator/calibrate.py).
    think_s: float = 0.0

    @property
    def users(self) -> int:
        return 1 if self.kind == "synchronous" else int(self.value)


@dataclass(frozen=True)
class Summary:
    """Means over the measured requests, as guidellm and llmperf report them."""

    requests: int
    output_tok_s: float
    ttft_s: float
    itl_s: float
    duration_s: float


class _Replica:
    def __init__(self, timing: TimingModel):
        self.engine = Engine(timing)
        self.step: Step | None = None
        self.step_end = 0.0


Sizes = Callable[[int], tuple[int, int]]  # request index -> (prompt tokens, output tokens)


def simulate(
    timing: TimingModel, load: Load, sizes: Sizes, requests: int | None = None
) -> tuple[Summary, list[EngineSeq]]:
    """Run `requests` requests (default: enough for a steady state) and summarise the ones
    after the warm-up share (the first tenth, at least the first `users` requests)."""
    users = load.users
    if load.kind == "rate":
        n = requests if requests is not None else max(60, int(load.value * 60))
        seqs = replay(timing, [(i / load.value, *sizes(i)) for i in range(n)])
        return summarise(seqs, warmup=len(seqs) // 10), seqs
    n = requests if requests is not None else max(40, 6 * users * timing.replicas)
    seqs = replay(
        timing, [(0.0, *sizes(i)) for i in range(min(users, n))], closed_loop=(n, sizes), think_s=load.think_s
    )
    return summarise(seqs, warmup=max(users, len(seqs) // 10)), seqs


def replay(
    timing: TimingModel,
    arrivals: list[tuple[float, int, int]],
    closed_loop: tuple[int, Sizes] | None = None,
    think_s: float = 0.0,
    until: float | None = None,
    patience_s: list[float] | None = None,
) -> list[EngineSeq]:
    """Requests (arrival time, prompt tokens, output tokens) through the instance's replicas;
    with `closed_loop` = (total, sizes), every finished request sends the next one after a
    think time until `total` were sent: exponential with mean `think_s` (seeded), so users that
    started together drift apart as a real client's do; none when `think_s` is 0. `until`: a
    load generator's end time: nothing arrives at or after it and the replay stops there
    (requests still running keep the token times they had). `patience_s`: per arrival, the seconds
    after which its client gives up (a live step's SLO deadline): an unfinished request is then
    cancelled at the next event, as the live server aborts one whose client disconnected, and
    its slot and KV go to the others (`cancelled`; it keeps the tokens it had). Returns every
    request, with its token times filled in."""
    think = random.Random(0)
    replicas = [_Replica(timing) for _ in range(max(1, timing.replicas))]
    seqs: list[EngineSeq] = []
    # (time the scheduler sees it, order, sequence): arrival + the host-side admission delay
    pending: list[tuple[float, int, EngineSeq]] = []
    delay = timing.admission_delay_s
    # (time its client gives up, order, sequence); holder: the engine each submitted one went to
    expiries: list[tuple[float, int, EngineSeq]] = []
    holder: dict[int, Engine] = {}

    def arrive(at: float, inp: int, out: int, patience: float | None = None) -> None:
        if until is not None and at >= until:
            return
        seq = EngineSeq(inp, out, at)
        seqs.append(seq)
        heapq.heappush(pending, (at + delay, len(seqs), seq))
        if patience is not None:
            heapq.heappush(expiries, (at + patience, len(seqs), seq))

    def give_up(now: float) -> None:
        while expiries and expiries[0][0] <= now:
            _, _, seq = heapq.heappop(expiries)
            if not seq.finished:
                engine = holder.get(id(seq))
                if engine is not None:
                    engine.cancel(seq)
                else:
                    seq.cancelled = True  # still on its way to the scheduler: never submitted

    for i, (at, inp, out) in enumerate(arrivals):
        arrive(at, inp, out, patience_s[i] if patience_s is not None else None)
    now = 0.0
    rr = 0
    while True:
        give_up(now)
        for r in replicas:
            if r.step is None and r.engine.has_work():
                r.step = r.engine.plan(now)
                if r.step is not None:
                    r.step_end = now + r.step.duration
        busy = [r for r in replicas if r.step is not None]
        step_end = min((r.step_end for r in busy), default=None)
        if pending and (step_end is None or pending[0][0] <= step_end):
            now, _, seq = heapq.heappop(pending)
            if not seq.cancelled:
                engine = replicas[rr % len(replicas)].engine
                engine.submit(seq)
                holder[id(seq)] = engine
                rr += 1
            continue
        if step_end is None or (until is not None and step_end > until):
            break
        now = step_end
        for r in busy:
            if r.step is None or r.step_end != now:
                continue
            step, r.step = r.step, None
            for seq in r.engine.complete(step, now):
                if seq.generated == 1:
                    seq.first_token_at = now
                seq.last_token_at = now
                if seq.generated >= seq.max_tokens:
                    seq.finish_reason = "length"
                    if closed_loop is not None and len(seqs) < closed_loop[0]:
                        wait = think.expovariate(1 / think_s) if think_s > 0 else 0.0
                        arrive(now + wait, *closed_loop[1](len(seqs)))  # a closed-loop user's next request
    return seqs


def summarise(seqs: list[EngineSeq], warmup: int) -> Summary:
    done = [s for s in seqs if s.finish_reason is not None and s.first_token_at is not None]
    measured = done[warmup:] if len(done) > warmup else done
    start = min(s.arrival for s in measured)
    end = max(s.last_token_at for s in measured)
    tokens = sum(s.generated for s in measured)
    itls = [
        (s.last_token_at - s.first_token_at) / (s.generated - 1)
        for s in measured
        if s.first_token_at is not None and s.generated > 1
    ]
    ttfts = [s.first_token_at - s.arrival for s in measured if s.first_token_at is not None]
    return Summary(
        requests=len(measured),
        output_tok_s=tokens / (end - start) if end > start else 0.0,
        ttft_s=statistics.fmean(ttfts),
        itl_s=statistics.fmean(itls) if itls else 0.0,
        duration_s=end - start,
    )
