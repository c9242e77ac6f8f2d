"""Continuous batching against the monotonic clock.

One loop owns the batch. Each step: admit waiting sequences (FIFO) while the batch has a
free slot (max_concurrency) and the KV cache can hold the newcomer's prompt + max_tokens
(reserved up front, so no preemption is needed); price the step with the timing model;
sleep until the step's scheduled end; emit one token to every running sequence. The next
step is scheduled from the previous step's *scheduled* end, so wake-up jitter never
accumulates into drift; the gap between actual and scheduled end is recorded as step lag.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from runtime.emulator.faults import RequestFaults
from runtime.emulator.metrics import EmulatorMetrics
from runtime.emulator.textgen import TokenStream
from runtime.emulator.timing import TimingModel


class Sequence:
    """One request's generation state, shared by the scheduler (producer) and its handler."""

    def __init__(self, prompt_tokens: int, max_tokens: int, stream: TokenStream, faults: RequestFaults, arrival: float):
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.stream = stream
        self.faults = faults
        self.arrival = arrival
        self.context = prompt_tokens
        self.generated = 0
        self.resume_at = 0.0
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.finish_reason: str | None = None
        self.cancelled = False
        self._pending: list[tuple[str, str | None]] = []
        self._waiter: asyncio.Future[None] | None = None

    @property
    def kv_need(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.cancelled

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
    def __init__(self, timing: TimingModel, metrics: EmulatorMetrics):
        self.timing = timing
        self.metrics = metrics
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.kv_reserved = 0
        self.stats = StepStats()
        self._wakeup = asyncio.Event()

    def submit(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.metrics.waiting.set(len(self.waiting))
        self._wakeup.set()

    def cancel(self, seq: Sequence) -> None:
        """The client went away (or a fault cut it off): free its slot at the next step."""
        if seq.finished:
            return
        seq.cancelled = True
        self.metrics.success["abort"].inc()
        with contextlib.suppress(ValueError):  # running: dropped at the next step boundary
            self.waiting.remove(seq)
        self.metrics.waiting.set(len(self.waiting))

    def _admit(self, at: float) -> tuple[list[Sequence], int]:
        new: list[Sequence] = []
        prefill = 0
        t = self.timing
        while self.waiting and len(self.running) + len(new) < t.max_concurrency:
            seq = self.waiting[0]
            # An empty engine always admits, so one oversized request cannot wedge the queue.
            if self.kv_reserved + seq.kv_need > t.kv_capacity_tokens and (self.running or new):
                break
            self.waiting.popleft()
            self.kv_reserved += seq.kv_need
            self.metrics.queue.observe(max(0.0, at - seq.arrival))
            self.metrics.prompt_tokens.inc(seq.prompt_tokens)
            seq.resume_at = at + seq.faults.first_token_delay_s
            new.append(seq)
            prefill += seq.prompt_tokens
        return new, prefill

    def _release_finished(self) -> None:
        keep: list[Sequence] = []
        for seq in self.running:
            if seq.finished:
                self.kv_reserved -= seq.kv_need
            else:
                keep.append(seq)
        self.running = keep

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        m = self.metrics
        step_end = loop.time()
        while True:
            self._release_finished()
            if not self.running and not self.waiting:
                m.running.set(0)
                m.kv_usage.set(0)
                self._wakeup.clear()
                await self._wakeup.wait()
                # An idle engine starts on the request's arrival, not when this loop got to
                # run after the handler parsed and tokenized the body.
                step_end = min(loop.time(), self.waiting[0].arrival) if self.waiting else loop.time()
            start = step_end
            new, prefill = self._admit(start)
            context = sum(s.context for s in self.running) + prefill
            duration = self.timing.step_s(context, prefill, len(self.running))
            self.running.extend(new)
            m.running.set(len(self.running))
            m.waiting.set(len(self.waiting))
            m.kv_usage.set(min(1.0, context / self.timing.kv_capacity_tokens) if self.timing.kv_capacity_tokens else 1.0)

            step_end = start + duration
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
            st.step_s.append(duration)
            st.batch.append(len(self.running))
            m.step_lag.observe(max(0.0, lag))
            m.generation_tokens.inc(self._emit(now))

    def _emit(self, now: float) -> int:
        m = self.metrics
        emitted = 0
        for seq in self.running:
            if seq.finished or seq.resume_at > now:
                continue
            text, stopped = seq.stream.next_token()
            seq.generated += 1
            seq.context += 1
            emitted += 1
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
        return emitted
