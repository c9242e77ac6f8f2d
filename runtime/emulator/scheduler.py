"""The live emulator's scheduler: the clock-free Engine (engine.py) paced by the event loop.

Each data-parallel replica is one Engine with its own loop task. The scheduler serves the
fleet's measured instances behind one port (`instances`, each with `timing.replicas` replicas
and their own batch and KV limits): a request goes to an instance drawn as the NLB's flow hash
does (runtime/emulator/balancer.py), then round-robin to that instance's replicas. A loop
plans a step, sleeps until the step's scheduled end, completes it and emits the tokens it
produced. The next step is scheduled from the previous step's *scheduled* end, so wake-up
jitter never accumulates into drift; the gap between actual and scheduled end is recorded as
step lag. A request reaches its replica after the fleet's per-request host
overhead (TimingModel.admission_delay_s), exactly as in the simulated-time replays.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from runtime.emulator.balancer import FlowHash
from runtime.emulator.engine import Engine, EngineSeq
from runtime.emulator.faults import RequestFaults
from runtime.emulator.metrics import EmulatorMetrics
from runtime.emulator.textgen import TokenStream
from runtime.emulator.timing import TimingModel


class LiveSequence(EngineSeq):
    """One request's generation state, shared by the scheduler (producer) and its handler."""

    def __init__(
        self,
        prompt_tokens: int,
        max_tokens: int,
        stream: TokenStream,
        faults: RequestFaults,
        arrival: float,
        block_hashes: tuple[int, ...] | None = None,
    ):
        super().__init__(prompt_tokens, max_tokens, arrival, block_hashes)
        self.stream = stream
        self.faults = faults
        self.resume_at = 0.0
        self._pending: list[tuple[str, str | None]] = []
        self._waiter: asyncio.Future[None] | None = None

    def ready(self, now: float) -> bool:
        return self.resume_at <= now

    def push(self, text: str, finish_reason: str | None) -> None:
        self._pending.append((text, finish_reason))
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_tokens(self) -> list[tuple[str, str | None]]:
        """Every (text, finish_reason) produced since the last call; waits for at least one."""
        while not self._pending:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        out, self._pending = self._pending, []
        return out


@dataclass
class StepStats:
    steps: int = 0
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=20000))
    step_s: deque[float] = field(default_factory=lambda: deque(maxlen=20000))
    batch: deque[int] = field(default_factory=lambda: deque(maxlen=20000))


class Scheduler:
    def __init__(self, timing: TimingModel, metrics: EmulatorMetrics, instances: int = 1):
        self.timing = timing
        self.metrics = metrics
        self.replicas = max(1, timing.replicas)
        self.flow = FlowHash(instances)
        # instance k's replicas are engines[k * replicas:(k + 1) * replicas]
        self.engines = [Engine(timing) for _ in range(instances * self.replicas)]
        self.stats = StepStats()
        self._wakeups = [asyncio.Event() for _ in self.engines]
        self._next = [0] * instances  # per instance: its replicas' round-robin turn
        self._reported = [(0, 0) for _ in self.engines]  # prefix-cache (queries, hits) already counted
        metrics.instances.set(instances)

    @property
    def instances(self) -> int:
        return self.flow.instances

    def submit(self, seq: LiveSequence) -> None:
        k = self.flow.pick()
        i = k * self.replicas + self._next[k] % self.replicas
        self._next[k] += 1
        delay = self.timing.admission_delay_s
        if delay > 0:
            asyncio.get_running_loop().call_at(seq.arrival + delay, self._enqueue, i, seq)
        else:
            self._enqueue(i, seq)

    def _enqueue(self, i: int, seq: LiveSequence) -> None:
        if seq.cancelled:
            return
        self.engines[i].submit(seq)
        self._gauges()
        self._wakeups[i].set()

    def cancel(self, seq: LiveSequence) -> None:
        """The client went away (or a fault cut it off): free its slot at the next step."""
        if seq.finished:
            return
        self.metrics.success["abort"].inc()
        for e in self.engines:
            e.cancel(seq)
        self._gauges()

    def _gauges(self) -> None:
        m = self.metrics
        m.waiting.set(sum(len(e.waiting) for e in self.engines))
        m.running.set(sum(sum(1 for s in e.running if not s.finished) for e in self.engines))
        m.kv_usage.set(max(e.kv_usage for e in self.engines))

    async def run(self) -> None:
        await asyncio.gather(*(self._run_replica(i) for i in range(len(self.engines))))

    async def _run_replica(self, i: int) -> None:
        loop = asyncio.get_running_loop()
        engine, wakeup, m = self.engines[i], self._wakeups[i], self.metrics
        step_end = loop.time()
        while True:
            step = engine.plan(step_end) if engine.has_work() else None
            if step is None:
                self._gauges()
                wakeup.clear()
                await wakeup.wait()
                # An idle engine starts when the request became visible to it, not when this
                # loop got to run after the handler parsed and tokenized the body.
                first = engine.waiting[0] if engine.waiting else None
                step_end = (
                    min(loop.time(), first.arrival + self.timing.admission_delay_s)
                    if first is not None
                    else loop.time()
                )
                continue
            start = step_end
            for seq in step.admitted:
                m.queue.observe(max(0.0, start - seq.arrival))
                m.prompt_tokens.inc(seq.prompt_tokens)
                if isinstance(seq, LiveSequence):
                    seq.resume_at = start + seq.faults.first_token_delay_s
            self._count_prefix(i)
            self._gauges()
            step_end = start + step.duration
            # epoll rounds timeouts up to whole milliseconds: sleep to 1 ms short, then yield
            # until the step's end, so wake-ups land on time. Always yields at least once,
            # even when behind schedule, so handlers keep running.
            await asyncio.sleep(max(0.0, step_end - loop.time() - 0.001))
            while loop.time() < step_end:
                await asyncio.sleep(0)
            now = loop.time()
            lag = now - step_end
            st = self.stats
            st.steps += 1
            st.lags.append(lag)
            st.step_s.append(step.duration)
            st.batch.append(step.batch)
            m.step_lag.observe(max(0.0, lag))
            emitted = engine.complete(step, now)
            m.generation_tokens.inc(self._emit(emitted, now))

    def _count_prefix(self, i: int) -> None:
        e = self.engines[i]
        q0, h0 = self._reported[i]
        if e.prefix_queries != q0:
            self.metrics.prefix_queries.inc(e.prefix_queries - q0)
            self.metrics.prefix_hits.inc(e.prefix_hits - h0)
            self._reported[i] = (e.prefix_queries, e.prefix_hits)

    def _emit(self, emitted: list[EngineSeq], now: float) -> int:
        m = self.metrics
        for seq in emitted:
            assert isinstance(seq, LiveSequence)
            text, stopped = seq.stream.next_token()
            if seq.generated == 1:
                seq.first_token_at = now
                m.ttft.observe(now - seq.arrival)
            else:
                m.itl.observe(now - seq.last_token_at)
            seq.last_token_at = now
            finish: str | None = None
            if stopped:
                finish = "stop"
            elif seq.generated >= seq.max_tokens:
                finish = "length"
                text += seq.stream.flush()
            elif seq.faults.stall_at == seq.generated:
                seq.resume_at = now + seq.faults.stall_s
            if finish is not None:
                seq.finish_reason = finish
                m.e2e.observe(now - seq.arrival)
                m.success[finish].inc()
            seq.push(text, finish)
        return len(emitted)
